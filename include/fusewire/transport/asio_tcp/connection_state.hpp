#pragma once
/// asio_tcp's connection state: what it holds, its setup, and the hooks of
/// the shared stream_connection base; the read and write paths are defined in
/// asio_tcp/read.hpp and asio_tcp/write.hpp.

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/container/small_vector.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/util/small_fifo.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/asio_tcp/options.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_connection.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

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
class asio_connection_state final : public stream_connection<asio_connection_state, asio_reactor>, public spin_reader {
 public:
  using socket_type = boost::asio::ip::tcp::socket;
  static constexpr const char* handle_name = "asio_tcp_connection";

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
  void async_write(std::span<const const_buffer> sg, H&& handler);

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
  /// An empty exact read needs no bytes: the posted pump completes it.
  bool may_start_read(const read_op& op) const noexcept { return !reading_ && (op.some || !op.dst.empty()); }
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

  // The socket leaves Asio's epoll set while the spinning reactor reads it with
  // plain recvs (see asio_tcp.hpp): only with no Asio operation on it
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

  // ---- the write path (asio_tcp/write.hpp) ----
  void pump_writes();
  void start_write();
  void send_some();
  bool send_front(write_op& op);
  void finish_sent();
  static void consume(write_op& op, std::size_t n);
  void on_written(const boost::system::error_code& ec);
  void post_written(boost::system::error_code ec);
  void run_written();

  // ---- the read path (asio_tcp/read.hpp) ----
  void pump_reads();
  bool start_read();
  bool front_may_read() noexcept;
  bool waits_for_chunk() noexcept;
  bool is_direct(const read_op& op) const noexcept;
  std::size_t chunk_room(const read_op& op);
  void chunk_filled(std::size_t n);
  bool recv_chunk(std::size_t room);
  inline result spin_read() override;
  inline void spin_stopped() noexcept override;
  void on_readable(const boost::system::error_code& ec);
  void on_read(bool direct, const boost::system::error_code& ec, std::size_t n);

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
  int released_fd_ = -1;                  // taken back from Asio, until the release's handler has it
  int detached_fd_ = -1;                  // out of Asio's epoll set (detach()), until attach() or close
  boost::asio::ip::tcp protocol_ = boost::asio::ip::tcp::v4();  ///< for attach()
  util::small_fifo<write_op> writes_;
  util::small_fifo<write_op> sent_;  ///< sent in full, before writes_; completed (in order) by written_task_
  std::vector<iovec> iov_;           ///< send_some's iovec array, kept between calls
  tensor_buffer chunk_;
  std::size_t chunk_used_ = 0;
  asio_tcp_stats stats_;
};

}  // namespace detail

}  // namespace v0
}  // namespace fusewire

// The read path defines the spin_reader overrides this class declares: a
// translation unit that includes only this header must see them too.
#include <fusewire/transport/asio_tcp/read.hpp>
