#pragma once
/// util::log_limiter: at most a few log lines per kind per interval, so that a
/// peer that misbehaves a million times writes a handful of lines, each saying
/// how many like it were left out. One owner thread; no locking.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace fusewire {
inline namespace v0 {
namespace util {

class log_limiter {
 public:
  using clock = std::chrono::steady_clock;

  /// Up to `burst` lines of each kind per `interval`.
  explicit log_limiter(std::size_t burst = 5, clock::duration interval = std::chrono::seconds(10)) noexcept
      : burst_(burst), interval_(interval) {}

  /// Whether a line of kind `kind` may be written now. When it may, `suffix`
  /// is set to what to append (" (N similar lines suppressed)") or left empty.
  bool allow(std::string_view kind, std::string& suffix, clock::time_point now = clock::now()) {
    suffix.clear();
    auto it = kinds_.find(kind);
    if (it == kinds_.end()) {
      if (kinds_.size() >= max_kinds) kinds_.clear();  // kinds are the code's, not a peer's: never many
      it = kinds_.emplace(std::string(kind), state{}).first;
    }
    state& s = it->second;
    if (s.lines == 0 || now - s.window_start >= interval_) {
      s.window_start = now;
      s.lines = 0;
    }
    if (s.lines >= burst_) {
      ++s.suppressed;
      return false;
    }
    ++s.lines;
    if (s.suppressed != 0) {
      suffix = " (" + std::to_string(s.suppressed) + " similar lines suppressed)";
      s.suppressed = 0;
    }
    return true;
  }

  /// Lines left out so far, over all kinds (for counters and tests).
  std::uint64_t suppressed_total() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [k, s] : kinds_) n += s.suppressed;
    return n;
  }

 private:
  struct state {
    clock::time_point window_start{};
    std::size_t lines = 0;
    std::uint64_t suppressed = 0;
  };
  static constexpr std::size_t max_kinds = 64;

  std::size_t burst_;
  clock::duration interval_;
  std::map<std::string, state, std::less<>> kinds_;
};

}  // namespace util
}  // namespace v0
}  // namespace fusewire
