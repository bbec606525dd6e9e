#pragma once
/// What the graph model itself knows about op names: the loop-frame ops,
/// the ops with a fixed number of outputs, and the ops that write a variable.
/// Everything else is an opaque op with one output unless specs say more.

#include <string_view>

namespace fusewire {
inline namespace v0 {
namespace graph::detail {

inline bool is_enter(std::string_view op) { return op == "Enter"; }
inline bool is_exit(std::string_view op) { return op == "Exit"; }
inline bool is_next_iteration(std::string_view op) { return op == "NextIteration"; }
inline bool is_merge(std::string_view op) { return op == "Merge"; }
inline bool is_switch(std::string_view op) { return op == "Switch"; }
inline bool is_loop_cond(std::string_view op) { return op == "LoopCond"; }
inline bool is_send(std::string_view op) { return op == "_Send"; }
inline bool is_recv(std::string_view op) { return op == "_Recv"; }
inline bool is_variable(std::string_view op) { return op == "Variable" || op == "VariableV2"; }

/// Ops whose input 0 is a variable they update in place (must be colocated).
inline bool writes_variable(std::string_view op) { return op == "Assign" || op == "AssignAdd" || op == "AssignSub"; }

/// Enter, Exit, Merge, Switch, NextIteration, LoopCond: the nodes that make a loop.
inline bool is_frame_control(std::string_view op) {
  return is_enter(op) || is_exit(op) || is_merge(op) || is_switch(op) || is_next_iteration(op) || is_loop_cond(op);
}

/// Ops the partitioner generates; user graphs may not contain them.
inline bool is_internal(std::string_view op) { return !op.empty() && op[0] == '_'; }

/// Number of outputs of a known op; -1 when the op is opaque (count from use).
inline int fixed_output_count(std::string_view op) {
  if (is_switch(op) || is_merge(op)) return 2;
  if (op == "NoOp" || is_send(op)) return 0;
  if (is_recv(op)) return -2;  // from the node's "entries" attribute
  if (op == "Const" || op == "Placeholder" || op == "Identity" || is_variable(op) || writes_variable(op) ||
      is_enter(op) || is_exit(op) || is_next_iteration(op) || is_loop_cond(op) || op == "Add" || op == "Sub" ||
      op == "Mul" || op == "MatMul" || op == "Less" || op == "Gather" || op == "Concat")
    return 1;
  return -1;
}

}  // namespace graph::detail
}  // namespace v0
}  // namespace fusewire
