#pragma once
/// ps::serve_until_signal: the whole life of a PS process in one call — build
/// the server, serve until a worker asks for shutdown or a stop signal comes,
/// stop cleanly.
///
/// Signal contract: for the duration of the call it installs a handler for
/// `signals` (process-wide, as dispositions are) and puts the previous
/// dispositions back before it returns, after the server's threads are gone.
/// The handler only records the signal, so it does not matter which thread
/// the kernel delivers it to: threads that a library started earlier (a BLAS
/// pool, a framework's workers) with the signals unblocked are fine. A signal
/// that arrives while the server stops is consumed with the first. One that
/// arrives after the call returned meets the program's own disposition (by
/// default, it ends the process).

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/ps/config.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/server.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

namespace detail {

/// Stop signals seen while some serve_until_signal runs: the handler stores
/// the last one's number and bumps the count (lock-free atomics, so
/// async-signal-safe); each serve loop compares the count with its own start.
struct stop_signal_state {
  std::atomic<int> last{0};
  std::atomic<std::uint64_t> count{0};
  std::mutex mutex;  ///< guards users and saved (not touched by the handler)
  int users = 0;
  std::vector<std::pair<int, struct sigaction>> saved;
};

inline stop_signal_state& stop_signals() noexcept {
  static stop_signal_state s;
  return s;
}

extern "C" inline void on_stop_signal(int sig) {
  stop_signals().last.store(sig, std::memory_order_relaxed);
  stop_signals().count.fetch_add(1, std::memory_order_release);
}

/// Handles a signal set for its lifetime; see the file comment. Nested or
/// concurrent scopes share the handlers: the first installs them, the last
/// puts back what was there before.
class scoped_stop_signals {
 public:
  explicit scoped_stop_signals(std::initializer_list<int> signals) {
    static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free);
    sigset_t check;
    sigemptyset(&check);
    for (int s : signals) {
      if (s == SIGKILL || s == SIGSTOP || sigaddset(&check, s) != 0) {
        throw std::system_error(EINVAL, std::generic_category(),
                                "ps::serve_until_signal: bad signal " + std::to_string(s));
      }
    }
    stop_signal_state& st = stop_signals();
    std::lock_guard lock(st.mutex);
    start_ = st.count.load(std::memory_order_acquire);
    for (int s : signals) {
      bool known = false;
      for (const auto& [sig, old] : st.saved) known = known || sig == s;
      if (known) continue;
      struct sigaction sa {};
      sa.sa_handler = &on_stop_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;  // other threads' system calls go on
      struct sigaction old {};
      if (::sigaction(s, &sa, &old) != 0) {
        const int e = errno;
        restore(st);
        throw std::system_error(e, std::generic_category(), "ps::serve_until_signal: sigaction");
      }
      st.saved.emplace_back(s, old);
    }
    ++st.users;
  }
  scoped_stop_signals(const scoped_stop_signals&) = delete;
  scoped_stop_signals& operator=(const scoped_stop_signals&) = delete;
  ~scoped_stop_signals() {
    stop_signal_state& st = stop_signals();
    std::lock_guard lock(st.mutex);
    if (--st.users == 0) restore(st);
  }

  /// The last stop signal since this scope began, or 0.
  int taken() const noexcept {
    const stop_signal_state& st = stop_signals();
    return st.count.load(std::memory_order_acquire) != start_ ? st.last.load(std::memory_order_relaxed) : 0;
  }

 private:
  /// Puts back every saved disposition (mutex held).
  static void restore(stop_signal_state& st) noexcept {
    for (const auto& [sig, old] : st.saved) (void)::sigaction(sig, &old, nullptr);
    st.saved.clear();
  }

  std::uint64_t start_ = 0;
};

}  // namespace detail

/// Serves as PS task `self` (see server's constructor, whose errors it throws)
/// until a worker calls client::shutdown_servers() or one of `signals` arrives,
/// then stops the server and waits for its threads. Returns 0 after a worker's
/// shutdown, else the signal's number. See the file comment for the signal contract.
template <transport Transport>
int serve_until_signal(task_id self, cluster_spec spec, model_spec model, server_config<Transport> config = {},
                       std::initializer_list<int> signals = {SIGINT, SIGTERM}) {
  using namespace std::chrono_literals;
  detail::scoped_stop_signals stops(signals);
  server<Transport> srv(std::move(self), std::move(spec), std::move(model), std::move(config));
  int sig = 0;
  // A worker's shutdown is seen at once; a signal within one tick.
  while ((sig = stops.taken()) == 0 && !srv.wait_for(50ms)) {
  }
  srv.stop();
  return sig;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
