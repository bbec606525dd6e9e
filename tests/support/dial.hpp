#pragma once
/// One blocking loopback dial for the tests that speak raw TCP (the rendezvous
/// unit tests' raw peers, the multi-process drivers, the plain-socket side of
/// transport_pingpong); free of doctest.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace fusewire::test {

/// A blocking TCP socket connected to 127.0.0.1:`port`, or -1 (nobody listens).
inline int dial_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  ::close(fd);
  return -1;
}

}  // namespace fusewire::test
