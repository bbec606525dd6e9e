#pragma once
/// The scatter-gather list of one send: a single buffer (the tensor form, the
/// common case) lives inline, so starting a send allocates no vector. Private
/// to the rendezvous layer.

#include <cstddef>
#include <span>
#include <vector>

#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// A send's payload buffers: one inline, more in a vector.
class segments {
 public:
  void push_back(const_buffer b) {
    if (count_ == 0 && more_.empty()) {
      one_ = b;
      count_ = 1;
      return;
    }
    if (more_.empty()) more_.push_back(one_);
    more_.push_back(b);
    count_ = more_.size();
  }

  template <class It>
  void assign(It first, It last) {
    count_ = 0;
    more_.clear();
    for (; first != last; ++first) push_back(*first);
  }

  std::size_t size() const noexcept { return count_; }
  const const_buffer* begin() const noexcept { return more_.empty() ? &one_ : more_.data(); }
  const const_buffer* end() const noexcept { return begin() + count_; }
  const const_buffer& operator[](std::size_t i) const noexcept { return begin()[i]; }
  std::span<const const_buffer> view() const noexcept { return {begin(), count_}; }

 private:
  const_buffer one_{};
  std::size_t count_ = 0;
  std::vector<const_buffer> more_;
};

}  // namespace detail
}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
