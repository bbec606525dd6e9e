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

#include "support/shm_raw_peer.hpp"

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

/// The hand-made connecting side (support/shm_raw_peer.hpp), its setup
/// steps checked.
struct raw_peer : shm_raw_peer {
  void make_segment(std::size_t ring) { REQUIRE(shm_raw_peer::make_segment(ring)); }
  void ring_server() const { CHECK(shm_raw_peer::ring_server()); }
};

}  // namespace fusewire::test::shm
