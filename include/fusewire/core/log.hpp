#pragma once
/// log_sink: where fusewire's diagnostic lines go (refused peers, bad frames,
/// transport fallbacks, PS stalls). Every layer takes one and writes through
/// write_log, so an embedder routes all of them to its own logger at once.

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace fusewire {
inline namespace v0 {

/// Receives one log line at a time, without a trailing newline; called on the
/// thread that has something to say (a reactor thread, for the endpoint).
using log_sink = std::function<void(std::string_view)>;

/// Gives `line` to `sink`, or writes it to stderr when `sink` is empty. A sink
/// that throws loses the line: logging never fails the caller.
inline void write_log(const log_sink& sink, const std::string& line) noexcept {
  if (!sink) {
    std::fprintf(stderr, "%s\n", line.c_str());
    return;
  }
  try {
    sink(line);
  } catch (...) {
  }
}

}  // namespace v0
}  // namespace fusewire
