#pragma once
/// Turns the partitioner's work state into a `plan`: messages in a stable
/// order, and per-task subgraphs with their _Send/_Recv nodes. Private to the
/// graph layer.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/partition_cycles.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Sorts the messages and emits the plan.
class partition_output : public partition_cycles {
 protected:
  using partition_cycles::partition_cycles;

  // ---- output ---------------------------------------------------------------

  void sort_messages() {
    std::vector<std::size_t> order(messages_.size());
    std::iota(order.begin(), order.end(), 0);
    auto first_src = [&](std::size_t m) {
      std::size_t best = npos;
      for (auto t : messages_[m].transfers) best = std::min(best, transfers_[t].src);
      return best;
    };
    auto key = [&](std::size_t m) {
      const auto& wm = messages_[m];
      const std::size_t call_client = wm.call == npos ? wm.src_task : calls_[wm.call].client;
      const std::size_t call_server = wm.call == npos ? wm.dst_task : calls_[wm.call].server;
      return std::make_tuple(wm.frame, wm.round, wm.kind == message_kind::send ? 0 : 1, call_client, call_server,
                             wm.kind == message_kind::response ? 1 : 0, wm.src_task, wm.dst_task, first_src(m));
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    std::vector<std::size_t> new_index(messages_.size());
    std::vector<work_message> sorted;
    for (std::size_t k = 0; k < order.size(); ++k) {
      new_index[order[k]] = k;
      sorted.push_back(std::move(messages_[order[k]]));
    }
    messages_ = std::move(sorted);
    for (auto& t : transfers_) t.message = new_index[t.message];
    for (auto& c : calls_) {
      c.request = new_index[c.request];
      c.response = new_index[c.response];
    }
    // Data entries first, then control tokens, each in transfer order.
    for (auto& m : messages_)
      std::stable_sort(m.transfers.begin(), m.transfers.end(), [&](std::size_t a, std::size_t b) {
        return std::make_pair(transfers_[a].port < 0, a) < std::make_pair(transfers_[b].port < 0, b);
      });
  }

  std::string message_name(std::size_t m) const { return "m" + std::to_string(m); }

  std::string tensor_text(const transfer& t) const {
    const auto& name = aug_->node(t.src).name;
    return t.port < 0 ? "^" + name : name + ":" + std::to_string(t.port);
  }

  void emit(plan& out) {
    const auto& g = *aug_;
    out = plan{};
    out.options = opts_;
    out.cycle_breaks = cycle_breaks_;
    std::vector<std::size_t> entry_of(transfers_.size(), 0);
    for (std::size_t m = 0; m < messages_.size(); ++m)
      for (std::size_t k = 0; k < messages_[m].transfers.size(); ++k) entry_of[messages_[m].transfers[k]] = k;

    for (std::size_t m = 0; m < messages_.size(); ++m) {
      const auto& wm = messages_[m];
      plan_message pm;
      pm.name = message_name(m);
      pm.kind = wm.kind;
      pm.src = g.tasks()[wm.src_task];
      pm.dst = g.tasks()[wm.dst_task];
      pm.frame = wm.frame == 0 ? std::string() : g.frames()[wm.frame].name;
      pm.round = wm.round;
      pm.fallback = wm.fallback;
      pm.key = task_name(pm.src) + "/device:CPU:0;0000000000000001;" + task_name(pm.dst) + "/device:CPU:0;" + pm.name;
      for (auto t : wm.transfers) {
        const auto& tr = transfers_[t];
        plan_entry e;
        e.tensor = tensor_text(tr);
        for (auto c : tr.consumers) e.consumers.push_back(g.node(c).name);
        if (tr.port < 0) {
          e.descriptor = token_descriptor();
        } else if (const auto& s = g.output_spec(tr.src, static_cast<std::size_t>(tr.port))) {
          e.descriptor = s->descriptor();
        }
        pm.entries.push_back(std::move(e));
      }
      out.messages.push_back(std::move(pm));
    }

    std::vector<std::vector<std::size_t>> triggers_of(g.size());
    std::vector<std::vector<std::size_t>> acks_of(messages_.size());
    std::vector<std::size_t> request_of(messages_.size(), npos);
    for (const auto& c : calls_) {
      for (auto x : c.triggers) triggers_of[x].push_back(c.request);
      acks_of[c.response] = c.acks;
      if (c.ordered) request_of[c.response] = c.request;
    }

    std::vector<graph_def> parts(g.tasks().size());
    std::vector<char> used(g.tasks().size(), 0);
    for (auto& p : parts) p.tasks = g.def().tasks;
    auto recv_name = [&](std::size_t m) { return "_recv/" + message_name(m); };
    std::set<std::pair<std::size_t, std::size_t>> adapters;

    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto task = g.task_of(i);
      used[task] = 1;
      node_def nd = g.node(i);
      nd.inputs.clear();
      for (auto ei : g.in_edges(i)) {
        const auto& e = g.edges()[ei];
        const auto& src_name = g.node(e.src).name;
        if (g.task_of(e.src) == task) {
          nd.inputs.push_back(e.control() ? "^" + src_name : src_name + ":" + std::to_string(e.src_port));
          continue;
        }
        auto t = transfer_index_.at({e.src, e.src_port, task});
        auto m = transfers_[t].message;
        auto k = entry_of[t];
        if (!e.control()) {
          nd.inputs.push_back(recv_name(m) + ":" + std::to_string(k));
        } else {
          const std::string adapter = recv_name(m) + "/ctl" + std::to_string(k);
          if (adapters.emplace(m, k).second)
            parts[task].add(adapter, "Identity", {recv_name(m) + ":" + std::to_string(k)}, g.node(i).device);
          nd.inputs.push_back("^" + adapter);
        }
      }
      for (auto req : triggers_of[i]) nd.inputs.push_back("^" + recv_name(req));
      parts[task].nodes.push_back(std::move(nd));
    }

    for (std::size_t m = 0; m < messages_.size(); ++m) {
      const auto& wm = messages_[m];
      const auto& pm = out.messages[m];
      const std::int64_t entries = static_cast<std::int64_t>(wm.transfers.size());
      // Sender.
      auto& send = parts[wm.src_task].add("_send/" + pm.name, "_Send", {}, task_name(pm.src));
      send.set("key", pm.key).set("entries", entries);
      for (auto t : wm.transfers)
        if (transfers_[t].port >= 0) send.inputs.push_back(tensor_text(transfers_[t]));
      for (auto t : wm.transfers)
        if (transfers_[t].port < 0) send.inputs.push_back(tensor_text(transfers_[t]));
      for (auto x : acks_of[m]) {
        bool carried = false;
        for (auto t : wm.transfers) carried = carried || transfers_[t].src == x;
        if (!carried) send.inputs.push_back("^" + g.node(x).name);
      }
      if (request_of[m] != npos) send.inputs.push_back("^" + recv_name(request_of[m]));
      if (wm.frame != 0 && wm.transfers.empty() && request_of[m] == npos && acks_of[m].empty())
        if (auto s = skeleton_merge(wm.src_task, wm.frame)) send.inputs.push_back("^" + g.node(*s).name);
      // Receiver.
      auto& recv = parts[wm.dst_task].add(recv_name(m), "_Recv", {}, task_name(pm.dst));
      recv.set("key", pm.key).set("entries", entries);
      if (wm.frame != 0)
        if (auto s = skeleton_merge(wm.dst_task, wm.frame)) recv.inputs.push_back("^" + g.node(*s).name);
      for (std::size_t k = 0; k < wm.transfers.size(); ++k) {
        const auto& tr = transfers_[wm.transfers[k]];
        if (tr.port < 0) continue;
        if (const auto& s = g.output_spec(tr.src, static_cast<std::size_t>(tr.port))) recv.spec(*s, k);
      }
      used[wm.src_task] = used[wm.dst_task] = 1;
    }

    for (std::size_t t = 0; t < parts.size(); ++t)
      if (used[t]) out.partitions.push_back(plan_partition{g.tasks()[t], std::move(parts[t])});
  }
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
