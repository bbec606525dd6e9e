#pragma once
/// Raw peers for the rendezvous tests: a blocking TCP client that speaks frames
/// by hand (hello, truncated or hostile frames), and a log sink to wait on.
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/wire/codec.hpp>

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/dial.hpp"

namespace fusewire::test {

struct log_capture {
  std::mutex m;
  std::vector<std::string> lines;
  rendezvous::log_sink sink() {
    return [this](std::string_view s) {
      std::lock_guard lock(m);
      lines.emplace_back(s);
    };
  }
  /// Waits (bounded) for a line containing `needle`.
  bool saw(std::string_view needle) {
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard lock(m);
        for (auto& l : lines) {
          if (l.find(needle) != std::string::npos) return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::lock_guard lock(m);
    for (auto& l : lines) MESSAGE("log: " << l);
    return false;
  }
};

/// A raw blocking TCP client.
struct raw_client {
  int fd = -1;
  explicit raw_client(std::uint16_t port) : fd(dial_loopback(port)) { REQUIRE(fd >= 0); }
  ~raw_client() {
    if (fd >= 0) ::close(fd);
  }
  void send(std::span<const std::byte> bytes) {
    REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  void send(std::string_view s) { send(std::as_bytes(std::span(s.data(), s.size()))); }
  /// True once the peer closed (reads drain whatever it sent first), bounded by 20 s.
  bool closed_by_peer() {
    std::byte buf[4096];
    for (int i = 0; i < 400; ++i) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
    return false;
  }
  void shut_write() { ::shutdown(fd, SHUT_WR); }
};

std::vector<std::byte> frame_bytes(const auto& meta, const_buffer payload = {}) {
  std::vector<std::byte> out(wire::prefix_size(meta) + payload.size());
  std::error_code ec;
  const std::size_t n = wire::encode_frame(meta, wire::frame_header{}, payload, out, ec);
  REQUIRE_FALSE(ec);
  out.resize(n);
  return out;
}

inline std::vector<std::byte> hello_from(const task_id& t) {
  wire::hello_meta h;
  h.job = t.job;
  h.task_index = t.index;
  return frame_bytes(h);
}

}  // namespace fusewire::test
