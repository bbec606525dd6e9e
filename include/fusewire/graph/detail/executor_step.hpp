#pragma once
/// The executor's step state: starting a step, loop-frame tags, failing it,
/// and taking in the messages that arrived.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/executor.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// 64-bit FNV-1a; names a loop-frame instance in rendezvous keys.
inline std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace detail

inline void executor::start(send_fn send, recv_fn recv, std::uint64_t step, const feed_map& feeds,
                            const std::vector<std::string>& fetches) {
  if (running_ && !done_) throw_error(errc::invalid_argument, "step " + std::to_string(step_) + " is still running");
  for (const auto& [name, value] : feeds) {
    auto i = graph_.find(name);
    if (!i || nodes_[*i].kind != op_kind::placeholder)
      throw_error(errc::invalid_argument, "feed " + util::quoted(name) + " names no Placeholder in this graph");
    if (auto bad = spec_mismatch(*i, 0, value))
      throw_error(errc::invalid_argument,
                  "feed " + util::quoted(name) + " does not fit: Placeholder " + graph_.describe(*i) + *bad);
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].kind == op_kind::placeholder && !feeds.count(graph_.node(i).name))
      throw_error(errc::invalid_argument, "no feed for Placeholder " + util::quoted(graph_.node(i).name));
  std::vector<std::pair<std::size_t, int>> fetch_ports;
  for (const auto& f : fetches) {
    auto in = detail::split_input(f);
    std::optional<std::size_t> i;
    if (in && !in->control) i = graph_.find(in->node);
    if (!i || static_cast<std::size_t>(in->port) >= nodes_[*i].outputs)
      throw_error(errc::invalid_argument, "fetch " + util::quoted(f) + " names no output in this graph");
    if (graph_.output_frame_of(*i) != 0)
      throw_error(errc::invalid_argument, "fetch " + util::quoted(f) + " is inside " +
                                              graph_.describe_frame(graph_.output_frame_of(*i)) +
                                              "; fetch the loop's Exit instead");
    fetch_ports.emplace_back(*i, in->port);
  }
  send_ = std::move(send);
  recv_ = std::move(recv);
  step_ = step;
  feeds_ = &feeds;
  fetches_.clear();
  for (std::size_t k = 0; k < fetches.size(); ++k)
    fetches_.push_back({fetch_ports[k].first, fetch_ports[k].second, fetches[k]});
  results_.clear();
  instances_.clear();
  frames_.clear();
  tags_.assign(1, tag_info{});
  tag_index_.clear();
  ready_.clear();
  pending_recvs_ = 0;
  pending_keys_.clear();
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->arrivals.clear();
  }
  inbox_ = std::make_shared<inbox>();  // late handlers of an abandoned step land in the old one
  error_.clear();
  error_text_.clear();
  running_ = true;
  done_ = false;
  for (auto i : graph_.topological_order())
    if (graph_.in_edges(i).empty()) ready_.push_back({i, 0, new_instance(i)});
}

inline void executor::fail(std::error_code ec, std::string text) {
  if (failed()) return;
  error_ = ec;
  error_text_ = "step " + std::to_string(step_) + ": " + std::move(text);
}

inline executor::instance executor::new_instance(std::size_t i) const {
  instance in;
  in.data.resize(nodes_[i].data_inputs);
  in.have.assign(nodes_[i].data_inputs, 0);
  in.control.assign(nodes_[i].control_inputs, -1);
  return in;
}

inline std::size_t executor::child_tag(std::size_t parent, std::size_t frame, std::int64_t iter) {
  auto key = std::make_tuple(parent, frame, iter);
  auto it = tag_index_.find(key);
  if (it != tag_index_.end()) return it->second;
  tag_info t;
  t.parent = parent;
  t.frame = frame;
  t.iter = iter;
  std::string instance_name = tags_[parent].text + "/" + graph_.frames()[frame].name;
  t.frame_id = detail::fnv1a64(instance_name);
  t.text = instance_name + ":" + std::to_string(iter);
  tags_.push_back(std::move(t));
  tag_index_.emplace(key, tags_.size() - 1);
  return tags_.size() - 1;
}

inline std::size_t executor::drain_inbox() {
  std::deque<arrival> got;
  {
    std::lock_guard lock(inbox_->mutex);
    got.swap(inbox_->arrivals);
  }
  for (auto& a : got) {
    --pending_recvs_;
    pending_keys_.erase(a.recv_id);
    if (failed()) continue;
    const auto& c = nodes_[a.node];
    if (a.ec) {
      fail(a.ec,
           "receive of " + full_key(c, a.tag) + " by node " + graph_.describe(a.node) + " failed: " + a.ec.message());
      continue;
    }
    if (a.values.size() != c.entries) {
      fail(errc::size_mismatch, "node " + graph_.describe(a.node) + " expected " + std::to_string(c.entries) +
                                    " entries under " + full_key(c, a.tag) + ", got " +
                                    std::to_string(a.values.size()));
      continue;
    }
    edge_values values(a.values.size());
    for (std::size_t p = 0; p < a.values.size() && !failed(); ++p) {
      const auto& entry = a.values[p];
      values[p].dead = entry.dead;
      if (entry.dead) continue;
      if (auto ec = entry.to_tensor(values[p].value)) {
        fail(ec, "node " + graph_.describe(a.node) + " got entry " + std::to_string(p) + " under " +
                     full_key(c, a.tag) + " as " + fusewire::to_string(entry.descriptor) + " in " +
                     std::to_string(entry.bytes.size()) + " bytes (expected float32 values filling the shape)");
      } else if (auto bad = spec_mismatch(a.node, p, values[p].value)) {
        fail(errc::invalid_argument, "node " + graph_.describe(a.node) + *bad);
      }
    }
    if (failed()) continue;
    // Each entry carries its own deadness on its data output. The control
    // output means "the message arrived" (the partitioner hangs call
    // triggers and request/response ordering on it), so it is never dead:
    // a request whose entries all come from an untaken branch still runs
    // the server's part, as one process would.
    finish(a.node, a.tag, std::move(values), false);
  }
  return got.size();
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
