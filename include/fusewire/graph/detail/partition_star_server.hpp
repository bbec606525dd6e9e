#pragma once
/// The `star_server` mode: worker<->PS transfers become calls (request and
/// response), clustered in rounds so that the step never waits on itself.
/// Private to the graph layer.

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
#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/partition_send_recv.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Plans calls per (client, server, frame, round).
class star_server_planner : public send_recv_planner {
 protected:
  using send_recv_planner::send_recv_planner;

  /// Returns the call for (client, server, frame, round), creating it.
  std::size_t call_for(std::size_t client, std::size_t server, std::size_t frame, std::size_t round) {
    auto key = std::make_tuple(client, server, frame, round);
    auto it = call_index_.find(key);
    if (it != call_index_.end()) return it->second;
    call_info c;
    c.client = client;
    c.server = server;
    c.frame = frame;
    c.round = round;
    c.request = new_message(message_kind::request, client, server, frame, round, false);
    c.response = new_message(message_kind::response, server, client, frame, round, false);
    calls_.push_back(c);
    messages_[c.request].call = messages_[c.response].call = calls_.size() - 1;
    call_index_.emplace(key, calls_.size() - 1);
    return calls_.size() - 1;
  }

  /// Fills each call's triggers (root-frame sources of its server group) and
  /// acks (group nodes the response waits for). `group_of(node)` says which
  /// (frame, round) a server node runs in, or nullopt.
  template <class GroupOf>
  void finish_calls(GroupOf group_of) {
    const auto& g = *aug_;
    std::map<std::tuple<std::size_t, std::size_t, std::size_t>, std::vector<std::size_t>> groups;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!is_server(g.task_of(i))) continue;
      if (auto r = group_of(i)) groups[{g.task_of(i), g.frame_of(i), *r}].push_back(i);
    }
    for (auto& c : calls_) {
      auto it = groups.find({c.server, c.frame, c.round});
      if (it == groups.end()) continue;
      const auto& members = it->second;
      std::set<std::size_t> in_group(members.begin(), members.end());
      for (auto n : members) {
        const auto& op = g.node(n).op;
        if (g.in_edges(n).empty() && c.frame == 0) c.triggers.push_back(n);
        if (is_enter(op) || is_exit(op) || is_next_iteration(op)) continue;
        bool feeds_group = false;
        for (auto ei : g.out_edges(n)) feeds_group = feeds_group || in_group.count(g.edges()[ei].dst) != 0;
        if (!feeds_group) c.acks.push_back(n);
      }
    }
  }

  void plan_star() {
    const auto& g = *aug_;
    std::vector<std::size_t> servers;
    std::vector<std::size_t> server_slot(g.tasks().size(), npos);
    for (std::size_t t = 0; t < g.tasks().size(); ++t)
      if (is_server(t)) {
        server_slot[t] = servers.size();
        servers.push_back(t);
      }
    // rounds[v][s]: how many responses of server s condensed node v depends
    // on. A frame's virtual node counts every server node of the loop as a
    // response (a loop's result may carry any of them back to the worker).
    const auto ns = servers.size();
    const auto n = g.size();
    std::vector<std::vector<std::size_t>> rounds(cin_.size(), std::vector<std::size_t>(ns, 0));
    for (auto v : corder_)
      for (auto u : cin_[v]) {
        const std::size_t tu = u < n ? g.task_of(u) : npos;
        const bool to_client = v >= n || !is_server(g.task_of(v));
        for (std::size_t s = 0; s < ns; ++s) {
          std::size_t r = rounds[u][s] + ((to_client && tu == servers[s]) ? 1 : 0);
          rounds[v][s] = std::max(rounds[v][s], r);
        }
      }
    const bool single = opts_.clustering == star_clustering::single_call;
    std::vector<std::size_t> plain;
    for (std::size_t t = 0; t < transfers_.size(); ++t) {
      const auto& tr = transfers_[t];
      const bool src_server = is_server(tr.src_task), dst_server = is_server(tr.dst_task);
      if (!src_server && dst_server) {
        std::size_t r = npos;
        for (auto c : tr.consumers) r = std::min(r, rounds[c][server_slot[tr.dst_task]]);
        auto call = call_for(tr.src_task, tr.dst_task, tr.frame, single ? 0 : r);
        attach(t, calls_[call].request);
      } else if (src_server && !dst_server) {
        auto call = call_for(tr.dst_task, tr.src_task, tr.frame, single ? 0 : rounds[tr.src][server_slot[tr.src_task]]);
        attach(t, calls_[call].response);
      } else {
        plain.push_back(t);
      }
    }
    group_sends(plain, true);
    if (single) return;
    finish_calls([&](std::size_t i) -> std::optional<std::size_t> { return rounds[i][server_slot[g.task_of(i)]]; });
  }
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
