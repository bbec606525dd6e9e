#pragma once
/// The public connection and listener handles of the TCP transports: move-only
/// owners of a ref-counted state (transport/detail/ref_counted.hpp) that check
/// the calling thread and forward to it. Each transport derives its named
/// handle from these and adds what is its own (constructors for its friends,
/// counters). Private to the transport layer.

#include <cstdint>
#include <string>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
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
  { s.native_handle() } -> std::convertible_to<int>;
};

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

  /// Closes; pending operations complete with errc::cancelled. Idempotent.
  void close() noexcept {
    if (state_) state_->close();
  }

  bool is_open() const noexcept { return state_ && state_->is_open(); }
  /// "host:port" of the peer (empty for an empty handle).
  std::string remote_endpoint() const { return state_ ? std::string(state_->peer()) : std::string(); }
  /// The reactor this connection lives on. Precondition: not empty.
  Reactor& reactor() const {
    if (!state_) throw_error(errc::invalid_argument, std::string("reactor() on an empty ") + Name::value);
    return state_->reactor();
  }
  /// The socket's file descriptor, or -1.
  int native_handle() const noexcept { return state_ ? state_->native_handle() : -1; }

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

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
