#pragma once
/// POSIX socket helpers shared by the TCP transports: address resolution,
/// listening sockets, socket options, errno mapping. Private to the transport layer.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// An IPv4 or IPv6 socket address.
struct socket_address {
  sockaddr_storage storage{};
  socklen_t size = 0;

  const sockaddr* get() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() noexcept { return reinterpret_cast<sockaddr*>(&storage); }
  int family() const noexcept { return storage.ss_family; }
};

/// "1.2.3.4:5" or "[::1]:5".
inline std::string to_string(const socket_address& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a.storage);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (a.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

/// The address of `host`:`port`. Numeric addresses are parsed; names go
/// through getaddrinfo (which may block: resolve names before the hot path).
/// An empty host means every IPv4 interface. Fails with errc::invalid_argument.
inline socket_address resolve(std::string_view host, std::uint16_t port, std::error_code& ec) {
  ec.clear();
  socket_address out;
  const std::string name(host);
  if (name.empty()) {
    auto* in = reinterpret_cast<sockaddr_in*>(&out.storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    out.size = sizeof(sockaddr_in);
    return out;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  addrinfo* result = nullptr;
  int rc = ::getaddrinfo(name.c_str(), service.c_str(), &hints, &result);
  if (rc == EAI_NONAME) {
    hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
    rc = ::getaddrinfo(name.c_str(), service.c_str(), &hints, &result);
  }
  if (rc != 0 || result == nullptr) {
    ec = make_error_code(errc::invalid_argument);
    return out;
  }
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.size = static_cast<socklen_t>(result->ai_addrlen);
  ::freeaddrinfo(result);
  return out;
}

/// The transports' view of an errno value.
inline std::error_code from_errno(int err) noexcept {
  switch (err) {
    case 0:
      return {};
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
      return make_error_code(errc::connection_reset);
    case ECONNREFUSED:
      return make_error_code(errc::connection_refused);
    case ECANCELED:
      return make_error_code(errc::cancelled);
    default:
      return {err, std::system_category()};
  }
}

/// TCP_NODELAY (small frames go out at once), SO_KEEPALIVE (dead peers are
/// noticed) and, when `send_buffer` is not 0, SO_SNDBUF (which turns the
/// kernel's send-buffer autotuning off for this socket; the kernel caps the
/// value at net.core.wmem_max and doubles it for its own bookkeeping).
inline std::error_code set_stream_options(int fd, bool keepalive, std::size_t send_buffer = 0) noexcept {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) return {errno, std::system_category()};
  if (keepalive && ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) {
    return {errno, std::system_category()};
  }
  if (send_buffer != 0) {
    const int bytes = static_cast<int>(std::min<std::size_t>(send_buffer, std::numeric_limits<int>::max()));
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) != 0) return {errno, std::system_category()};
  }
  return {};
}

/// Throws std::system_error(errc::invalid_argument) naming `who`'s
/// config.local_send_buffer unless it is 0 or 4 KiB to 1 GiB.
inline void check_local_send_buffer(const char* who, std::size_t bytes) {
  if (bytes != 0 && (bytes < 4096 || bytes > (std::size_t{1} << 30))) {
    throw_error(errc::invalid_argument, std::string(who) + "::config.local_send_buffer = " + std::to_string(bytes) +
                                            ": must be 0 (the kernel's autotuning) or 4096 to 1073741824 bytes");
  }
}

/// A non-blocking, close-on-exec TCP socket of `family`.
inline int open_stream_socket(int family, std::error_code& ec) noexcept {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ec = fd < 0 ? std::error_code(errno, std::system_category()) : std::error_code();
  return fd;
}

/// A bound, listening, non-blocking socket with SO_REUSEADDR (and SO_REUSEPORT
/// if asked, so several reactors can each accept on the same port).
inline int open_listener(const socket_address& addr, int backlog, bool reuse_port, std::error_code& ec) noexcept {
  const int fd = open_stream_socket(addr.family(), ec);
  if (fd < 0) return -1;
  const int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      (reuse_port && ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) ||
      ::bind(fd, addr.get(), addr.size) != 0 || ::listen(fd, backlog) != 0) {
    ec = std::error_code(errno, std::system_category());
    ::close(fd);
    return -1;
  }
  return fd;
}

/// The local port a socket is bound to (0 if unknown).
inline std::uint16_t local_port(int fd) noexcept {
  socket_address a;
  a.size = sizeof a.storage;
  if (::getsockname(fd, a.get(), &a.size) != 0) return 0;
  if (a.family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_port);
  if (a.family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_port);
  return 0;
}

/// True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104.
inline bool is_loopback(const socket_address& a) noexcept {
  if (a.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a.storage);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.family() == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&ip)) return true;
    return IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127;
  }
  return false;
}

/// Whether two addresses name the same host address (ports ignored).
inline bool same_host_address(const socket_address& a, const socket_address& b) noexcept {
  if (a.family() != b.family()) return false;
  if (a.family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b.storage)->sin_addr.s_addr;
  }
  if (a.family() == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&b.storage)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

/// Whether a connected socket's peer is on this host: a loopback peer, or a
/// peer whose address is the socket's own local address (a connection to one of
/// this host's interface addresses is routed over loopback with that address at
/// both ends). False when either address cannot be had.
inline bool peer_is_local(int fd) noexcept {
  socket_address local;
  socket_address peer;
  local.size = sizeof local.storage;
  peer.size = sizeof peer.storage;
  if (::getpeername(fd, peer.get(), &peer.size) != 0) return false;
  if (is_loopback(peer)) return true;
  if (::getsockname(fd, local.get(), &local.size) != 0) return false;
  return same_host_address(local, peer);
}

/// O_NONBLOCK and FD_CLOEXEC on `fd`: a descriptor handed between reactors is
/// then never read blocking, nor inherited by a child that execs.
inline std::error_code set_nonblocking_cloexec(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ((flags & O_NONBLOCK) == 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)) {
    return {errno, std::system_category()};
  }
  const int fd_flags = ::fcntl(fd, F_GETFD);
  if (fd_flags < 0 || ((fd_flags & FD_CLOEXEC) == 0 && ::fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) != 0)) {
    return {errno, std::system_category()};
  }
  return {};
}

/// The first step of a transport's adopt(): checks that `fd` is a connected TCP
/// socket (IPv4 or IPv6) and makes it non-blocking and close-on-exec; the TCP
/// options are the transport's prepare(), as after an accept. Returns the
/// address family. On failure `fd` is closed (adopt takes it either way), `ec`
/// says why (errc::invalid_argument for anything but a connected TCP socket)
/// and -1 is returned.
inline int adopt_stream_socket(int fd, std::error_code& ec) noexcept {
  ec.clear();
  if (fd < 0) {
    ec = make_error_code(errc::invalid_argument);
    return -1;
  }
  int type = 0;
  int protocol = 0;
  socklen_t type_len = sizeof type;
  socklen_t protocol_len = sizeof protocol;
  socket_address local;
  socket_address peer;
  local.size = sizeof local.storage;
  peer.size = sizeof peer.storage;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM ||
      ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &protocol_len) != 0 || protocol != IPPROTO_TCP ||
      ::getsockname(fd, local.get(), &local.size) != 0 || (local.family() != AF_INET && local.family() != AF_INET6) ||
      ::getpeername(fd, peer.get(), &peer.size) != 0) {
    ec = make_error_code(errc::invalid_argument);
  } else {
    ec = set_nonblocking_cloexec(fd);
  }
  if (ec) {
    ::close(fd);
    return -1;
  }
  return local.family();
}

/// The peer of a connected socket as "host:port" (empty if unknown).
inline std::string peer_name(int fd) {
  socket_address a;
  a.size = sizeof a.storage;
  if (::getpeername(fd, a.get(), &a.size) != 0) return {};
  return to_string(a);
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
