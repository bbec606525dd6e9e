#pragma once
/// Small helpers of the reactor loop: reporting escaped exceptions, the
/// sleep/wake fence, relaxed counters. Private to the reactor layer.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

namespace fusewire {
inline namespace v0 {

namespace detail {

inline void report_to_stderr(unsigned reactor, std::string_view what) {
  std::fprintf(stderr, "fusewire: reactor %u: %.*s\n", reactor, static_cast<int>(what.size()), what.data());
}

inline std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// A full fence for the sleep/wake handshake. g++ warns (-Wtsan) that TSan does
// not model fences; it does not need to here: the fence only orders "queue an
// item" against "read the sleeping flag", the data itself travels by
// acquire/release through the queues, which TSan sees.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#endif
inline void full_fence() noexcept { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
