#pragma once
/// The partitioner's first steps, shared by every mode: input checks, the
/// graph augmented with control-loop skeletons, the condensed dependency graph
/// and the cross-task transfers. Private to the graph layer.

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
#include <fusewire/graph/detail/partition_state.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Checks the input and builds what every mode plans from.
class partition_input : public partition_state {
 protected:
  using partition_state::partition_state;

  // ---- input checks and the augmented graph -------------------------------

  std::optional<failure> check_input() {
    const auto& g = user_;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto& nd = g.node(i);
      if (nd.name[0] == '_' || is_internal(nd.op))
        return failure{errc::invalid_graph, "node " + g.describe(i) +
                                                ": names and ops starting with '_' are reserved for nodes "
                                                "the partitioner adds"};
      if (writes_variable(nd.op) && g.data_input_count(i) > 0) {
        const auto& e = g.edges()[g.in_edges(i)[0]];
        if (g.task_of(e.src) != g.task_of(i))
          return failure{errc::invalid_graph, "node " + g.describe(i) + " is on " +
                                                  g.tasks()[g.task_of(i)].to_string() +
                                                  " but the variable it writes, " + g.describe(e.src) + ", is on " +
                                                  g.tasks()[g.task_of(e.src)].to_string() + "; they must share a task"};
      }
    }
    if (opts_.mode == partition_mode::star_server_lite && g.has_loops()) {
      const auto& fr = g.frames()[1];
      std::string where;
      for (auto n : fr.control_nodes) {
        if (!is_merge(g.node(n).op)) continue;
        for (auto ei : g.in_edges(n)) {
          const auto& e = g.edges()[ei];
          if (g.is_back_edge(e)) {
            where = " (Merge " + util::quoted(g.node(n).name) + " <- NextIteration " +
                    util::quoted(g.node(e.src).name) + ")";
            break;
          }
        }
        if (!where.empty()) break;
      }
      return failure{errc::graph_cycle, "star_server_lite cannot merge the ps graphs: the graph has loop frame " +
                                            util::quoted(fr.name) + where +
                                            ", and the aggressive merge needs a graph without loops; use "
                                            "star_server or send_recv"};
    }
    return std::nullopt;
  }

  std::string task_tag(std::size_t t) const {
    const auto& id = user_.tasks()[t];
    return id.job + "_" + std::to_string(id.index);
  }

  std::string skeleton_name(std::size_t task, std::size_t frame, std::string_view part) const {
    return "_loop/" + user_.frames()[frame].name + "/" + task_tag(task) + "/" + std::string(part);
  }

  std::optional<failure> build_augmented() {
    const auto& g = user_;
    const auto nf = g.frames().size();
    std::vector<std::set<std::size_t>> participants(nf);
    for (std::size_t i = 0; i < g.size(); ++i) {
      for (std::size_t f : {g.frame_of(i), g.input_frame_of(i)})
        for (; f != 0; f = g.frames()[f].parent) participants[f].insert(g.task_of(i));
    }
    graph_def def = g.def();
    skeleton_.assign(nf, {});
    // Parents before children: frames are numbered in discovery order, and a
    // frame is discovered after its parent.
    for (std::size_t f = 1; f < nf; ++f) {
      const auto& fr = g.frames()[f];
      if (participants[f].size() < 2) continue;
      if (!fr.loop_cond) {
        std::vector<std::string> names;
        for (auto t : participants[f]) names.push_back(g.tasks()[t].to_string());
        return failure{errc::invalid_graph, "frame " + util::quoted(fr.name) + " spans tasks " + join(names, ", ") +
                                                " but has no LoopCond to drive their iterations"};
      }
      for (auto t : participants[f]) {
        const std::string device = task_name(g.tasks()[t]);
        auto name = [&](std::string_view part) { return skeleton_name(t, f, part); };
        auto& start = def.add(name("start"), "Const", {}, device);
        start.set("value", std::vector<float>{0.0f}).set("shape", std::vector<std::int64_t>{});
        if (fr.parent != 0) start.inputs.push_back("^" + skeleton_[fr.parent].at(t).pivot);
        def.add(name("enter"), "Enter", {name("start")}, device).set("frame_name", fr.name);
        def.add(name("merge"), "Merge", {name("enter"), name("next")}, device);
        def.add(name("switch"), "Switch", {name("merge"), g.node(*fr.loop_cond).name}, device);
        def.add(name("pivot"), "Identity", {name("switch") + ":1"}, device);
        def.add(name("next"), "NextIteration", {name("pivot")}, device);
        def.add(name("exit"), "Exit", {name("switch") + ":0"}, device);
        skeleton_[f][t] = skeleton{name("merge"), name("pivot")};
      }
    }
    try {
      aug_.emplace(std::move(def), relaxed_frames);
    } catch (const std::system_error& e) {
      return failure{errc::invalid_graph, std::string("internal: the loop skeletons do not validate: ") + e.what()};
    }
    return std::nullopt;
  }

  // ---- the condensed dependency graph ----------------------------------------
  //
  // The augmented graph without its NextIteration -> Merge edges, plus one
  // virtual node per loop frame ("the frame instance is done"): every node of
  // the frame except its Exits feeds it, it feeds the frame's Exits, and a
  // nested frame's node feeds its parent's. A loop's result thereby depends on
  // everything the loop did in any iteration, which the graph without back
  // edges alone would not show. Waves, rounds and the cycle check use it.

  std::size_t frame_node(std::size_t frame) const { return aug_->size() + frame; }

  std::optional<failure> build_condensed() {
    const auto& g = *aug_;
    const auto n = g.size(), total = n + g.frames().size();
    cin_.assign(total, {});
    for (const auto& e : g.edges())
      if (!g.is_back_edge(e)) cin_[e.dst].push_back(e.src);
    for (std::size_t i = 0; i < n; ++i) {
      const auto f = g.frame_of(i);
      if (f == 0) continue;
      if (is_exit(g.node(i).op))
        cin_[i].push_back(frame_node(f));
      else
        cin_[frame_node(f)].push_back(i);
    }
    for (std::size_t f = 1; f < g.frames().size(); ++f)
      if (g.frames()[f].parent != 0) cin_[frame_node(g.frames()[f].parent)].push_back(frame_node(f));
    std::vector<std::vector<std::size_t>> outs(total);
    std::vector<std::size_t> pending(total, 0);
    for (std::size_t v = 0; v < total; ++v)
      for (auto u : cin_[v]) outs[u].push_back(v), ++pending[v];
    std::vector<std::size_t> ready;
    for (std::size_t v = total; v-- > 0;)
      if (pending[v] == 0) ready.push_back(v);
    corder_.clear();
    while (!ready.empty()) {
      auto v = ready.back();
      ready.pop_back();
      corder_.push_back(v);
      for (auto w : outs[v])
        if (--pending[w] == 0) ready.push_back(w);
    }
    if (corder_.size() != total) {
      std::size_t f = 1;
      while (f < g.frames().size() && pending[frame_node(f)] == 0) ++f;
      return failure{errc::graph_cycle, "loop " + (f < g.frames().size() ? g.describe_frame(f) : std::string("frame")) +
                                            " needs its own result before it can start (a value computed "
                                            "from its Exit flows back into it)"};
    }
    cwave_.assign(total, 0);
    cpos_.assign(total, 0);
    for (std::size_t k = 0; k < corder_.size(); ++k) {
      const auto v = corder_[k];
      cpos_[v] = k;
      for (auto u : cin_[v]) cwave_[v] = std::max(cwave_[v], cwave_[u] + 1);
    }
    return std::nullopt;
  }

  // ---- transfers ------------------------------------------------------------

  void collect_transfers() {
    const auto& g = *aug_;
    std::map<std::tuple<std::size_t, int, std::size_t>, std::size_t> index;
    for (auto i : g.topological_order())
      for (auto ei : g.out_edges(i)) {
        const auto& e = g.edges()[ei];
        const auto st = g.task_of(e.src), dt = g.task_of(e.dst);
        if (st == dt) continue;
        auto key = std::make_tuple(e.src, e.src_port, dt);
        auto [it, fresh] = index.emplace(key, transfers_.size());
        if (fresh) {
          transfer t;
          t.src = e.src;
          t.port = e.src_port;
          t.src_task = st;
          t.dst_task = dt;
          t.frame = g.output_frame_of(e.src);
          t.wave = cwave_[e.src];
          transfers_.push_back(std::move(t));
        }
        auto& cons = transfers_[it->second].consumers;
        if (std::find(cons.begin(), cons.end(), e.dst) == cons.end()) cons.push_back(e.dst);
      }
    transfer_index_ = std::move(index);
  }
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
