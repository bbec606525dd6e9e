#pragma once
// What the shm transport's own tests share: a reactor group whose reports
// the test reads, and a hand-made connecting side that can send what a
// well-behaved peer never would.
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/shm.hpp>

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace fusewire::test::shm {

namespace fw = fusewire;
namespace seg = fusewire::detail::shm;
using namespace std::chrono_literals;

using group_t = fw::basic_reactor_group<fw::asio_engine>;

/// shm on each reactor this build has: what the tests that look at the
/// reactor's side of a connection (its waits) run over.
#if FUSEWIRE_HAS_URING
using reactor_shms = std::tuple<fw::shm, fw::uring_shm>;
#else
using reactor_shms = std::tuple<fw::shm>;
#endif

/// A group of `count` reactors of `Engine` whose reports (protocol errors,
/// dropped hellos) the test reads.
template <class Engine>
struct basic_reported_group {
  std::mutex mu;
  std::vector<std::string> reports;
  fw::basic_reactor_group<Engine> group;

  explicit basic_reported_group(fw::reactor_mode mode = fw::reactor_mode::adaptive, unsigned count = 1)
      : group(config(this, mode, count)) {}
  ~basic_reported_group() { group.stop(); }

  static fw::reactor_config config(basic_reported_group* self, fw::reactor_mode mode, unsigned count) {
    fw::reactor_config cfg;
    cfg.mode = mode;
    cfg.count = count;
    cfg.on_error = [self](unsigned, std::string_view what) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->reports.emplace_back(what);
    };
    return cfg;
  }

  /// Runs `f` on reactor `r` and returns what it returned.
  template <class F>
  auto on(unsigned r, F&& f) {
    auto fut = group.submit(r, std::forward<F>(f));
    REQUIRE(fut.wait_for(60s) == std::future_status::ready);
    return fut.get();
  }
  template <class F>
  auto on(F&& f) {
    return on(0, std::forward<F>(f));
  }

  /// Waits until a report containing `part` arrived.
  bool wait_report(const std::string& part) {
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& r : reports) {
          if (r.find(part) != std::string::npos) return true;
        }
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};
using reported_group = basic_reported_group<fw::asio_engine>;

/// A hand-made connecting side: what the transport's connect does, with every
/// piece replaceable, so the test can send what a well-behaved peer never would.
struct raw_peer {
  seg::unique_fd sock, memfd, client_bell, server_bell;
  seg::mapping map;

  bool connect(std::uint16_t port, const char* host = "127.0.0.1") {
    sock = seg::unique_fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr;
    const socklen_t len = seg::socket_name(host, port, addr);
    return ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0;
  }
  void make_segment(std::size_t ring) {
    std::error_code ec;
    auto [fd, m] = seg::create_segment(ring, ec);
    REQUIRE_FALSE(ec);
    memfd = std::move(fd);
    map = std::move(m);
    client_bell = seg::unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    server_bell = seg::unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  }
  bool send_hello(const seg::hello& h, std::vector<int> fds) { return send_message(h, std::move(fds)); }
  /// Sends `m` with `fds` on the socket (as a hello, or later as a pool).
  template <class M>
  bool send_message(const M& m, const std::vector<int>& fds) {
    return seg::send_with_fds(sock.get(), &m, sizeof m, fds) == static_cast<ssize_t>(sizeof m);
  }
  bool send_good_hello(std::size_t ring) {
    make_segment(ring);
    return send_hello({seg::segment_magic, seg::segment_version, 0, ring},
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
    store_word(at, seg::record_header(at, bytes.size()));
    return next;
  }
  void ring_server() const {
    const std::uint64_t one = 1;
    CHECK(::write(server_bell.get(), &one, sizeof one) == sizeof one);
  }
};

}  // namespace fusewire::test::shm
