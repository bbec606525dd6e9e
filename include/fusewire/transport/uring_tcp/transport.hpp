#pragma once
/// uring_tcp, the transport type: its config, connect, adopt and listen.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/uring_engine.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/uring_tcp/connection.hpp>
#include <fusewire/transport/uring_tcp/listener.hpp>
#include <fusewire/transport/uring_tcp/options.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/stream_transport.hpp>
#include <fusewire/transport/detail/thread_check.hpp>

namespace fusewire {
inline namespace v0 {

/// The io_uring TCP transport; a model of fusewire::transport. Cheap to copy.
class uring_tcp : public detail::stream_transport<uring_tcp, uring_reactor, uring_tcp_connection, uring_tcp_listener> {
 public:
  static constexpr std::string_view name() noexcept { return "uring_tcp"; }

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
    std::size_t read_ahead = 256 * 1024;  ///< unread bytes a connection may hold before its multishot recv pauses
    /// SO_SNDBUF of a connection whose peer is on this host (loopback or one of
    /// this host's addresses); 0: the kernel's autotuning, which connections to
    /// other hosts always keep (it covers their bandwidth-delay product). Over
    /// loopback an autotuned send queue of megabytes is released by ACKs, its
    /// segments arrive out of order, and TCP's spurious fast retransmits shrink
    /// the window and large-tensor bandwidth; a few hundred KiB in flight avoid
    /// that. 0, or 4 KiB to 1 GiB.
    std::size_t local_send_buffer = 256 * 1024;
    std::size_t fallback_read = 16 * 1024;  ///< heap buffer per read_some when no ring buffer can be used
    bool multishot = true;                  ///< use multishot recv with provided buffers when the kernel has them
    bool keepalive = true;                  ///< SO_KEEPALIVE on every connection
    bool reuse_port = false;                ///< SO_REUSEPORT on listeners (one listener per reactor)
    int backlog = 1024;
  };

  uring_tcp() = default;
  /// Throws std::system_error(errc::invalid_argument) naming a bad field.
  explicit uring_tcp(config cfg) : config_(cfg) {
    if (config_.fallback_read < 512) {
      throw_error(errc::invalid_argument, "uring_tcp::config.fallback_read = " + std::to_string(config_.fallback_read) +
                                              ": must be at least 512");
    }
    check_stream_config(config_);
    if (config_.read_ahead == 0) {
      throw_error(errc::invalid_argument, "uring_tcp::config.read_ahead = 0: must be at least 1");
    }
  }

  const config& settings() const noexcept { return config_; }

 private:
  friend stream_transport;

  void start_connect(uring_reactor& reactor, const detail::socket_address& addr,
                     detail::pending_connect<uring_tcp_connection, uring_reactor> op) const {
    std::error_code ec;
    const int fd = detail::open_stream_socket(addr.family(), ec);
    if (fd < 0) return op.fail(ec);
    detail::ref_ptr<detail::uring_connection_state> state(new detail::uring_connection_state(reactor, fd, options()));
    state->connect(addr, op.release());
  }

  detail::ref_ptr<detail::uring_connection_state> adopt_state(uring_reactor& reactor, int fd, int,
                                                              std::error_code&) const {
    return detail::ref_ptr<detail::uring_connection_state>(new detail::uring_connection_state(reactor, fd, options()));
  }

  uring_tcp_listener listener_on(uring_reactor& reactor, int fd, const detail::socket_address&,
                                 std::error_code&) const {
    return detail::handle_access::make<uring_tcp_listener>(
        detail::ref_ptr<detail::uring_listener_state>(new detail::uring_listener_state(reactor, fd, options())));
  }

  detail::uring_options options() const noexcept {
    return {config_.zero_copy,         config_.zc_threshold, config_.speculative_send,
            config_.copy_threshold,    config_.read_ahead,   config_.fallback_read,
            config_.local_send_buffer, config_.keepalive,    config_.multishot};
  }

  config config_;
};

static_assert(readahead_connection<uring_tcp_connection>);

}  // namespace v0
}  // namespace fusewire
