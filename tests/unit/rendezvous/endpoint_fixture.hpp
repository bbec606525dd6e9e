#pragma once
/// What every rendezvous::endpoint test file starts with: the endpoint and both
/// TCP transports (tcp_transports, for TEST_CASE_TEMPLATE_APPLY), the usual
/// aliases, and the task ids of the test clusters (in fusewire::test).
#include <fusewire/rendezvous/endpoint.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <future>

#include "support/tcp_transports.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;

namespace fusewire::test {

inline const task_id ps0{"ps", 0};
inline const task_id w0{"worker", 0};
inline const task_id w1{"worker", 1};

/// Block-mode reactors and a 4 MiB pool: what most endpoint tests run with.
inline options block_options(std::chrono::milliseconds connect_timeout = 3000ms) {
  options o;
  o.mode = reactor_mode::block;
  o.pool_size = 4u << 20;
  o.connect_timeout = connect_timeout;
  return o;
}

/// The result of `f`; fails the test if it is not ready within 60 s.
template <class F>
auto wait(std::future<F>& f) {
  REQUIRE_MESSAGE(f.wait_for(60s) == std::future_status::ready, "operation did not complete");
  return f.get();
}

}  // namespace fusewire::test
