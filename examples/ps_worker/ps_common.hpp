// What both PS examples (ps_worker, embedding) do the same way: pick the
// transport, build fusewire options from the command line, serve as a PS
// until told to stop, and the end-of-training handshake of async workers.
#pragma once

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/ps/ps.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace example {

namespace ps = fusewire::ps;

#if FUSEWIRE_HAS_URING
inline constexpr const char* default_transport = "uring";
#else
inline constexpr const char* default_transport = "asio";
#endif

/// Transports this build can use, for --transport.
inline std::vector<std::string> transport_names() {
#if FUSEWIRE_HAS_URING
  return {"uring", "asio"};
#else
  return {"asio"};
#endif
}

/// Calls `f.template operator()<Transport>()` for the transport named `name`.
template <class F>
decltype(auto) with_transport(const std::string& name, F&& f) {
#if FUSEWIRE_HAS_URING
  if (name == "uring") return f.template operator()<fusewire::uring_tcp>();
#endif
  if (name != "asio") throw std::invalid_argument("--transport '" + name + "' is not available in this build");
  return f.template operator()<fusewire::asio_tcp>();
}

/// fusewire options for reactor mode `mode` ("poll", "adaptive", "block") and fusion on/off.
inline fusewire::options net_options(const std::string& mode, bool fusion) {
  fusewire::options o;
  o.mode = *fusewire::reactor_mode_from_string(mode);
  o.coalesce = fusion;
  o.tensor_fuse = fusion;
  o.connect_timeout = std::chrono::seconds(60);
  return o;
}

/// Name of the per-worker "finished" flags: async workers set theirs, worker 0
/// waits for all before it evaluates the final model.
inline constexpr const char* done_variable = "control/done";

/// Adds the done flags (plain SGD with lr 1: pushing -1 at index i sets flag i to 1).
inline void add_done_flags(ps::model_spec& m, std::size_t workers) {
  m.add_dense(done_variable, {static_cast<std::int64_t>(workers)}, ps::initializer::zeros(),
              ps::optimizer_config::sgd(1.0f));
}

/// Sets worker `task`'s done flag; worker 0 then waits until every worker set its own.
template <class Client>
void finish_training(Client& client, unsigned task, std::size_t workers) {
  std::vector<float> flag(workers, 0.0f);
  flag[task] = -1.0f;
  client.push(done_variable, flag);
  if (task != 0) return;
  for (;;) {
    const std::vector<float> done = client.pull(done_variable);
    if (std::all_of(done.begin(), done.end(), [](float f) { return f >= 0.5f; })) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// A PS process: serves `model` until a worker calls shutdown_servers() or SIGTERM/SIGINT arrives.
template <class Transport>
int serve(const fusewire::cluster_spec& spec, unsigned task, ps::model_spec model, fusewire::options net, bool sync) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // threads started below inherit the mask
  ps::server_options so;
  so.mode = sync ? ps::training_mode::sync : ps::training_mode::async;
  ps::server<Transport> server({"ps", task}, spec, std::move(model), std::move(net), so);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig != SIGUSR1) server.stop();
  });
  server.wait();
  pthread_kill(stopper.native_handle(), SIGUSR1);  // wakes the waiter when no signal came
  stopper.join();
  return 0;
}

}  // namespace example
