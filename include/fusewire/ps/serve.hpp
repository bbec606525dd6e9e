#pragma once
/// ps::serve_until_signal: the whole life of a PS process in one call — build
/// the server, serve until a worker asks for shutdown or a stop signal comes,
/// stop cleanly.
///
/// Signal contract: it blocks `signals` in the calling thread before the server
/// starts its threads (so they inherit the block), takes them with
/// sigtimedwait, and restores the calling thread's mask before it returns,
/// after the server's threads are gone. It installs no handler and touches no
/// other thread's mask, so threads the program started earlier must block
/// these signals themselves (or not exist): the kernel may deliver a
/// process-directed signal to any thread that does not block it, where its
/// default action ends the process. A signal that arrives while the server
/// stops is consumed with the first, not left pending.

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <initializer_list>
#include <string>
#include <system_error>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/ps/config.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/server.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

namespace detail {
/// Blocks a signal set in the calling thread for its lifetime; see the file comment.
class scoped_signal_block {
 public:
  explicit scoped_signal_block(std::initializer_list<int> signals) {
    sigemptyset(&set_);
    for (int s : signals) {
      if (sigaddset(&set_, s) != 0)
        throw std::system_error(EINVAL, std::generic_category(),
                                "ps::serve_until_signal: bad signal " + std::to_string(s));
    }
    if (const int e = pthread_sigmask(SIG_BLOCK, &set_, &old_); e != 0) {
      throw std::system_error(e, std::generic_category(), "ps::serve_until_signal: pthread_sigmask");
    }
  }
  scoped_signal_block(const scoped_signal_block&) = delete;
  scoped_signal_block& operator=(const scoped_signal_block&) = delete;
  /// Takes any of the signals still pending, then restores the thread's mask.
  ~scoped_signal_block() {
    while (take(std::chrono::milliseconds(0)) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

  /// One of the signals if it came within `wait`, else 0.
  int take(std::chrono::milliseconds wait) noexcept {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    const timespec ts{static_cast<std::time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    const int s = sigtimedwait(&set_, nullptr, &ts);
    return s > 0 ? s : 0;
  }

 private:
  sigset_t set_;
  sigset_t old_;
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
  detail::scoped_signal_block block(signals);  // before the server's threads start: they inherit it
  server<Transport> srv(std::move(self), std::move(spec), std::move(model), std::move(config));
  int sig = 0;
  // A worker's shutdown is seen within one tick; a signal at once.
  while (sig == 0 && !srv.wait_for(0ms)) sig = block.take(50ms);
  srv.stop();
  return sig;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
