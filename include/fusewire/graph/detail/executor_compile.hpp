#pragma once
/// The executor's construction: checks each node's op, inputs and attributes
/// and compiles the graph into per-node records and output links.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/executor.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline void executor::bad_node(std::size_t i, const std::string& what, errc code) const {
  throw_error(code, "node " + graph_.describe(i) + ": " + what);
}

inline void executor::expect_inputs(std::size_t i, std::size_t want) const {
  auto got = graph_.data_input_count(i);
  if (got != want)
    bad_node(i,
             "takes " + std::to_string(want) + " data input" + (want == 1 ? "" : "s") + ", got " + std::to_string(got));
}

inline tensor executor::value_attr(std::size_t i) const {
  const auto& nd = graph_.node(i);
  const auto* v = nd.attr<std::vector<float>>("value");
  if (!v) bad_node(i, "needs a \"value\" attribute (list of floats)");
  std::vector<std::int64_t> shape{static_cast<std::int64_t>(v->size())};
  if (const auto* s = nd.attr<std::vector<std::int64_t>>("shape")) shape = *s;
  if (tensor::count_of(shape) != v->size())
    bad_node(i, "\"shape\" " + tensor::shape_string(shape) + " needs " + std::to_string(tensor::count_of(shape)) +
                    " values, \"value\" has " + std::to_string(v->size()));
  return tensor(shape, *v);
}

inline void executor::compile() {
  static const std::map<std::string_view, op_kind> kinds = {{"Const", op_kind::constant},
                                                            {"Placeholder", op_kind::placeholder},
                                                            {"Identity", op_kind::identity},
                                                            {"Add", op_kind::add},
                                                            {"Sub", op_kind::sub},
                                                            {"Mul", op_kind::mul},
                                                            {"Less", op_kind::less},
                                                            {"MatMul", op_kind::matmul},
                                                            {"Gather", op_kind::gather},
                                                            {"Concat", op_kind::concat},
                                                            {"Variable", op_kind::variable},
                                                            {"VariableV2", op_kind::variable},
                                                            {"Assign", op_kind::assign},
                                                            {"AssignAdd", op_kind::assign_add},
                                                            {"AssignSub", op_kind::assign_sub},
                                                            {"NoOp", op_kind::no_op},
                                                            {"Enter", op_kind::enter},
                                                            {"Exit", op_kind::exit},
                                                            {"NextIteration", op_kind::next_iteration},
                                                            {"Merge", op_kind::merge},
                                                            {"Switch", op_kind::switch_},
                                                            {"LoopCond", op_kind::loop_cond},
                                                            {"_Send", op_kind::send},
                                                            {"_Recv", op_kind::recv}};
  const auto n = graph_.size();
  nodes_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& nd = graph_.node(i);
    auto& c = nodes_[i];
    auto k = kinds.find(nd.op);
    if (k == kinds.end()) {
      std::string names;
      for (const auto& [name, kind] : kinds) names += (names.empty() ? "" : ", ") + std::string(name);
      bad_node(i, "op " + util::quoted(nd.op) + " is not supported by the executor (supported: " + names + ")",
               errc::not_supported);
    }
    c.kind = k->second;
    c.data_inputs = graph_.data_input_count(i);
    c.control_inputs = graph_.control_input_count(i);
    c.outputs = graph_.output_count(i);
    switch (c.kind) {
      case op_kind::constant:
        expect_inputs(i, 0);
        c.value = value_attr(i);
        break;
      case op_kind::placeholder:
        expect_inputs(i, 0);
        break;
      case op_kind::variable:
        expect_inputs(i, 0);
        variables_.emplace(i, value_attr(i));
        break;
      case op_kind::identity:
      case op_kind::exit:
      case op_kind::next_iteration:
      case op_kind::loop_cond:
        expect_inputs(i, 1);
        break;
      case op_kind::enter:
        expect_inputs(i, 1);
        c.frame = graph_.frame_of(i);
        if (const auto* b = nd.attr<bool>("is_constant")) c.is_constant = *b;
        break;
      case op_kind::add:
      case op_kind::sub:
      case op_kind::mul:
      case op_kind::less:
      case op_kind::matmul:
      case op_kind::gather:
      case op_kind::switch_:
        expect_inputs(i, 2);
        break;
      case op_kind::assign:
      case op_kind::assign_add:
      case op_kind::assign_sub: {
        expect_inputs(i, 2);
        const auto& e = graph_.edges()[graph_.in_edges(i)[0]];
        if (!detail::is_variable(graph_.node(e.src).op))
          bad_node(i, "input 0 must be a Variable, got " + graph_.describe(e.src));
        c.variable = e.src;
        break;
      }
      case op_kind::concat:
        if (c.data_inputs == 0) bad_node(i, "takes at least 1 data input, got 0");
        if (const auto* a = nd.attr<std::int64_t>("axis")) c.axis = *a;
        break;
      case op_kind::merge:
        if (c.data_inputs == 0) bad_node(i, "takes at least 1 data input, got 0");
        if (c.control_inputs != 0) bad_node(i, "a Merge may not have control inputs");
        for (auto ei : graph_.in_edges(i))
          (graph_.is_back_edge(graph_.edges()[ei]) ? c.back_inputs : c.forward_inputs) += 1;
        break;
      case op_kind::no_op:
        expect_inputs(i, 0);
        break;
      case op_kind::send:
      case op_kind::recv: {
        has_transfers_ = true;
        const auto* key = nd.attr<std::string>("key");
        const auto* entries = nd.attr<std::int64_t>("entries");
        if (!key || key->empty() || !entries || *entries < 0)
          bad_node(i, "needs \"key\" (string) and \"entries\" (int) attributes");
        c.key = *key;
        c.entries = static_cast<std::size_t>(*entries);
        if (c.kind == op_kind::recv) expect_inputs(i, 0);
        if (c.kind == op_kind::send && (c.data_inputs > c.entries || c.entries - c.data_inputs > c.control_inputs))
          bad_node(i, "has " + std::to_string(c.data_inputs) + " data and " + std::to_string(c.control_inputs) +
                          " control inputs for " + std::to_string(c.entries) + " entries");
        break;
      }
      default:
        break;
    }
  }
  std::vector<std::size_t> next_control(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (auto ei : graph_.in_edges(i)) {
      const auto& e = graph_.edges()[ei];
      out_link l;
      l.dst = i;
      l.port = e.src_port;
      l.slot = e.control() ? next_control[i]++ : static_cast<std::size_t>(e.dst_slot);
      nodes_[e.src].outs.push_back(l);
    }
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
