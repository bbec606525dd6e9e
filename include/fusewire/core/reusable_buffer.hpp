#pragma once
/// A small heap buffer that one owner hands out again and again.

#include <cstddef>

#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {

/// `take(n)` gives the first `n` bytes of one cached buffer of `capacity`
/// bytes while nobody else holds any of it (the last frame's head, prefix or
/// read died, on whatever thread: tensor_buffer::sole() orders that release
/// before the reuse), else a fresh buffer. Saves an allocation per frame in a
/// request/response exchange.
class reusable_buffer {
 public:
  explicit reusable_buffer(std::size_t capacity = 256) noexcept : capacity_(capacity) {}

  std::size_t capacity() const noexcept { return capacity_; }

  tensor_buffer take(std::size_t n) {
    if (n == 0 || n > capacity_) return tensor_buffer::allocate(n);
    if (cache_.empty()) cache_ = tensor_buffer::allocate(capacity_);
    if (!cache_.sole()) return tensor_buffer::allocate(n);
    return cache_.share(0, n);
  }

  /// The cached buffer's bytes to write into while nobody else holds any of
  /// them, else empty. For a caller that may not keep what it writes (a
  /// speculative read): it takes a handle with keep(n) only for what it keeps,
  /// so an attempt that finds nothing costs no reference count.
  mutable_buffer scratch() {
    if (cache_.empty()) cache_ = tensor_buffer::allocate(capacity_);
    return cache_.sole() ? cache_.bytes() : mutable_buffer{};
  }

  /// The first `n` bytes (at most capacity()) of what scratch() returned, as a
  /// handle; call it before anything else takes from this buffer.
  tensor_buffer keep(std::size_t n) const { return cache_.share(0, n); }

 private:
  std::size_t capacity_;
  tensor_buffer cache_;
};

}  // namespace v0
}  // namespace fusewire
