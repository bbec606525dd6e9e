#pragma once
/// Bytes a stream transport received before a read asked for them. Private to
/// the transport layer.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>

#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// Copies the oldest bytes of `received` into `dst` from offset `filled` on,
/// until `dst` is full or nothing is left; consumes what it copied and
/// advances `filled`. Returns the number of bytes copied.
inline std::size_t take_received(std::deque<tensor_buffer>& received, mutable_buffer dst, std::size_t& filled) {
  std::size_t copied = 0;
  while (filled < dst.size() && !received.empty()) {
    tensor_buffer& b = received.front();
    const std::size_t n = std::min(b.size(), dst.size() - filled);
    std::memcpy(dst.data() + filled, b.data(), n);
    filled += n;
    copied += n;
    if (n == b.size()) {
      received.pop_front();
    } else {
      b.trim_front(n);
    }
  }
  return copied;
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
