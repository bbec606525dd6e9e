#pragma once
/// The scatter-gather list of one send: a single buffer (the tensor form, the
/// common case) lives inline, so starting a send allocates no vector. Private
/// to the rendezvous layer.

#include <span>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// A send's payload buffers: one inline, more on the heap.
class segments : public boost::container::small_vector<const_buffer, 1> {
 public:
  std::span<const const_buffer> view() const noexcept { return {data(), size()}; }
};

}  // namespace detail
}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
