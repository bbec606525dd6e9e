#pragma once
/// The dataflow-graph model: nodes placed on tasks, data and control edges
/// written as TensorFlow writes them ("node", "node:port", "^node"), loop
/// frames made of Enter/Merge/Switch/NextIteration/Exit/LoopCond, and the
/// validation that turns a `graph_def` into an indexed `placed_graph`.
///
/// A `graph_def` is plain data you fill in. Building a `placed_graph` from it
/// checks everything the partitioner and executor rely on and throws
/// `std::system_error(errc::invalid_graph)` whose what() names the node at
/// fault (or use `placed_graph::make(def, ec, &what)` to get an error code).

#include <fusewire/graph/graph_def.hpp>
#include <fusewire/graph/placed_graph.hpp>
#include <fusewire/graph/tensor_spec.hpp>
