#pragma once
/// A timer queue: a binary min-heap of deadlines with lazy deletion. Used by
/// reactors and by the rendezvous layer; single-threaded (its owner's thread).

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {
namespace util {

/// CLOCK_MONOTONIC (steady_clock's clock) at tick resolution (a few ms)
/// without reading the TSC: for stamps that need no precision (keepalive
/// bookkeeping) and to rule out that a timer is due.
inline std::chrono::steady_clock::time_point coarse_now() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

/// How far coarse_now() may lag behind steady_clock::now(), with room to spare
/// (twice the coarse clock's resolution; 20 ms if the kernel does not say).
inline std::chrono::steady_clock::duration coarse_lag() noexcept {
  static const std::chrono::steady_clock::duration lag = [] {
    timespec res{};
    if (::clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0 || res.tv_sec != 0) {
      return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::milliseconds(20));
    }
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::nanoseconds(2 * res.tv_nsec));
  }();
  return lag;
}

/// Timers by deadline. Cancelled entries stay in the heap until they reach the
/// top or the heap is compacted (when dead entries outnumber live ones).
class timer_queue {
 public:
  using clock = std::chrono::steady_clock;
  using callback = unique_function<void(std::error_code)>;

  /// Adds a timer; returns its id (never 0).
  std::uint64_t add(clock::time_point when, callback cb) {
    const std::uint64_t id = next_id_++;
    live_.emplace(id, std::move(cb));
    heap_.push_back({when, id});
    std::push_heap(heap_.begin(), heap_.end(), later);
    return id;
  }

  /// Removes a pending timer and returns its callback (empty if the id is not pending).
  callback remove(std::uint64_t id) {
    auto it = live_.find(id);
    if (it == live_.end()) return {};
    callback cb = std::move(it->second);
    live_.erase(it);
    if (heap_.size() > 64 && heap_.size() > 2 * live_.size()) compact();
    return cb;
  }

  bool empty() const noexcept { return live_.empty(); }
  std::size_t size() const noexcept { return live_.size(); }

  /// No timer is due before this (the heap's top, cancelled or not; max() if none). Cheap.
  clock::time_point not_before() const noexcept {
    return heap_.empty() ? clock::time_point::max() : heap_.front().when;
  }

  /// The earliest pending deadline, if any.
  std::optional<clock::time_point> next_deadline() {
    drop_dead_top();
    if (heap_.empty()) return std::nullopt;
    return heap_.front().when;
  }

  /// Removes and returns the callbacks of every timer due at `now`, earliest first.
  template <class Sink>
  std::size_t take_expired(clock::time_point now, Sink&& sink) {
    std::size_t n = 0;
    // Every entry, live or dead, is due no earlier than the top: nothing to look up.
    if (heap_.empty() || heap_.front().when > now) return 0;
    for (;;) {
      drop_dead_top();
      if (heap_.empty() || heap_.front().when > now) break;
      const std::uint64_t id = heap_.front().id;
      std::pop_heap(heap_.begin(), heap_.end(), later);
      heap_.pop_back();
      auto it = live_.find(id);
      callback cb = std::move(it->second);
      live_.erase(it);
      sink(std::move(cb));
      ++n;
    }
    return n;
  }

  /// Removes every pending timer, handing each callback to `sink` in deadline order.
  template <class Sink>
  void take_all(Sink&& sink) {
    std::sort_heap(heap_.begin(), heap_.end(), later);
    std::reverse(heap_.begin(), heap_.end());
    for (const entry& e : heap_) {
      auto it = live_.find(e.id);
      if (it == live_.end()) continue;
      callback cb = std::move(it->second);
      live_.erase(it);
      sink(std::move(cb));
    }
    heap_.clear();
  }

 private:
  struct entry {
    clock::time_point when;
    std::uint64_t id;
  };

  static bool later(const entry& a, const entry& b) noexcept {
    return a.when != b.when ? a.when > b.when : a.id > b.id;
  }

  void drop_dead_top() {
    while (!heap_.empty() && !live_.contains(heap_.front().id)) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      heap_.pop_back();
    }
  }

  void compact() {
    std::erase_if(heap_, [this](const entry& e) { return !live_.contains(e.id); });
    std::make_heap(heap_.begin(), heap_.end(), later);
  }

  std::vector<entry> heap_;
  std::unordered_map<std::uint64_t, callback> live_;
  std::uint64_t next_id_ = 1;
};

}  // namespace util
}  // namespace v0
}  // namespace fusewire
