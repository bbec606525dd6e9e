#pragma once
/// basic_shm, the transport type (shm: on an asio_reactor): its config,
/// connect and listen. See transport/shm.hpp.

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/transport/shm/connection.hpp>
#include <fusewire/transport/shm/listener.hpp>
#include <fusewire/transport/shm/pool.hpp>
#include <fusewire/transport/shm/segment.hpp>
#if defined(FUSEWIRE_HAS_URING) && __has_include(<liburing.h>)
#include <fusewire/reactor/uring_engine.hpp>
#define FUSEWIRE_SHM_URING 1
#endif

namespace fusewire {
inline namespace v0 {

/// The config of the shm transport, whichever its reactor.
struct shm_config {
  /// Bytes of each of a connection's two rings (the connecting side's
  /// choice): a power of two from 4 KiB to max_ring_size. A connection maps
  /// 4 KiB + 2 * ring_size bytes in each of its two processes.
  std::size_t ring_size = std::size_t{1} << 20;
  /// The largest ring a listener accepts from a connecting side (a power of two, at most 1 GiB).
  std::size_t max_ring_size = std::size_t{64} << 20;
  /// The most bytes one async_read_some delivers (one allocation and copy out of the ring).
  std::size_t read_some_max = 256 * 1024;
  /// Single copy: a piece of a write at least this long is not copied into
  /// the ring; the peer copies it straight out of this process's memory
  /// (process_vm_readv) into its destination, and the write completes once
  /// it did. Used only where both sides turn it on and the peer could read
  /// a probe word of this process (same user, no ptrace restriction such as
  /// Yama's ptrace_scope >= 1 between the two); otherwise the ring carries
  /// everything. 0 = off (this side then copies none of the peer's pieces
  /// either); else at least 4096. Off by default: one reader's
  /// process_vm_readv can be slower than two memcpys, one on each side, run
  /// in parallel (docs/transports.md says when to turn it on).
  std::size_t single_copy_min = 0;
  /// How long a listener waits for a connecting side's hello before dropping it.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Listeners take connections only from processes of the same user
  /// (SO_PEERCRED); abstract Unix sockets have no file permissions.
  bool same_user_only = true;
  int backlog = 1024;
  /// Bytes of address space of the shared pool (allocate_shared), made on
  /// the first allocation: 0 = no pool, else 1 MiB..64 GiB. Pages are backed
  /// only once written, and a block freed stays backed for reuse.
  std::size_t pool_size = std::size_t{1} << 30;
};

/// The same-host shared-memory transport on a `Reactor` (a basic_reactor
/// whose engine offers a readiness wait: asio_reactor, uring_reactor); a
/// model of fusewire::transport. Cheap to copy (it is its config and a
/// shared pool). Connections of basic_shm<asio_reactor> and of
/// basic_shm<uring_reactor> reach each other: the reactor is local to a process.
template <class Reactor>
class basic_shm {
 public:
  using transport_concept = transport_tag;
  using reactor_type = Reactor;
  using connection_type = basic_shm_connection<Reactor>;
  using listener_type = basic_shm_listener<Reactor>;
  using config = shm_config;

  static constexpr std::string_view name() noexcept { return "shm"; }

  basic_shm() : basic_shm(config{}) {}
  /// Throws std::system_error(errc::invalid_argument) naming a bad field.
  explicit basic_shm(config cfg) : config_(cfg) {
    const auto bad = [](const std::string& what) { throw_error(errc::invalid_argument, "shm::config." + what); };
    if (!detail::shm::valid_ring_size(config_.max_ring_size)) {
      bad("max_ring_size = " + std::to_string(config_.max_ring_size) + ": must be a power of two, 4096..1 GiB");
    }
    if (!detail::shm::valid_ring_size(config_.ring_size) || config_.ring_size > config_.max_ring_size) {
      bad("ring_size = " + std::to_string(config_.ring_size) + ": must be a power of two, 4096..max_ring_size");
    }
    if (config_.read_some_max == 0) bad("read_some_max = 0: must be at least 1");
    if (config_.single_copy_min != 0 && config_.single_copy_min < 4096) {
      bad("single_copy_min = " + std::to_string(config_.single_copy_min) + ": must be 0 (off) or at least 4096");
    }
    if (config_.handshake_timeout.count() <= 0) bad("handshake_timeout: must be positive");
    if (config_.backlog < 1) bad("backlog = " + std::to_string(config_.backlog) + ": must be at least 1");
    if (config_.pool_size != 0 &&
        (config_.pool_size < detail::shm::min_pool_size || config_.pool_size > detail::shm::max_pool_size)) {
      bad("pool_size = " + std::to_string(config_.pool_size) + ": must be 0 (no pool) or 1 MiB..64 GiB");
    }
    if (config_.pool_size != 0) pool_ = std::make_shared<detail::shm::shared_pool>(config_.pool_size);
  }

  const config& settings() const noexcept { return config_; }

  /// `n` bytes of the shared pool: a piece of a write of 16 KiB or more that
  /// lies in the pool is not copied into the ring; the peer copies it straight
  /// out of the pool (which it maps read-only), so it is copied once, with
  /// memcpy, and the write completes once the peer did. Copies of this
  /// transport object share one pool. When there is no pool, or it is full,
  /// ordinary memory (which the ring carries); `conn.stats().pool_sent` tells
  /// the two apart. Any thread; the buffer may outlive the transport.
  tensor_buffer allocate_shared(std::size_t n) const {
    if (pool_) {
      tensor_buffer b = pool_->allocate(n);
      if (b.data() != nullptr) return b;
    }
    return tensor_buffer::allocate(n);
  }

  /// Connects to the listener of host:port on this host (its thread only):
  /// `handler(error_code, connection)`, never inline. Makes and sends the
  /// segment; the connection is usable at once (bytes wait in the ring until
  /// the listener accepts). No listener: errc::connection_refused; a host
  /// that is not a valid name: errc::invalid_argument.
  template <connection_handler<connection_type> H>
  void connect(Reactor& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    detail::pending_connect<connection_type, Reactor> op(reactor, "shm", std::forward<H>(handler));
    if (reactor.stopping()) return op.fail(make_error_code(errc::cancelled));
    if (!detail::shm::valid_host(host) || port == 0) return op.fail(make_error_code(errc::invalid_argument));
    std::error_code ec;
    auto state = open(reactor, host, port, ec);
    if (ec) return op.fail(ec);
    connection_type conn = detail::handle_access::make<connection_type>(std::move(state));
    reactor.post([op = std::move(op), conn = std::move(conn)]() mutable { op.finish({}, std::move(conn)); });
  }

  /// A listener on host:port (port 0: a free port is picked; see port()).
  /// Throws std::system_error naming the address on failure.
  listener_type listen(Reactor& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    listener_type l = listen(reactor, host, port, ec);
    if (ec) {
      throw std::system_error(ec, "shm::listen(" + std::string(host) + ":" + std::to_string(port) + ")");
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  listener_type listen(Reactor& reactor, std::string_view host, std::uint16_t port, std::error_code& ec) const {
    detail::check_reactor_thread(reactor, "shm", "listen");
    ec.clear();
    if (!detail::shm::valid_host(host)) {
      ec = make_error_code(errc::invalid_argument);
      return {};
    }
    detail::shm::unique_fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      ec = detail::shm::last_error();
      return {};
    }
    std::uint16_t bound = port;
    if (port != 0) {
      if (!bind_name(fd.get(), host, port, ec)) return {};
    } else {
      // Abstract names have no kernel-chosen port: try random ones.
      thread_local std::mt19937 rng{std::random_device{}()};
      std::uniform_int_distribution<int> pick(32768, 60999);
      for (int attempt = 0; attempt < 1000; ++attempt) {
        bound = static_cast<std::uint16_t>(pick(rng));
        if (bind_name(fd.get(), host, bound, ec)) break;
        if (ec != std::errc::address_in_use) return {};
      }
      if (ec) return {};
    }
    if (::listen(fd.get(), config_.backlog) != 0) {
      ec = detail::shm::last_error();
      return {};
    }
    detail::shm_listener_options opts{config_.max_ring_size,     config_.read_some_max,  config_.single_copy_min,
                                      config_.handshake_timeout, config_.same_user_only, pool_};
    return detail::handle_access::make<listener_type>(detail::ref_ptr<detail::shm_listener_state<Reactor>>(
        new detail::shm_listener_state<Reactor>(reactor, fd.release(), std::string(host), bound, opts)));
  }

 private:
  static bool bind_name(int fd, std::string_view host, std::uint16_t port, std::error_code& ec) {
    sockaddr_un addr;
    const socklen_t len = detail::shm::socket_name(host, port, addr);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      ec = detail::shm::last_error();
      return false;
    }
    ec.clear();
    return true;
  }

  /// The connecting side: the Unix socket, the segment and two eventfds, sent
  /// to the listener in one message.
  detail::ref_ptr<detail::shm_connection_state<Reactor>> open(Reactor& reactor, std::string_view host,
                                                              std::uint16_t port, std::error_code& ec) const {
    namespace s = detail::shm;
    s::unique_fd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) {
      ec = s::last_error();
      return {};
    }
    sockaddr_un addr;
    const socklen_t len = s::socket_name(host, port, addr);
    if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      // No listener, or its backlog is full (EAGAIN): refused, as TCP.
      const int e = errno;
      ec = (e == ECONNREFUSED || e == ENOENT || e == EAGAIN) ? make_error_code(errc::connection_refused)
                                                             : std::error_code(e, std::system_category());
      return {};
    }
    auto [memfd, map] = s::create_segment(config_.ring_size, ec);
    if (ec) return {};
    s::unique_fd mine(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    s::unique_fd theirs(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!mine || !theirs) {
      ec = s::last_error();
      return {};
    }
    const s::hello h{s::segment_magic, s::segment_version, 0, config_.ring_size};
    const int fds[s::hello_fds] = {memfd.get(), mine.get(), theirs.get()};
    if (s::send_with_fds(sock.get(), &h, sizeof h, fds) != static_cast<ssize_t>(sizeof h)) {
      const int e = errno;
      ec = (e == EPIPE || e == ECONNRESET) ? make_error_code(errc::connection_refused)
                                           : std::error_code(e, std::system_category());
      return {};
    }
    // The listener's process, for single copy (0 if the kernel does not say).
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) cred.pid = 0;
    const detail::shm_link_options link{config_.read_some_max, config_.single_copy_min, cred.pid, pool_};
    return detail::ref_ptr<detail::shm_connection_state<Reactor>>(new detail::shm_connection_state<Reactor>(
        reactor, std::move(sock), std::move(mine), std::move(theirs), std::move(map), 0,
        std::string(host) + ":" + std::to_string(port), link));
  }

  config config_;
  std::shared_ptr<detail::shm::shared_pool> pool_;  ///< null: no pool
};

/// shm on an asio_reactor: what "shm" and "shm+asio" name (transport/select.hpp).
using shm = basic_shm<asio_reactor>;
using shm_connection = shm::connection_type;
using shm_listener = shm::listener_type;

static_assert(transport<shm>);
static_assert(readahead_connection<shm_connection>);

#ifdef FUSEWIRE_SHM_URING
/// shm on a uring_reactor: what "shm+uring" names (transport/select.hpp), so
/// a task's shm and uring_tcp connections share its reactors. Builds with
/// liburing (FUSEWIRE_HAS_URING).
using uring_shm = basic_shm<uring_reactor>;
static_assert(transport<uring_shm>);
#endif

}  // namespace v0
}  // namespace fusewire
