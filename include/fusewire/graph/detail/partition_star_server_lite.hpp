#pragma once
/// The `star_server_lite` mode: the PS subgraph's connected parts that are
/// ready together merge into one call per wave; a part that cannot merge is
/// reported with errc::graph_cycle. Private to the graph layer.

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
#include <fusewire/graph/detail/partition_star_server.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Merges PS parts into waves of calls.
class star_server_lite_planner : public star_server_planner {
 protected:
  using star_server_planner::star_server_planner;

  std::optional<failure> plan_lite() {
    const auto& g = *aug_;
    const auto n = g.size();
    std::vector<std::size_t> parent(n);
    std::iota(parent.begin(), parent.end(), 0);
    auto find = [&](std::size_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (const auto& e : g.edges()) {
      const auto ts = g.task_of(e.src);
      if (ts != g.task_of(e.dst) || !is_server(ts) || is_variable(g.node(e.src).op)) continue;
      parent[find(e.src)] = find(e.dst);
    }
    std::map<std::size_t, std::vector<std::size_t>> units;
    for (std::size_t i = 0; i < n; ++i)
      if (is_server(g.task_of(i))) units[find(i)].push_back(i);
    std::vector<char> ready(n, 0);
    std::vector<std::size_t> wave_of(n, npos);
    std::size_t wave = 0;
    while (true) {
      for (bool changed = true; changed;) {
        changed = false;
        for (auto i : g.topological_order()) {
          if (ready[i] || is_server(g.task_of(i))) continue;
          bool ok = true;
          for (auto ei : g.in_edges(i)) ok = ok && ready[g.edges()[ei].src];
          if (ok) ready[i] = 1, changed = true;
        }
      }
      if (units.empty()) break;
      // Merge every part that is ready, then every part of the same PS that
      // only waits on parts merged into this wave, until nothing changes.
      bool merged_any = false;
      for (bool changed = true; changed;) {
        changed = false;
        for (auto it = units.begin(); it != units.end();) {
          const auto root = it->first;
          const auto task = g.task_of(it->second.front());
          bool ok = true;
          for (auto m : it->second)
            for (auto ei : g.in_edges(m)) {
              auto src = g.edges()[ei].src;
              ok = ok && (find(src) == root || (ready[src] && (wave_of[src] != wave || g.task_of(src) == task)));
            }
          if (!ok) {
            ++it;
            continue;
          }
          for (auto m : it->second) ready[m] = 1, wave_of[m] = wave;
          it = units.erase(it);
          changed = merged_any = true;
        }
      }
      if (!merged_any) return stuck_unit(units.begin()->second, ready, find);
      ++wave;
    }
    std::vector<std::size_t> plain;
    for (std::size_t t = 0; t < transfers_.size(); ++t) {
      const auto& tr = transfers_[t];
      const bool src_server = is_server(tr.src_task), dst_server = is_server(tr.dst_task);
      if (!src_server && dst_server) {
        std::size_t r = npos;
        for (auto c : tr.consumers) r = std::min(r, wave_of[c]);
        attach(t, calls_[call_for(tr.src_task, tr.dst_task, 0, r)].request);
      } else if (src_server && !dst_server) {
        attach(t, calls_[call_for(tr.dst_task, tr.src_task, 0, wave_of[tr.src])].response);
      } else {
        plain.push_back(t);
      }
    }
    group_sends(plain, true);
    finish_calls([&](std::size_t i) -> std::optional<std::size_t> { return wave_of[i]; });
    return std::nullopt;
  }

  template <class Find>
  failure stuck_unit(const std::vector<std::size_t>& members, const std::vector<char>& ready, Find find) const {
    const auto& g = *aug_;
    const auto root = find(members.front());
    std::size_t blocker = npos;
    for (auto m : members)
      for (auto ei : g.in_edges(m)) {
        auto src = g.edges()[ei].src;
        if (!ready[src] && find(src) != root && blocker == npos) blocker = src;
      }
    // Is the blocker computed from this part's own outputs?
    std::vector<char> seen(g.size(), 0);
    std::vector<std::size_t> todo(members.begin(), members.end());
    for (auto m : members) seen[m] = 1;
    while (!todo.empty()) {
      auto x = todo.back();
      todo.pop_back();
      for (auto ei : g.out_edges(x)) {
        auto d = g.edges()[ei].dst;
        if (!seen[d]) seen[d] = 1, todo.push_back(d);
      }
    }
    std::vector<std::string> names;
    for (std::size_t k = 0; k < members.size() && k < 3; ++k) names.push_back(util::quoted(g.node(members[k]).name));
    if (members.size() > 3) names.push_back("...");
    std::string text = "star_server_lite cannot merge the ps graphs: the part of " +
                       g.tasks()[g.task_of(members.front())].to_string() + " holding " + join(names, ", ") + " needs " +
                       util::quoted(g.node(blocker).name) + " from " + g.tasks()[g.task_of(blocker)].to_string();
    text += seen[blocker] ? ", which is computed from that part's own outputs" : ", which never becomes ready";
    text += "; use star_server, which splits such chains into rounds";
    return failure{errc::graph_cycle, text};
  }
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
