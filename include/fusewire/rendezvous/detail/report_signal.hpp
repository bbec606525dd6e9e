#pragma once
/// Snapshot requests by signal: SIGUSR1 (or request_report()) asks every
/// rendezvous endpoint of the process to log its pending operations. The
/// handler only bumps an atomic count; each endpoint's stall check, on its
/// reactor thread, notices and writes the snapshot.

#include <signal.h>

#include <atomic>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// Snapshot requests: bumped by request_report() (a signal handler), compared
/// by every endpoint's stall check against the count it last answered.
inline std::atomic<unsigned>& report_requests() noexcept {
  static std::atomic<unsigned> n{0};
  return n;
}

extern "C" inline void on_report_signal(int) { report_requests().fetch_add(1, std::memory_order_relaxed); }

/// SIGUSR1 asks for a snapshot, when nobody else handles it: an application
/// that installed its own handler keeps it (and may call request_report()
/// from it). Once per process.
inline void install_report_signal() noexcept {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  struct sigaction old {};
  if (::sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
  struct sigaction sa {};
  sa.sa_handler = &on_report_signal;
  ::sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  (void)::sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace detail

/// Asks every endpoint of this process for a snapshot of its pending
/// operations, written to its log at its next stall check (within a second).
/// Async-signal-safe: for an application that handles SIGUSR1 itself.
inline void request_report() noexcept { detail::on_report_signal(0); }

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
