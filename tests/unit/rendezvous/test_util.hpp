#pragma once
// Helpers shared by the rendezvous tests: free loopback ports, byte patterns, clusters.
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/tensor_buffer.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace rvtest {

/// A loopback port that was free a moment ago (the kernel picked it).
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

/// "ps=127.0.0.1:p;worker=127.0.0.1:p,..." with fresh ports.
inline fusewire::cluster_spec loopback_cluster(unsigned ps, unsigned workers) {
  // free_port() closes its probe socket, so two calls can name the same port:
  // draw until every task has its own.
  std::vector<std::uint16_t> ports;
  while (ports.size() < ps + workers) {
    const std::uint16_t p = free_port();
    if (std::find(ports.begin(), ports.end(), p) == ports.end()) ports.push_back(p);
  }
  std::string text = "ps=";
  for (unsigned i = 0; i < ps; ++i) text += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(ports[i]);
  text += ";worker=";
  for (unsigned i = 0; i < workers; ++i) {
    text += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(ports[ps + i]);
  }
  return fusewire::cluster_spec::from_string(text);
}

/// `n` bytes that depend on `seed` and on their position.
inline fusewire::tensor_buffer pattern(std::size_t n, std::uint32_t seed) {
  auto b = fusewire::tensor_buffer::allocate(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    b.data()[i] = static_cast<std::byte>(x >> 24);
  }
  return b;
}

/// True if `b` holds pattern(n, seed).
inline bool matches(const fusewire::tensor_buffer& b, std::size_t n, std::uint32_t seed) {
  if (b.size() != n) return false;
  const auto expect = pattern(n, seed);
  return n == 0 || std::memcmp(b.data(), expect.data(), n) == 0;
}

}  // namespace rvtest
