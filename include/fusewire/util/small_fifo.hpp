#pragma once
/// A FIFO for queues that are nearly always empty or one element long (the
/// per-(peer, key) queues of rendezvous::endpoint, a connection's pending reads
/// and writes): its first element lives inline, so a steady exchange touches
/// no memory outside its owner. std::deque allocates a map and a 512-byte
/// chunk per queue, and a queue that keeps going 0 -> 1 -> 0 walks through its
/// chunks, freeing one and allocating the next every few elements. Private to
/// fusewire.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <utility>

#include <boost/container/small_vector.hpp>

namespace fusewire {
inline namespace v0 {
namespace util {

/// FIFO over a small_vector with a moving head: push_back, front, pop_front in
/// amortized O(1); the popped prefix is dropped once it is the larger part.
template <class T>
  requires std::movable<T> && std::default_initializable<T>
class small_fifo {
 public:
  using iterator = typename boost::container::small_vector<T, 1>::iterator;

  bool empty() const noexcept { return head_ == items_.size(); }
  std::size_t size() const noexcept { return items_.size() - head_; }
  T& front() noexcept { return items_[head_]; }
  const T& front() const noexcept { return items_[head_]; }
  iterator begin() noexcept { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  iterator end() noexcept { return items_.end(); }

  void push_back(T v) { items_.push_back(std::move(v)); }

  /// Drops the front element (the caller moved from it or no longer needs it).
  void pop_front() {
    items_[head_] = T{};
    if (++head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    } else if (head_ >= 32 && head_ * 2 >= items_.size()) {
      items_.erase(items_.begin(), begin());
      head_ = 0;
    }
  }

  /// Removes every element for which `pred` holds, keeping the others' order.
  template <class Pred>
    requires std::predicate<Pred&, const T&>
  void erase_if(Pred pred) {
    items_.erase(std::remove_if(begin(), end(), pred), items_.end());
    if (empty()) {
      items_.clear();
      head_ = 0;
    }
  }

  /// Removes every element equal to `v`.
  void erase(const T& v) {
    erase_if([&v](const T& x) { return x == v; });
  }

 private:
  boost::container::small_vector<T, 1> items_;
  std::size_t head_ = 0;
};

}  // namespace util
}  // namespace v0
}  // namespace fusewire
