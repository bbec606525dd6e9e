#pragma once
/// The partitioner's last planning step, shared by every mode: prove the
/// message graph acyclic, moving any tensor that would close a cycle to its
/// own message. Private to the graph layer.

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
#include <fusewire/graph/detail/partition_input.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Finds and breaks cycles among messages, calls and the condensed graph.
class partition_cycles : public partition_input {
 protected:
  using partition_input::partition_input;

  // ---- acyclicity -----------------------------------------------------------

  enum class dep_kind { local, into, out_of, trigger, ack, order, activation };
  struct dep {
    std::size_t from, to;
    dep_kind kind;
    std::size_t ref = 0;  // transfer (into/out_of) or call (trigger/ack/order)
  };

  std::vector<dep> dependencies() const {
    const auto& g = *aug_;
    const auto n = cin_.size();  // messages are numbered after the condensed nodes
    std::vector<dep> deps;
    for (std::size_t v = 0; v < cin_.size(); ++v)
      for (auto u : cin_[v])
        if (u >= g.size() || v >= g.size() || g.task_of(u) == g.task_of(v)) deps.push_back({u, v, dep_kind::local});
    for (std::size_t t = 0; t < transfers_.size(); ++t) {
      const auto& tr = transfers_[t];
      deps.push_back({tr.src, n + tr.message, dep_kind::into, t});
      for (auto c : tr.consumers) deps.push_back({n + tr.message, c, dep_kind::out_of, t});
    }
    for (std::size_t c = 0; c < calls_.size(); ++c) {
      const auto& ci = calls_[c];
      for (auto x : ci.triggers) deps.push_back({n + ci.request, x, dep_kind::trigger, c});
      for (auto x : ci.acks) deps.push_back({x, n + ci.response, dep_kind::ack, c});
      if (ci.ordered) deps.push_back({n + ci.request, n + ci.response, dep_kind::order, c});
    }
    for (std::size_t m = 0; m < messages_.size(); ++m) {
      const auto& wm = messages_[m];
      if (wm.frame == 0) continue;
      deps.push_back({n + m, frame_node(wm.frame), dep_kind::local});
      if (auto s = skeleton_merge(wm.dst_task, wm.frame)) deps.push_back({*s, n + m, dep_kind::activation});
      if (wm.transfers.empty())
        if (auto s = skeleton_merge(wm.src_task, wm.frame)) deps.push_back({*s, n + m, dep_kind::activation});
    }
    return deps;
  }

  /// A cycle in the dependency graph, as the deps along it, or empty.
  std::vector<dep> find_cycle(const std::vector<dep>& deps) const {
    const auto total = cin_.size() + messages_.size();
    std::vector<std::vector<std::size_t>> in(total), out(total);
    std::vector<std::size_t> pending(total, 0);
    for (std::size_t d = 0; d < deps.size(); ++d) {
      out[deps[d].from].push_back(d);
      in[deps[d].to].push_back(d);
      ++pending[deps[d].to];
    }
    std::vector<std::size_t> todo;
    for (std::size_t v = 0; v < total; ++v)
      if (pending[v] == 0) todo.push_back(v);
    while (!todo.empty()) {
      auto v = todo.back();
      todo.pop_back();
      for (auto d : out[v])
        if (--pending[deps[d].to] == 0) todo.push_back(deps[d].to);
    }
    std::size_t cur = 0;
    while (cur < total && pending[cur] == 0) ++cur;
    if (cur == total) return {};
    std::vector<std::size_t> path;  // dep indices, walking backwards
    std::vector<int> pos(total, -1);
    while (pos[cur] < 0) {
      pos[cur] = static_cast<int>(path.size());
      for (auto d : in[cur])
        if (pending[deps[d].from] != 0) {
          path.push_back(d);
          cur = deps[d].from;
          break;
        }
    }
    std::vector<dep> cycle;
    for (auto k = static_cast<std::size_t>(pos[cur]); k < path.size(); ++k) cycle.push_back(deps[path[k]]);
    std::reverse(cycle.begin(), cycle.end());
    return cycle;
  }

  std::optional<failure> break_cycles() {
    const std::size_t limit = transfers_.size() + 4 * calls_.size() + 8 + aug_->size();
    for (std::size_t round = 0; round <= limit; ++round) {
      auto cycle = find_cycle(dependencies());
      if (cycle.empty()) return std::nullopt;
      // Move out the tensor that closes the cycle: of the fused messages on
      // it, the entry whose source comes last in topological order.
      const dep* evict = nullptr;
      for (const auto& d : cycle) {
        if (d.kind != dep_kind::into) continue;
        const auto& wm = messages_[transfers_[d.ref].message];
        std::size_t others = 0;
        for (auto t : wm.transfers) others += transfers_[t].src != d.from;
        if (wm.kind == message_kind::send && others == 0) continue;
        if (!evict || cpos_[d.from] > cpos_[evict->from]) evict = &d;
      }
      bool fixed = false;
      if (evict) {
        const auto d = *evict;
        auto& wm = messages_[transfers_[d.ref].message];
        std::vector<std::size_t> keep, moved;
        for (auto t : wm.transfers) (transfers_[t].src == d.from ? moved : keep).push_back(t);
        wm.transfers = keep;
        for (auto t : moved) {
          const auto& tr = transfers_[t];
          attach(t, new_message(message_kind::send, tr.src_task, tr.dst_task, tr.frame, tr.wave, true));
          ++cycle_breaks_;
        }
        fixed = true;
      }
      for (std::size_t k = 0; !fixed && k < cycle.size(); ++k) {
        const auto& d = cycle[k];
        auto& c = calls_[d.ref];
        if (d.kind == dep_kind::trigger) {
          c.triggers.erase(std::remove(c.triggers.begin(), c.triggers.end(), d.to), c.triggers.end());
          fixed = true;
        } else if (d.kind == dep_kind::ack) {
          c.acks.erase(std::remove(c.acks.begin(), c.acks.end(), d.from), c.acks.end());
          fixed = true;
        } else if (d.kind == dep_kind::order) {
          c.ordered = false;
          fixed = true;
        }
      }
      if (!fixed) return failure{errc::graph_cycle, "internal: the plan has a cycle that no message split removes"};
    }
    return failure{errc::graph_cycle, "internal: cycle breaking did not converge"};
  }
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
