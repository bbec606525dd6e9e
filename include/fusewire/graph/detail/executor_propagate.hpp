#pragma once
/// The executor's dataflow: delivering a node's outputs to the next nodes
/// (through loop frames and iterations) and noticing a step that is done.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/executor.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline void executor::finish(std::size_t n, std::size_t tag, edge_values outs, bool control_dead) {
  const auto& c = nodes_[n];
  const bool is_exit = c.kind == op_kind::exit;
  const std::size_t out_tag = is_exit ? tags_[tag].parent : tag;
  if (out_tag == 0 && !(is_exit && control_dead))
    for (const auto& f : fetches_)
      if (f.node == n) {
        if (outs[static_cast<std::size_t>(f.port)].dead) {
          fail(errc::invalid_argument, "fetch " + util::quoted(f.name) + " is dead (an untaken branch)");
          return;
        }
        results_[f.name] = outs[static_cast<std::size_t>(f.port)].value;
      }
  for (const auto& l : c.outs) {
    edge_value v = l.port < 0 ? edge_value{tensor{}, control_dead} : outs[static_cast<std::size_t>(l.port)];
    switch (c.kind) {
      case op_kind::enter: {
        auto& fs = frames_[{tag, c.frame}];
        if (c.is_constant) {
          fs.invariants.push_back({l, v});
          for (std::int64_t it = 0; it <= fs.max_iter; ++it) deliver(l, child_tag(tag, c.frame, it), v);
        } else {
          deliver(l, child_tag(tag, c.frame, 0), std::move(v));
        }
        break;
      }
      case op_kind::exit:
        if (!v.dead) deliver(l, tags_[tag].parent, std::move(v));
        break;
      case op_kind::next_iteration:
        if (!v.dead) {
          auto next = advance(tag);
          if (failed()) return;
          deliver(l, next, std::move(v));
        }
        break;
      default:
        deliver(l, tag, std::move(v));
        break;
    }
    if (failed()) return;
  }
}

inline std::size_t executor::advance(std::size_t tag) {
  const auto t = tags_[tag];
  const auto iter = t.iter + 1;
  if (iter > opts_.max_iterations) {
    fail(errc::invalid_argument,
         graph_.describe_frame(t.frame) + " ran more than " + std::to_string(opts_.max_iterations) + " iterations");
    return tag;
  }
  auto& fs = frames_[{t.parent, t.frame}];
  auto next = child_tag(t.parent, t.frame, iter);
  if (iter > fs.max_iter) {
    fs.max_iter = iter;
    auto invariants = fs.invariants;
    for (const auto& inv : invariants) deliver(inv.link, next, inv.value);
  }
  return next;
}

inline void executor::deliver(const out_link& l, std::size_t tag, edge_value v) {
  const auto& c = nodes_[l.dst];
  auto key = std::make_pair(l.dst, tag);
  auto it = instances_.find(key);
  if (it == instances_.end()) it = instances_.emplace(key, new_instance(l.dst)).first;
  auto& in = it->second;
  if (c.kind == op_kind::merge) {
    if (in.fired) return;
    if (!v.dead) {
      in.fired = true;
      instance chosen;
      chosen.data.push_back(std::move(v));
      chosen.merge_index = static_cast<int>(l.slot);
      ready_.push_back({l.dst, tag, std::move(chosen)});
      return;
    }
    ++in.dead_inputs;
    const std::size_t expected = c.back_inputs == 0     ? c.forward_inputs
                                 : tags_[tag].iter == 0 ? c.forward_inputs
                                                        : c.back_inputs;
    if (in.dead_inputs >= expected) {
      in.fired = true;
      ready_.push_back({l.dst, tag, instance{}});
    }
    return;
  }
  const bool twice = l.port < 0 ? in.control[l.slot] >= 0 : in.have[l.slot] != 0;
  if (twice) {
    fail(errc::invalid_graph, "node " + graph_.describe(l.dst) + " got its " + (l.port < 0 ? "control" : "data") +
                                  " input " + std::to_string(l.slot) + " twice in " + tag_text(tag));
    return;
  }
  in.dead = in.dead || v.dead;
  if (l.port < 0) {
    in.control[l.slot] = v.dead ? 1 : 0;
    ++in.controls;
  } else {
    in.data[l.slot] = std::move(v);
    in.have[l.slot] = 1;
    ++in.filled;
  }
  if (in.filled == c.data_inputs && in.controls == c.control_inputs) {
    ready_.push_back({l.dst, tag, std::move(in)});
    instances_.erase(it);
  }
}

inline void executor::settle() {
  // Nodes inside loops may wait forever for inputs of an iteration that
  // turned dead (TensorFlow drops them when the frame ends); a root-frame
  // node that never ran means an input was never produced.
  std::vector<std::string> stuck;
  for (const auto& [key, in] : instances_) {
    if (in.fired || key.second != 0) continue;
    const auto& c = nodes_[key.first];
    stuck.push_back("node " + graph_.describe(key.first) + " in " + tag_text(key.second) + " got " +
                    std::to_string(in.filled + in.controls + in.dead_inputs) + " of " +
                    std::to_string(c.data_inputs + c.control_inputs) + " inputs");
    if (stuck.size() == 3) break;
  }
  if (!stuck.empty()) {
    fail(errc::invalid_graph, "the step ended with nodes that never ran: " + detail::join(stuck, "; "));
  } else {
    for (const auto& f : fetches_)
      if (!results_.count(f.name)) {
        fail(errc::invalid_argument, "fetch " + util::quoted(f.name) + " was never produced");
        break;
      }
  }
  done_ = true;
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
