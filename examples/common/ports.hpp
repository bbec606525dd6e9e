// Loopback ports for a local multi-process run: one the kernel just handed
// out, and a whole cluster string with a distinct port per task.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace example {

/// A loopback TCP port nobody listens on right now (the kernel handed it out
/// and took it back; another process may still take it before we bind).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw std::system_error(err, std::system_category(), "cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// "ps=HOST:p,...;worker=HOST:p,..." for `jobs` (name, task count), in the
/// order given, every port distinct and free on loopback (a port free there is
/// free on the host's other addresses unless a socket is bound to one alone).
inline std::string host_cluster(std::initializer_list<std::pair<std::string_view, unsigned>> jobs,
                                std::string_view host = "127.0.0.1") {
  std::vector<std::uint16_t> used;
  auto port = [&] {
    for (;;) {
      const std::uint16_t p = free_port();
      if (std::find(used.begin(), used.end(), p) == used.end()) {
        used.push_back(p);
        return p;
      }
    }
  };
  std::string s;
  for (const auto& [name, tasks] : jobs) {
    if (!s.empty()) s += ';';
    s += name;
    s += '=';
    for (unsigned i = 0; i < tasks; ++i) {
      if (i) s += ',';
      s += host;
      s += ':' + std::to_string(port());
    }
  }
  return s;
}

}  // namespace example
