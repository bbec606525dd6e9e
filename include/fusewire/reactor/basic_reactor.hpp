#pragma once
/// One event loop on one thread (`basic_reactor`): its posted tasks, timers,
/// engine, cross-reactor outboxes and the closables it shuts down on stop.
/// Created and run by a basic_reactor_group (reactor_group.hpp).

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/reactor/detail/affinity.hpp>
#include <fusewire/reactor/detail/inbox.hpp>
#include <fusewire/reactor/detail/loop_support.hpp>
#include <fusewire/reactor/engine.hpp>
#include <fusewire/reactor/reactor_config.hpp>
#include <fusewire/util/timer_queue.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

/// Names a pending timer; a default-constructed id names none.
struct timer_id {
  std::uint64_t value = 0;
  explicit operator bool() const noexcept { return value != 0; }
  friend bool operator==(timer_id, timer_id) = default;
};

/// Counters of one reactor; readable from any thread (relaxed, approximate while running).
struct reactor_stats {
  std::uint64_t ticks = 0;       ///< loop iterations
  std::uint64_t sleeps = 0;      ///< times the reactor went to sleep in its engine
  std::uint64_t tasks = 0;       ///< tasks run (posted + cross-thread)
  std::uint64_t timers = 0;      ///< timer callbacks run (fired or cancelled)
  std::uint64_t exceptions = 0;  ///< exceptions caught at the loop boundary
  std::uint64_t dropped = 0;     ///< tasks destroyed unrun because their target had stopped
  /// Where the loop's time went, in nanoseconds, sampled with the coarse
  /// clock (a few ms resolution; exact over seconds): ticks that did work,
  /// ticks that found nothing (polling), and, of those idle, time asleep in
  /// the engine. busy / (busy + idle) is how loaded the reactor is. Zero in a
  /// build with FUSEWIRE_NO_OBSERVE.
  std::uint64_t busy_ns = 0;
  std::uint64_t idle_ns = 0;
  std::uint64_t sleep_ns = 0;
};

namespace detail {

/// A connection, listener or pending connect that a stopping reactor must close.
/// shutdown() acts like close(): pending operations complete with errc::cancelled
/// (later, never inline); it must not destroy any closable synchronously.
class closable {
 public:
  virtual void shutdown() noexcept = 0;

  closable* closable_prev_ = nullptr;
  closable* closable_next_ = nullptr;
  bool closable_linked_ = false;

 protected:
  ~closable() = default;
};

}  // namespace detail

template <reactor_engine Engine>
class basic_reactor_group;

/// One event loop on one thread. Created and owned by a basic_reactor_group.
template <reactor_engine Engine>
class basic_reactor final : private detail::engine_hooks {
 public:
  using engine_type = Engine;
  using group_type = basic_reactor_group<Engine>;
  using clock = std::chrono::steady_clock;

  basic_reactor(const basic_reactor&) = delete;
  basic_reactor& operator=(const basic_reactor&) = delete;

  ~basic_reactor() {
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  /// This reactor's position in its group (0..size-1). Any thread.
  unsigned index() const noexcept { return index_; }
  /// The group that owns this reactor. Any thread.
  group_type& group() const noexcept { return *group_; }
  /// The CPU this reactor is pinned to, or -1 if not pinned. Any thread.
  int cpu() const noexcept { return cpu_; }
  reactor_mode mode() const noexcept { return group_->config().mode; }

  /// The reactor running on the calling thread (of any group of this engine), or nullptr.
  static basic_reactor* current() noexcept { return current_; }
  /// True on this reactor's own thread.
  bool on_reactor_thread() const noexcept { return current_ == this; }

  /// The I/O engine. Reactor thread only.
  Engine& engine() noexcept { return *engine_; }

  /// True once the group began stopping; transports refuse new operations then. Reactor thread only.
  bool stopping() const noexcept { return stopping_; }

  /// Runs `fn` later on this reactor (never inline), in FIFO order with other posts. Reactor thread only.
  template <class F>
    requires std::invocable<std::decay_t<F>&> && std::move_constructible<std::decay_t<F>>
  void post(F&& fn) {
    posted_.push_back(util::make_task(std::forward<F>(fn)));
  }

  /// post() of a task the caller made (for transports: a task embedded in a
  /// connection, posted without an allocation). Reactor thread only.
  void post_task(util::task_ptr t) noexcept { posted_.push_back(std::move(t)); }

  /// Calls `fn(std::error_code{})` at `when`, or `fn(errc::cancelled)` if the
  /// timer is cancelled or the reactor stops first. Exactly once, never inline.
  /// Reactor thread only.
  template <class F>
    requires std::invocable<std::decay_t<F>&, std::error_code> && std::move_constructible<std::decay_t<F>>
  timer_id run_at(clock::time_point when, F&& fn) {
    if (stopping_) {
      post([f = std::forward<F>(fn)]() mutable { f(make_error_code(errc::cancelled)); });
      return {};
    }
    return timer_id{timers_.add(when, util::timer_queue::callback(std::forward<F>(fn)))};
  }

  /// run_at(now + delay, fn).
  template <class F>
    requires std::invocable<std::decay_t<F>&, std::error_code> && std::move_constructible<std::decay_t<F>>
  timer_id run_after(clock::duration delay, F&& fn) {
    return run_at(clock::now() + delay, std::forward<F>(fn));
  }

  /// Cancels a pending timer: its callback will run with errc::cancelled.
  /// Returns false if it already fired or was cancelled. Reactor thread only.
  bool cancel(timer_id id) {
    if (!id) return false;
    util::timer_queue::callback cb = timers_.remove(id.value);
    if (!cb) return false;
    post([cb = std::move(cb)]() mutable { cb(make_error_code(errc::cancelled)); });
    return true;
  }

  /// Number of pending timers. Reactor thread only.
  std::size_t timer_count() const noexcept { return timers_.size(); }

  /// Transports count user operations between initiation and handler so stop()
  /// knows when every handler has run. Reactor thread only.
  void work_started() noexcept { ++pending_ops_; }
  void work_finished() noexcept { --pending_ops_; }
  /// User operations initiated but not yet completed (for hang diagnosis). Reactor thread only.
  std::size_t pending_operations() const noexcept { return pending_ops_; }

  /// Registers something to close when the reactor stops. Reactor thread (or after stop).
  void add_closable(detail::closable& c) noexcept {
    if (c.closable_linked_) return;
    c.closable_prev_ = nullptr;
    c.closable_next_ = closables_;
    if (closables_ != nullptr) closables_->closable_prev_ = &c;
    closables_ = &c;
    c.closable_linked_ = true;
  }

  void remove_closable(detail::closable& c) noexcept {
    if (!c.closable_linked_) return;
    if (c.closable_prev_ != nullptr) {
      c.closable_prev_->closable_next_ = c.closable_next_;
    } else {
      closables_ = c.closable_next_;
    }
    if (c.closable_next_ != nullptr) c.closable_next_->closable_prev_ = c.closable_prev_;
    c.closable_prev_ = c.closable_next_ = nullptr;
    c.closable_linked_ = false;
  }

  /// Runs `fn(args...)`, reporting instead of propagating an exception. For
  /// transports invoking user handlers.
  template <class F, class... Args>
  void invoke(F& fn, Args&&... args) noexcept {
    try {
      fn(std::forward<Args>(args)...);
    } catch (...) {
      report_exception("a handler");
    }
  }

  /// Reports a problem through reactor_config::on_error. Any thread.
  void report(std::string_view what) noexcept override {
    try {
      const auto& sink = group_->config().on_error;
      if (sink) {
        sink(index_, what);
      } else {
        detail::report_to_stderr(index_, what);
      }
    } catch (...) {
    }
  }

  /// Counters; any thread.
  reactor_stats stats() const noexcept {
    constexpr auto relaxed = std::memory_order_relaxed;
    return {ticks_.load(relaxed),      sleeps_.load(relaxed),     tasks_.load(relaxed),
            timers_run_.load(relaxed), exceptions_.load(relaxed), dropped_.load(relaxed),
            busy_ns_.load(relaxed),    idle_ns_.load(relaxed),    sleep_ns_.load(relaxed)};
  }

 private:
  friend group_type;

  basic_reactor(group_type& group, unsigned index, int cpu, const typename Engine::config& engine_config)
      : group_(&group), index_(index), cpu_(cpu), engine_config_(engine_config), outgoing_(group.config().count) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      throw std::system_error(errno, std::system_category(), "reactor " + std::to_string(index) + ": eventfd() failed");
    }
  }

  int wake_fd() const noexcept override { return wake_fd_; }

  void report_exception(std::string_view where) noexcept {
    detail::bump(exceptions_);
    try {
      report("exception escaped " + std::string(where) + ": " + detail::describe_current_exception());
    } catch (...) {
    }
  }

  void run_task(util::task_ptr t) noexcept {
    detail::bump(tasks_);
    try {
      t->run();
    } catch (...) {
      report_exception("a task");
    }
  }

  /// Wakes the reactor from its engine's wait. Any thread.
  void wake() noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  /// Called by a sender after queueing: pairs with the fence in sleep().
  void wake_if_sleeping() noexcept {
    detail::full_fence();
    if (sleeping_.load(std::memory_order_relaxed)) wake();
  }

  // ---- the loop (reactor thread) -------------------------------------------

  void thread_main() {
    current_ = this;
    for (unsigned row = 0; row < group_->total_rows(); ++row) column_.push_back(&group_->inbox(index_, row));
    std::exception_ptr failure;
    try {
      if (cpu_ >= 0) {
        if (std::error_code ec = detail::pin_thread(::pthread_self(), cpu_)) {
          throw std::system_error(ec,
                                  "reactor " + std::to_string(index_) + ": cannot pin to CPU " + std::to_string(cpu_));
        }
      }
      engine_.emplace(engine_config_, static_cast<detail::engine_hooks&>(*this));
    } catch (...) {
      failure = std::current_exception();
    }
    group_->note_started(failure);
    if (failure == nullptr) {
      run_loop();
      final_drain();
      engine_.reset();
    } else {
      accepting_.store(false, std::memory_order_seq_cst);
      alien_.close();
      group_->note_quiescent();
    }
    current_ = nullptr;
  }

  void run_loop() {
    const reactor_config& cfg = group_->config();
    auto last_work = clock::now();
    bool spinning = cfg.mode == reactor_mode::poll;  // whether the last tick did not sleep (block: never asked)
    // The coarse clock is a memory read (vDSO), cheap enough for once a tick
    // of a polling loop; the time between two reads goes to the kind of tick
    // that ended it, which over many ticks is each kind's share of the time.
    // The same read tells the next tick's run_timers() whether a timer can
    // be due.
    coarse_ = util::coarse_now();
    auto mark = coarse_;
    auto account = [&](std::atomic<std::uint64_t>& to, std::atomic<std::uint64_t>* also = nullptr) {
      const auto now = util::coarse_now();
      coarse_ = now;
#if defined(FUSEWIRE_NO_OBSERVE)
      // Compiled out with the rest of the observability (measuring its cost).
      (void)to, (void)also, (void)mark;
      return;
#endif
      if (now == mark) return;
      const auto ns =
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark).count());
      mark = now;
      detail::bump(to, ns);
      if (also != nullptr) detail::bump(*also, ns);
    };
    for (;;) {
      if (!stopping_ && stop_requested_.load(std::memory_order_acquire)) begin_stop();
      // A stopping reactor does not spin: each tick asks its engine for
      // everything ready, so the handlers of the operations that stopping
      // cancelled run before the reactor reports itself quiescent.
      const bool worked = tick(spinning && !stopping_);
      account(worked ? busy_ns_ : idle_ns_);
      spinning = cfg.mode != reactor_mode::block;
      if (stopping_) {
        if (!reported_quiescent_ && (quiescent() || clock::now() >= stop_deadline_)) {
          if (!quiescent()) {
            report("stop timed out with " + std::to_string(pending_ops_) + " operations, " +
                   std::to_string(posted_.size()) + " tasks pending; abandoning them");
          }
          reported_quiescent_ = true;
          group_->note_quiescent();
        }
        if (reported_quiescent_ && group_->all_quiescent()) return;
      }
      if (worked) {
        if (cfg.mode == reactor_mode::adaptive) last_work = clock::now();
        continue;
      }
      if (cfg.mode == reactor_mode::poll) continue;
      if (cfg.mode == reactor_mode::adaptive && clock::now() - last_work < cfg.idle_poll) {
        // Idle polling gives way to runnable threads (an oversubscribed host:
        // the caller that would hand us work may be waiting for this CPU).
        std::this_thread::yield();
        continue;
      }
      sleep();
      account(idle_ns_, &sleep_ns_);
      spinning = false;
      if (cfg.mode == reactor_mode::adaptive) last_work = clock::now();
    }
  }

  /// `spinning`: the loop polls (it did not sleep before this tick and will
  /// not sleep after an idle one), so an engine that can (uring_engine::spin)
  /// may read its hottest connections with a plain recv, as a busy-polling C
  /// program does; before the posted tasks, which send what those reads
  /// answer. An engine whose poll is a system call may offer
  /// poll_spinning() for such ticks (asio_engine: it asks epoll less often
  /// while nothing comes).
  bool tick(bool spinning) {
    detail::bump(ticks_);
    bool worked = drain_inboxes();
    if (!timers_.empty()) worked |= run_timers();
    try {
      if constexpr (requires {
                      { engine_->poll_spinning() } -> std::same_as<bool>;
                    }) {
        worked |= spinning ? engine_->poll_spinning() : engine_->poll();
      } else {
        worked |= engine_->poll();
      }
      if constexpr (requires {
                      { engine_->spin() } -> std::same_as<bool>;
                    }) {
        if (spinning) worked |= engine_->spin();
      }
    } catch (...) {
      report_exception("the engine");
      worked = true;
    }
    worked |= run_posted();
    if (outgoing_count_ != 0) flush_outgoing();
    return worked;
  }

  bool drain_inboxes() {
    bool worked = false;
    const unsigned rows = group_->active_rows();
    const std::size_t batch = group_->config().batch;
    std::array<util::task*, reactor_config::max_batch> items;
    for (unsigned row = 0; row < rows; ++row) {
      if (row == index_) continue;
      auto& queue = column_[row]->queue();
      const std::size_t n = queue.pop(items.data(), batch);
      for (std::size_t i = 0; i < n; ++i) run_task(util::task_ptr(items[i]));
      worked |= n != 0;
    }
    if (alien_.maybe_nonempty()) {
      util::task_list list = alien_.take();
      worked |= !list.empty();
      while (util::task_ptr t = list.pop_front()) run_task(std::move(t));
    }
    return worked;
  }

  bool run_timers() {
    // Most ticks have no timer due for milliseconds: the coarse clock read at
    // the end of the last tick (no TSC read; a busy-polling reactor ticks
    // millions of times a second) says so. A timer is then late by at most
    // the tick that found it due.
    if (coarse_ + util::coarse_lag() < timers_.not_before()) return false;
    std::vector<util::timer_queue::callback> due;
    timers_.take_expired(clock::now(), [&](util::timer_queue::callback cb) { due.push_back(std::move(cb)); });
    for (auto& cb : due) {
      detail::bump(timers_run_);
      try {
        cb(std::error_code());
      } catch (...) {
        report_exception("a timer");
      }
    }
    return !due.empty();
  }

  /// Runs the tasks posted before this call; later posts wait for the next tick.
  bool run_posted() {
    std::size_t n = posted_.size();
    const bool worked = n != 0;
    while (n-- != 0) run_task(posted_.pop_front());
    return worked;
  }

  bool has_incoming() const noexcept {
    const unsigned rows = group_->active_rows();
    for (unsigned row = 0; row < rows; ++row) {
      if (row != index_ && column_[row]->queue().read_available() != 0) return true;
    }
    return alien_.maybe_nonempty() || stop_requested_.load(std::memory_order_relaxed) != stopping_ ||
           (reported_quiescent_ && group_->all_quiescent());
  }

  void sleep() {
    if (!posted_.empty() || outgoing_count_ != 0) return;
    std::optional<clock::time_point> deadline = timers_.next_deadline();
    if (stopping_ && !reported_quiescent_) deadline = deadline ? std::min(*deadline, stop_deadline_) : stop_deadline_;
    sleeping_.store(true, std::memory_order_relaxed);
    detail::full_fence();
    if (!has_incoming()) {
      detail::bump(sleeps_);
      try {
        wait_until(deadline);
      } catch (...) {
        report_exception("the engine");
      }
    }
    sleeping_.store(false, std::memory_order_relaxed);
  }

  /// An engine that can wait for an absolute deadline (uring_engine: a ring
  /// timeout armed once) gets it as is; others get the time left.
  void wait_until(std::optional<clock::time_point> deadline) {
    if constexpr (requires { engine_->wait_until(deadline); }) {
      engine_->wait_until(deadline);
    } else {
      std::optional<std::chrono::nanoseconds> timeout;
      if (deadline) timeout = detail::time_left(*deadline);
      engine_->wait(timeout);
    }
  }

  void begin_stop() {
    stopping_ = true;
    stop_deadline_ = clock::now() + group_->config().stop_timeout;
    // shutdown() never destroys a closable inline, so a snapshot stays valid.
    std::vector<detail::closable*> open;
    for (detail::closable* c = closables_; c != nullptr; c = c->closable_next_) open.push_back(c);
    for (detail::closable* c : open) c->shutdown();
    timers_.take_all([this](util::timer_queue::callback cb) {
      post([cb = std::move(cb)]() mutable { cb(make_error_code(errc::cancelled)); });
    });
  }

  bool quiescent() const noexcept {
    return posted_.empty() && timers_.empty() && pending_ops_ == 0 && outgoing_count_ == 0 && !engine_->busy();
  }

  /// After the whole group went quiet: refuse new tasks, run what was queued.
  void final_drain() {
    accepting_.store(false, std::memory_order_seq_cst);
    const unsigned rows = group_->total_rows();
    for (unsigned row = 0; row < rows; ++row) {
      if (row == index_) continue;
      auto& in = group_->inbox(index_, row);
      while (in.producing().load(std::memory_order_seq_cst)) std::this_thread::yield();
    }
    util::task_list alien = alien_.close();
    while (util::task_ptr t = alien.pop_front()) run_task(std::move(t));
    for (int round = 0; round < 1000; ++round) {
      bool any = false;
      for (unsigned row = 0; row < rows; ++row) {
        if (row == index_) continue;
        group_->inbox(index_, row).queue().consume_all([&](util::task* t) {
          any = true;
          run_task(util::task_ptr(t));
        });
      }
      while (util::task_ptr t = posted_.pop_front()) {
        any = true;
        run_task(std::move(t));
      }
      timers_.take_all([this](util::timer_queue::callback cb) {
        detail::bump(timers_run_);
        try {
          cb(make_error_code(errc::cancelled));
        } catch (...) {
          report_exception("a timer");
        }
      });
      if (outgoing_count_ != 0) flush_outgoing();
      if (!any) break;
    }
    if (outgoing_count_ != 0) {
      std::size_t n = 0;
      for (auto& q : outgoing_) {
        n += q.size();
        for (util::task* t : q) t->dispose();
        q.clear();
      }
      outgoing_count_ = 0;
      detail::bump(dropped_, n);
      report("dropped " + std::to_string(n) + " cross-reactor tasks while stopping");
    }
    if (!posted_.empty()) {
      detail::bump(dropped_, posted_.size());
      report("dropped " + std::to_string(posted_.size()) + " posted tasks while stopping");
      posted_.clear();
    }
  }

  // ---- cross-reactor sends (reactor thread) -----------------------------------

  std::error_code enqueue_outgoing(unsigned target, util::task_ptr t) {
    auto& q = outgoing_[target];
    q.push_back(t.release());
    ++outgoing_count_;
    if (q.size() >= group_->config().batch) flush_to(target);
    return {};
  }

  void flush_outgoing() {
    for (unsigned target = 0; target < outgoing_.size(); ++target) {
      if (!outgoing_[target].empty()) flush_to(target);
    }
  }

  /// Pushes as much of the batch for `target` as its inbox takes; the rest waits.
  void flush_to(unsigned target_index) {
    auto& pending = outgoing_[target_index];
    basic_reactor& target = group_->at(target_index);
    auto& in = group_->inbox(target_index, index_);
    in.producing().store(true, std::memory_order_seq_cst);
    if (!target.accepting_.load(std::memory_order_seq_cst)) {
      in.producing().store(false, std::memory_order_release);
      const std::size_t n = pending.size();
      for (util::task* t : pending) t->dispose();
      pending.clear();
      outgoing_count_ -= n;
      detail::bump(dropped_, n);
      report("dropped " + std::to_string(n) + " tasks for reactor " + std::to_string(target_index) +
             ": it has stopped");
      return;
    }
    std::size_t pushed = 0;
    while (pushed < pending.size() && in.queue().push(pending[pushed])) ++pushed;
    in.producing().store(false, std::memory_order_release);
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(pushed));
    outgoing_count_ -= pushed;
    if (pushed != 0) target.wake_if_sleeping();
  }

  static inline thread_local basic_reactor* current_ = nullptr;

  group_type* group_;
  unsigned index_;
  int cpu_;
  typename Engine::config engine_config_;
  int wake_fd_ = -1;
  std::optional<Engine> engine_;
  std::thread thread_;
  std::chrono::steady_clock::time_point coarse_{};  ///< util::coarse_now() when the last tick ended (reactor thread)

  alignas(64) std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> accepting_{true};
  detail::locked_inbox alien_;

  alignas(64) std::atomic<std::uint64_t> ticks_{0};
  std::atomic<std::uint64_t> sleeps_{0};
  std::atomic<std::uint64_t> busy_ns_{0}, idle_ns_{0}, sleep_ns_{0};
  std::atomic<std::uint64_t> tasks_{0};
  std::atomic<std::uint64_t> timers_run_{0};
  std::atomic<std::uint64_t> exceptions_{0};
  std::atomic<std::uint64_t> dropped_{0};

  bool stopping_ = false;
  bool reported_quiescent_ = false;
  clock::time_point stop_deadline_{};
  util::task_list posted_;
  util::timer_queue timers_;
  std::vector<detail::spsc_inbox*> column_;  // this reactor's inboxes, one per sender row
  std::vector<std::deque<util::task*>> outgoing_;
  std::size_t outgoing_count_ = 0;
  std::size_t pending_ops_ = 0;
  detail::closable* closables_ = nullptr;
};

}  // namespace v0
}  // namespace fusewire
