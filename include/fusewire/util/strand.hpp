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
/// post() queues a job without running it here: an idle strand is started
/// through `pass` (for work worth a hand-off to another thread).
///
/// A runner that has run `batch` queued jobs stops and passes the rest on with
/// the `pass` callable it was given: `pass()` must arrange for resume(pass) to
/// run later on some thread (ps::server: the lane's home reactor) and return
/// true. When it returns false or throws, this runner keeps the strand and
/// runs the rest itself. So one thread is not held on a strand that others
/// keep feeding, and no job is ever dropped.
///
/// A job that throws does not stop the strand: its runner passes the jobs
/// after it on (as above) and rethrows, so each exception reaches the thread
/// that ran its job (a reactor reports it). Only a runner that could not pass
/// on keeps running, and then rethrows the first exception it met.

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

  /// Queues `fn`; if no job runs, starts the strand elsewhere through `pass`
  /// (here, at once, when it cannot).
  template <class F, class Pass>
  void post(F&& fn, Pass&& pass) {
    task_ptr t = make_task(std::forward<F>(fn));
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(t));
      if (busy_) return;
      busy_ = true;
    }
    if (!hand_on(pass)) drain(pass, nullptr, false);
  }

  /// Continues a strand that a runner passed on (or post() started): runs its queued jobs.
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
  /// Runs the queued jobs until none is left, or until `batch_` ran or one
  /// threw and `pass` took the rest; rethrows the first exception it met.
  template <class Pass>
  void drain(Pass& pass, std::exception_ptr failed, bool may_pass = true) {
    for (std::size_t ran = 0;;) {
      task_ptr next;
      bool pass_on = false;
      {
        std::lock_guard lock(mutex_);
        if (queue_.empty()) {
          busy_ = false;
          break;
        }
        pass_on = may_pass && (ran >= batch_ || failed);
        if (!pass_on) next = queue_.pop_front();
      }
      if (pass_on) {  // the strand stays busy until resume()
        if (hand_on(pass)) break;
        may_pass = false;  // nowhere to pass: this runner keeps it
        continue;
      }
      ++ran;
      try {
        next->run();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
  }

  template <class Pass>
  static bool hand_on(Pass& pass) noexcept {
    try {
      return pass();
    } catch (...) {
      return false;
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
