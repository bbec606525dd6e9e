#pragma once
// A hand-made connecting side of the shm transport: what its connect does,
// with every piece replaceable, so that a test or a fuzz target can send what
// a well-behaved peer never would and scribble on the shared segment. No test
// framework here: the shm unit tests wrap it with their checks
// (tests/unit/transport/shm_harness.hpp), the fuzz target uses it as is.
#include <fusewire/transport/shm.hpp>

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
#include <vector>

namespace fusewire::test::shm {

struct shm_raw_peer {
  using unique_fd = fusewire::detail::shm::unique_fd;
  unique_fd sock, memfd, client_bell, server_bell;
  fusewire::detail::shm::mapping map;

  bool connect(std::uint16_t port, const char* host = "127.0.0.1") {
    namespace seg = fusewire::detail::shm;
    sock = unique_fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr;
    const socklen_t len = seg::socket_name(host, port, addr);
    return ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0;
  }
  /// The segment (rings of `ring` bytes) and both eventfds; false if any could not be made.
  bool make_segment(std::size_t ring) {
    namespace seg = fusewire::detail::shm;
    std::error_code ec;
    auto [fd, m] = seg::create_segment(ring, ec);
    if (ec) return false;
    memfd = std::move(fd);
    map = std::move(m);
    client_bell = unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    server_bell = unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    return client_bell && server_bell;
  }
  bool send_hello(const fusewire::detail::shm::hello& h, std::vector<int> fds) {
    return send_message(h, std::move(fds));
  }
  /// Sends `m` with `fds` on the socket (as a hello, or later as a pool).
  template <class M>
  bool send_message(const M& m, const std::vector<int>& fds) {
    return fusewire::detail::shm::send_with_fds(sock.get(), &m, sizeof m, fds) == static_cast<ssize_t>(sizeof m);
  }
  /// The segment with rings of `ring` bytes and the hello that offers it.
  bool send_good_hello(std::size_t ring) {
    namespace seg = fusewire::detail::shm;
    return make_segment(ring) && send_hello({seg::segment_magic, seg::segment_version, 0, ring},
                                            {memfd.get(), client_bell.get(), server_bell.get()});
  }
  /// Stores `w` in the word at stream position `at` (a multiple of 8) of the
  /// client's ring.
  void store_word(std::uint64_t at, std::uint64_t w) const {
    std::byte* ring = map.ring_data(0);
    const std::uint64_t mask = map.header()->ring_size - 1;
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(ring + (at & mask))).store(w);
  }
  /// Publishes `bytes` as one record at stream position `at` of the client's
  /// ring, as the transport does; returns where the next record goes.
  std::uint64_t publish_record(std::uint64_t at, std::span<const std::byte> bytes) const {
    const std::uint64_t mask = map.header()->ring_size - 1;
    for (std::size_t i = 0; i < bytes.size(); ++i) map.ring_data(0)[(at + 8 + i) & mask] = bytes[i];
    const std::uint64_t next = (at + 8 + bytes.size() + 7) & ~std::uint64_t{7};
    store_word(next, 0);
    store_word(at, fusewire::detail::shm::record_header(at, bytes.size()));
    return next;
  }
  /// Writes the server's eventfd, as a producer does for a sleeping consumer.
  bool ring_server() const {
    const std::uint64_t one = 1;
    return ::write(server_bell.get(), &one, sizeof one) == static_cast<ssize_t>(sizeof one);
  }
};

}  // namespace fusewire::test::shm
