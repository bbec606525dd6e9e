#pragma once
/// uring_tcp: the io_uring TCP transport (liburing >= 2.2), a model of
/// fusewire::transport. See transport/concepts.hpp for the contract; here is
/// what it does underneath.
///
/// Receiving
/// - async_read_some: a multishot recv fills buffers of the reactor's
///   provided-buffer ring; each filled buffer is handed to the caller as a
///   tensor_buffer without a copy (it returns to the ring when its last alias
///   dies, on any thread). While a quarter or less of the ring is left, received
///   bytes are copied to the heap instead and the ring buffer reused at once, so
///   one slow consumer cannot starve the reactor's other connections. Without a
///   ring (or when it is empty, or multishot is unsupported) a plain recv into a
///   heap buffer of config::fallback_read bytes is used.
/// - async_read(dst) with dst of config::copy_threshold bytes or more (8 KiB):
///   bytes the multishot recv already delivered (read ahead, at most
///   config::read_ahead bytes) are COPIED into dst first; that is the only copy
///   on this path. For the rest, the multishot recv is cancelled and a plain
///   recv(MSG_WAITALL) goes straight into dst; the multishot is re-armed when a
///   read needs it again. So a large payload lands in the destination without a
///   copy except for what arrived before the read was posted. The next few
///   small exact reads after a large one (the following frames' heads) also get
///   exact recvs, not the multishot: in a stream of large frames a re-armed
///   multishot would drain the next payload into ring buffers before its head
///   was even parsed, and all of it would be copied.
/// - async_read(dst) with a smaller dst (headers, small tensors) is filled by
///   copying from the multishot receive: no SQE per read, one small copy.
/// - The multishot recv stays armed between read_some calls (that is its point)
///   until config::read_ahead unconsumed bytes pile up; then it is cancelled
///   (backpressure) and re-armed on demand.
/// - On a spinning reactor (poll mode, adaptive while it polls) a connection
///   whose small exact read waits for the multishot recv is also read with a plain
///   non-blocking recv (at most spin_read_bytes) once a tick, for the few
///   connections that waited last (uring_engine::config::spin_readers): bytes
///   then reach the reader without the multishot's detour through task work
///   and a completion, as with a busy-polling C program. Stream order is kept
///   with a multishot recv armed because with DEFER_TASKRUN the kernel runs it
///   only inside this thread's io_uring_enter (see uring_engine::watch()).
///   But an armed multishot is woken by every message, in the sender's
///   sendmsg (on loopback that cost about 0.3 us per message): so a watched
///   connection on a spinning reactor arms none, and a spin read that takes
///   bytes cancels one still armed (no spin read while the cancel is in
///   flight). It is armed again when the reactor stops reading the connection
///   that way: evicted from the watch list, or the reactor about to sleep
///   (spin_stopped()). Without DEFER_TASKRUN this is all off.
///
/// Sending
/// - async_write of at most config::speculative_send bytes (16 KiB) with no
///   unsent bytes queued before it first tries one direct non-blocking sendmsg
///   (what a busy-polling C program does); whatever it could not send goes to
///   the ring. Earlier writes whose bytes are all sent but whose completions
///   have not run yet do not hold it back (a task that writes several frames
///   has each leave as it is made); completions still run in call order.
/// - Otherwise one sendmsg SQE (MSG_WAITALL) with the caller's iovecs, continued
///   on short writes. Writes of at least config::zc_threshold bytes use
///   SENDMSG_ZC when the kernel has it: the first CQE reports the bytes sent,
///   the notification CQE (IORING_CQE_F_NOTIF) says the kernel released the
///   pages; the handler runs only after every notification of that write, so
///   the caller may reuse its buffers as soon as the handler runs. The next
///   write does not wait for notifications, only for the bytes to be queued.
///   Over loopback the kernel pins the pages, then copies them anyway, and
///   SENDMSG_ZC costs about twice a plain send; so by default
///   (config::zero_copy = automatic) a connection whose peer is on this host
///   (loopback address, or the same address at both ends) never uses it, and
///   any other connection stops using it once a notification says the kernel
///   copied the bytes. zero_copy_policy::always forces it, ::never turns it off.
///
/// Closing
/// - close() shuts the socket down and cancels its SQEs; handlers of operations
///   the kernel still holds run when their CQEs arrive (after the buffers are
///   free), the rest right away (posted), all in call order. The fd is closed
///   once no SQE is in flight; if zero-copy notifications are still owed then,
///   the socket is reset (SO_LINGER 0) so the kernel drops its queued data and
///   releases the caller's pages instead of waiting for a peer that may never read.
///
/// Releasing (async_release, for a move to another reactor; see
/// handoff_transport in concepts.hpp)
/// - Like close() without the shutdown: the SQEs are cancelled, and the fd is
///   handed out once no SQE is in flight and no zero-copy notification is owed.
///   Bytes the multishot recv (or a fallback recv) took that no read consumed,
///   at the release or from a CQE that beat the cancellation, and exact reads or
///   writes the cancellation cut in half, make it close the socket instead.
///   The fd stays non-blocking (accept4, socket() and adopt() make it so).
///
/// Every SQE is submitted by the reactor's engine in one io_uring_enter per tick.

#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/reusable_buffer.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/reactor/uring_engine.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/received.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_connection.hpp>
#include <fusewire/transport/detail/thread_check.hpp>

#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)  // kernel 6.2; not in liburing 2.3's headers
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

namespace fusewire {
inline namespace v0 {

class uring_tcp_connection;

/// When uring_tcp sends large writes with SENDMSG_ZC (see uring_tcp::config::zero_copy).
enum class zero_copy_policy {
  /// Zero copy unless the peer is on this host (a loopback address, or the
  /// connection's own local address), and only until a notification says the
  /// kernel copied the bytes anyway. The default.
  automatic,
  /// Zero copy for every write of at least zc_threshold bytes, whatever the route.
  always,
  /// Plain sends only.
  never,
};

/// What one uring_tcp connection did; for tests, benchmarks and diagnostics.
struct uring_tcp_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t sends = 0;                ///< sendmsg SQEs (plain)
  std::uint64_t speculative_sends = 0;    ///< direct non-blocking sendmsg calls (small writes, nothing unsent before them)
  std::uint64_t zc_sends = 0;             ///< SENDMSG_ZC SQEs
  std::uint64_t zc_notifications = 0;     ///< IORING_CQE_F_NOTIF CQEs received
  std::uint64_t zc_copied = 0;            ///< notifications saying the kernel copied anyway (e.g. loopback)
  std::uint64_t multishot_arms = 0;       ///< multishot recvs armed
  std::uint64_t multishot_disarms = 0;    ///< armed multishot recvs cancelled because spin reads serve the connection
  std::uint64_t ring_buffers = 0;         ///< provided buffers received
  std::uint64_t direct_recvs = 0;         ///< plain recvs straight into a destination
  std::uint64_t fallback_recvs = 0;       ///< plain recvs into a heap buffer (no ring, or ring empty)
  std::uint64_t spin_reads = 0;           ///< plain non-blocking recvs of a spinning reactor that got bytes
  std::uint64_t bytes_copied_to_destination = 0;  ///< read-ahead bytes copied into async_read destinations
};

namespace detail {

struct uring_options {
  zero_copy_policy zero_copy;
  std::size_t zc_threshold;
  std::size_t speculative_send;
  std::size_t copy_threshold;
  std::size_t read_ahead;
  std::size_t fallback_read;
  std::size_t local_send_buffer;
  bool keepalive;
  bool multishot;
};

/// One connection's state, kept alive by its handle and by its kernel operations.
class uring_connection_state final : public stream_connection<uring_connection_state, uring_reactor>,
                                     public spin_reader {
 public:
  using connect_handler = util::unique_function<void(std::error_code, uring_tcp_connection)>;

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
    zc_allowed_ = opts_.zc_threshold != 0 &&
                  (opts_.zero_copy == zero_copy_policy::always ||
                   (opts_.zero_copy == zero_copy_policy::automatic && !local));
    return set_stream_options(fd_, opts_.keepalive, local ? opts_.local_send_buffer : 0);
  }

  // ---- connect --------------------------------------------------------------

  void connect(const socket_address& addr, connect_handler handler);

  // ---- writes ---------------------------------------------------------------

  template <class H>
  void async_write(std::span<const const_buffer> sg, H&& handler) {
    reactor_->work_started();
    std::unique_ptr<write_req> req = spare_write_ ? std::move(spare_write_) : std::make_unique<write_req>();
    req->owner = this;
    req->complete = &on_send_cqe;
    req->handler = std::forward<H>(handler);
    req->iov.reserve(sg.size());
    for (const_buffer b : sg) {
      if (b.empty()) continue;
      req->iov.push_back({const_cast<std::byte*>(b.data()), b.size()});
      req->total += b.size();
    }
    if (!open_ || write_error_) {
      req->result = !open_ ? make_error_code(errc::connection_closed) : write_error_;
      req->finished = true;
    }
    // Straight to the kernel when nothing could complete inline; else via a
    // posted pump. The writes queued before it may be waiting only for their
    // completions to run (every byte sent): a reactor task that writes frame
    // after frame then has each leave as it is made, and the peer works on the
    // first while this side makes the next.
    const bool direct = (writes_.empty() || writes_.back()->finished) && !req->finished && req->total != 0;
    writes_.push_back(std::move(req));
    if (direct) {
      write_req& w = *writes_.back();
      if (w.total <= opts_.speculative_send && try_send_now(w)) {
        write_task_.schedule(*reactor_);  // completes it, posted
      } else if (!w.finished) {
        send(w);  // what pump_writes would start, without completing the earlier writes inline
      }
    } else {
      write_task_.schedule(*reactor_);
    }
  }

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

  // -- reads --

  bool multishot_usable() {
    return opts_.multishot && !ring_starved_ && engine().buffers() != nullptr &&
           engine().runtime_features().recv_multishot != uring_features::tri::no;
  }

  void pump_reads() {
    ref_ptr<uring_connection_state> guard(this);
    detail::read_pump::pass pass(reads_pump_);
    while (!reads_.empty()) {
      if (!pass.serve()) {
        read_task_.schedule(*reactor_);
        break;
      }
      if (!open_) {
        // Closed: everything not in the kernel's hands completes with cancelled, in order.
        if (direct_ == direct_kind::exact) return;
        read_op r = pop_read();
        fail_read(r, r.preset ? r.preset : make_error_code(errc::cancelled));
        continue;
      }
      read_op& front = reads_.front();
      if (front.some) {
        if (!ahead_.empty()) {
          tensor_buffer b = std::move(ahead_.front());
          ahead_.pop_front();
          ahead_bytes_ -= b.size();
          read_op r = pop_read();
          complete(r.some, std::error_code(), std::move(b));
          continue;
        }
        if (read_error_) {
          read_op r = pop_read();
          fail_read(r, read_error_);
          continue;
        }
        if (direct_ != direct_kind::none || multishot_ == multishot_state::cancelling) break;
        if (multishot_usable()) {
          if (multishot_ == multishot_state::idle) arm_multishot();
        } else if (multishot_ == multishot_state::idle) {
          start_fallback_recv();
        }
        break;
      }
      // exact read: first what already arrived (the one copy), then straight into dst
      const std::size_t copied = take_received(ahead_, front.dst, front.filled);
      stats_.bytes_copied_to_destination += copied;
      ahead_bytes_ -= copied;
      if (front.filled == front.dst.size()) {
        read_op r = pop_read();
        complete(r.exact, std::error_code(), r.filled);
        continue;
      }
      if (read_error_) {
        read_op r = pop_read();
        fail_read(r, read_error_);
        continue;
      }
      if (direct_ != direct_kind::none) break;
      const bool small = front.dst.size() < opts_.copy_threshold;
      if (small_exact(front) && multishot_usable()) {
        // Small: wait for the multishot receive and copy (no recv SQE per read).
        // A spinning reactor reads a watched connection with plain recvs and
        // arms no multishot for it (see spin_read() and spin_stopped()).
        engine().watch(*this);
        if (multishot_ == multishot_state::idle && !engine().spin_reads()) arm_multishot();
        break;
      }
      if (multishot_ == multishot_state::armed) {
        cancel(multishot_op_);
        multishot_ = multishot_state::cancelling;
      }
      if (multishot_ == multishot_state::cancelling) break;
      // Right after a large read the stream is likely bulk (a chunked tensor):
      // the next few small reads (frame heads) get exact recvs too, so that a
      // multishot recv does not drain the next payload into ring buffers only
      // for it to be copied again.
      if (!small) {
        bulk_credit_ = bulk_follow_reads;
      } else if (bulk_credit_ != 0) {
        --bulk_credit_;
      }
      start_direct_recv(front);
      break;
    }
    // Backpressure: stop reading ahead once enough unconsumed bytes piled up.
    if (multishot_ == multishot_state::armed && ahead_bytes_ >= opts_.read_ahead &&
        (reads_.empty() || reads_.front().exact)) {
      cancel(multishot_op_);
      multishot_ = multishot_state::cancelling;
    }
  }

  void arm_multishot() {
    io_uring_sqe* sqe = start(multishot_op_);
    io_uring_prep_recv_multishot(sqe, fd_, nullptr, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = engine().buffers()->group_id();
    multishot_ = multishot_state::armed;
    ++stats_.multishot_arms;
  }

  void start_direct_recv(read_op& r) {
    io_uring_sqe* sqe = start(direct_op_);
    const std::size_t len = std::min<std::size_t>(r.dst.size() - r.filled, 1u << 30);
    io_uring_prep_recv(sqe, fd_, r.dst.data() + r.filled, len, MSG_WAITALL);
    direct_ = direct_kind::exact;
    ++stats_.direct_recvs;
  }

  void start_fallback_recv() {
    fallback_ = tensor_buffer::allocate(opts_.fallback_read);
    io_uring_sqe* sqe = start(direct_op_);
    io_uring_prep_recv(sqe, fd_, fallback_.data(), fallback_.size(), 0);
    direct_ = direct_kind::fallback;
    ++stats_.fallback_recvs;
  }

  /// Whether `r` (the front read) waits for the multishot receive or a spin
  /// read and a copy: an exact read below copy_threshold, outside a bulk
  /// stretch. Anything else gets its own recv, or ring buffers as they are.
  bool small_exact(const read_op& r) const noexcept {
    return !r.some && r.dst.size() < opts_.copy_threshold && bulk_credit_ == 0;
  }

  /// A spinning reactor's plain recv (see uring_engine::watch()), while the
  /// front read, a small exact one, waits: nothing read ahead, no other recv
  /// in flight (while the multishot recv is being cancelled, it waits for the
  /// cancellation's last bytes).
  result spin_read() override {
    if (!open_ || reads_.empty() || direct_ != direct_kind::none || ahead_bytes_ != 0) return result::done;
    if (multishot_ == multishot_state::cancelling) return result::idle;  // its last bytes come first
    // Only small exact reads: a read_some keeps getting ring buffers (handed over as they are).
    if (!small_exact(reads_.front())) return result::done;
    // The recv writes into the reusable buffer, and only bytes read take a
    // handle to it: a spinning tick that finds nothing costs no reference count.
    tensor_buffer fresh;
    mutable_buffer dst = spin_buffer_.scratch();
    if (dst.empty()) {  // the last bytes read are still held
      fresh = tensor_buffer::allocate(spin_read_bytes);
      dst = fresh.bytes();
    }
    const ssize_t n = ::recv(fd_, dst.data(), dst.size(), MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return result::idle;
      // The recv took the socket's error: the multishot recv may never see it.
      if (!read_error_) read_error_ = error_from(-err);
    } else if (n == 0) {
      if (!read_error_) read_error_ = make_error_code(errc::connection_closed);
    } else {
      tensor_buffer buf = fresh.empty() ? spin_buffer_.keep(static_cast<std::size_t>(n)) : std::move(fresh);
      buf.trim(static_cast<std::size_t>(n));
      ahead_bytes_ += buf.size();
      stats_.bytes_received += buf.size();
      ++stats_.spin_reads;
      ahead_.push_back(std::move(buf));
      // The connection is hot and these recvs serve it: a multishot recv still
      // armed would be woken by every message, and its poll wake-up runs in the
      // sender's sendmsg (on loopback about 0.3 us per message). It goes;
      // spin_stopped() arms it again when the plain recvs stop.
      if (multishot_ == multishot_state::armed) {
        cancel(multishot_op_);
        multishot_ = multishot_state::cancelling;
        ++stats_.multishot_disarms;
      }
    }
    pump_reads();  // may re-watch this
    return n > 0 ? result::read : result::done;
  }

  /// The reactor stopped reading this with plain recvs (evicted, done, or about
  /// to sleep): a small exact read still waiting gets the multishot recv again.
  void spin_stopped() noexcept override {
    if (!open_ || reads_.empty() || multishot_ != multishot_state::idle || direct_ != direct_kind::none ||
        !multishot_usable()) {
      return;
    }
    if (!small_exact(reads_.front())) return;
    try {
      arm_multishot();
    } catch (const std::system_error& e) {
      // The ring takes no more submissions: the read fails (posted) instead of waiting forever.
      if (!read_error_) read_error_ = e.code();
      read_task_.schedule(*reactor_);
    }
  }

  static void on_multishot_cqe(uring_op* op, int res, unsigned flags) {
    static_cast<op_slot*>(op)->owner->on_multishot(res, flags);
  }

  void on_multishot(int res, unsigned flags) {
    ref_ptr<uring_connection_state> guard(this);
    provided_buffer_ring* ring = engine().buffers();
    if ((flags & IORING_CQE_F_BUFFER) != 0) {
      const auto bid = static_cast<std::uint16_t>(flags >> IORING_CQE_BUFFER_SHIFT);
      if (res > 0 && open_) {
        ahead_.push_back(ring->take(bid, static_cast<std::size_t>(res)));
        ahead_bytes_ += static_cast<std::size_t>(res);
        stats_.bytes_received += static_cast<std::size_t>(res);
        ++stats_.ring_buffers;
        engine().runtime_features().recv_multishot = uring_features::tri::yes;
      } else {
        if (res > 0) release_.lose_stream();  // arrived before the cancellation
        ring->discard(bid);
      }
    }
    const bool final = (flags & IORING_CQE_F_MORE) == 0;
    if (final) {
      multishot_ = multishot_state::idle;
      if (res == 0) {
        if (!read_error_) read_error_ = !open_ ? make_error_code(errc::cancelled)
                                               : make_error_code(errc::connection_closed);
      } else if (res == -ENOBUFS) {
        ring_starved_ = true;  // the next read_some uses a plain recv
      } else if (res == -EINVAL && engine().runtime_features().recv_multishot == uring_features::tri::unknown) {
        engine().runtime_features().recv_multishot = uring_features::tri::no;
      } else if (res < 0 && res != -ECANCELED && !read_error_) {
        read_error_ = error_from(res);
      }
    }
    if (final) request_done();
    pump_reads();
    if (final) op_done();
  }

  static void on_direct_cqe(uring_op* op, int res, unsigned flags) {
    static_cast<op_slot*>(op)->owner->on_direct(res, flags);
  }

  void on_direct(int res, unsigned) {
    ref_ptr<uring_connection_state> guard(this);
    request_done();
    const direct_kind kind = direct_;
    direct_ = direct_kind::none;
    if (kind == direct_kind::exact) {
      read_op& r = reads_.front();
      if (res > 0) {
        r.filled += static_cast<std::size_t>(res);
        stats_.bytes_received += static_cast<std::size_t>(res);
      }
      if (r.filled == r.dst.size()) {
        read_op done = pop_read();
        complete(done.exact, std::error_code(), done.filled);
      } else if (!open_) {
        read_op done = pop_read();
        fail_read(done, make_error_code(errc::cancelled));
      } else if (res == 0) {
        read_error_ = make_error_code(errc::connection_closed);
      } else if (res < 0 && res != -EAGAIN && res != -EINTR) {
        read_error_ = error_from(res);
      }
    } else {
      tensor_buffer got = std::move(fallback_);
      ring_starved_ = false;
      if (res > 0) release_.lose_stream();
      if (res > 0 && open_) {
        got.trim(static_cast<std::size_t>(res));
        stats_.bytes_received += static_cast<std::size_t>(res);
        ahead_bytes_ += got.size();
        ahead_.push_back(std::move(got));
      } else if (res == 0 && open_) {
        read_error_ = make_error_code(errc::connection_closed);
      } else if (res < 0 && res != -EAGAIN && res != -EINTR && res != -ECANCELED && !read_error_) {
        read_error_ = error_from(res);
      }
    }
    pump_reads();
    op_done();
  }

  // -- writes --

  void pump_writes() {
    ref_ptr<uring_connection_state> guard(this);
    // Start the first write that still has bytes to send (one send SQE at a time).
    for (auto& w : writes_) {
      if (w->finished) continue;
      if (w->in_flight) break;
      if (!open_) {
        w->finished = true;
        w->result = make_error_code(errc::cancelled);
        continue;
      }
      if (write_error_) {
        w->finished = true;
        w->result = write_error_;
        continue;
      }
      if (w->sent == w->total) {
        w->finished = true;
        continue;
      }
      send(*w);
      break;
    }
    // Complete writes in call order once the kernel is done with their bytes.
    while (!writes_.empty()) {
      write_req& w = *writes_.front();
      if (!w.finished || w.in_flight || w.notifications != 0) break;
      std::unique_ptr<write_req> done = std::move(writes_.front());
      writes_.pop_front();
      if (done->sent != 0 && done->sent != done->total) release_.lose_stream();  // the peer got half
      complete(done->handler, done->result, done->sent);
      if (!spare_write_) {  // the next write reuses it (the kernel is done with it)
        std::destroy_at(done.get());
        std::construct_at(done.get());
        spare_write_ = std::move(done);
      }
    }
  }

  /// One non-blocking sendmsg straight from the caller's thread, for a small
  /// write with nothing queued before it: saves the ring round trip when the
  /// socket has room. Returns false if the rest must go through the ring.
  bool try_send_now(write_req& w) {
    msghdr msg{};
    msg.msg_iov = w.iov.data() + w.next_iov;
    msg.msg_iovlen = std::min<std::size_t>(w.iov.size() - w.next_iov, IOV_MAX);
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    ++stats_.speculative_sends;
    if (n > 0) {
      advance(w, static_cast<std::size_t>(n));
      stats_.bytes_sent += static_cast<std::size_t>(n);
      if (w.sent == w.total) {
        w.finished = true;
        return true;
      }
      return false;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      const std::error_code ec = from_errno(errno);
      write_error_ = ec;
      w.result = ec;
      w.finished = true;
      return true;
    }
    return false;
  }

  void send(write_req& w) {
    const uring_features& f = engine().features();
    w.zero_copy = zc_allowed_ && w.total >= opts_.zc_threshold && f.op_sendmsg_zc;
    w.msg = msghdr{};
    w.msg.msg_iov = w.iov.data() + w.next_iov;
    w.msg.msg_iovlen = std::min<std::size_t>(w.iov.size() - w.next_iov, IOV_MAX);
    io_uring_sqe* sqe = start(w);
    if (w.zero_copy) {
      io_uring_prep_sendmsg_zc(sqe, fd_, &w.msg, MSG_NOSIGNAL | MSG_WAITALL);
      if (engine().runtime_features().zc_report_usage != uring_features::tri::no) {
        sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
      }
      ++stats_.zc_sends;
    } else {
      io_uring_prep_sendmsg(sqe, fd_, &w.msg, MSG_NOSIGNAL | MSG_WAITALL);
      ++stats_.sends;
    }
    w.in_flight = true;
  }

  static void on_send_cqe(uring_op* op, int res, unsigned flags) {
    auto* w = static_cast<write_req*>(op);
    w->owner->on_send(*w, res, flags);
  }

  void on_send(write_req& w, int res, unsigned flags) {
    ref_ptr<uring_connection_state> guard(this);
    if ((flags & IORING_CQE_F_NOTIF) != 0) {
      --w.notifications;
      --notifications_owed_;
      ++stats_.zc_notifications;
      if ((static_cast<unsigned>(res) & IORING_NOTIF_USAGE_ZC_COPIED) != 0) {
        ++stats_.zc_copied;
        // The route copies anyway: plain sends from now on, unless forced.
        if (opts_.zero_copy != zero_copy_policy::always) zc_allowed_ = false;
      }
      pump_writes();
      op_done();
      return;
    }
    w.in_flight = false;
    request_done();
    if ((flags & IORING_CQE_F_MORE) != 0) {  // counted in flight until the notification
      ++w.notifications;
      ++notifications_owed_;
    }
    if (res > 0) {
      advance(w, static_cast<std::size_t>(res));
      stats_.bytes_sent += static_cast<std::size_t>(res);
    } else if (res == -EINVAL && w.zero_copy &&
               engine().runtime_features().zc_report_usage == uring_features::tri::unknown) {
      engine().runtime_features().zc_report_usage = uring_features::tri::no;  // retried without the flag
    } else if (res < 0 && res != -EAGAIN && res != -EINTR) {
      const std::error_code ec = error_from(res);
      if (open_ && !write_error_) write_error_ = ec;
      w.result = ec;
      w.finished = true;
    }
    if (w.zero_copy && res >= 0 && engine().runtime_features().zc_report_usage == uring_features::tri::unknown) {
      engine().runtime_features().zc_report_usage = uring_features::tri::yes;
    }
    if (!w.finished && w.sent == w.total) w.finished = true;
    if (!w.finished && !open_) {
      w.result = make_error_code(errc::cancelled);
      w.finished = true;
    }
    pump_writes();
    if ((flags & IORING_CQE_F_MORE) == 0) op_done();
  }

  static void advance(write_req& w, std::size_t n) {
    w.sent += n;
    while (n != 0 && w.next_iov < w.iov.size()) {
      iovec& v = w.iov[w.next_iov];
      const std::size_t k = std::min(n, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + k;
      v.iov_len -= k;
      n -= k;
      if (v.iov_len == 0) ++w.next_iov;
    }
  }

  // -- connect --

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
  std::size_t requests_ = 0;    // SQEs whose last CQE has not arrived
  multishot_state multishot_ = multishot_state::idle;
  direct_kind direct_ = direct_kind::none;
  op_slot multishot_op_;
  op_slot direct_op_;
  op_slot connect_op_;
  socket_address connect_addr_;
  connect_handler connect_handler_;
  std::deque<std::unique_ptr<write_req>> writes_;
  std::unique_ptr<write_req> spare_write_;  ///< a finished write's record, for the next write
  std::size_t ahead_bytes_ = 0;  ///< in ahead_
  tensor_buffer fallback_;
  static constexpr std::size_t spin_read_bytes = 4096;  ///< a spinning reactor's plain recv takes at most this
  fusewire::reusable_buffer spin_buffer_{spin_read_bytes};
  uring_tcp_stats stats_;
};

class uring_listener_state;

}  // namespace detail

namespace detail {
/// Names for error messages.
struct uring_tcp_connection_name {
  static constexpr const char* value = "uring_tcp_connection";
};
struct uring_tcp_listener_name {
  static constexpr const char* value = "uring_tcp_listener";
};

}  // namespace detail

/// A TCP connection on a uring_reactor; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
class uring_tcp_connection
    : public detail::basic_connection_handle<detail::uring_connection_state, uring_reactor, detail::uring_tcp_connection_name> {
 public:
  uring_tcp_connection() noexcept = default;

  /// Counters of this connection (zeros for an empty handle).
  uring_tcp_stats stats() const noexcept { return state_ ? state_->stats() : uring_tcp_stats{}; }

 private:
  friend class uring_tcp;
  friend class detail::uring_connection_state;
  friend class detail::uring_listener_state;

  explicit uring_tcp_connection(detail::ref_ptr<detail::uring_connection_state> s) noexcept
      : basic_connection_handle(std::move(s)) {}
};

namespace detail {

inline void uring_connection_state::connect(const socket_address& addr, connect_handler handler) {
  connect_addr_ = addr;
  connect_handler_ = std::move(handler);
  connecting_ = true;
  io_uring_sqe* sqe = start(connect_op_);
  io_uring_prep_connect(sqe, fd_, connect_addr_.get(), connect_addr_.size);
}

inline void uring_connection_state::on_connect(int res, unsigned) {
  ref_ptr<uring_connection_state> guard(this);
  request_done();
  connecting_ = false;
  std::error_code ec = res < 0 ? error_from(res) : std::error_code();
  if (!ec && !open_) ec = make_error_code(errc::cancelled);
  if (!ec) ec = prepare();
  uring_tcp_connection conn;
  if (!ec) {
    conn = uring_tcp_connection(ref_ptr<uring_connection_state>(this));
  } else {
    close();
  }
  connect_handler h = std::move(connect_handler_);
  complete(h, ec, std::move(conn));
  op_done();
}

/// A listening socket's state, shared by its handle and its pending accept.
class uring_listener_state final : public ref_counted, public closable {
 public:
  using handler_type = util::unique_function<void(std::error_code, uring_tcp_connection)>;

  uring_listener_state(uring_reactor& reactor, int fd, uring_options opts)
      : reactor_(&reactor), fd_(fd), port_(local_port(fd)), opts_(opts) {
    accept_op_.owner = this;
    accept_op_.complete = &on_accept_cqe;
    reactor_->add_closable(*this);
  }
  ~uring_listener_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
    if (fd_ >= 0) ::close(fd_);
  }

  uring_reactor& reactor() const noexcept { return *reactor_; }
  std::uint16_t port() const noexcept { return port_; }
  bool is_open() const noexcept { return open_; }

  void async_accept(handler_type handler) {
    reactor_->work_started();
    pending_.push_back(std::move(handler));
    schedule_pump();
  }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    try {
      if (accepting_) {
        io_uring_sqe* sqe = reactor_->engine().start_untracked();
        io_uring_prep_cancel64(sqe, reinterpret_cast<std::uint64_t>(static_cast<uring_op*>(&accept_op_)), 0);
      }
      schedule_pump();
    } catch (...) {
      reactor_->report("uring_tcp: could not cancel an accept (out of memory)");
    }
    close_fd_if_idle();
  }

  void shutdown() noexcept override { close(); }

 private:
  struct op_slot : uring_op {
    uring_listener_state* owner = nullptr;
  };

  void schedule_pump() noexcept { pump_task_.schedule(*reactor_); }

  void pump() {
    ref_ptr<uring_listener_state> guard(this);
    if (!open_) {
      while (pending_.size() > (accepting_ ? 1u : 0u)) {
        handler_type h = std::move(pending_.back());
        pending_.pop_back();
        complete(h, make_error_code(errc::cancelled), uring_tcp_connection());
      }
      return;
    }
    if (accepting_ || pending_.empty()) return;
    accepting_ = true;
    add_ref();  // held by the accept SQE
    io_uring_sqe* sqe = reactor_->engine().start(accept_op_);
    peer_ = socket_address{};
    peer_.size = sizeof peer_.storage;
    io_uring_prep_accept(sqe, fd_, peer_.get(), &peer_.size, SOCK_NONBLOCK | SOCK_CLOEXEC);
  }

  static void on_accept_cqe(uring_op* op, int res, unsigned) { static_cast<op_slot*>(op)->owner->on_accept(res); }

  void on_accept(int res) {
    ref_ptr<uring_listener_state> guard(this);
    release();  // the SQE's reference; guard keeps us alive
    accepting_ = false;
    handler_type h = std::move(pending_.front());
    pending_.pop_front();
    std::error_code ec;
    uring_tcp_connection conn;
    if (res >= 0 && !open_) {
      ::close(res);
      ec = make_error_code(errc::cancelled);
    } else if (res >= 0) {
      ref_ptr<uring_connection_state> state(new uring_connection_state(*reactor_, res, opts_));
      ec = state->prepare(&peer_);
      if (!ec) conn = uring_tcp_connection(std::move(state));
    } else {
      ec = open_ ? from_errno(-res) : make_error_code(errc::cancelled);
    }
    complete(h, ec, std::move(conn));
    close_fd_if_idle();
    pump();
  }

  void close_fd_if_idle() noexcept {
    if (!open_ && !accepting_ && fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

  void complete(handler_type& h, std::error_code ec, uring_tcp_connection conn) {
    reactor_->work_finished();
    reactor_->invoke(h, ec, std::move(conn));
  }

  uring_reactor* reactor_;
  int fd_;
  std::uint16_t port_;
  uring_options opts_;
  bool open_ = true;
  bool accepting_ = false;
  member_task<uring_listener_state> pump_task_{*this, &uring_listener_state::pump};  ///< pump, posted
  op_slot accept_op_;
  socket_address peer_;  // filled by the accept in flight
  std::deque<handler_type> pending_;
};

}  // namespace detail

/// A listening TCP socket on a uring_reactor; a model of fusewire::listener.
class uring_tcp_listener
    : public detail::basic_listener_handle<detail::uring_listener_state, uring_tcp_connection, detail::uring_tcp_listener_name> {
 public:
  uring_tcp_listener() noexcept = default;

 private:
  friend class uring_tcp;
  explicit uring_tcp_listener(detail::ref_ptr<detail::uring_listener_state> s) noexcept
      : basic_listener_handle(std::move(s)) {}
};

/// The io_uring TCP transport; a model of fusewire::transport. Cheap to copy.
class uring_tcp {
 public:
  using transport_concept = transport_tag;
  using reactor_type = uring_reactor;
  using connection_type = uring_tcp_connection;
  using listener_type = uring_tcp_listener;

  struct config {
    /// Whether large writes use SENDMSG_ZC. automatic: not to a peer on this
    /// host (over loopback the kernel pins the pages, then copies them anyway,
    /// which costs more than a plain send); always: forced (tests, measurements).
    zero_copy_policy zero_copy = zero_copy_policy::automatic;
    std::size_t zc_threshold = 64 * 1024;  ///< writes of at least this many bytes may use SENDMSG_ZC (0: never)
    /// Writes up to this size, with nothing queued before them, first try one
    /// direct non-blocking sendmsg (no ring round trip); 0: always use the ring.
    std::size_t speculative_send = 16 * 1024;
    /// async_read destinations smaller than this are filled from the multishot
    /// receive (one copy, no recv SQE per read); larger ones get a recv straight
    /// into the destination. 8 KiB, DeepRec's zero-copy cut-off; 0: always direct.
    std::size_t copy_threshold = 8 * 1024;
    std::size_t read_ahead = 256 * 1024;   ///< unread bytes a connection may hold before its multishot recv pauses
    /// SO_SNDBUF of a connection whose peer is on this host (loopback or one of
    /// this host's addresses); 0: the kernel's autotuning, which connections to
    /// other hosts always keep (it covers their bandwidth-delay product). Over
    /// loopback an autotuned send queue of megabytes is released by ACKs, its
    /// segments arrive out of order, and TCP's spurious fast retransmits shrink
    /// the window (large-tensor bandwidth fell to 0.75x ZeroMQ's); a few hundred
    /// KiB in flight avoid that. 0, or 4 KiB to 1 GiB.
    std::size_t local_send_buffer = 256 * 1024;
    std::size_t fallback_read = 16 * 1024; ///< heap buffer per read_some when no ring buffer can be used
    bool multishot = true;                 ///< use multishot recv with provided buffers when the kernel has them
    bool keepalive = true;                 ///< SO_KEEPALIVE on every connection
    bool reuse_port = false;               ///< SO_REUSEPORT on listeners (one listener per reactor)
    int backlog = 1024;
  };

  uring_tcp() = default;
  /// Throws std::system_error(errc::invalid_argument) naming a bad field.
  explicit uring_tcp(config cfg) : config_(cfg) {
    if (config_.fallback_read < 512) {
      throw_error(errc::invalid_argument, "uring_tcp::config.fallback_read = " +
                                              std::to_string(config_.fallback_read) + ": must be at least 512");
    }
    detail::check_local_send_buffer("uring_tcp", config_.local_send_buffer);
    if (config_.read_ahead == 0) {
      throw_error(errc::invalid_argument, "uring_tcp::config.read_ahead = 0: must be at least 1");
    }
    if (config_.backlog < 1) {
      throw_error(errc::invalid_argument,
                  "uring_tcp::config.backlog = " + std::to_string(config_.backlog) + ": must be at least 1");
    }
  }

  static constexpr std::string_view name() noexcept { return "uring_tcp"; }
  const config& settings() const noexcept { return config_; }

  /// Connects to host:port from `reactor` (its thread only): `handler(error_code,
  /// uring_tcp_connection)`, never inline. Names are resolved with getaddrinfo
  /// (blocking); a bad host completes with errc::invalid_argument.
  template <connection_handler<uring_tcp_connection> H>
  void connect(uring_reactor& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    detail::pending_connect<uring_tcp_connection, uring_reactor> op(reactor, "uring_tcp", std::forward<H>(handler));
    detail::socket_address addr;
    if (!op.start(host, port, addr)) return;
    std::error_code ec;
    const int fd = detail::open_stream_socket(addr.family(), ec);
    if (fd < 0) return op.fail(ec);
    detail::ref_ptr<detail::uring_connection_state> state(new detail::uring_connection_state(reactor, fd, options()));
    state->connect(addr, op.release());
  }

  /// Takes the connected TCP socket `fd` (released by a connection on another
  /// reactor, say) and returns a connection on `reactor`, prepared as an
  /// accepted one. Call it on `reactor`'s thread. On failure `fd` is closed,
  /// `ec` says why and the connection is empty (see handoff_transport in concepts.hpp).
  uring_tcp_connection adopt(uring_reactor& reactor, int fd, std::error_code& ec) const {
    if (detail::start_adopt(reactor, "uring_tcp", fd, ec) < 0) return {};
    detail::ref_ptr<detail::uring_connection_state> state(new detail::uring_connection_state(reactor, fd, options()));
    ec = state->prepare();
    if (ec) return {};  // the state closes fd
    return uring_tcp_connection(std::move(state));
  }

  /// A listener on host:port (port 0: the kernel picks). Throws std::system_error naming the address.
  uring_tcp_listener listen(uring_reactor& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    uring_tcp_listener l = listen(reactor, host, port, ec);
    if (ec) {
      throw std::system_error(ec, "uring_tcp::listen(" + std::string(host) + ":" + std::to_string(port) + ")");
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  uring_tcp_listener listen(uring_reactor& reactor, std::string_view host, std::uint16_t port,
                            std::error_code& ec) const {
    detail::check_reactor_thread(reactor, "uring_tcp", "listen");
    const detail::socket_address addr = detail::resolve(host, port, ec);
    if (ec) return {};
    const int fd = detail::open_listener(addr, config_.backlog, config_.reuse_port, ec);
    if (fd < 0) return {};
    return uring_tcp_listener(
        detail::ref_ptr<detail::uring_listener_state>(new detail::uring_listener_state(reactor, fd, options())));
  }

 private:
  detail::uring_options options() const noexcept {
    return {config_.zero_copy, config_.zc_threshold, config_.speculative_send, config_.copy_threshold, config_.read_ahead,
            config_.fallback_read, config_.local_send_buffer, config_.keepalive, config_.multishot};
  }

  config config_;
};

static_assert(readahead_connection<uring_tcp_connection>);

}  // namespace v0
}  // namespace fusewire
