#pragma once
/// What flows along an edge inside the executor: a value or a dead token.
/// Private to the graph layer.

#include <vector>

#include <fusewire/graph/channel.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph::detail {

/// What flows along an edge inside an executor: a tensor, or a dead value
/// from an untaken Switch branch (TensorFlow's is_dead). Control tokens are
/// empty tensors.
struct edge_value {
  tensor value;
  bool dead = false;
};

/// The outputs of one node firing, by port.
using edge_values = std::vector<edge_value>;

}  // namespace graph::detail
}  // namespace v0
}  // namespace fusewire
