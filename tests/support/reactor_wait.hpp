#pragma once
/// Scaffolding of the tests that drive reactor groups from the test thread.
#include <fusewire/reactor/reactor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

namespace fusewire::test {

/// Hang guard: a lost wake-up or a missing completion fails the test instead of hanging it.
template <class T>
T get(std::future<T>& f) {
  REQUIRE_MESSAGE(f.wait_for(std::chrono::seconds(60)) == std::future_status::ready, "timed out waiting for a reactor");
  return f.get();
}

/// `count` reactors in `mode`, polling 50 us before sleeping in adaptive mode.
inline reactor_config make_config(reactor_mode mode, unsigned count) {
  reactor_config cfg;
  cfg.mode = mode;
  cfg.count = count;
  cfg.idle_poll = std::chrono::microseconds(50);
  return cfg;
}

/// Waits (bounded: 5 s) until `done()` holds; its last answer.
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 5000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done();
}

}  // namespace fusewire::test
