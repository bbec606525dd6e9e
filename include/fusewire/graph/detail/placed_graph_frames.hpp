#pragma once
/// placed_graph's loop frames: which frame each node belongs to, and the
/// rules a frame's Enter/Exit/Merge/NextIteration/LoopCond nodes must keep.

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/placed_graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline std::optional<std::string> placed_graph::infer_frames(bool strict) {
  const auto n = def_.nodes.size();
  frame_.assign(n, 0);
  in_frame_.assign(n, 0);
  out_frame_.assign(n, 0);
  frames_.clear();
  frames_.push_back(frame_info{});
  std::unordered_map<std::string, std::size_t> frame_index;
  std::vector<std::size_t> frame_entered_by(1, 0);
  for (auto i : order_) {
    const auto& nd = def_.nodes[i];
    std::optional<std::size_t> in_frame;
    std::size_t via = 0;
    for (auto ei : in_[i]) {
      const auto& e = edges_[ei];
      if (is_back_edge(e)) continue;
      std::size_t f = out_frame_[e.src];
      if (!in_frame) {
        in_frame = f;
        via = e.src;
      } else if (*in_frame != f) {
        return "node " + util::quoted(nd.name) + " mixes inputs from " + describe_frame(*in_frame) + " (via " +
               util::quoted(def_.nodes[via].name) + ") and " + describe_frame(f) + " (via " +
               util::quoted(def_.nodes[e.src].name) + ")";
      }
    }
    if (detail::is_merge(nd.op) && !in_frame)
      return "node " + util::quoted(nd.name) + " (Merge) has only NextIteration inputs";
    std::size_t f = in_frame.value_or(0);
    in_frame_[i] = f;
    frame_[i] = f;
    out_frame_[i] = f;
    if (detail::is_enter(nd.op)) {
      const auto* name = nd.attr<std::string>("frame_name");
      if (!name || name->empty()) return "node " + util::quoted(nd.name) + " (Enter) has no \"frame_name\" attribute";
      auto [it, fresh] = frame_index.emplace(*name, frames_.size());
      if (fresh) {
        frame_info fi;
        fi.name = *name;
        fi.parent = f;
        fi.depth = frames_[f].depth + 1;
        frames_.push_back(std::move(fi));
        frame_entered_by.push_back(i);
      } else if (frames_[it->second].parent != f) {
        return "frame " + util::quoted(*name) + " is entered from " + describe_frame(frames_[it->second].parent) +
               " by " + util::quoted(def_.nodes[frame_entered_by[it->second]].name) + " and from " + describe_frame(f) +
               " by " + util::quoted(nd.name);
      }
      frame_[i] = it->second;
      out_frame_[i] = it->second;
    } else if (detail::is_exit(nd.op)) {
      if (f == 0) return "node " + util::quoted(nd.name) + " (Exit) is not inside a loop frame";
      out_frame_[i] = frames_[f].parent;
    }
  }
  for (const auto& e : edges_) {
    if (!is_back_edge(e)) continue;
    if (out_frame_[e.src] != frame_[e.dst])
      return "node " + util::quoted(def_.nodes[e.dst].name) + " (Merge) is in " + describe_frame(frame_[e.dst]) +
             " but its NextIteration " + util::quoted(def_.nodes[e.src].name) + " is in " +
             describe_frame(out_frame_[e.src]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto& fr = frames_[frame_[i]];
    fr.nodes.push_back(i);
    if (detail::is_enter(def_.nodes[i].op)) fr.enters.push_back(i);
    if (detail::is_exit(def_.nodes[i].op)) fr.exits.push_back(i);
    if (frame_[i] == 0 || !detail::is_frame_control(def_.nodes[i].op) || detail::is_enter(def_.nodes[i].op) ||
        detail::is_exit(def_.nodes[i].op))
      continue;
    if (detail::is_loop_cond(def_.nodes[i].op)) {
      if (fr.loop_cond)
        return "frame " + util::quoted(fr.name) + " has two LoopCond nodes, " +
               util::quoted(def_.nodes[*fr.loop_cond].name) + " and " + util::quoted(def_.nodes[i].name);
      fr.loop_cond = i;
    }
    if (fr.control_nodes.empty()) {
      fr.home_task = task_of_[i];
    } else if (strict && fr.home_task != task_of_[i]) {
      std::size_t first = fr.control_nodes.front();
      return "frame " + util::quoted(fr.name) + ": control nodes " + describe(first) + " on " +
             def_.tasks[task_of_[first]].to_string() + " and " + describe(i) + " on " +
             def_.tasks[task_of_[i]].to_string() +
             " are on different tasks; a frame's Merge/Switch/NextIteration/LoopCond must share "
             "one task (its Enter and Exit nodes may be anywhere)";
    }
    fr.control_nodes.push_back(i);
  }
  return std::nullopt;
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
