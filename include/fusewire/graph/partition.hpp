#pragma once
/// Cuts a placed graph into one subgraph per task and plans the messages
/// between them, in the three ways the systems we replace do it:
///
/// - `send_recv`: one message per cross-task tensor (a tensor feeding several
///   nodes of one task is sent once). With `tensor_fuse`, tensors between the
///   same two tasks in the same ready-wave and loop frame share one message.
/// - `star_server`: pull/push. Each worker-to-PS exchange becomes a call: one
///   request carrying the PS's feeds, one response carrying its fetches. Calls
///   are clustered in rounds: a PS value computed from worker values that
///   themselves needed an earlier fetch from that PS goes in a later round, so
///   the step never waits on itself. A final check proves the message graph
///   acyclic and moves any tensor that would close a cycle to its own message.
/// - `star_server_lite`: the aggressive merge: the PS subgraph's connected
///   parts (variables apart) that are ready together merge into one call per
///   wave. It needs a loop-free graph with no worker->PS->worker->same-part
///   chains; otherwise it reports errc::graph_cycle naming the loop or chain.
///
/// Loops whose nodes span tasks get a control-loop skeleton on every task
/// involved (as TensorFlow's partitioner does): the loop predicate is sent to
/// each of them once per iteration, so each partition runs on its own.
/// Messages of a loop frame repeat once per iteration (including the final
/// one that exits); the plan counts them per iteration.

#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/partition_star_server_lite.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Builds a plan: the shared steps, then the mode's own, then the cycle check
/// and the output.
class partitioner final : public star_server_lite_planner {
 public:
  partitioner(const placed_graph& g, partition_options opts) : star_server_lite_planner(g, std::move(opts)) {}

  std::optional<failure> run(plan& out) {
    if (auto f = check_input()) return f;
    if (auto f = build_augmented()) return f;
    if (auto f = build_condensed()) return f;
    collect_transfers();
    std::optional<failure> f;
    switch (opts_.mode) {
      case partition_mode::send_recv:
        group_sends(all_transfers(), false);
        break;
      case partition_mode::star_server:
        plan_star();
        break;
      case partition_mode::star_server_lite:
        f = plan_lite();
        break;
    }
    if (f) return f;
    if (auto c = break_cycles()) return c;
    sort_messages();
    emit(out);
    return std::nullopt;
  }
};

}  // namespace detail

/// Plans `g` as `opts` says. Throws std::system_error: errc::invalid_graph
/// for graphs the partitioner cannot cut (reserved names, a variable written
/// from another task, a cross-task loop without LoopCond), errc::graph_cycle
/// when star_server_lite cannot merge; what() names the nodes or frame.
inline plan partition(const placed_graph& g, const partition_options& opts = {}) {
  plan out;
  detail::partitioner p(g, opts);
  if (auto f = p.run(out)) throw_error(f->code, f->what);
  return out;
}

/// Non-throwing partition: on failure sets `ec` and, if given, `*what`.
inline std::optional<plan> partition(const placed_graph& g, const partition_options& opts, std::error_code& ec,
                                     std::string* what = nullptr) {
  plan out;
  detail::partitioner p(g, opts);
  if (auto f = p.run(out)) {
    ec = make_error_code(f->code);
    if (what) *what = std::move(f->what);
    return std::nullopt;
  }
  ec.clear();
  return out;
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
