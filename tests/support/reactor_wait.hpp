#pragma once
/// Scaffolding of the tests that drive reactor groups from the test thread.
#include <fusewire/reactor/reactor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <future>

#include "support/eventually.hpp"

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

}  // namespace fusewire::test
