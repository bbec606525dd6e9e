#pragma once
/// Cross-thread inboxes of a reactor: one bounded SPSC queue per sender, and
/// one locked queue for threads that never registered. Private to the reactor layer.

#include <atomic>
#include <cstddef>
#include <mutex>

#include <boost/lockfree/spsc_queue.hpp>

#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// One (sender, reactor) lane. The producer marks itself `producing_` around a
/// push so that a stopping reactor can wait for a push it raced with.
class spsc_inbox {
 public:
  explicit spsc_inbox(std::size_t capacity) : queue_(capacity) {}
  spsc_inbox(const spsc_inbox&) = delete;
  spsc_inbox& operator=(const spsc_inbox&) = delete;

  /// Consumer side: deletes tasks that were never run.
  ~spsc_inbox() {
    queue_.consume_all([](util::task* t) { t->dispose(); });
  }

  boost::lockfree::spsc_queue<util::task*>& queue() noexcept { return queue_; }
  std::atomic<bool>& producing() noexcept { return producing_; }

 private:
  boost::lockfree::spsc_queue<util::task*> queue_;
  alignas(64) std::atomic<bool> producing_{false};
};

/// The slow lane for threads that are neither reactors nor attached senders.
class locked_inbox {
 public:
  /// Appends `t` unless the inbox was closed; returns whether it was taken.
  bool push(util::task_ptr& t) {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    tasks_.push_back(std::move(t));
    nonempty_.store(true, std::memory_order_relaxed);
    return true;
  }

  bool maybe_nonempty() const noexcept { return nonempty_.load(std::memory_order_relaxed); }

  util::task_list take() {
    std::lock_guard lock(mutex_);
    nonempty_.store(false, std::memory_order_relaxed);
    return std::move(tasks_);
  }

  /// After this, push() refuses; returns what was still queued.
  util::task_list close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    nonempty_.store(false, std::memory_order_relaxed);
    return std::move(tasks_);
  }

 private:
  std::mutex mutex_;
  util::task_list tasks_;
  bool closed_ = false;
  std::atomic<bool> nonempty_{false};
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
