#pragma once
/// The share-nothing reactor: one event loop per core that owns its I/O
/// engine, its connections and its timers; and the group that runs N of them
/// and carries work between them through bounded lock-free SPSC inboxes.
///
/// Threading contract:
/// - Everything on a `basic_reactor` (post, timers, its engine, the connections
///   made on it) is used only on that reactor's own thread, except where a
///   member says otherwise.
/// - Other threads reach a reactor only through `basic_reactor_group::submit_to`
///   (or an attached `sender`). Each (sender thread, reactor) pair has its own
///   SPSC queue (capacity `reactor_config::inbox_capacity`), drained `batch`
///   items at a time. Threads that neither run a reactor nor attached a sender
///   use a mutex-protected fallback queue.
/// - A reactor sleeps only in `adaptive` (after `idle_poll` without work) and
///   `block` modes; a sender writes the reactor's eventfd only when the reactor
///   is asleep (a seq_cst fence on both sides orders "queue an item" against
///   "announce sleep", so a wake-up is never lost).
///
/// Exceptions never cross the loop: one escaping a task, timer or handler is
/// caught, counted (`stats().exceptions`) and passed to `reactor_config::on_error`.

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
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
#include <fusewire/util/unique_function.hpp>
#include <fusewire/reactor/detail/inbox.hpp>
#include <fusewire/util/timer_queue.hpp>

namespace fusewire {
inline namespace v0 {

/// Receives what escaped a task or handler (the loop itself never throws): the
/// reactor's index and a description.
using reactor_error_reporter = std::function<void(unsigned reactor, std::string_view what)>;

/// How a reactor group runs: count, wait mode, pinning and inbox sizes.
struct reactor_config {
  reactor_mode mode = reactor_mode::adaptive;  ///< poll: never sleep; block: sleep when idle
  std::chrono::microseconds idle_poll{200};    ///< adaptive: how long to spin without work before sleeping
  unsigned count = 1;                          ///< reactors in the group (>= 1)
  bool pin_cores = false;  ///< pin reactor i to the i-th allowed CPU (round-robin over sched_getaffinity)
  std::size_t inbox_capacity = 128;  ///< slots per (sender, reactor) SPSC queue
  std::size_t batch = 16;            ///< inbox items taken per queue per tick (1..64)
  unsigned external_senders = 8;     ///< how many non-reactor threads may attach() at once
  std::chrono::milliseconds stop_timeout{10000};  ///< stop() gives up waiting for pending I/O after this
  reactor_error_reporter on_error;  ///< empty: print to stderr

  /// Throws std::system_error(errc::invalid_argument) naming the bad field and what is allowed.
  void validate() const {
    if (count == 0 || count > 4096) {
      throw_error(errc::invalid_argument,
                  "reactor_config.count = " + std::to_string(count) + ": must be 1..4096");
    }
    if (inbox_capacity < 2 || inbox_capacity > (1u << 20)) {
      throw_error(errc::invalid_argument, "reactor_config.inbox_capacity = " + std::to_string(inbox_capacity) +
                                              ": must be 2..1048576");
    }
    if (batch == 0 || batch > max_batch) {
      throw_error(errc::invalid_argument,
                  "reactor_config.batch = " + std::to_string(batch) + ": must be 1.." + std::to_string(max_batch));
    }
    if (idle_poll.count() < 0) {
      throw_error(errc::invalid_argument, "reactor_config.idle_poll = " + std::to_string(idle_poll.count()) +
                                              "us: must not be negative");
    }
    if (external_senders > 1024) {
      throw_error(errc::invalid_argument, "reactor_config.external_senders = " +
                                              std::to_string(external_senders) + ": must be 0..1024");
    }
  }

  static constexpr std::size_t max_batch = 64;
};

/// The reactor_config that fusewire's options ask for (mode, idle_poll,
/// pin_cores; count = o.reactor_count(connections)).
inline reactor_config make_reactor_config(const options& o, std::size_t connections) {
  reactor_config cfg;
  cfg.mode = o.mode;
  cfg.idle_poll = o.idle_poll;
  cfg.pin_cores = o.pin_cores;
  cfg.count = o.reactor_count(connections);
  return cfg;
}

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
};

namespace detail {

/// The time from now until `deadline`, never negative: what an engine's wait()
/// takes when the reactor (or the engine itself) has only an absolute deadline.
inline std::chrono::nanoseconds time_left(std::chrono::steady_clock::time_point deadline) noexcept {
  return std::max(std::chrono::nanoseconds(0), std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                   deadline - std::chrono::steady_clock::now()));
}

/// What an engine may ask of its reactor.
class engine_hooks {
 public:
  /// An eventfd (EFD_NONBLOCK) that other threads write to wake the reactor;
  /// the engine must wake from wait() when it becomes readable and reset it.
  virtual int wake_fd() const noexcept = 0;
  /// Reports something that escaped a handler run by the engine.
  virtual void report(std::string_view what) noexcept = 0;

 protected:
  ~engine_hooks() = default;
};

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

inline void report_to_stderr(unsigned reactor, std::string_view what) {
  std::fprintf(stderr, "fusewire: reactor %u: %.*s\n", reactor, static_cast<int>(what.size()), what.data());
}

inline std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// A full fence for the sleep/wake handshake. g++ warns (-Wtsan) that TSan does
// not model fences; it does not need to here: the fence only orders "queue an
// item" against "read the sleeping flag", the data itself travels by
// acquire/release through the queues, which TSan sees.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#endif
inline void full_fence() noexcept { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

}  // namespace detail

/// What a reactor needs from its I/O engine (io_uring ring, Asio io_context, ...).
/// Constructed and destroyed on the reactor's thread.
template <class E>
concept reactor_engine =
    std::destructible<E> && requires { typename E::config; } &&
    std::constructible_from<E, const typename E::config&, detail::engine_hooks&> &&
    requires(E& e, std::optional<std::chrono::nanoseconds> timeout) {
      /// Non-blocking: submits queued work and runs ready completions; true if any ran.
      { e.poll() } -> std::same_as<bool>;
      /// Blocks until a completion is ready, the wake fd is written, or the timeout passes.
      /// (An engine may also offer wait_until(std::optional<steady_clock::time_point>),
      /// which the reactor then calls instead, with no clock read of its own.)
      e.wait(timeout);
      /// True while the engine still owes completions (kernel operations in flight).
      { e.busy() } -> std::same_as<bool>;
      { E::name() } -> std::convertible_to<std::string_view>;
    };

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
    return {ticks_.load(std::memory_order_relaxed),      sleeps_.load(std::memory_order_relaxed),
            tasks_.load(std::memory_order_relaxed),      timers_run_.load(std::memory_order_relaxed),
            exceptions_.load(std::memory_order_relaxed), dropped_.load(std::memory_order_relaxed)};
  }

 private:
  friend group_type;

  basic_reactor(group_type& group, unsigned index, int cpu, const typename Engine::config& engine_config)
      : group_(&group), index_(index), cpu_(cpu), engine_config_(engine_config), outgoing_(group.config().count) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      throw std::system_error(errno, std::system_category(),
                              "reactor " + std::to_string(index) + ": eventfd() failed");
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
          throw std::system_error(ec, "reactor " + std::to_string(index_) + ": cannot pin to CPU " +
                                          std::to_string(cpu_));
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
    for (;;) {
      if (!stopping_ && stop_requested_.load(std::memory_order_acquire)) begin_stop();
      const bool worked = tick(spinning);
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
      spinning = false;
      if (cfg.mode == reactor_mode::adaptive) last_work = clock::now();
    }
  }

  /// `spinning`: the loop polls (it did not sleep before this tick and will
  /// not sleep after an idle one), so an engine that can (uring_engine::spin)
  /// may read its hottest connections with a plain recv, as a busy-polling C
  /// program does; before the posted tasks, which send what those reads answer.
  bool tick(bool spinning) {
    detail::bump(ticks_);
    bool worked = drain_inboxes();
    if (!timers_.empty()) worked |= run_timers();
    try {
      worked |= engine_->poll();
      if constexpr (requires { { engine_->spin() } -> std::same_as<bool>; }) {
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
    // Most ticks have no timer due for milliseconds: the coarse clock (no TSC
    // read; a busy-polling reactor ticks millions of times a second) says so.
    if (util::coarse_now() + util::coarse_lag() < timers_.not_before()) return false;
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

  alignas(64) std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> accepting_{true};
  detail::locked_inbox alien_;

  alignas(64) std::atomic<std::uint64_t> ticks_{0};
  std::atomic<std::uint64_t> sleeps_{0};
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

/// N reactors, one thread each, plus the N×N (and external) SPSC inboxes between
/// them. Starts its threads in the constructor; stop() or the destructor ends them.
///
/// Connections and listeners made on a reactor must be destroyed on that
/// reactor's thread, or on any thread after the group has stopped, and before
/// the group itself is destroyed.
template <reactor_engine Engine>
class basic_reactor_group {
 public:
  using reactor_type = basic_reactor<Engine>;
  using engine_config = typename Engine::config;

  /// Starts cfg.count reactors. Throws std::system_error if the config is
  /// invalid, pinning fails, or an engine cannot be created (naming the reactor).
  explicit basic_reactor_group(reactor_config cfg = {}, engine_config engine_cfg = {}) : config_(std::move(cfg)) {
    config_.validate();
    const unsigned n = config_.count;
    if (config_.pin_cores) {
      std::error_code ec;
      allowed_cpus_ = detail::allowed_cpus(ec);
      if (ec) throw std::system_error(ec, "reactor_group: sched_getaffinity failed");
      if (allowed_cpus_.empty()) throw_error(errc::invalid_config, "reactor_group: no CPU is allowed to this thread");
    }
    const unsigned rows = n + config_.external_senders;
    inboxes_.reserve(static_cast<std::size_t>(n) * rows);
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * rows; ++i) {
      inboxes_.push_back(std::make_unique<detail::spsc_inbox>(config_.inbox_capacity));
    }
    for (unsigned slot = config_.external_senders; slot-- > 0;) free_slots_.push_back(n + slot);
    reactors_.reserve(n);
    for (unsigned i = 0; i < n; ++i) {
      const int cpu = config_.pin_cores ? allowed_cpus_[i % allowed_cpus_.size()] : -1;
      reactors_.push_back(std::unique_ptr<reactor_type>(new reactor_type(*this, i, cpu, engine_cfg)));
    }
    for (auto& r : reactors_) {
      try {
        r->thread_ = std::thread([p = r.get()] { p->thread_main(); });
      } catch (...) {
        note_started(std::current_exception());
        note_quiescent();
      }
    }
    std::exception_ptr failure;
    {
      std::unique_lock lock(start_mutex_);
      start_cv_.wait(lock, [&] { return started_ == n; });
      failure = start_failure_;
    }
    if (failure != nullptr) {
      stop();
      std::rethrow_exception(failure);
    }
    warn_if_oversubscribed();
  }

  basic_reactor_group(const basic_reactor_group&) = delete;
  basic_reactor_group& operator=(const basic_reactor_group&) = delete;

  /// Stops and joins. Must not run on one of this group's reactor threads.
  ~basic_reactor_group() { stop(); }

  unsigned size() const noexcept { return static_cast<unsigned>(reactors_.size()); }
  reactor_type& at(unsigned i) const {
    check_index(i, "at");
    return *reactors_[i];
  }
  const reactor_config& config() const noexcept { return config_; }

  /// Runs `fn()` on reactor `core`, after everything the calling thread queued
  /// there before (FIFO per sender). Any thread. Returns errc::cancelled (and
  /// destroys fn unrun) if that reactor has stopped accepting work. From a
  /// reactor thread the task is handed over at the end of the current tick;
  /// tasks it queues during the group's final drain may be dropped (counted in
  /// stats().dropped). Throws std::system_error(errc::invalid_argument) if core >= size().
  template <class F>
    requires std::invocable<std::decay_t<F>&> && std::move_constructible<std::decay_t<F>>
  std::error_code submit_to(unsigned core, F&& fn) {
    check_index(core, "submit_to");
    reactor_type& target = *reactors_[core];
    reactor_type* self = reactor_type::current();
    if (self != nullptr && &self->group() == this) {
      if (self == &target) {
        self->post(std::forward<F>(fn));
        return {};
      }
      return self->enqueue_outgoing(core, util::make_task(std::forward<F>(fn)));
    }
    for (const attachment& a : attached_) {
      if (a.group == this) return push_external(core, a.row, util::make_task(std::forward<F>(fn)));
    }
    util::task_ptr t = util::make_task(std::forward<F>(fn));
    if (!target.alien_.push(t)) return make_error_code(errc::cancelled);
    target.wake_if_sleeping();
    return {};
  }

  /// submit_to() returning a future of fn's result. The future holds
  /// system_error(errc::cancelled) if the reactor refused the task. Never wait
  /// on it from the reactor that runs it.
  template <class F>
    requires std::invocable<std::decay_t<F>&> && std::move_constructible<std::decay_t<F>>
  auto submit(unsigned core, F&& fn) -> std::future<std::invoke_result_t<std::decay_t<F>&>> {
    using result = std::invoke_result_t<std::decay_t<F>&>;
    struct job {
      std::decay_t<F> fn;
      std::promise<result> promise;
      bool done = false;
      job(std::decay_t<F>&& f) : fn(std::move(f)) {}
      job(job&& o) noexcept(std::is_nothrow_move_constructible_v<std::decay_t<F>>)
          : fn(std::move(o.fn)), promise(std::move(o.promise)), done(std::exchange(o.done, true)) {}
      ~job() {
        if (!done) promise.set_exception(std::make_exception_ptr(std::system_error(make_error_code(errc::cancelled), "reactor task refused: the reactor has stopped")));
      }
      void operator()() {
        done = true;
        try {
          if constexpr (std::is_void_v<result>) {
            fn();
            promise.set_value();
          } else {
            promise.set_value(fn());
          }
        } catch (...) {
          promise.set_exception(std::current_exception());
        }
      }
    };
    job j{std::decay_t<F>(std::forward<F>(fn))};
    std::future<result> future = j.promise.get_future();
    (void)submit_to(core, std::move(j));
    return future;
  }

  /// A non-reactor thread's own SPSC lanes to every reactor of the group. Create
  /// and destroy it on the same thread; while it lives, submit_to() from this
  /// thread uses its lanes instead of the locked fallback.
  class sender {
   public:
    /// Throws std::system_error(errc::invalid_argument) when all
    /// reactor_config::external_senders slots are taken or the thread already has one.
    explicit sender(basic_reactor_group& group) : group_(&group), row_(group.acquire_slot()) {
      attached_.push_back({group_, row_});
    }
    sender(const sender&) = delete;
    sender& operator=(const sender&) = delete;
    ~sender() {
      std::erase_if(attached_, [this](const attachment& a) { return a.group == group_; });
      group_->release_slot(row_);
    }

    /// As basic_reactor_group::submit_to, through this sender's lane.
    template <class F>
      requires std::invocable<std::decay_t<F>&> && std::move_constructible<std::decay_t<F>>
    std::error_code submit_to(unsigned core, F&& fn) {
      group_->check_index(core, "sender::submit_to");
      return group_->push_external(core, row_, util::make_task(std::forward<F>(fn)));
    }

   private:
    basic_reactor_group* group_;
    unsigned row_;
  };

  /// Asks every reactor to stop: connections and listeners are closed (their
  /// pending operations complete with errc::cancelled), timers are cancelled,
  /// queued tasks run; then the threads exit. Any thread; idempotent. Joins the
  /// threads unless called on one of them (then the destructor joins).
  void stop() noexcept {
    for (auto& r : reactors_) {
      r->stop_requested_.store(true, std::memory_order_release);
      r->wake();
    }
    reactor_type* self = reactor_type::current();
    if (self != nullptr && &self->group() == this) return;
    join();
  }

  /// Waits for every reactor thread to exit (after stop()). Not from a reactor thread.
  void join() noexcept {
    std::lock_guard lock(join_mutex_);
    for (auto& r : reactors_) {
      if (r->thread_.joinable()) r->thread_.join();
    }
  }

  /// The CPUs pinning chooses from (empty unless pin_cores).
  const std::vector<int>& allowed_cpus() const noexcept { return allowed_cpus_; }

 private:
  friend reactor_type;

  struct attachment {
    const basic_reactor_group* group;
    unsigned row;
  };
  static inline thread_local std::vector<attachment> attached_;

  void check_index(unsigned core, const char* what) const {
    if (core >= reactors_.size()) {
      throw_error(errc::invalid_argument, std::string(what) + "(" + std::to_string(core) +
                                              "): no such reactor; the group has " +
                                              std::to_string(reactors_.size()));
    }
  }

  /// Busy-polling reactors that outnumber the CPUs they may run on take turns
  /// by timeslice (milliseconds per hand-off): say so instead of silently crawling.
  void warn_if_oversubscribed() noexcept {
    if (config_.mode != reactor_mode::poll) return;
    std::error_code ec;
    const std::size_t cpus = config_.pin_cores ? allowed_cpus_.size() : detail::allowed_cpus(ec).size();
    if (ec || cpus == 0 || size() <= cpus) return;
    reactors_[0]->report(std::to_string(size()) + " busy-polling reactors share " + std::to_string(cpus) +
                         " allowed CPU(s); they will wait for each other's timeslices (use adaptive or block mode)");
  }

  unsigned total_rows() const noexcept { return size() + config_.external_senders; }
  unsigned active_rows() const noexcept { return size() + slot_high_water_.load(std::memory_order_acquire); }

  detail::spsc_inbox& inbox(unsigned target, unsigned row) const noexcept {
    return *inboxes_[static_cast<std::size_t>(target) * total_rows() + row];
  }

  std::error_code push_external(unsigned core, unsigned row, util::task_ptr t) {
    reactor_type& target = *reactors_[core];
    detail::spsc_inbox& in = inbox(core, row);
    in.producing().store(true, std::memory_order_seq_cst);
    util::task* raw = t.release();
    for (;;) {
      if (!target.accepting_.load(std::memory_order_seq_cst)) {
        in.producing().store(false, std::memory_order_release);
        raw->dispose();
        return make_error_code(errc::cancelled);
      }
      if (in.queue().push(raw)) break;
      target.wake_if_sleeping();
      std::this_thread::yield();
    }
    in.producing().store(false, std::memory_order_release);
    target.wake_if_sleeping();
    return {};
  }

  unsigned acquire_slot() {
    for (const attachment& a : attached_) {
      if (a.group == this) throw_error(errc::invalid_argument, "reactor_group::sender: this thread already has one");
    }
    std::lock_guard lock(slot_mutex_);
    if (free_slots_.empty()) {
      throw_error(errc::invalid_argument, "reactor_group::sender: all " + std::to_string(config_.external_senders) +
                                              " external sender slots are taken (reactor_config::external_senders)");
    }
    const unsigned row = free_slots_.back();
    free_slots_.pop_back();
    const unsigned used = row - size() + 1;
    if (used > slot_high_water_.load(std::memory_order_relaxed)) {
      slot_high_water_.store(used, std::memory_order_release);
    }
    return row;
  }

  void release_slot(unsigned row) {
    std::lock_guard lock(slot_mutex_);
    free_slots_.push_back(row);
  }

  void note_started(std::exception_ptr failure) {
    std::lock_guard lock(start_mutex_);
    if (failure != nullptr && start_failure_ == nullptr) start_failure_ = failure;
    ++started_;
    start_cv_.notify_all();
  }

  void note_quiescent() noexcept {
    if (quiescent_.fetch_add(1, std::memory_order_acq_rel) + 1 == size()) {
      for (auto& r : reactors_) r->wake();
    }
  }

  bool all_quiescent() const noexcept { return quiescent_.load(std::memory_order_acquire) == size(); }

  reactor_config config_;
  std::vector<int> allowed_cpus_;
  std::vector<std::unique_ptr<detail::spsc_inbox>> inboxes_;
  std::vector<std::unique_ptr<reactor_type>> reactors_;

  std::mutex slot_mutex_;
  std::vector<unsigned> free_slots_;
  std::atomic<unsigned> slot_high_water_{0};

  std::mutex start_mutex_;
  std::condition_variable start_cv_;
  unsigned started_ = 0;
  std::exception_ptr start_failure_;

  std::atomic<unsigned> quiescent_{0};
  std::mutex join_mutex_;
};

}  // namespace v0
}  // namespace fusewire
