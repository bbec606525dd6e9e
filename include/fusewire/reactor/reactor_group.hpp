#pragma once
/// A group of N reactors, one thread each, and the N×N (and external) SPSC
/// inboxes that carry work between them (`basic_reactor_group`, `sender`).

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/reactor/basic_reactor.hpp>
#include <fusewire/reactor/detail/affinity.hpp>
#include <fusewire/reactor/detail/inbox.hpp>
#include <fusewire/reactor/engine.hpp>
#include <fusewire/reactor/reactor_config.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

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
        if (!done)
          promise.set_exception(std::make_exception_ptr(
              std::system_error(make_error_code(errc::cancelled), "reactor task refused: the reactor has stopped")));
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
                                              "): no such reactor; the group has " + std::to_string(reactors_.size()));
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
