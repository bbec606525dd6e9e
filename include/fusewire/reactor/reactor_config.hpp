#pragma once
/// How a reactor group runs: count, wait mode, pinning, inbox sizes, and
/// where escaped exceptions are reported.

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>

namespace fusewire {
inline namespace v0 {

/// Receives what escaped a task or handler (the loop itself never throws): the
/// reactor's index and a description.
using reactor_error_reporter = std::function<void(unsigned reactor, std::string_view what)>;

/// How a reactor group runs: count, wait mode, pinning and inbox sizes.
struct reactor_config {
  reactor_mode mode = reactor_mode::adaptive;  ///< poll: never sleep; block: sleep when idle
  std::chrono::microseconds idle_poll{200};    ///< adaptive: how long to spin without work before sleeping
  unsigned count = 1;                          ///< reactors in the group (>= 1)
  bool pin_cores = false;            ///< pin reactor i to the i-th allowed CPU (round-robin over sched_getaffinity)
  std::size_t inbox_capacity = 128;  ///< slots per (sender, reactor) SPSC queue
  std::size_t batch = 16;            ///< inbox items taken per queue per tick (1..64)
  unsigned external_senders = 8;     ///< how many non-reactor threads may attach() at once
  std::chrono::milliseconds stop_timeout{10000};  ///< stop() gives up waiting for pending I/O after this
  reactor_error_reporter on_error;                ///< empty: print to stderr

  /// Throws std::system_error(errc::invalid_argument) naming the bad field and what is allowed.
  void validate() const {
    if (count == 0 || count > 4096) {
      throw_error(errc::invalid_argument, "reactor_config.count = " + std::to_string(count) + ": must be 1..4096");
    }
    if (inbox_capacity < 2 || inbox_capacity > (1u << 20)) {
      throw_error(errc::invalid_argument,
                  "reactor_config.inbox_capacity = " + std::to_string(inbox_capacity) + ": must be 2..1048576");
    }
    if (batch == 0 || batch > max_batch) {
      throw_error(errc::invalid_argument,
                  "reactor_config.batch = " + std::to_string(batch) + ": must be 1.." + std::to_string(max_batch));
    }
    if (idle_poll.count() < 0) {
      throw_error(errc::invalid_argument,
                  "reactor_config.idle_poll = " + std::to_string(idle_poll.count()) + "us: must not be negative");
    }
    if (external_senders > 1024) {
      throw_error(errc::invalid_argument,
                  "reactor_config.external_senders = " + std::to_string(external_senders) + ": must be 0..1024");
    }
  }

  static constexpr std::size_t max_batch = 64;
};

/// The reactor_config that fusewire's options ask for (mode, idle_poll,
/// pin_cores; count = o.reactor_count(connections)).
inline reactor_config make_reactor_config(const options& o, std::size_t connections) {
  reactor_config cfg;
  cfg.mode = o.mode;
  cfg.idle_poll = o.idle_poll;
  cfg.pin_cores = o.pin_cores;
  cfg.count = o.reactor_count(connections);
  return cfg;
}

}  // namespace v0
}  // namespace fusewire
