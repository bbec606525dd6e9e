#pragma once
/// The io_uring reactor engine (liburing >= 2.2): one ring per reactor thread,
/// SQEs batched and submitted once per tick, features probed at runtime with a
/// working fallback for each; its readiness wait (uring_fd_wait); and the
/// reactor/group aliases built on it.

#include <liburing.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/detail/loop_support.hpp>
#include <fusewire/reactor/detail/spin_readers.hpp>
#include <fusewire/reactor/detail/uring_buffers.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/reactor/uring_features.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// One in-flight io_uring operation: the engine calls `complete(self, res,
/// flags)` for each of its CQEs (a static vtable of one entry per kind of op).
/// Counted in flight from start() until a CQE without IORING_CQE_F_MORE.
struct uring_op {
  using complete_fn = void (*)(uring_op* self, int res, unsigned flags);
  complete_fn complete = nullptr;
};

}  // namespace detail

class uring_fd_wait;

/// An io_uring owned by one reactor thread. Transports get SQEs with start(op),
/// which the next poll() or wait() submits (one io_uring_enter per tick).
class uring_engine {
 public:
  /// The engine's readiness wait on a descriptor (see uring_fd_wait).
  using fd_wait = uring_fd_wait;

  struct config {
    unsigned sq_entries = 256;
    unsigned cq_entries = 4096;
    bool single_issuer = true;     ///< try IORING_SETUP_SINGLE_ISSUER
    bool defer_taskrun = true;     ///< try IORING_SETUP_DEFER_TASKRUN (needs single_issuer)
    bool coop_taskrun = true;      ///< try IORING_SETUP_COOP_TASKRUN (and TASKRUN_FLAG)
    bool register_ring_fd = true;  ///< try io_uring_register_ring_fd
    bool provided_buffers = true;  ///< register a provided-buffer ring for multishot receives
    unsigned buffer_count = 256;   ///< provided buffers (a power of two)
    std::size_t buffer_size = 16384;
    /// Connections a spinning reactor (poll mode, or adaptive while it polls)
    /// reads with a plain recv each tick, as a busy-polling C program does,
    /// instead of waiting for their multishot receive's completion; the most
    /// recently waiting ones win. 0: off. Needs DEFER_TASKRUN (see watch()).
    unsigned spin_readers = 4;
  };

  static constexpr unsigned max_spin_readers = detail::spin_list::max_readers;

  /// Creates the ring, dropping setup flags the kernel refuses (EINVAL) one by one.
  /// Throws std::system_error if io_uring itself is unavailable.
  uring_engine(const config& cfg, detail::engine_hooks& hooks) : hooks_(&hooks), wake_fd_(hooks.wake_fd()), spin_(0) {
    setup(cfg);
    if (features_.defer_taskrun) spin_ = detail::spin_list(cfg.spin_readers);
    arm_wake();
  }

  uring_engine(const uring_engine&) = delete;
  uring_engine& operator=(const uring_engine&) = delete;

  ~uring_engine() {
    buffers_.reset();
    io_uring_queue_exit(&ring_);
  }

  const uring_features& features() const noexcept { return features_; }
  /// For transports to record what they learn at runtime (uring_features::tri fields).
  uring_features& runtime_features() noexcept { return features_; }
  io_uring& ring() noexcept { return ring_; }
  /// The provided-buffer ring, or nullptr if the kernel has none.
  detail::provided_buffer_ring* buffers() noexcept { return buffers_.get(); }

  /// An SQE whose CQEs go to `op`; submitted at the next poll()/wait().
  io_uring_sqe* start(detail::uring_op& op) {
    io_uring_sqe* sqe = next_sqe();
    io_uring_sqe_set_data64(sqe, reinterpret_cast<std::uint64_t>(&op));
    ++inflight_;
    return sqe;
  }

  /// An SQE whose completion nobody waits for (e.g. a cancellation request).
  io_uring_sqe* start_untracked() {
    io_uring_sqe* sqe = next_sqe();
    io_uring_sqe_set_data64(sqe, 0);
    return sqe;
  }

  bool poll() {
    if (buffers_) buffers_->collect_returns();
    if (needs_enter()) {
      ++enters_;
      const int rc = io_uring_submit_and_get_events(&ring_);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        hooks_->report("io_uring_enter failed: " + std::system_category().message(-rc));
      }
    }
    return reap();
  }

  void wait(std::optional<std::chrono::nanoseconds> timeout) {
    // The watched connections were read by plain recvs alone; asleep, the
    // reactor needs their multishot recvs (armed now, submitted below).
    spin_.stop_all();
    io_uring_cqe* cqe = nullptr;
    ++enters_;
    int rc = 0;
    if (timeout) {
      __kernel_timespec ts;
      ts.tv_sec = static_cast<long long>(timeout->count() / 1000000000);
      ts.tv_nsec = static_cast<long long>(timeout->count() % 1000000000);
      rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
    } else {
      rc = io_uring_submit_and_wait(&ring_, 1);
    }
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      hooks_->report("io_uring wait failed: " + std::system_category().message(-rc));
    }
    reap();
  }

  /// wait() until `deadline` (steady_clock, i.e. CLOCK_MONOTONIC). The ring
  /// keeps one absolute timeout armed (IORING_OP_TIMEOUT) and moves it only
  /// when the deadline comes earlier: a reactor with a far timer pending (the
  /// 10 s keepalive) sleeps once per message in block mode, and a timeout
  /// passed to each io_uring_enter made the kernel arm and cancel a timer
  /// every time, costing more per round trip than the message itself. A later
  /// deadline leaves the armed one, which then wakes the reactor early once. Kernels without IORING_FEAT_EXT_ARG
  /// (before 5.11, which also lack IORING_TIMEOUT_UPDATE) wait as before.
  void wait_until(std::optional<std::chrono::steady_clock::time_point> deadline) {
    if (deadline && !features_.ext_arg) return wait(detail::time_left(*deadline));
    if (deadline) arm_deadline(*deadline);
    wait(std::nullopt);
  }

  /// Ring timeouts armed or moved by wait_until() (each one SQE).
  std::uint64_t timeout_arms() const noexcept { return timeout_arms_; }

  bool busy() const noexcept { return inflight_ != 0; }

  /// Whether watch() does anything: the reactor spins (it called spin()) and
  /// the ring defers its task work to io_uring_enter on this thread.
  bool spin_reads() const noexcept { return spin_.active(); }

  /// Asks for `r.spin_read()` on every spinning tick, after poll() reaped the
  /// completions, until it says done or unwatch(r). A reader may take bytes
  /// with a plain recv while its multishot recv stays armed: with
  /// DEFER_TASKRUN the kernel runs a multishot recv only inside this thread's
  /// io_uring_enter, so no completion of it can be pending then (spin() checks
  /// the CQ is empty and not overflowing), and whatever it reads later comes
  /// after those bytes in the stream. Evicts the longest-watched reader when full.
  void watch(detail::spin_reader& r) noexcept { spin_.watch(r); }
  void unwatch(detail::spin_reader& r) noexcept { spin_.unwatch(r); }

  /// The reactor calls this on ticks it will not sleep after (see watch());
  /// true if a reader took bytes.
  bool spin() {
    if (spin_.empty()) return spin_.spin(false);  // marks the list spinning; nothing to read
    const bool cq_quiet = io_uring_cq_ready(&ring_) == 0 &&
                          (__atomic_load_n(ring_.sq.kflags, __ATOMIC_ACQUIRE) & IORING_SQ_CQ_OVERFLOW) == 0;
    return spin_.spin(cq_quiet);
  }

  /// Operations whose final CQE has not arrived.
  std::size_t inflight() const noexcept { return inflight_; }
  /// io_uring_enter calls made (submissions + waits); one per tick at most.
  std::uint64_t enters() const noexcept { return enters_; }

  static constexpr std::string_view name() noexcept { return "io_uring"; }

 private:
  static constexpr std::uint64_t wake_tag = 1;
  static constexpr std::uint64_t timeout_tag = 2;  ///< the timeout wait_until() keeps armed

  /// Whether this poll must call into the kernel: to submit, or to run task work
  /// (completions of network operations). With TASKRUN_FLAG the kernel says when
  /// task work is pending, so an idle busy-poll tick stays in user space; every
  /// 64th tick enters anyway, as a safety net.
  ///
  /// With spin readers watched, task work first seen pending waits one tick:
  /// it is most likely the wake of bytes a reader's plain recv takes in that
  /// tick's spin(), sooner than the multishot recv would deliver them (the
  /// multishot then finds nothing, later and off the critical path).
  bool needs_enter() noexcept {
    if (io_uring_sq_ready(&ring_) != 0) return true;
    if (inflight_ == 0) return false;
    if (!features_.taskrun_flag) return true;
    const unsigned flags = __atomic_load_n(ring_.sq.kflags, __ATOMIC_ACQUIRE);
    if ((flags & IORING_SQ_CQ_OVERFLOW) != 0) return true;
    if ((flags & IORING_SQ_TASKRUN) != 0) {
      if (spin_.empty() || taskrun_seen_) {
        taskrun_seen_ = false;
        return true;
      }
      taskrun_seen_ = true;
      return false;
    }
    taskrun_seen_ = false;
    return (++quiet_polls_ & 63u) == 0;
  }

  void setup(const config& cfg) {
    unsigned wanted = IORING_SETUP_SUBMIT_ALL;
    if (cfg.coop_taskrun) wanted |= IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    if (cfg.single_issuer) wanted |= IORING_SETUP_SINGLE_ISSUER;
    if (cfg.single_issuer && cfg.defer_taskrun) wanted |= IORING_SETUP_DEFER_TASKRUN;
    // Dropped in this order when the kernel answers EINVAL.
    static constexpr struct {
      unsigned flag;
      const char* name;
    } fallback[] = {{IORING_SETUP_DEFER_TASKRUN, "DEFER_TASKRUN"},
                    {IORING_SETUP_SINGLE_ISSUER, "SINGLE_ISSUER"},
                    {IORING_SETUP_SUBMIT_ALL, "SUBMIT_ALL"},
                    {IORING_SETUP_TASKRUN_FLAG, "TASKRUN_FLAG"},
                    {IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"}};
    io_uring_params params;
    for (std::size_t next = 0;;) {
      std::memset(&params, 0, sizeof params);
      params.flags = wanted | IORING_SETUP_CQSIZE;
      params.cq_entries = cfg.cq_entries;
      const int rc = io_uring_queue_init_params(cfg.sq_entries, &ring_, &params);
      if (rc == 0) break;
      while (next < std::size(fallback) && (wanted & fallback[next].flag) == 0) ++next;
      if (rc != -EINVAL || next == std::size(fallback)) {
        throw std::system_error(-rc, std::system_category(),
                                "uring_engine: io_uring_setup(sq_entries=" + std::to_string(cfg.sq_entries) +
                                    ", cq_entries=" + std::to_string(cfg.cq_entries) + ") failed");
      }
      wanted &= ~fallback[next].flag;
      if (fallback[next].flag == IORING_SETUP_COOP_TASKRUN) wanted &= ~IORING_SETUP_TASKRUN_FLAG;
      if (!features_.setup_fallback.empty()) features_.setup_fallback += '|';
      features_.setup_fallback += fallback[next].name;
    }
    features_.setup_flags = params.flags;
    features_.single_issuer = (params.flags & IORING_SETUP_SINGLE_ISSUER) != 0;
    features_.defer_taskrun = (params.flags & IORING_SETUP_DEFER_TASKRUN) != 0;
    features_.coop_taskrun = (params.flags & IORING_SETUP_COOP_TASKRUN) != 0;
    features_.taskrun_flag = (params.flags & IORING_SETUP_TASKRUN_FLAG) != 0;
    features_.submit_all = (params.flags & IORING_SETUP_SUBMIT_ALL) != 0;
    // Per thread: only the reactor's thread enters this ring.
    features_.registered_ring_fd = cfg.register_ring_fd && io_uring_register_ring_fd(&ring_) == 1;
    features_.ext_arg = (params.features & IORING_FEAT_EXT_ARG) != 0;
    features_.nodrop = (params.features & IORING_FEAT_NODROP) != 0;
    features_.fast_poll = (params.features & IORING_FEAT_FAST_POLL) != 0;

    if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
      features_.op_recv = io_uring_opcode_supported(probe, IORING_OP_RECV) != 0;
      features_.op_sendmsg = io_uring_opcode_supported(probe, IORING_OP_SENDMSG) != 0;
      features_.op_send_zc = io_uring_opcode_supported(probe, IORING_OP_SEND_ZC) != 0;
      features_.op_sendmsg_zc = io_uring_opcode_supported(probe, IORING_OP_SENDMSG_ZC) != 0;
      features_.op_accept = io_uring_opcode_supported(probe, IORING_OP_ACCEPT) != 0;
      features_.op_connect = io_uring_opcode_supported(probe, IORING_OP_CONNECT) != 0;
      features_.op_async_cancel = io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL) != 0;
      io_uring_free_probe(probe);
    }
    if (!features_.op_recv || !features_.op_sendmsg || !features_.op_accept || !features_.op_connect ||
        !features_.op_async_cancel) {
      io_uring_queue_exit(&ring_);
      throw_error(errc::not_supported,
                  "uring_engine: the kernel lacks io_uring recv/sendmsg/accept/connect/cancel (needs Linux 5.6+)");
    }

    if (!cfg.provided_buffers) {
      features_.buf_ring_error = "disabled by config";
    } else {
      std::error_code ec;
      buffers_ = detail::provided_buffer_ring::create(ring_, 0, cfg.buffer_count, cfg.buffer_size, ec);
      if (buffers_) {
        features_.buf_ring = true;
        features_.buf_count = cfg.buffer_count;
        features_.buf_size = cfg.buffer_size;
      } else {
        features_.buf_ring_error = ec.message();
      }
    }
  }

  io_uring_sqe* next_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    for (int attempt = 0; sqe == nullptr; ++attempt) {
      ++enters_;
      const int rc = io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr && attempt == 8) {
        throw std::system_error(rc < 0 ? -rc : EBUSY, std::system_category(),
                                "uring_engine: submission queue full and the kernel takes no more");
      }
    }
    return sqe;
  }

  void arm_wake() {
    io_uring_sqe* sqe = next_sqe();
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, wake_tag);
  }

  void arm_deadline(std::chrono::steady_clock::time_point at) {
    if (timeout_armed_ && at >= timeout_at_) return;
    const auto ns =
        std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count());
    // Read by the kernel when the SQE is submitted, which is this wait's enter.
    timeout_ts_.tv_sec = ns / 1000000000;
    timeout_ts_.tv_nsec = ns % 1000000000;
    io_uring_sqe* sqe = next_sqe();
    if (timeout_armed_) {
      // If the armed one already fired, this finds nothing (its CQE is on the
      // way and clears timeout_armed_); the next sleep arms again.
      io_uring_prep_timeout_update(sqe, &timeout_ts_, timeout_tag, IORING_TIMEOUT_ABS);
      io_uring_sqe_set_data64(sqe, 0);
    } else {
      io_uring_prep_timeout(sqe, &timeout_ts_, 0, IORING_TIMEOUT_ABS);
      io_uring_sqe_set_data64(sqe, timeout_tag);
      timeout_armed_ = true;
    }
    timeout_at_ = at;
    ++timeout_arms_;
  }

  bool reap() {
    struct completion {
      std::uint64_t user_data;
      int res;
      unsigned flags;
    };
    bool worked = false;
    for (int round = 0; round < 64; ++round) {
      io_uring_cqe* cqes[64];
      const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
      if (n == 0) break;
      completion batch[64];
      for (unsigned i = 0; i < n; ++i) batch[i] = {cqes[i]->user_data, cqes[i]->res, cqes[i]->flags};
      io_uring_cq_advance(&ring_, n);
      for (unsigned i = 0; i < n; ++i) {
        const completion& c = batch[i];
        if (c.user_data == 0 || c.user_data == LIBURING_UDATA_TIMEOUT) continue;
        if (c.user_data == timeout_tag) {  // fired (or cancelled): the reactor's timers decide what is due
          timeout_armed_ = false;
          continue;
        }
        if (c.user_data == wake_tag) {
          arm_wake();
          continue;
        }
        worked = true;
        auto* op = reinterpret_cast<detail::uring_op*>(c.user_data);
        if ((c.flags & IORING_CQE_F_MORE) == 0) --inflight_;
        try {
          op->complete(op, c.res, c.flags);
        } catch (...) {
          hooks_->report("exception escaped an io_uring completion: " + detail::describe_current_exception());
        }
      }
      if (n < 64) break;
    }
    return worked;
  }

  detail::engine_hooks* hooks_;
  int wake_fd_;
  io_uring ring_{};
  uring_features features_;
  std::unique_ptr<detail::provided_buffer_ring> buffers_;
  std::uint64_t wake_value_ = 0;
  std::size_t inflight_ = 0;
  std::uint64_t enters_ = 0;
  unsigned quiet_polls_ = 0;
  __kernel_timespec timeout_ts_{};
  std::chrono::steady_clock::time_point timeout_at_{};  ///< the armed timeout's deadline
  bool timeout_armed_ = false;
  std::uint64_t timeout_arms_ = 0;
  bool taskrun_seen_ = false;
  detail::spin_list spin_;  ///< connections read with a plain recv while spinning
};

static_assert(reactor_engine<uring_engine>);

/// A descriptor whose readability its reactor's engine reports (here: a
/// one-shot IORING_OP_POLL_ADD, submitted with the tick's other SQEs, so a
/// reactor about to sleep arms it and sleeps in one io_uring_enter). Owns the
/// descriptor. One wait at a time; its handler runs on the reactor's thread
/// with no error once the descriptor is readable, or errc::cancelled when
/// close(), release() or the destructor came first. Reactor thread only. A
/// pending poll counts as the engine's work (busy()), so a stopping reactor
/// runs the handler of a cancelled wait before it ends.
class uring_fd_wait {
 public:
  using handler_type = util::unique_function<void(std::error_code)>;

  uring_fd_wait(uring_engine& engine, int fd) noexcept : engine_(&engine), fd_(fd) {}
  uring_fd_wait(const uring_fd_wait&) = delete;
  uring_fd_wait& operator=(const uring_fd_wait&) = delete;
  /// A pending wait is cancelled; its state lives on until the kernel is done with it.
  ~uring_fd_wait() {
    if (op_ != nullptr && op_->in_flight) {
      cancel();
      op_->closed = op_->orphan = true;
    } else {
      delete op_;
    }
    if (fd_ >= 0) ::close(fd_);
  }

  int native_handle() const noexcept { return fd_; }

  /// `h(std::error_code)`, never inline. Throws std::bad_alloc, or
  /// std::system_error if the ring takes no SQE (uring_engine::start).
  void async_wait(handler_type h) {
    if (op_ == nullptr) op_ = new wait_op;
    io_uring_sqe* sqe = engine_->start(*op_);
    io_uring_prep_poll_add(sqe, fd_, POLLIN);
    op_->handler = std::move(h);
    op_->in_flight = true;
    op_->closed = false;
  }

  /// Closes the descriptor; a pending wait completes with errc::cancelled.
  void close() noexcept {
    if (const int fd = release(); fd >= 0) ::close(fd);
  }

  /// Hands the descriptor over (-1 if closed); a pending wait completes with errc::cancelled.
  int release() noexcept {
    if (op_ != nullptr && op_->in_flight) {
      cancel();
      op_->closed = true;
    }
    return std::exchange(fd_, -1);
  }

 private:
  /// The kernel's side of a wait: apart from the descriptor's object, so that
  /// a wait cancelled by the destructor can finish after it.
  struct wait_op : detail::uring_op {
    wait_op() noexcept { complete = &on_cqe; }
    handler_type handler;
    bool in_flight = false;
    bool cancelling = false;
    bool closed = false;  ///< the handler gets errc::cancelled, whatever the poll found
    bool orphan = false;  ///< its descriptor object is gone: deleted once complete
  };

  void cancel() noexcept {
    if (op_->cancelling) return;
    try {
      io_uring_sqe* sqe = engine_->start_untracked();
      io_uring_prep_cancel64(sqe, reinterpret_cast<std::uint64_t>(static_cast<detail::uring_op*>(op_)), 0);
      op_->cancelling = true;
    } catch (...) {
      // No SQE: the poll ends when the descriptor next becomes readable, and
      // its handler then sees errc::cancelled.
    }
  }

  static void on_cqe(detail::uring_op* o, int res, unsigned) {
    auto* op = static_cast<wait_op*>(o);
    op->in_flight = false;
    op->cancelling = false;
    std::error_code ec;
    if (op->closed || res == -ECANCELED) {
      ec = make_error_code(errc::cancelled);
    } else if (res < 0) {
      ec = std::error_code(-res, std::system_category());
    }
    handler_type h = std::move(op->handler);
    if (op->orphan) delete op;
    h(ec);  // may destroy the uring_fd_wait (and with it op)
  }

  uring_engine* engine_;
  int fd_;
  wait_op* op_ = nullptr;  ///< made on the first wait, reused
};

/// A reactor running an io_uring.
using uring_reactor = basic_reactor<uring_engine>;
/// A group of io_uring reactors.
using uring_reactor_group = basic_reactor_group<uring_engine>;

}  // namespace v0
}  // namespace fusewire
