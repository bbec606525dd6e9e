#pragma once
/// placed_graph's topological order (naming a cycle when there is one) and
/// ready-waves.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/placed_graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline std::optional<std::string> placed_graph::sort_topologically() {
  const auto n = def_.nodes.size();
  std::vector<std::size_t> pending(n, 0);
  for (const auto& e : edges_)
    if (!is_back_edge(e)) ++pending[e.dst];
  std::vector<std::size_t> ready;
  for (std::size_t i = n; i-- > 0;)
    if (pending[i] == 0) ready.push_back(i);
  order_.clear();
  while (!ready.empty()) {
    std::size_t i = ready.back();
    ready.pop_back();
    order_.push_back(i);
    std::vector<std::size_t> next;
    for (auto ei : out_[i]) {
      const auto& e = edges_[ei];
      if (is_back_edge(e)) continue;
      if (--pending[e.dst] == 0) next.push_back(e.dst);
    }
    std::sort(next.rbegin(), next.rend());
    ready.insert(ready.end(), next.begin(), next.end());
  }
  if (order_.size() == n) {
    for (const auto& e : edges_) {
      if (!is_back_edge(e)) continue;
      if (e.control() || !detail::is_merge(def_.nodes[e.dst].op))
        return "node " + util::quoted(def_.nodes[e.src].name) + " (NextIteration) feeds " + describe(e.dst) +
               (e.control() ? " through a control edge" : "") + "; a NextIteration may only feed a Merge's data input";
    }
    return std::nullopt;
  }
  // Name one cycle: walk from an unsorted node up its unsorted inputs until
  // a node repeats; every unsorted node has at least one unsorted input.
  std::size_t cur = 0;
  while (pending[cur] == 0) ++cur;
  std::vector<std::size_t> path;
  std::vector<int> pos(n, -1);
  while (pos[cur] < 0) {
    pos[cur] = static_cast<int>(path.size());
    path.push_back(cur);
    for (auto ei : in_[cur]) {
      const auto& e = edges_[ei];
      if (!is_back_edge(e) && pending[e.src] != 0) {
        cur = e.src;
        break;
      }
    }
  }
  std::vector<std::size_t> cycle(path.begin() + pos[cur], path.end());
  std::reverse(cycle.begin(), cycle.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string text;
  for (auto v : cycle) text += util::quoted(def_.nodes[v].name) + " -> ";
  text += util::quoted(def_.nodes[cycle.front()].name);
  return "graph has a cycle: " + text + " (only a NextIteration -> Merge edge may close a loop)";
}

inline void placed_graph::compute_waves() {
  wave_.assign(def_.nodes.size(), 0);
  for (auto i : order_)
    for (auto ei : out_[i]) {
      const auto& e = edges_[ei];
      if (!is_back_edge(e)) wave_[e.dst] = std::max(wave_[e.dst], wave_[i] + 1);
    }
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
