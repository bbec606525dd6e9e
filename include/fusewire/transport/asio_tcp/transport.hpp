#pragma once
/// asio_tcp, the transport type: its config, connect, adopt and listen.

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <boost/asio/ip/tcp.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/asio_tcp/connection.hpp>
#include <fusewire/transport/asio_tcp/listener.hpp>
#include <fusewire/transport/asio_tcp/options.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_transport.hpp>
#include <fusewire/transport/detail/thread_check.hpp>

namespace fusewire {
inline namespace v0 {

/// The Boost.Asio TCP transport; a model of fusewire::transport. Cheap to copy
/// (it is only its config).
class asio_tcp : public detail::stream_transport<asio_tcp, asio_reactor, asio_tcp_connection, asio_tcp_listener> {
 public:
  static constexpr std::string_view name() noexcept { return "asio_tcp"; }

  struct config {
    std::size_t read_chunk = 32 * 1024;  ///< bytes async_read_some reads at most (one chunk per connection)
    /// An exact read of fewer bytes reads ahead into the chunk (one recv for a
    /// frame's header, meta and small payload); 0 = every exact read goes
    /// straight into its destination.
    std::size_t read_ahead_below = 4096;
    /// SO_SNDBUF of a connection whose peer is on this host; 0: the kernel's
    /// autotuning (see uring_tcp::config::local_send_buffer). 0, or 4 KiB to 1 GiB.
    std::size_t local_send_buffer = 256 * 1024;
    bool keepalive = true;    ///< SO_KEEPALIVE on every connection
    bool reuse_port = false;  ///< SO_REUSEPORT on listeners (one listener per reactor)
    int backlog = 1024;
  };

  asio_tcp() = default;
  /// Throws std::system_error(errc::invalid_argument) for a read_chunk under 4 KiB or a backlog < 1.
  explicit asio_tcp(config cfg) : config_(cfg) {
    check_stream_config(config_);
    if (config_.read_chunk < 4096) {
      throw_error(errc::invalid_argument,
                  "asio_tcp::config.read_chunk = " + std::to_string(config_.read_chunk) + ": must be at least 4096");
    }
  }

  const config& settings() const noexcept { return config_; }

 private:
  friend stream_transport;

  void start_connect(asio_reactor& reactor, const detail::socket_address& addr,
                     detail::pending_connect<asio_tcp_connection, asio_reactor> op) const {
    boost::asio::ip::tcp::endpoint endpoint;
    std::memcpy(endpoint.data(), addr.get(), addr.size);
    endpoint.resize(addr.size);
    boost::asio::ip::tcp::socket socket(reactor.engine().context());
    detail::ref_ptr<detail::asio_connection_state> state(
        new detail::asio_connection_state(reactor, std::move(socket), options()));
    state->connect(endpoint, [op = std::move(op), state](std::error_code e) mutable {
      asio_tcp_connection conn;
      if (!e) conn = detail::handle_access::make<asio_tcp_connection>(std::move(state));
      state.reset();
      op.finish(e, std::move(conn));
    });
  }

  detail::ref_ptr<detail::asio_connection_state> adopt_state(asio_reactor& reactor, int fd, int family,
                                                             std::error_code& ec) const {
    boost::asio::ip::tcp::socket socket(reactor.engine().context());
    boost::system::error_code bec;
    socket.assign(family == AF_INET6 ? boost::asio::ip::tcp::v6() : boost::asio::ip::tcp::v4(), fd, bec);
    if (bec) {
      ::close(fd);
      ec = detail::from_asio(bec, false);
      return {};
    }
    return detail::ref_ptr<detail::asio_connection_state>(
        new detail::asio_connection_state(reactor, std::move(socket), options()));
  }

  asio_tcp_listener listener_on(asio_reactor& reactor, int fd, const detail::socket_address& addr,
                                std::error_code& ec) const {
    const std::uint16_t bound = detail::local_port(fd);
    boost::system::error_code bec;
    boost::asio::ip::tcp::acceptor acceptor(reactor.engine().context());
    acceptor.assign(addr.family() == AF_INET6 ? boost::asio::ip::tcp::v6() : boost::asio::ip::tcp::v4(), fd, bec);
    if (bec) {
      ::close(fd);
      ec = detail::from_asio(bec, false);
      return {};
    }
    return detail::handle_access::make<asio_tcp_listener>(detail::ref_ptr<detail::asio_listener_state>(
        new detail::asio_listener_state(reactor, std::move(acceptor), bound, options())));
  }

  detail::asio_options options() const noexcept {
    return {config_.read_chunk, config_.keepalive, config_.read_ahead_below, config_.local_send_buffer};
  }

  config config_;
};

static_assert(readahead_connection<asio_tcp_connection>);

}  // namespace v0
}  // namespace fusewire
