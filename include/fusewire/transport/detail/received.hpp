#pragma once
/// Bytes a stream transport received before a read asked for them. Private to
/// the transport layer.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>

#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// Copies the oldest bytes of `received` into `dst` from offset `filled` on,
/// until `dst` is full or nothing is left; consumes what it copied and
/// advances `filled`. Returns the number of bytes copied.
inline std::size_t take_received(std::deque<tensor_buffer>& received, mutable_buffer dst, std::size_t& filled) {
  std::size_t copied = 0;
  while (filled < dst.size() && !received.empty()) {
    tensor_buffer& b = received.front();
    const std::size_t n = std::min(b.size(), dst.size() - filled);
    std::memcpy(dst.data() + filled, b.data(), n);
    filled += n;
    copied += n;
    if (n == b.size()) {
      received.pop_front();
    } else {
      b.trim_front(n);
    }
  }
  return copied;
}

/// Copies exactly `dst.size()` bytes from `received` (consuming them) when at
/// least that many are there and returns true; else copies nothing and returns false.
inline bool take_exactly(std::deque<tensor_buffer>& received, mutable_buffer dst) {
  std::size_t have = 0;
  for (const tensor_buffer& b : received) {
    if (have >= dst.size()) break;
    have += b.size();
  }
  if (have < dst.size()) return false;
  std::size_t filled = 0;
  take_received(received, dst, filled);
  return true;
}

/// The state of a connection's read pump (the loop that serves its queued
/// reads in order). While the loop runs, a read queued by one of the handlers
/// it calls is left to that loop: it is served after the handler returns (so
/// never inline from its initiating call), in the same pass, without a posted
/// pump and the reactor tick that would cost. A pass serves at most `budget`
/// reads, so one busy connection cannot hold the reactor; the rest is posted.
struct read_pump {
  static constexpr unsigned budget = 64;

  bool running = false;

  /// Marks one pass of the loop (restores the previous state when it ends).
  class pass {
   public:
    explicit pass(read_pump& p) noexcept : pump_(p), outer_(p.running) { p.running = true; }
    ~pass() { pump_.running = outer_; }
    pass(const pass&) = delete;
    pass& operator=(const pass&) = delete;

    /// Counts a served read; false once the pass has used its budget.
    bool serve() noexcept { return ++served_ < budget; }

   private:
    read_pump& pump_;
    bool outer_;
    unsigned served_ = 0;
  };
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
