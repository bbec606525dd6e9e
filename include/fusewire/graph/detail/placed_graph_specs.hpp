#pragma once
/// placed_graph's output specs: declared ones, or inferred from the op and
/// the specs of its inputs.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/placed_graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline const std::optional<tensor_spec>& placed_graph::input_spec(std::size_t i, std::size_t slot) const {
  static const std::optional<tensor_spec> none;
  for (auto ei : in_[i]) {
    const auto& e = edges_[ei];
    if (e.dst_slot == static_cast<int>(slot) && !is_back_edge(e))
      return output_spec(e.src, static_cast<std::size_t>(e.src_port));
  }
  return none;
}

inline std::optional<tensor_spec> placed_graph::infer_spec(std::size_t i, std::size_t port) const {
  const auto& nd = def_.nodes[i];
  const auto& op = nd.op;
  using shape_t = std::vector<std::int64_t>;
  if (op == "Const" || detail::is_variable(op)) {
    if (const auto* s = nd.attr<shape_t>("shape")) return tensor_spec{dtype::float32, *s};
    if (const auto* v = nd.attr<std::vector<float>>("value"))
      return tensor_spec{dtype::float32, {static_cast<std::int64_t>(v->size())}};
    return std::nullopt;
  }
  if (op == "Identity" || detail::is_loop_cond(op) || detail::is_enter(op) || detail::is_exit(op) ||
      detail::is_next_iteration(op) || detail::is_switch(op) || detail::writes_variable(op))
    return input_spec(i, 0);
  if (detail::is_merge(op)) {
    if (port == 1) return tensor_spec{dtype::float32, {}};
    for (std::size_t s = 0; s < data_inputs_[i]; ++s)
      if (const auto& sp = input_spec(i, s)) return sp;
    return std::nullopt;
  }
  const auto& a = input_spec(i, 0);
  const auto& b = input_spec(i, 1);
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Less") {
    if (!a || !b) return std::nullopt;
    if (a->shape == b->shape) return a;
    if (a->shape.empty()) return b;
    if (b->shape.empty()) return a;
    return std::nullopt;
  }
  if (op == "MatMul") {
    if (!a || !b || a->shape.size() != 2 || b->shape.size() != 2) return std::nullopt;
    return tensor_spec{a->type, {a->shape[0], b->shape[1]}};
  }
  if (op == "Gather") {
    if (!a || !b || a->shape.empty()) return std::nullopt;
    shape_t s = b->shape;
    s.insert(s.end(), a->shape.begin() + 1, a->shape.end());
    return tensor_spec{a->type, s};
  }
  if (op == "Concat") {
    if (!a || data_inputs_[i] == 0) return std::nullopt;
    const auto rank = static_cast<std::int64_t>(a->shape.size());
    std::int64_t axis = -1;
    if (const auto* ax = nd.attr<std::int64_t>("axis")) axis = *ax;
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return std::nullopt;
    shape_t s = a->shape;
    for (std::size_t k = 1; k < data_inputs_[i]; ++k) {
      const auto& o = input_spec(i, k);
      if (!o || o->shape.size() != s.size()) return std::nullopt;
      s[axis] = (s[axis] < 0 || o->shape[axis] < 0) ? -1 : s[axis] + o->shape[axis];
    }
    return tensor_spec{a->type, s};
  }
  return std::nullopt;
}

inline void placed_graph::infer_specs() {
  specs_.assign(def_.nodes.size(), {});
  for (auto i : order_) {
    auto& out = specs_[i];
    out.resize(outputs_[i]);
    const auto& declared = def_.nodes[i].output_specs;
    for (std::size_t p = 0; p < out.size(); ++p)
      out[p] = (p < declared.size() && declared[p]) ? declared[p] : infer_spec(i, p);
  }
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
