#pragma once
/// The public operations every stream transport shares (asio_tcp, uring_tcp):
/// connect, adopt and listen, written once over the engine's hooks. Private
/// to the transport layer.

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/detail/thread_check.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// A stream transport's connect, adopt and listen. `Derived` (cheap to copy:
/// its config) supplies `name()`, `settings()` (with `local_send_buffer`,
/// `backlog` and `reuse_port`) and, reachable by this base:
/// - `start_connect(reactor, addr, op)`: connects to `addr` and finishes the
///   pending_connect `op` with the connection (or the error);
/// - `adopt_state(reactor, fd, family, ec)`: a connection state over the
///   connected socket `fd`, or an empty pointer with `fd` closed and `ec` set;
/// - `listener_on(reactor, fd, addr, ec)`: a listener over the listening
///   socket `fd` bound to `addr`, or an empty one with `fd` closed and `ec` set.
template <class Derived, class Reactor, class Connection, class Listener>
class stream_transport {
 public:
  using transport_concept = transport_tag;
  using reactor_type = Reactor;
  using connection_type = Connection;
  using listener_type = Listener;

  /// Connects to host:port from `reactor` (its thread only): `handler(error_code,
  /// connection)`, never inline. A host name is resolved with getaddrinfo
  /// (blocking); a bad host completes with errc::invalid_argument.
  template <connection_handler<Connection> H>
  void connect(Reactor& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    pending_connect<Connection, Reactor> op(reactor, Derived::name().data(), std::forward<H>(handler));
    socket_address addr;
    if (!op.start(host, port, addr)) return;
    derived().start_connect(reactor, addr, std::move(op));
  }

  /// Takes the connected TCP socket `fd` (released by a connection on another
  /// reactor, say) and returns a connection on `reactor`, prepared as an
  /// accepted one. Call it on `reactor`'s thread. On failure `fd` is closed,
  /// `ec` says why and the connection is empty (see handoff_transport in concepts.hpp).
  Connection adopt(Reactor& reactor, int fd, std::error_code& ec) const {
    const int family = start_adopt(reactor, Derived::name().data(), fd, ec);
    if (family < 0) return {};
    auto state = derived().adopt_state(reactor, fd, family, ec);
    if (!state) return {};
    ec = state->prepare();
    if (ec) return {};  // the state closes fd
    return handle_access::make<Connection>(std::move(state));
  }

  /// A listener on host:port (port 0: the kernel picks; see port()). Throws
  /// std::system_error naming the address on failure.
  Listener listen(Reactor& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    Listener l = listen(reactor, host, port, ec);
    if (ec) {
      throw std::system_error(
          ec, std::string(Derived::name()) + "::listen(" + std::string(host) + ":" + std::to_string(port) + ")");
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  Listener listen(Reactor& reactor, std::string_view host, std::uint16_t port, std::error_code& ec) const {
    check_reactor_thread(reactor, Derived::name().data(), "listen");
    const socket_address addr = resolve(host, port, ec);
    if (ec) return {};
    const int fd = open_listener(addr, derived().settings().backlog, derived().settings().reuse_port, ec);
    if (fd < 0) return {};
    return derived().listener_on(reactor, fd, addr, ec);
  }

 protected:
  /// Checks the config fields every stream transport has: throws
  /// std::system_error(errc::invalid_argument) for a bad local_send_buffer or a backlog < 1.
  template <class Config>
  static void check_stream_config(const Config& cfg) {
    check_local_send_buffer(Derived::name().data(), cfg.local_send_buffer);
    if (cfg.backlog < 1) {
      throw_error(errc::invalid_argument, std::string(Derived::name()) + "::config.backlog = " +
                                              std::to_string(cfg.backlog) + ": must be at least 1");
    }
  }

 private:
  const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
