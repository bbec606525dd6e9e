#pragma once
/// TensorFlow device names for the adapter: the parser the graph layer places
/// nodes with (graph/device_name.hpp), under `fusewire::tf`, so that a
/// TensorFlow fork and the partitioner read device strings the same way.
/// A device maps onto core's `task_id` (job and index); the replica, which
/// fusewire does not model, stays in `device_name`.

#include <fusewire/graph/device_name.hpp>

namespace fusewire {
inline namespace v0 {
namespace tf {

using graph::device_name;
using graph::parse_device_name;
using graph::parse_task;
using graph::task_name;

}  // namespace tf
}  // namespace v0
}  // namespace fusewire
