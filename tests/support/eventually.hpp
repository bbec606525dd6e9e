#pragma once
/// A bounded wait for a state that another thread reaches on its own time.
#include <chrono>
#include <thread>

namespace fusewire::test {

/// Polls `done()` every millisecond until it holds or `limit` has passed; its
/// last answer. The bound is a hang guard, not a timing check, so it is wide
/// enough for sanitizer builds on a loaded host.
template <class F>
bool eventually(F&& done, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace fusewire::test
