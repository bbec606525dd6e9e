#pragma once
/// asio_tcp: the portable TCP transport on Boost.Asio (epoll underneath), a
/// model of fusewire::transport. See transport/concepts.hpp for the contract.
///
/// Zero copy: async_write hands the kernel the caller's buffers as they are
/// (sendmsg of up to IOV_MAX of them per call, no gathering copy), at once when
/// nothing unsent is queued before it (earlier writes may still wait for their
/// completions to run; those run in call order); async_read reads straight into the
/// destination; async_read_some reads into a chunk (asio_tcp::config::read_chunk)
/// and hands out aliases of it, so nothing is copied after the kernel. An exact
/// read below asio_tcp::config::read_ahead_below reads ahead into the chunk
/// instead (one recv for a frame's header, meta and small payload, which the
/// following reads then copy out); a larger one first takes what was read
/// ahead, then reads the rest straight into its destination.
///
/// On a spinning reactor (poll mode, or adaptive), reads into the chunk are
/// plain non-blocking recvs made by the connection itself; when the socket has
/// nothing, the reactor tries the recv on every tick, as a busy-polling C
/// program does (asio_engine::config::spin_readers). Once such a recv got
/// bytes, the socket leaves Asio's epoll set (basic_socket::release()) until
/// Asio is needed again: registered, every message would run epoll's wake-up
/// in the sender's sendmsg. When the reactor stops reading it that way
/// (evicted, or about to sleep), the socket goes back to Asio, which waits for
/// it to be readable (and reads nothing). In block mode Asio reads into the chunk.
///
/// async_release (a move to another reactor; see handoff_transport in
/// concepts.hpp) takes the socket back from Asio (basic_socket::release(),
/// which aborts Asio's operations on it) and hands it out once their handlers
/// ran, non-blocking and close-on-exec whatever Asio left it as; unless the
/// chunk holds bytes no read consumed (read ahead before the release, or by a
/// receive Asio had finished but not yet delivered), or an exact read or a
/// write was cut in half: then the socket is closed.

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/container/small_vector.hpp>

#include <fusewire/util/small_fifo.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/received.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_connection.hpp>
#include <fusewire/transport/detail/thread_check.hpp>

namespace fusewire {
inline namespace v0 {

class asio_tcp_connection;
class asio_tcp_listener;

namespace detail {

/// Asio's errors in the transports' terms; every error after a local close is errc::cancelled.
inline std::error_code from_asio(const boost::system::error_code& ec, bool closed_locally) {
  if (!ec) return {};
  if (closed_locally || ec == boost::asio::error::operation_aborted) return make_error_code(errc::cancelled);
  if (ec == boost::asio::error::eof) return make_error_code(errc::connection_closed);
  if (ec.category() == boost::system::system_category()) return from_errno(ec.value());
  return ec;  // Boost.System converts to std::error_code
}

/// Asio's composed read completion condition without its 64 KiB cap per system
/// call (transfer_all hands the kernel at most 65536 bytes per readv, so a 6 MB
/// payload costs ~100 calls and as many reactor turns).
struct transfer_everything {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::size_t{1} << 30;
  }
};

}  // namespace detail

/// What one asio_tcp connection did; for tests, benchmarks and diagnostics.
struct asio_tcp_stats {
  std::uint64_t bytes_sent = 0;  ///< handed to the kernel (sendmsg)
  std::uint64_t bytes_received = 0;
  std::uint64_t recvs = 0;         ///< plain non-blocking recvs into the read chunk that got bytes (spinning reactor)
  std::uint64_t spin_reads = 0;    ///< of those, the ones made from the reactor's spin (asio_engine::watch())
  std::uint64_t waits = 0;         ///< waits for the socket to be readable (spinning reactor)
  std::uint64_t detaches = 0;      ///< times the socket left Asio's epoll set for plain recvs (spinning reactor)
  std::uint64_t chunk_reads = 0;   ///< Asio reads into the read chunk (a reactor that never spins)
  std::uint64_t direct_reads = 0;  ///< Asio reads straight into an exact read's destination
};

namespace detail {

struct asio_options {
  std::size_t read_chunk;
  bool keepalive;
  std::size_t read_ahead_below;
  std::size_t local_send_buffer;
};

/// A write queued on an asio_connection_state (outside the class, so that its
/// queue can check it is default-constructible while the class is incomplete).
struct asio_write_op {
  boost::container::small_vector<boost::asio::const_buffer, 4> buffers;
  util::unique_function<void(std::error_code, std::size_t)> handler;
  std::error_code preset;   // started on a closed connection
  std::size_t written = 0;  // bytes sent so far
};

/// One TCP connection's state, shared by its handle and its in-flight Asio
/// operations (which hold a ref_ptr until their handler ran).
class asio_connection_state final : public stream_connection<asio_connection_state, asio_reactor>,
                                    public spin_reader {
 public:
  using socket_type = boost::asio::ip::tcp::socket;

  asio_connection_state(asio_reactor& reactor, socket_type socket, asio_options opts)
      : stream_connection(reactor), socket_(std::move(socket)), opts_(opts) {}

  ~asio_connection_state() override {
    unlink();
    if (released_fd_ >= 0) ::close(released_fd_);
    if (detached_fd_ >= 0) ::close(detached_fd_);
  }

  int native_handle() noexcept { return detached_fd_ >= 0 ? detached_fd_ : socket_ ? socket_->native_handle() : -1; }
  const asio_tcp_stats& stats() const noexcept { return stats_; }

  /// Applies TCP_NODELAY/SO_KEEPALIVE (and SO_SNDBUF to a peer on this host)
  /// and remembers the peer's address.
  std::error_code prepare() {
    const int fd = socket_->native_handle();
    peer_ = peer_name(fd);
    return set_stream_options(fd, opts_.keepalive, peer_is_local(fd) ? opts_.local_send_buffer : 0);
  }

  template <class H>
  void async_write(std::span<const const_buffer> sg, H&& handler) {
    reactor_->work_started();
    write_op op;
    op.handler = std::forward<H>(handler);
    op.buffers.reserve(sg.size());
    for (const_buffer b : sg) {
      if (!b.empty()) op.buffers.emplace_back(b.data(), b.size());
    }
    if (!open_) op.preset = make_error_code(errc::connection_closed);
    const bool direct = writes_.empty() && !writing_ && open_ && !write_error_;
    writes_.push_back(std::move(op));
    if (direct) {
      start_write();  // Asio never completes inline
    } else {
      write_task_.schedule(*reactor_);
    }
  }

  /// Starts the connect; `on_done(error_code)` runs once, from Asio's handler.
  template <class F>
  void connect(const boost::asio::ip::tcp::endpoint& endpoint, F&& on_done) {
    connecting_ = true;
    socket_->async_connect(endpoint, [self = ref_ptr<asio_connection_state>(this),
                                      f = std::forward<F>(on_done)](const boost::system::error_code& ec) mutable {
      self->connecting_ = false;
      std::error_code e = from_asio(ec, !self->open_);
      if (!e) e = self->prepare();
      if (e) self->close();
      self->let_go_if_idle();
      f(e);
    });
  }

 private:
  friend stream_connection;
  using write_op = asio_write_op;

  static constexpr const char* release_no_memory = "asio_tcp: could not post a release's completion (out of memory)";

  // ---- stream_connection's hooks ----

  /// Closes the socket: the operation Asio is running completes through its
  /// own handler (errc::cancelled); the queued ones after it, in call order.
  void close_stream() noexcept {
    boost::system::error_code ignored;
    if (socket_) socket_->close(ignored);
    if (detached_fd_ >= 0) ::close(std::exchange(detached_fd_, -1));
    chunk_.reset();
    chunk_used_ = 0;
  }

  /// Takes the socket back from Asio (basic_socket::release(), which aborts
  /// Asio's operations on it); the fd is handed out once their handlers ran.
  void begin_release() noexcept {
    boost::system::error_code ec;
    released_fd_ = detached_fd_ >= 0 ? std::exchange(detached_fd_, -1) : socket_->release(ec);
    if (ec) {
      release_.fail(from_asio(ec, false));
      released_fd_ = -1;
      socket_->close(ec);
    }
  }

  void abort_handoff() noexcept {
    if (released_fd_ >= 0) ::close(std::exchange(released_fd_, -1));
  }

  int take_released_fd() noexcept {
    chunk_.reset();
    chunk_used_ = 0;
    return std::exchange(released_fd_, -1);
  }

  bool writes_pending() const noexcept { return !writes_.empty(); }
  bool may_take_ahead(std::size_t) const noexcept { return !reading_; }
  void took_ahead(std::size_t) noexcept {}
  void dropped_ahead() noexcept {}
  bool may_start_read(const read_op&) const noexcept { return !reading_; }
  // Never completes inline: bytes read now are served by the posted pump.
  void start_first_read() {
    if (start_read()) read_task_.schedule(*reactor_);
  }

  /// Why queued operations fail now (or no error: they may run).
  std::error_code write_failure() const {
    if (!open_) return make_error_code(errc::cancelled);
    return write_error_;
  }
  std::error_code read_failure() const {
    if (!open_) return make_error_code(errc::cancelled);
    return read_error_;
  }

  void pump_writes() {
    ref_ptr<asio_connection_state> guard(this);
    finish_sent();
    while (!writing_ && !writes_.empty()) {
      const std::error_code ec = writes_.front().preset ? writes_.front().preset : write_failure();
      if (!ec) {
        start_write();
        break;
      }
      write_op op = std::move(writes_.front());
      writes_.pop_front();
      complete(op.handler, ec, std::size_t{0});
    }
    let_go_if_idle();
  }

  void start_write() {
    writing_ = true;
    send_some();
  }

  // Sends what the socket takes of the front write, with sendmsg calls of up
  // to IOV_MAX buffers (a fused frame's hundreds of segments go in one or two
  // calls; Asio's composed write passes at most 16 buffers per call). All
  // sent: the completion is posted (never inline), and the next queued write
  // goes out at once, as does a write started before that completion ran (a
  // reactor task that writes frame after frame has each leave as it is made,
  // so the peer works on the first while this side makes the next). The
  // socket is full: waits until it is writable and goes on.
  void send_some() {
    for (;;) {
      write_op& op = writes_.front();
      if (!send_front(op)) return;
      sent_.push_back(std::move(op));
      writes_.pop_front();
      written_task_.schedule(*reactor_);
      if (writes_.empty() || write_failure() || writes_.front().preset) {
        writing_ = false;
        return;
      }
    }
  }

  // send_some() for one write: true once all its bytes are sent; false if it
  // waits for the socket or failed (its completion is then on its way).
  bool send_front(write_op& op) {
    while (!op.buffers.empty()) {
      const std::size_t count = std::min<std::size_t>(op.buffers.size(), IOV_MAX);
      iov_.resize(count);
      std::size_t asked = 0;
      for (std::size_t i = 0; i < count; ++i) {
        iov_[i].iov_base = const_cast<void*>(op.buffers[i].data());
        iov_[i].iov_len = op.buffers[i].size();
        asked += op.buffers[i].size();
      }
      msghdr msg{};
      msg.msg_iov = iov_.data();
      msg.msg_iovlen = count;
      const ssize_t r = ::sendmsg(native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) break;
        post_written(boost::system::error_code(err, boost::system::system_category()));
        return false;
      }
      consume(op, static_cast<std::size_t>(r));
      stats_.bytes_sent += static_cast<std::size_t>(r);
      if (static_cast<std::size_t>(r) < asked) break;  // the send buffer is full
    }
    if (op.buffers.empty()) return true;
    if (const boost::system::error_code e = attach()) {
      post_written(e);
      return false;
    }
    socket_->async_wait(boost::asio::socket_base::wait_write,
                        [self = ref_ptr<asio_connection_state>(this)](const boost::system::error_code& ec) {
                          if (ec) return self->on_written(ec);
                          if (!self->open_) return self->on_written(boost::asio::error::operation_aborted);
                          self->send_some();
                        });
    return false;
  }

  /// Completes the writes sent in full, in order (before anything queued after them).
  void finish_sent() {
    while (!sent_.empty()) {
      write_op op = std::move(sent_.front());
      sent_.pop_front();
      complete(op.handler, std::error_code{}, op.written);
    }
  }

  /// Drops the first `n` bytes of `op`'s buffers (sent).
  static void consume(write_op& op, std::size_t n) {
    op.written += n;
    std::size_t first = 0;
    while (first < op.buffers.size() && n >= op.buffers[first].size()) n -= op.buffers[first++].size();
    op.buffers.erase(op.buffers.begin(), op.buffers.begin() + static_cast<std::ptrdiff_t>(first));
    if (!op.buffers.empty()) op.buffers.front() += n;
  }

  void on_written(const boost::system::error_code& ec) {
    finish_sent();
    writing_ = false;
    write_op op = std::move(writes_.front());
    writes_.pop_front();
    const std::error_code e = from_asio(ec, !open_);
    if (e && open_ && !write_error_) write_error_ = e;
    if (op.written != 0 && !op.buffers.empty()) release_.lose_stream();  // the peer got half
    complete(op.handler, e, op.written);
    pump_writes();
  }

  // The front write failed: its completion runs from the reactor's queue
  // (after those of the writes sent before it); writing_ holds until on_written ran.
  void post_written(boost::system::error_code ec) {
    written_ec_ = ec;
    written_failed_ = true;
    written_task_.schedule(*reactor_);
  }
  void run_written() {
    if (!std::exchange(written_failed_, false)) return pump_writes();  // writes sent in full
    on_written(written_ec_);
  }

  /// Serves the queued reads, in order, from what was read ahead; reads the
  /// socket for the first one that needs more (or fails them on an error).
  void pump_reads() {
    ref_ptr<asio_connection_state> guard(this);
    detail::read_pump::pass pass(reads_pump_);
    while (!reading_ && !reads_.empty()) {
      if (!pass.serve()) {
        read_task_.schedule(*reactor_);
        break;
      }
      read_op& front = reads_.front();
      if (!front.preset && open_) {
        if (front.some && !ahead_.empty()) {
          read_op op = pop_read();
          tensor_buffer b = std::move(ahead_.front());
          ahead_.pop_front();
          complete(op.some, std::error_code(), std::move(b));
          continue;
        }
        if (front.exact) take_received(ahead_, front.dst, front.filled);
        if (front.exact && front.filled == front.dst.size()) {
          read_op op = pop_read();
          complete(op.exact, std::error_code(), op.filled);
          continue;
        }
      }
      const std::error_code ec = front.preset ? front.preset : read_failure();
      if (!ec) {
        if (start_read()) continue;  // bytes (or an error) to serve now
        break;
      }
      read_op op = pop_read();
      fail_read(op, ec);
    }
    let_go_if_idle();
  }

  // The front read needs bytes from the socket. An exact read of at least
  // read_ahead_below bytes gets them straight into its destination, through
  // Asio. Anything else reads what there is into the chunk (handed out, or
  // read ahead): through Asio on a reactor that never spins (block mode);
  // otherwise with a plain non-blocking recv of our own, and if there is
  // nothing yet the spinning reactor tries the recv each tick (spin_read);
  // when it stops (spin_stopped), Asio waits for the socket to be readable
  // (and reads nothing). Every byte of the stream is read by this thread in
  // order, whichever comes first. (A wait costs Asio an epoll_ctl to re-arm
  // the socket, which its own reads avoid; a sleeping reactor gains nothing
  // from the recv of our own.)
  // True: bytes (or the socket's error) arrived now, for the pump to serve.
  bool start_read() {
    read_op& op = reads_.front();
    const bool direct = is_direct(op);
    if ((direct || !reactor_->engine().spin_reads()) && !read_error_) {
      if (const boost::system::error_code e = attach()) {
        read_error_ = from_asio(e, false);
        return true;
      }
    }
    auto on_done = [self = ref_ptr<asio_connection_state>(this), direct](const boost::system::error_code& ec,
                                                                          std::size_t n) {
      self->on_read(direct, ec, n);
    };
    if (direct) {
      reading_ = true;
      ++stats_.direct_reads;
      boost::asio::async_read(*socket_, boost::asio::buffer(op.dst.data() + op.filled, op.dst.size() - op.filled),
                              transfer_everything{}, std::move(on_done));
      return false;
    }
    const std::size_t room = chunk_room(op);
    if (!reactor_->engine().spin_reads()) {
      reading_ = true;
      ++stats_.chunk_reads;
      socket_->async_read_some(boost::asio::buffer(chunk_.data() + chunk_used_, room), std::move(on_done));
      return false;
    }
    if (recv_chunk(room)) return true;
    reactor_->engine().watch(*this);
    return false;
  }

  // Whether a queued read may take the socket's next bytes: open, no Asio
  // read in flight, no error, the front read not failed in advance.
  bool front_may_read() noexcept {
    return open_ && !reading_ && !read_error_ && !reads_.empty() && !reads_.front().preset;
  }

  // Whether the front read waits for bytes into the chunk with nothing of
  // Asio's in flight for it: what the spinning reactor's recvs serve.
  bool waits_for_chunk() noexcept {
    return front_may_read() && !waiting_ && ahead_.empty() && !is_direct(reads_.front());
  }

  // The socket leaves Asio's epoll set while the spinning reactor reads it with
  // plain recvs (see the file comment): only with no Asio operation on it
  // (basic_socket::release() would abort them). The fd stays open here.
  void detach() noexcept {
    if (detached_fd_ >= 0 || !open_ || reading_ || waiting_ || writing_ || connecting_ || !socket_) return;
    boost::system::error_code ec;
    const boost::asio::ip::tcp protocol = socket_->local_endpoint(ec).protocol();
    if (ec) return;
    const int fd = socket_->release(ec);
    if (ec || fd < 0) return;
    detached_fd_ = fd;
    protocol_ = protocol;
    ++stats_.detaches;
  }

  // Back into Asio's epoll set (an epoll_ctl), before any Asio operation.
  // Fails only if Asio cannot register it (out of memory, epoll's limits).
  boost::system::error_code attach() noexcept {
    if (detached_fd_ < 0) return {};
    boost::system::error_code ec;
    try {
      socket_->assign(protocol_, detached_fd_, ec);
    } catch (const std::bad_alloc&) {
      ec = boost::asio::error::no_memory;
    }
    if (!ec) detached_fd_ = -1;
    return ec;
  }

  // Whether `op`'s bytes go straight into its destination (an exact read of at
  // least read_ahead_below bytes still to fill) rather than through the chunk.
  bool is_direct(const read_op& op) const noexcept {
    return op.exact && op.dst.size() - op.filled >= opts_.read_ahead_below;
  }

  // Makes room in the chunk for a read into it for `op` (not a direct read);
  // how many bytes that read may take.
  std::size_t chunk_room(const read_op& op) {
    if (chunk_.size() - chunk_used_ < min_chunk_tail) {
      chunk_ = tensor_buffer::allocate(opts_.read_chunk);
      chunk_used_ = 0;
    }
    // Reading ahead for a small exact read takes at most read_ahead_below bytes,
    // so a large payload behind a small header is not copied out of the chunk.
    std::size_t room = chunk_.size() - chunk_used_;
    if (op.exact) room = std::min(room, std::max(opts_.read_ahead_below, op.dst.size() - op.filled));
    return room;
  }

  // `n` bytes arrived at the chunk's end: read ahead.
  void chunk_filled(std::size_t n) {
    stats_.bytes_received += n;
    ahead_.push_back(chunk_.share(chunk_used_, n));
    chunk_used_ += n;
    if (chunk_.size() - chunk_used_ < min_chunk_tail) {
      chunk_.reset();
      chunk_used_ = 0;
    }
  }

  // One non-blocking recv of at most `room` bytes into the chunk (chunk_room()
  // made them). True: bytes were read ahead, or the socket's error (or its
  // end) went to read_error_.
  bool recv_chunk(std::size_t room) {
    ssize_t n;
    do {
      n = ::recv(native_handle(), chunk_.data() + chunk_used_, room, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return false;
      if (!read_error_) read_error_ = from_errno(err);
      return true;
    }
    if (n == 0) {
      if (!read_error_) read_error_ = make_error_code(errc::connection_closed);
      return true;
    }
    ++stats_.recvs;
    chunk_filled(static_cast<std::size_t>(n));
    return true;
  }

  /// A spinning reactor's recv (see asio_engine::watch()) while the front read
  /// waits for the socket to be readable.
  result spin_read() override {
    if (!front_may_read()) return result::done;
    if (!ahead_.empty()) return result::idle;  // the pump has bytes to serve first (it is posted)
    const read_op& front = reads_.front();
    if (is_direct(front)) return result::done;
    if (!recv_chunk(chunk_room(front))) return result::idle;
    if (!read_error_) {
      ++stats_.spin_reads;
      detach();  // the connection is hot and these recvs serve it
    }
    pump_reads();  // may watch this again
    return result::read;
  }

  /// The reactor stopped reading this with plain recvs (evicted, said done, or
  /// about to sleep): a read still waiting for the chunk gets Asio's wait.
  void spin_stopped() noexcept override {
    if (!waits_for_chunk()) return;
    if (const boost::system::error_code e = attach()) {
      read_error_ = from_asio(e, false);
      read_task_.schedule(*reactor_);
      return;
    }
    try {
      waiting_ = true;
      ++stats_.waits;
      socket_->async_wait(boost::asio::socket_base::wait_read,
                          [self = ref_ptr<asio_connection_state>(this)](const boost::system::error_code& ec) {
                            self->on_readable(ec);
                          });
    } catch (const std::bad_alloc&) {
      waiting_ = false;
      read_error_ = make_error_code(errc::out_of_memory);
      read_task_.schedule(*reactor_);
    }
  }

  void on_readable(const boost::system::error_code& ec) {
    waiting_ = false;
    const std::error_code e = from_asio(ec, !open_);
    if (e && open_ && !read_error_) read_error_ = e;
    pump_reads();
  }

  // Asio's read finished: into the front read's destination (`direct`), or into the chunk.
  void on_read(bool direct, const boost::system::error_code& ec, std::size_t n) {
    reading_ = false;
    const std::error_code e = from_asio(ec, !open_);
    if (e && open_ && !read_error_) read_error_ = e;
    if (direct) {
      stats_.bytes_received += n;
      read_op op = pop_read();
      if (e && op.filled + n != 0) release_.lose_stream();
      complete(op.exact, e, op.filled + n);
    } else if (!e && n != 0 && !chunk_.empty()) {
      // (An empty chunk: close() ran between Asio's read and this handler, and
      // dropped the chunk; the bytes go with the closed stream.)
      chunk_filled(n);
    }
    pump_reads();
  }

  /// Drops the Asio socket object once closed and idle, so nothing of this
  /// state touches the io_context after the reactor stopped. A release is
  /// finished then: no Asio handler of this connection is left to run.
  void let_go_if_idle() noexcept {
    if (open_ || reading_ || waiting_ || writing_ || connecting_) return;
    socket_.reset();
    post_release_finish();
  }

  static constexpr std::size_t min_chunk_tail = 2048;

  std::optional<socket_type> socket_;
  asio_options opts_;
  bool reading_ = false;  // an Asio read is in flight (into the chunk, or into the front read's destination)
  bool writing_ = false;
  bool connecting_ = false;
  bool waiting_ = false;  // an Asio wait for the socket to be readable is in flight
  member_task<asio_connection_state> written_task_{*this, &asio_connection_state::run_written};  ///< post_written
  boost::system::error_code written_ec_;  ///< what post_written passes on
  bool written_failed_ = false;           ///< post_written ran: the front write failed with written_ec_
  int released_fd_ = -1;  // taken back from Asio, until the release's handler has it
  int detached_fd_ = -1;  // out of Asio's epoll set (detach()), until attach() or close
  boost::asio::ip::tcp protocol_ = boost::asio::ip::tcp::v4();  ///< for attach()
  util::small_fifo<write_op> writes_;
  util::small_fifo<write_op> sent_;  ///< sent in full, before writes_; completed (in order) by written_task_
  std::vector<iovec> iov_;  ///< send_some's iovec array, kept between calls
  tensor_buffer chunk_;
  std::size_t chunk_used_ = 0;
  asio_tcp_stats stats_;
};

class asio_listener_state;

}  // namespace detail

namespace detail {
/// Names for error messages.
struct asio_tcp_connection_name {
  static constexpr const char* value = "asio_tcp_connection";
};
struct asio_tcp_listener_name {
  static constexpr const char* value = "asio_tcp_listener";
};

}  // namespace detail

/// A TCP connection on an asio_reactor; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
class asio_tcp_connection
    : public detail::basic_connection_handle<detail::asio_connection_state, asio_reactor, detail::asio_tcp_connection_name> {
 public:
  asio_tcp_connection() noexcept = default;

  /// Counters of this connection (zeros for an empty handle).
  asio_tcp_stats stats() const noexcept { return state_ ? state_->stats() : asio_tcp_stats{}; }

 private:
  friend class asio_tcp;
  friend class detail::asio_listener_state;

  explicit asio_tcp_connection(detail::ref_ptr<detail::asio_connection_state> s) noexcept
      : basic_connection_handle(std::move(s)) {}
};

namespace detail {

/// A listening socket's state, shared by its handle and its pending accept.
class asio_listener_state final : public ref_counted, public closable {
 public:
  using handler_type = util::unique_function<void(std::error_code, asio_tcp_connection)>;

  asio_listener_state(asio_reactor& reactor, boost::asio::ip::tcp::acceptor acceptor, std::uint16_t port,
                      asio_options opts)
      : reactor_(&reactor), acceptor_(std::move(acceptor)), port_(port), opts_(opts) {
    reactor_->add_closable(*this);
  }
  ~asio_listener_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
  }

  asio_reactor& reactor() const noexcept { return *reactor_; }
  std::uint16_t port() const noexcept { return port_; }
  bool is_open() const noexcept { return open_; }

  void async_accept(handler_type handler) {
    reactor_->work_started();
    if (!open_) {
      reactor_->post([this, self = ref_ptr<asio_listener_state>(this), h = std::move(handler)]() mutable {
        complete(h, make_error_code(errc::connection_closed));
      });
      return;
    }
    pending_.push_back(std::move(handler));
    start_accept();
  }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
    while (pending_.size() > (accepting_ ? 1u : 0u)) {
      handler_type h = std::move(pending_.back());
      pending_.pop_back();
      reactor_->post([this, self = ref_ptr<asio_listener_state>(this), h = std::move(h)]() mutable {
        complete(h, make_error_code(errc::cancelled));
      });
    }
    if (!accepting_) acceptor_.reset();
  }

  void shutdown() noexcept override { close(); }

 private:
  void start_accept() {
    if (accepting_ || pending_.empty() || !open_) return;
    accepting_ = true;
    acceptor_->async_accept([self = ref_ptr<asio_listener_state>(this)](const boost::system::error_code& ec,
                                                                        boost::asio::ip::tcp::socket socket) {
      self->on_accept(ec, std::move(socket));
    });
  }

  void on_accept(const boost::system::error_code& ec, boost::asio::ip::tcp::socket socket) {
    accepting_ = false;
    handler_type h = std::move(pending_.front());
    pending_.pop_front();
    std::error_code e = from_asio(ec, !open_);
    asio_tcp_connection conn;
    if (!e) {
      ref_ptr<asio_connection_state> state(new asio_connection_state(*reactor_, std::move(socket), opts_));
      e = state->prepare();
      if (!e) conn = asio_tcp_connection(std::move(state));
    }
    complete(h, e, std::move(conn));
    if (!open_) {
      acceptor_.reset();
    } else {
      start_accept();
    }
  }

  void complete(handler_type& h, std::error_code ec, asio_tcp_connection conn = {}) {
    reactor_->work_finished();
    reactor_->invoke(h, ec, std::move(conn));
  }

  asio_reactor* reactor_;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor_;
  std::uint16_t port_;
  asio_options opts_;
  bool open_ = true;
  bool accepting_ = false;
  std::deque<handler_type> pending_;
};

}  // namespace detail

/// A listening TCP socket on an asio_reactor; a model of fusewire::listener.
class asio_tcp_listener
    : public detail::basic_listener_handle<detail::asio_listener_state, asio_tcp_connection, detail::asio_tcp_listener_name> {
 public:
  asio_tcp_listener() noexcept = default;

 private:
  friend class asio_tcp;
  explicit asio_tcp_listener(detail::ref_ptr<detail::asio_listener_state> s) noexcept
      : basic_listener_handle(std::move(s)) {}
};

/// The Boost.Asio TCP transport; a model of fusewire::transport. Cheap to copy
/// (it is only its config).
class asio_tcp {
 public:
  using transport_concept = transport_tag;
  using reactor_type = asio_reactor;
  using connection_type = asio_tcp_connection;
  using listener_type = asio_tcp_listener;

  struct config {
    std::size_t read_chunk = 32 * 1024;  ///< bytes async_read_some reads at most (one chunk per connection)
    /// An exact read of fewer bytes reads ahead into the chunk (one recv for a
    /// frame's header, meta and small payload); 0 = every exact read goes
    /// straight into its destination.
    std::size_t read_ahead_below = 4096;
    /// SO_SNDBUF of a connection whose peer is on this host; 0: the kernel's
    /// autotuning (see uring_tcp::config::local_send_buffer). 0, or 4 KiB to 1 GiB.
    std::size_t local_send_buffer = 256 * 1024;
    bool keepalive = true;               ///< SO_KEEPALIVE on every connection
    bool reuse_port = false;             ///< SO_REUSEPORT on listeners (one listener per reactor)
    int backlog = 1024;
  };

  asio_tcp() = default;
  /// Throws std::system_error(errc::invalid_argument) for a read_chunk under 4 KiB or a backlog < 1.
  explicit asio_tcp(config cfg) : config_(cfg) {
    detail::check_local_send_buffer("asio_tcp", config_.local_send_buffer);
    if (config_.read_chunk < 4096) {
      throw_error(errc::invalid_argument, "asio_tcp::config.read_chunk = " + std::to_string(config_.read_chunk) +
                                              ": must be at least 4096");
    }
    if (config_.backlog < 1) {
      throw_error(errc::invalid_argument,
                  "asio_tcp::config.backlog = " + std::to_string(config_.backlog) + ": must be at least 1");
    }
  }

  static constexpr std::string_view name() noexcept { return "asio_tcp"; }
  const config& settings() const noexcept { return config_; }

  /// Connects to host:port from `reactor` (its thread only): `handler(error_code,
  /// asio_tcp_connection)`, never inline. A host name is resolved with getaddrinfo
  /// (blocking); a bad host completes with errc::invalid_argument.
  template <connection_handler<asio_tcp_connection> H>
  void connect(asio_reactor& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    detail::pending_connect<asio_tcp_connection, asio_reactor> op(reactor, "asio_tcp", std::forward<H>(handler));
    detail::socket_address addr;
    if (!op.start(host, port, addr)) return;
    boost::asio::ip::tcp::endpoint endpoint;
    std::memcpy(endpoint.data(), addr.get(), addr.size);
    endpoint.resize(addr.size);
    boost::asio::ip::tcp::socket socket(reactor.engine().context());
    detail::ref_ptr<detail::asio_connection_state> state(
        new detail::asio_connection_state(reactor, std::move(socket), options()));
    state->connect(endpoint, [op = std::move(op), state](std::error_code e) mutable {
      asio_tcp_connection conn;
      if (!e) conn = asio_tcp_connection(std::move(state));
      state.reset();
      op.finish(e, std::move(conn));
    });
  }

  /// Takes the connected TCP socket `fd` (released by a connection on another
  /// reactor, say) and returns a connection on `reactor`, prepared as an
  /// accepted one. Call it on `reactor`'s thread. On failure `fd` is closed,
  /// `ec` says why and the connection is empty (see handoff_transport in concepts.hpp).
  asio_tcp_connection adopt(asio_reactor& reactor, int fd, std::error_code& ec) const {
    const int family = detail::start_adopt(reactor, "asio_tcp", fd, ec);
    if (family < 0) return {};
    boost::asio::ip::tcp::socket socket(reactor.engine().context());
    boost::system::error_code bec;
    socket.assign(family == AF_INET6 ? boost::asio::ip::tcp::v6() : boost::asio::ip::tcp::v4(), fd, bec);
    if (bec) {
      ::close(fd);
      ec = detail::from_asio(bec, false);
      return {};
    }
    detail::ref_ptr<detail::asio_connection_state> state(
        new detail::asio_connection_state(reactor, std::move(socket), options()));
    ec = state->prepare();
    if (ec) return {};  // the socket closes fd
    return asio_tcp_connection(std::move(state));
  }

  /// A listener on host:port (port 0: the kernel picks; see port()). Throws
  /// std::system_error naming the address on failure.
  asio_tcp_listener listen(asio_reactor& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    asio_tcp_listener l = listen(reactor, host, port, ec);
    if (ec) {
      throw std::system_error(ec, "asio_tcp::listen(" + std::string(host) + ":" + std::to_string(port) + ")");
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  asio_tcp_listener listen(asio_reactor& reactor, std::string_view host, std::uint16_t port,
                           std::error_code& ec) const {
    detail::check_reactor_thread(reactor, "asio_tcp", "listen");
    const detail::socket_address addr = detail::resolve(host, port, ec);
    if (ec) return {};
    const int fd = detail::open_listener(addr, config_.backlog, config_.reuse_port, ec);
    if (fd < 0) return {};
    const std::uint16_t bound = detail::local_port(fd);
    boost::system::error_code bec;
    boost::asio::ip::tcp::acceptor acceptor(reactor.engine().context());
    acceptor.assign(addr.family() == AF_INET6 ? boost::asio::ip::tcp::v6() : boost::asio::ip::tcp::v4(), fd, bec);
    if (bec) {
      ::close(fd);
      ec = detail::from_asio(bec, false);
      return {};
    }
    return asio_tcp_listener(detail::ref_ptr<detail::asio_listener_state>(
        new detail::asio_listener_state(reactor, std::move(acceptor), bound, options())));
  }

 private:
  detail::asio_options options() const noexcept {
    return {config_.read_chunk, config_.keepalive, config_.read_ahead_below, config_.local_send_buffer};
  }

  config config_;
};

static_assert(readahead_connection<asio_tcp_connection>);

}  // namespace v0
}  // namespace fusewire
