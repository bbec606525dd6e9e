#pragma once
/// Loopback ports for tests: one that was free a moment ago (free_port), and
/// ports held until the test lets them go (reserved_ports). No doctest here:
/// the multi-process drivers have their own main.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace fusewire::test {

/// A loopback port that was free a moment ago: the kernel picked it for a
/// socket that was bound and closed again, so nobody listens on it. Two calls
/// can name the same port.
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw std::runtime_error("bind failed");
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Loopback ports held for a test's tasks: bound with SO_REUSEADDR and not
/// listening, so the code under test can bind them too while nobody else
/// gets them (as fwbench's launcher does for backends with fixed ports).
class reserved_ports {
 public:
  reserved_ports() = default;
  reserved_ports(const reserved_ports&) = delete;
  reserved_ports& operator=(const reserved_ports&) = delete;
  ~reserved_ports() {
    for (int fd : fds_) ::close(fd);
  }

  /// A fresh loopback port, held until this object dies.
  std::uint16_t take() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("reserved_ports: socket failed");
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd);
      throw std::runtime_error("reserved_ports: bind failed");
    }
    fds_.push_back(fd);
    return ntohs(a.sin_port);
  }

 private:
  std::vector<int> fds_;
};

}  // namespace fusewire::test
