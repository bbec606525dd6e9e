#pragma once
/// A graph as plain data you fill in, as TensorFlow's GraphDef: nodes with
/// an op, inputs ("node", "node:port", "^node"), a device and attributes.
/// placed_graph.hpp validates it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/graph/tensor_spec.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// An attribute value. Attributes the model and executor read:
/// "frame_name" (string, Enter), "is_constant" (bool, Enter), "value" (floats,
/// Const/Variable), "shape" (ints, Const/Variable), "axis" (int, Concat),
/// "key" and "entries" (the partitioner's _Send/_Recv).
using attr_value = std::variant<bool, std::int64_t, std::string, std::vector<float>, std::vector<std::int64_t>>;

/// One node, as TensorFlow's NodeDef: inputs are "node", "node:port" or
/// "^node" (control, after all data inputs); `device` names the task.
struct node_def {
  std::string name;
  std::string op;
  std::vector<std::string> inputs;
  std::string device;  ///< "/job:ps/replica:0/task:0" (a "/device:CPU:0" part is fine); see device_name
  std::map<std::string, attr_value, std::less<>> attrs;
  std::vector<std::optional<tensor_spec>> output_specs;  ///< declared, per output port

  /// Sets attribute `key`; returns *this for chaining.
  node_def& set(std::string key, attr_value value) {
    attrs.insert_or_assign(std::move(key), std::move(value));
    return *this;
  }
  /// Declares the spec of output `port`; returns *this for chaining.
  node_def& spec(tensor_spec s, std::size_t port = 0) {
    if (output_specs.size() <= port) output_specs.resize(port + 1);
    output_specs[port] = std::move(s);
    return *this;
  }
  /// The attribute `key` if present and of type T, else nullptr.
  template <class T>
    requires std::is_constructible_v<attr_value, T>
  const T* attr(std::string_view key) const {
    auto it = attrs.find(key);
    return it == attrs.end() ? nullptr : std::get_if<T>(&it->second);
  }
};

/// A whole graph: the cluster (every task a node may be placed on, e.g.
/// `cluster_spec::tasks()`) and the nodes.
struct graph_def {
  std::vector<task_id> tasks;
  std::vector<node_def> nodes;

  /// Appends a node; the reference stays valid until the next add().
  node_def& add(std::string name, std::string op, std::vector<std::string> inputs = {}, std::string device = {}) {
    node_def n;
    n.name = std::move(name);
    n.op = std::move(op);
    n.inputs = std::move(inputs);
    n.device = std::move(device);
    nodes.push_back(std::move(n));
    return nodes.back();
  }
};

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
