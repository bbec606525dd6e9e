#pragma once
/// The public connection and listener handles of the transports: move-only
/// owners of a ref-counted state (transport/detail/ref_counted.hpp) that check
/// the calling thread and forward to it. Each transport derives its named
/// handle from these and adds what is its own (constructors for its friends,
/// counters, verbs' one-sided writes). Also the start and end that every
/// transport's connect() shares (pending_connect), and the start of the TCP
/// transports' adopt() (start_adopt). Private to the transport layer.

#include <unistd.h>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/thread_check.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// A connection state as the handles use it.
template <class S>
concept handle_connection_state = requires(S& s, const S& cs) {
  s.close();
  { cs.is_open() } -> std::same_as<bool>;
  { cs.peer() } -> std::convertible_to<std::string>;
  cs.reactor();
};

/// A connection state over a file descriptor (the TCP transports; not verbs).
template <class S>
concept fd_connection_state = requires(S& s) {
  { s.native_handle() } -> std::convertible_to<int>;
};

/// A connection state that can give up its socket (the TCP transports: see
/// handoff_transport in concepts.hpp).
template <class S>
concept releasable_connection_state = requires(S& s, release_handler_archetype h) { s.async_release(std::move(h)); };

/// A listener state as the handles use it.
template <class S>
concept handle_listener_state = requires(S& s, const S& cs) {
  s.close();
  { cs.is_open() } -> std::same_as<bool>;
  { cs.port() } -> std::convertible_to<std::uint16_t>;
  cs.reactor();
};

/// Names a handle type in error messages ("asio_tcp_connection").
template <class N>
concept handle_name = requires {
  { N::value } -> std::convertible_to<const char*>;
};

/// Move-only connection handle over `State`; destroying it closes it. Use it on its reactor's thread only.
template <handle_connection_state State, class Reactor, handle_name Name>
class basic_connection_handle {
 public:
  using connection_concept = connection_tag;
  using reactor_type = Reactor;

  /// An empty handle (not open); what a failed connect or accept delivers.
  basic_connection_handle() noexcept = default;
  basic_connection_handle(basic_connection_handle&&) noexcept = default;
  basic_connection_handle& operator=(basic_connection_handle&& other) noexcept {
    if (this != &other) {
      close();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  basic_connection_handle(const basic_connection_handle&) = delete;
  basic_connection_handle& operator=(const basic_connection_handle&) = delete;
  ~basic_connection_handle() { close(); }

  /// Writes every byte of `sg`, in order (see concepts.hpp and the transport's header comment).
  template <io_handler H>
  void async_write(std::span<const const_buffer> sg, H&& handler) {
    state("async_write").async_write(sg, std::forward<H>(handler));
  }

  /// Fills exactly `dst`.
  template <io_handler H>
  void async_read(mutable_buffer dst, H&& handler) {
    state("async_read").async_read(dst, std::forward<H>(handler));
  }

  /// Delivers bytes that arrived, as one buffer handed over without a copy.
  template <read_some_handler H>
  void async_read_some(H&& handler) {
    state("async_read_some").async_read_some(std::forward<H>(handler));
  }

  /// Fills exactly `dst` now from bytes already read ahead, or returns false
  /// having consumed nothing (see readahead_connection). Only where the state can.
  bool try_read(mutable_buffer dst)
    requires requires(State& s, mutable_buffer b) { s.try_read(b); }
  {
    return state_ && state_->try_read(dst);
  }

  /// Closes; pending operations complete with errc::cancelled. Idempotent.
  void close() noexcept {
    if (state_) state_->close();
  }

  /// Gives up the socket without closing it: `handler(error_code, fd)` once the
  /// kernel is done with it; the connection is closed from then on. Keep this
  /// handle until the handler ran (destroying it cancels the release). See
  /// handoff_transport in concepts.hpp. Only where the state can.
  template <release_handler H>
    requires releasable_connection_state<State>
  void async_release(H&& handler) {
    state("async_release").async_release(std::forward<H>(handler));
  }

  bool is_open() const noexcept { return state_ && state_->is_open(); }
  /// "host:port" of the peer (empty for an empty handle).
  std::string remote_endpoint() const { return state_ ? std::string(state_->peer()) : std::string(); }
  /// The reactor this connection lives on. Precondition: not empty.
  Reactor& reactor() const {
    if (!state_) throw_error(errc::invalid_argument, std::string("reactor() on an empty ") + Name::value);
    return state_->reactor();
  }
  /// The socket's file descriptor, or -1; only where the state has one.
  int native_handle() const noexcept
    requires fd_connection_state<State>
  {
    return state_ ? state_->native_handle() : -1;
  }

 protected:
  explicit basic_connection_handle(ref_ptr<State> s) noexcept : state_(std::move(s)) {}

  State& state(const char* what) {
    if (!state_) throw_error(errc::invalid_argument, std::string(what) + " on an empty " + Name::value);
    check_reactor_thread(state_->reactor(), Name::value, what);
    return *state_;
  }

  ref_ptr<State> state_;
};

/// Move-only listener handle over `State`, accepting `Connection`s; destroying it closes it.
template <handle_listener_state State, class Connection, handle_name Name>
class basic_listener_handle {
 public:
  using listener_concept = listener_tag;
  using connection_type = Connection;

  basic_listener_handle() noexcept = default;
  basic_listener_handle(basic_listener_handle&&) noexcept = default;
  basic_listener_handle& operator=(basic_listener_handle&& other) noexcept {
    if (this != &other) {
      close();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  basic_listener_handle(const basic_listener_handle&) = delete;
  basic_listener_handle& operator=(const basic_listener_handle&) = delete;
  ~basic_listener_handle() { close(); }

  /// Accepts one connection: `handler(error_code, Connection)`; queued accepts are served in call order.
  template <connection_handler<Connection> H>
  void async_accept(H&& handler) {
    if (!state_) throw_error(errc::invalid_argument, std::string("async_accept on an empty ") + Name::value);
    check_reactor_thread(state_->reactor(), Name::value, "async_accept");
    state_->async_accept(std::forward<H>(handler));
  }

  /// The bound port (the one the kernel chose if 0 was asked for); 0 if empty.
  std::uint16_t port() const noexcept { return state_ ? state_->port() : 0; }
  bool is_open() const noexcept { return state_ && state_->is_open(); }
  /// Stops listening; pending accepts complete with errc::cancelled.
  void close() noexcept {
    if (state_) state_->close();
  }

 protected:
  explicit basic_listener_handle(ref_ptr<State> s) noexcept : state_(std::move(s)) {}

  ref_ptr<State> state_;
};

/// A connect() under way: the user's handler plus the unit of work it keeps
/// counted on the reactor until the handler runs, exactly once (through fail(),
/// finish(), or whoever release() hands it to). Reactor thread only.
template <class Connection, class Reactor>
class pending_connect {
 public:
  using handler_type = util::unique_function<void(std::error_code, Connection)>;

  /// Checks the calling thread (naming `transport` in the error), then counts the connect as work.
  template <class H>
  pending_connect(Reactor& reactor, const char* transport, H&& handler) : reactor_(&reactor) {
    check_reactor_thread(reactor, transport, "connect");
    reactor.work_started();
    handler_ = handler_type(std::forward<H>(handler));
  }

  /// Resolves host:port into `addr`. False when the connect cannot start (the
  /// reactor is stopping: errc::cancelled; a bad host); the handler is then posted.
  bool start(std::string_view host, std::uint16_t port, socket_address& addr) {
    if (reactor_->stopping()) {
      fail(make_error_code(errc::cancelled));
      return false;
    }
    std::error_code ec;
    addr = resolve(host, port, ec);
    if (ec) {
      fail(ec);
      return false;
    }
    return true;
  }

  /// Posts `handler(ec, Connection())` (never inline).
  void fail(std::error_code ec) {
    Reactor& r = *reactor_;
    r.post([&r, h = std::move(handler_), ec]() mutable {
      r.work_finished();
      r.invoke(h, ec, Connection());
    });
  }

  /// Runs `handler(ec, conn)` now; for a completion that is already posted.
  void finish(std::error_code ec, Connection conn) {
    reactor_->work_finished();
    reactor_->invoke(handler_, ec, std::move(conn));
  }

  /// The handler, for a state that completes it itself (and ends the work).
  handler_type release() noexcept { return std::move(handler_); }

 private:
  Reactor* reactor_;
  handler_type handler_;
};

/// What a TCP connection state keeps while an async_release is under way: the
/// bookkeeping both transports share (each does its own socket work). The
/// release ends with `error()` none (the fd goes out) or set (it is closed):
/// invalid_argument when the stream is torn (lose_stream), cancelled on close()
/// or stop (cancel), or why the transport could not stop its operations (fail).
class release_progress {
 public:
  using handler_type = util::unique_function<void(std::error_code, int)>;

  bool active() const noexcept { return active_; }
  const std::error_code& error() const noexcept { return error_; }

  void start(handler_type h) noexcept {
    active_ = true;
    handler_ = std::move(h);
  }
  /// No-op unless a release is under way: bytes taken that no read delivered,
  /// or a read or write cut in half; handing the fd out would lose or tear data.
  void lose_stream() noexcept {
    if (active_) fail(make_error_code(errc::invalid_argument));
  }
  void fail(std::error_code ec) noexcept {
    if (!error_) error_ = ec;
  }
  /// close() or the reactor's stop during the release: false if that happened already.
  bool cancel() noexcept {
    if (error_ == errc::cancelled) return false;
    error_ = make_error_code(errc::cancelled);
    return true;
  }
  /// Posts `finish` on `reactor` once (again only after repost()); when it cannot
  /// (no memory), reports `no_memory`.
  template <class Reactor, class F>
  void post_finish(Reactor& reactor, const char* no_memory, F&& finish) noexcept {
    if (!active_ || posted_) return;
    try {
      reactor.post(std::forward<F>(finish));
      posted_ = true;
    } catch (...) {
      reactor.report(no_memory);
    }
  }
  void repost() noexcept { posted_ = false; }
  /// The release is over: its handler, to complete with error() and the fd.
  handler_type finish() noexcept {
    active_ = false;
    return std::move(handler_);
  }

 private:
  handler_type handler_;
  bool active_ = false;  // its handler has not run
  bool posted_ = false;  // the transport's finish step is posted
  std::error_code error_;
};

/// The start that every TCP transport's adopt() shares: on `reactor`'s thread
/// (anywhere else it closes `fd` and throws std::system_error naming
/// `transport`), not while the reactor stops (errc::cancelled), then
/// adopt_stream_socket(). Returns the socket's address family, or -1 with `fd`
/// closed and `ec` set.
template <class Reactor>
int start_adopt(Reactor& reactor, const char* transport, int fd, std::error_code& ec) {
  if (!reactor.on_reactor_thread()) {
    if (fd >= 0) ::close(fd);  // adopt() owns fd whatever happens
    check_reactor_thread(reactor, transport, "adopt");
  }
  if (reactor.stopping()) {
    if (fd >= 0) ::close(fd);
    ec = make_error_code(errc::cancelled);
    return -1;
  }
  return adopt_stream_socket(fd, ec);
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
