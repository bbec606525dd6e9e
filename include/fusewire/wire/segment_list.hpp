#pragma once
/// The sizes of a tensor frame's payload segments: one view over wire bytes,
/// the caller's sizes, or a scatter-gather payload.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/wire/endian.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// The sizes of a tensor frame's payload segments, in order. A view: over the
/// wire bytes when decoded, over the caller's sizes or buffers when encoding.
class segment_list {
  enum class source : std::uint8_t { wire, sizes, buffers };

 public:
  /// Iterates the sizes as `std::uint64_t` values.
  class iterator {
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;
    using value_type = std::uint64_t;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    std::uint64_t operator*() const noexcept { return (*list_)[index_]; }
    iterator& operator++() noexcept {
      ++index_;
      return *this;
    }
    iterator operator++(int) noexcept {
      auto copy = *this;
      ++index_;
      return copy;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.index_ == b.index_; }

   private:
    friend class segment_list;
    iterator(const segment_list* list, std::size_t index) noexcept : list_(list), index_(index) {}
    const segment_list* list_ = nullptr;
    std::size_t index_ = 0;
  };

  /// No segments.
  segment_list() = default;
  /// The caller's sizes; `sizes` must outlive the list.
  explicit segment_list(std::span<const std::uint64_t> sizes) noexcept
      : data_(sizes.data()), count_(sizes.size()), source_(source::sizes) {}
  /// The sizes of a scatter-gather payload; `buffers` must outlive the list.
  explicit segment_list(std::span<const const_buffer> buffers) noexcept
      : data_(buffers.data()), count_(buffers.size()), source_(source::buffers) {}
  /// `bytes.size() / 8` little-endian u64 values (what the decoder returns).
  [[nodiscard]] static segment_list from_wire(const_buffer bytes) noexcept {
    segment_list list;
    list.data_ = bytes.data();
    list.count_ = bytes.size() / 8;
    list.source_ = source::wire;
    return list;
  }

  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  /// The `i`-th size; `i < size()`.
  [[nodiscard]] std::uint64_t operator[](std::size_t i) const noexcept {
    switch (source_) {
      case source::wire:
        return load_le<std::uint64_t>(static_cast<const std::byte*>(data_) + 8 * i);
      case source::sizes:
        return static_cast<const std::uint64_t*>(data_)[i];
      case source::buffers:
        return static_cast<const const_buffer*>(data_)[i].size();
    }
    return 0;
  }
  [[nodiscard]] iterator begin() const noexcept { return {this, 0}; }
  [[nodiscard]] iterator end() const noexcept { return {this, count_}; }

  /// Same sizes in the same order, whatever each list views.
  friend bool operator==(const segment_list& a, const segment_list& b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }

 private:
  const void* data_ = nullptr;
  std::size_t count_ = 0;
  source source_ = source::sizes;
};

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
