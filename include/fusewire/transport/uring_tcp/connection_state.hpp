#pragma once
/// uring_tcp's connection state: what it holds, its kernel-operation
/// bookkeeping, and the hooks of the shared stream_connection base; the read
/// and write paths are defined in uring_tcp/read.hpp and uring_tcp/write.hpp,
/// the connect in uring_tcp/connection.hpp.

#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/core/reusable_buffer.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/uring_engine.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/uring_tcp/options.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_connection.hpp>

namespace fusewire {
inline namespace v0 {

class uring_tcp_connection;

namespace detail {

/// One connection's state, kept alive by its handle and by its kernel operations.
class uring_connection_state final : public stream_connection<uring_connection_state, uring_reactor>,
                                     public spin_reader {
 public:
  using connect_handler = util::unique_function<void(std::error_code, uring_tcp_connection)>;
  static constexpr const char* handle_name = "uring_tcp_connection";

  uring_connection_state(uring_reactor& reactor, int fd, uring_options opts)
      : stream_connection(reactor), fd_(fd), opts_(opts) {
    multishot_op_.owner = this;
    multishot_op_.complete = &on_multishot_cqe;
    direct_op_.owner = this;
    direct_op_.complete = &on_direct_cqe;
    connect_op_.owner = this;
    connect_op_.complete = &on_connect_cqe;
  }

  ~uring_connection_state() override {
    unlink();
    if (fd_ >= 0) ::close(fd_);
  }

  int native_handle() const noexcept { return fd_; }
  const uring_tcp_stats& stats() const noexcept { return stats_; }

  /// Applies TCP_NODELAY/SO_KEEPALIVE (and SO_SNDBUF to a peer on this host),
  /// records the peer (given by accept, or asked of the socket) and decides
  /// whether large writes may use SENDMSG_ZC.
  std::error_code prepare(const socket_address* peer = nullptr) {
    peer_ = peer != nullptr ? to_string(*peer) : peer_name(fd_);
    const bool local = peer_is_local(fd_);
    zc_allowed_ = opts_.zc_threshold != 0 && (opts_.zero_copy == zero_copy_policy::always ||
                                              (opts_.zero_copy == zero_copy_policy::automatic && !local));
    return set_stream_options(fd_, opts_.keepalive, local ? opts_.local_send_buffer : 0);
  }

  // ---- connect --------------------------------------------------------------

  void connect(const socket_address& addr, connect_handler handler);

  // ---- writes ---------------------------------------------------------------

  template <class H>
  void async_write(std::span<const const_buffer> sg, H&& handler);

 private:
  enum class multishot_state { idle, armed, cancelling };
  enum class direct_kind { none, exact, fallback };

  struct op_slot : uring_op {
    uring_connection_state* owner = nullptr;
  };

  struct write_req : uring_op {
    uring_connection_state* owner = nullptr;
    boost::container::small_vector<iovec, 8> iov;
    std::size_t next_iov = 0;  // first iovec not fully sent
    std::size_t total = 0;
    std::size_t sent = 0;
    unsigned notifications = 0;  // zero-copy notifications still owed
    bool in_flight = false;      // a send SQE is out
    bool finished = false;       // no more sends: all bytes out, or failed
    bool zero_copy = false;
    std::error_code result;
    msghdr msg{};
    util::unique_function<void(std::error_code, std::size_t)> handler;
  };

  // -- plumbing --

  /// close() and async_release(): asks the kernel to cancel every operation in
  /// flight; the error when no SQE could be had for it.
  std::error_code cancel_kernel_ops() noexcept {
    try {
      if (multishot_ == multishot_state::armed) {
        cancel(multishot_op_);
        multishot_ = multishot_state::cancelling;
      }
      if (direct_ != direct_kind::none) cancel(direct_op_);
      if (connecting_) cancel(connect_op_);
      for (auto& w : writes_) {
        if (w->in_flight) cancel(*w);
      }
    } catch (const std::system_error& e) {
      return e.code();
    } catch (...) {
      return make_error_code(errc::out_of_memory);
    }
    return {};
  }

  // ---- stream_connection's hooks ----

  friend stream_connection;

  static constexpr const char* release_no_memory = "uring_tcp: could not post a release's completion (out of memory)";

  /// Shuts the socket down and cancels its kernel operations; their handlers
  /// run once the kernel is done with their buffers.
  void close_stream() noexcept {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    (void)cancel_kernel_ops();  // without an SQE, the shutdown above still ends every pending recv/send
  }

  /// Cancels the kernel operations as close() does, without the shutdown; the
  /// fd is handed out once no SQE is in flight and no zero-copy notification is owed.
  void begin_release() noexcept {
    if (const std::error_code ec = cancel_kernel_ops()) {
      // No SQE for a cancellation: only a shutdown ends the operations, and it
      // leaves a socket nobody can use.
      release_.fail(ec);
      ::shutdown(fd_, SHUT_RDWR);
    }
  }

  void abort_handoff() noexcept {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    let_go_if_idle();
  }

  int take_released_fd() noexcept { return std::exchange(fd_, -1); }
  bool writes_pending() const noexcept { return !writes_.empty(); }
  bool may_take_ahead(std::size_t n) const noexcept { return ahead_bytes_ >= n; }
  void took_ahead(std::size_t n) noexcept {
    ahead_bytes_ -= n;
    stats_.bytes_copied_to_destination += n;
  }
  void dropped_ahead() noexcept { ahead_bytes_ = 0; }
  /// Nothing could complete inline: a non-empty destination.
  static bool may_start_read(const read_op& op) noexcept { return op.some || !op.dst.empty(); }
  void start_first_read() { pump_reads(); }

  uring_engine& engine() noexcept { return reactor_->engine(); }

  io_uring_sqe* start(uring_op& op) {
    io_uring_sqe* sqe = engine().start(op);
    if (kernel_ops_++ == 0) add_ref();
    ++requests_;
    return sqe;
  }

  /// A request's last CQE arrived (zero-copy notifications are counted apart).
  void request_done() noexcept {
    --requests_;
    let_go_if_idle();
  }

  /// Called at the end of a final CQE's handling; may delete this.
  void op_done() noexcept {
    if (--kernel_ops_ == 0) {
      let_go_if_idle();
      release();
    }
  }

  void cancel(uring_op& op) {
    io_uring_sqe* sqe = engine().start_untracked();
    io_uring_prep_cancel64(sqe, reinterpret_cast<std::uint64_t>(&op), 0);
  }

  /// After close(), once no request is in the kernel. If zero-copy
  /// notifications are still owed, the socket is reset (SO_LINGER 0): its queued
  /// data would otherwise pin the caller's pages (and hold back the write's
  /// handler) until an unresponsive peer read them. A release that can still
  /// hand the fd out keeps it, and waits for the notifications too.
  void let_go_if_idle() noexcept {
    if (open_ || requests_ != 0) return;
    if (fd_ >= 0 && !(release_.active() && !release_.error())) {
      if (notifications_owed_ != 0) {
        const linger abort{1, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
      }
      ::close(fd_);
      fd_ = -1;
    }
    if (notifications_owed_ == 0) post_release_finish();
  }

  std::error_code error_from(int res) const {
    if (!open_) return make_error_code(errc::cancelled);  // closed or released here
    return from_errno(-res);
  }

  // -- reads (uring_tcp/read.hpp) --

  bool multishot_usable();
  void pump_reads();
  void arm_multishot();
  void start_direct_recv(read_op& r);
  void start_fallback_recv();
  bool small_exact(const read_op& r) const noexcept;
  inline result spin_read() override;
  inline void spin_stopped() noexcept override;
  static void on_multishot_cqe(uring_op* op, int res, unsigned flags);
  void on_multishot(int res, unsigned flags);
  static void on_direct_cqe(uring_op* op, int res, unsigned flags);
  void on_direct(int res, unsigned);

  // -- writes (uring_tcp/write.hpp) --

  void pump_writes();
  bool try_send_now(write_req& w);
  void send(write_req& w);
  static void on_send_cqe(uring_op* op, int res, unsigned flags);
  void on_send(write_req& w, int res, unsigned flags);
  static void advance(write_req& w, std::size_t n);

  // -- connect (uring_tcp/connection.hpp) --

  static void on_connect_cqe(uring_op* op, int res, unsigned flags) {
    static_cast<op_slot*>(op)->owner->on_connect(res, flags);
  }

  void on_connect(int res, unsigned);

  int fd_;
  uring_options opts_;
  bool connecting_ = false;
  bool ring_starved_ = false;
  bool zc_allowed_ = false;  // large writes may use SENDMSG_ZC (policy, peer, the kernel's copy reports)
  /// Small exact reads still to be served by exact recvs after a large one.
  unsigned bulk_credit_ = 0;
  static constexpr unsigned bulk_follow_reads = 4;  ///< two frames' header and meta
  std::size_t kernel_ops_ = 0;  // requests + owed zero-copy notifications; holds a reference while > 0
  // Zero-copy notifications still owed, by all writes. Only these make close
  // reset the socket: kernel_ops_ also counts the CQE being handled, whose
  // handler may be the one closing (a plain write completes once its bytes are
  // queued, and a reset would drop them).
  std::size_t notifications_owed_ = 0;
  std::size_t requests_ = 0;  // SQEs whose last CQE has not arrived
  multishot_state multishot_ = multishot_state::idle;
  direct_kind direct_ = direct_kind::none;
  op_slot multishot_op_;
  op_slot direct_op_;
  op_slot connect_op_;
  socket_address connect_addr_;
  connect_handler connect_handler_;
  std::deque<std::unique_ptr<write_req>> writes_;
  std::unique_ptr<write_req> spare_write_;  ///< a finished write's record, for the next write
  std::size_t ahead_bytes_ = 0;             ///< in ahead_
  tensor_buffer fallback_;
  static constexpr std::size_t spin_read_bytes = 4096;  ///< a spinning reactor's plain recv takes at most this
  fusewire::reusable_buffer spin_buffer_{spin_read_bytes};
  uring_tcp_stats stats_;
};

}  // namespace detail

}  // namespace v0
}  // namespace fusewire

// The read path defines the spin_reader overrides this class declares: a
// translation unit that includes only this header must see them too.
#include <fusewire/transport/uring_tcp/read.hpp>
