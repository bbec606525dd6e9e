#pragma once
/// util::strand: runs jobs one at a time, in the order they were handed in,
/// on whichever thread hands one in while none runs.
///
/// That thread runs its job at once, then the jobs other threads queued
/// meanwhile. So a job given to an idle strand costs no hand-off to another
/// thread (no wake-up), and one given to a busy strand costs its caller a
/// queue push: the caller never waits for the strand. Jobs given by one thread
/// run in the order that thread gave them; everything a job did is visible to
/// the jobs after it (the queue's lock orders them).
///
/// A runner that has run `batch` queued jobs stops and passes the rest on with
/// the `pass` callable it was given: `pass()` must arrange for resume(pass) to
/// run later on some thread (ps::server: the lane's home reactor) and return
/// true, or return false when it cannot (shutting down), and then the queued
/// jobs are dropped without running. So one thread is not held on a strand
/// that others keep feeding.
///
/// A job that throws does not stop the strand: the jobs after it still run,
/// and the runner rethrows the first exception once it let the strand go.

#include <cstddef>
#include <exception>
#include <mutex>
#include <utility>

#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {
namespace util {

class strand {
 public:
  /// `batch`: queued jobs one runner runs before it passes the rest on (at least 1).
  explicit strand(std::size_t batch = 64) noexcept : batch_(batch == 0 ? 1 : batch) {}
  strand(const strand&) = delete;
  strand& operator=(const strand&) = delete;

  /// Runs `fn` now on this thread if no job runs, then the queued ones; else
  /// queues `fn` for the thread that runs the strand. See the file comment for `pass`.
  template <class F, class Pass>
  void run(F&& fn, Pass&& pass) {
    {
      std::lock_guard lock(mutex_);
      if (busy_) {
        queue_.push_back(make_task(std::forward<F>(fn)));
        return;
      }
      busy_ = true;
    }
    std::exception_ptr failed;
    try {
      fn();
    } catch (...) {
      failed = std::current_exception();
    }
    drain(pass, std::move(failed));
  }

  /// Continues a strand that a runner passed on: runs its queued jobs.
  template <class Pass>
  void resume(Pass&& pass) {
    drain(pass, nullptr);
  }

  /// Whether a job runs (or a runner passed the strand on and it has not resumed).
  bool busy() const {
    std::lock_guard lock(mutex_);
    return busy_;
  }

 private:
  template <class Pass>
  void drain(Pass& pass, std::exception_ptr failed) {
    for (std::size_t ran = 0;; ++ran) {
      task_ptr next;
      {
        std::lock_guard lock(mutex_);
        if (queue_.empty()) {
          busy_ = false;
          break;
        }
        if (ran != batch_) next = queue_.pop_front();
      }
      if (next == nullptr) {  // ran a batch: the strand stays busy until resume()
        if (!pass()) abandon();
        break;
      }
      try {
        next->run();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
  }

  /// Drops the queued jobs (their captures are destroyed unrun) and frees the strand.
  void abandon() noexcept {
    task_list dropped;
    {
      std::lock_guard lock(mutex_);
      dropped = std::move(queue_);
      busy_ = false;
    }
  }

  mutable std::mutex mutex_;
  task_list queue_;
  bool busy_ = false;
  const std::size_t batch_;
};

}  // namespace util
}  // namespace v0
}  // namespace fusewire
