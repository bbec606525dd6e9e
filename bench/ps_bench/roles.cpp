#include "roles.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/transport/select.hpp>

#include "common/options.hpp"
#include "netstat.hpp"
#include "ps_api.hpp"
#include "results.hpp"

namespace fusewire::bench::psb {
namespace {

using clock_type = std::chrono::steady_clock;

std::atomic<bool> stop_requested{false};

extern "C" void on_stop(int) { stop_requested.store(true, std::memory_order_relaxed); }

/// The task's options: fusewire's environment knobs, then --reactor-mode;
/// block by default, since P + W processes share a few cores.
fusewire::options task_options(const run_settings& s, fusewire::role r) {
  example::option_choices command_line;
  if (!s.reactor_mode.empty()) command_line.mode = fusewire::reactor_mode_from_string(s.reactor_mode);
  return example::task_options(r, command_line, {.mode = fusewire::reactor_mode::block});
}

::fusewire::cluster_spec task_cluster(const std::string& cluster, const char* job, unsigned task) {
  ::fusewire::cluster_spec spec = ::fusewire::cluster_spec::from_string(cluster);
  spec.set_self(::fusewire::task_id{job, task});
  return spec;
}

ps::training_mode training(const run_settings& s) {
  return s.sync ? ps::training_mode::sync : ps::training_mode::async;
}

/// The PS's log, less the line it writes when a worker's connection closes:
/// workers leave when their window ends, before the launcher stops the PS.
/// A worker that dies mid-measurement fails its
/// own exit status, which the launcher reports.
void quiet_losses(std::string_view line) {
  if (line.find(" lost: ") == std::string_view::npos)
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

int run_ps_role(const run_settings& s, const cell_spec& c, const std::string& cluster, unsigned task) {
  struct sigaction sa {};
  sa.sa_handler = &on_stop;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  const ::fusewire::cluster_spec spec = task_cluster(cluster, "ps", task);
  const fusewire::options o = task_options(s, fusewire::role::ps);
  return fusewire::with_transport(s.transport, o, spec, [&]<class T>(T t) {
    const std::uint64_t requests = serve_ps<T>(
        spec, task, s.ps, c, {.options = o, .mode = training(s), .transport = std::move(t), .log = quiet_losses},
        stop_requested);
    // CPU and peak RSS of the whole life: the launcher subtracts what /proc
    // showed when the measured window began.
    const usage_snapshot u = take_usage();
    std::printf("@ps task=%u requests=%llu transport=%s user_s=%.6f sys_s=%.6f max_rss_kib=%ld\n", task,
                static_cast<unsigned long long>(requests), std::string(T::name()).c_str(), u.user_s, u.sys_s,
                u.max_rss_kib);
    std::fflush(stdout);
    return 0;
  });
}

int run_worker_role(const run_settings& s, const cell_spec& c, const std::string& cluster, unsigned task) {
  const ::fusewire::cluster_spec spec = task_cluster(cluster, "worker", task);
  const fusewire::options o = task_options(s, fusewire::role::worker);
  const auto barrier_timeout = std::chrono::seconds(30) + std::chrono::seconds(s.step_timeout_s);
  return fusewire::with_transport(s.transport, o, spec, [&]<class T>(T t) {
    step_maker<T> steps(spec, task, c,
                        {.options = o,
                         .mode = training(s),
                         .step_timeout = std::chrono::seconds(s.step_timeout_s),
                         .retry_interval = std::chrono::seconds(std::max(2u, s.step_timeout_s / 2)),
                         .transport = std::move(t)});
    // Warm-up: connections, first-touch of the PS's values, the caches. A
    // sync job counts steps (every worker must run as many), an async one
    // runs for the time given.
    const auto warm_start = clock_type::now();
    std::uint64_t warm = 0;
    do {
      steps.run();
      ++warm;
    } while (s.sync ? warm < s.sync_warmup_steps : seconds_since(warm_start) < s.warmup_s);

    // Every worker starts measuring at once.
    steps.barrier(barrier_timeout);
    std::printf("@start task=%u\n", task);
    std::fflush(stdout);
    std::vector<std::int64_t> samples;
    samples.reserve(1 << 16);
    const std::string interface = interface_towards(spec.job("ps").front().host);
    const net_counters net_before = read_net_counters(interface);
    const usage_snapshot before = take_usage();
    const auto start = clock_type::now();
    auto last_progress = start;
    auto last = start;
    for (;;) {
      steps.run();
      const auto now = clock_type::now();
      samples.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count());
      last = now;
      if (task == 0 && now - last_progress >= std::chrono::seconds(1)) {
        last_progress = now;
        std::printf("@progress elapsed=%.2f runs=%zu\n", seconds_since(start), samples.size());
        std::fflush(stdout);
      }
      if (s.sync ? samples.size() >= s.sync_steps : seconds_since(start) >= s.time_s) break;
    }
    const usage_snapshot after = take_usage();
    const net_counters net_after = read_net_counters(interface);
    const process_usage usage = usage_between(before, after, role_kind::worker, task);
    const double seconds = std::chrono::duration<double>(last - start).count();
    const std::size_t runs = samples.size();
    const latency_summary lat = summarize(samples);
    std::printf(
        "@result task=%u runs=%zu seconds=%.6f mean_us=%.3f p50_us=%.3f p99_us=%.3f min_us=%.3f max_us=%.3f "
        "transport=%s user_s=%.6f sys_s=%.6f wall_s=%.6f max_rss_kib=%ld net_interface=%s net_tx_bytes=%llu "
        "net_rx_bytes=%llu\n",
        task, runs, seconds, lat.mean_us, lat.p50_us, lat.p99_us, lat.min_us, lat.max_us,
        std::string(T::name()).c_str(), usage.user_s, usage.sys_s, usage.wall_s, usage.max_rss_kib,
        net_before.interface.empty() ? "-" : net_before.interface.c_str(),
        static_cast<unsigned long long>(net_after.tx_bytes - net_before.tx_bytes),
        static_cast<unsigned long long>(net_after.rx_bytes - net_before.rx_bytes));
    std::fflush(stdout);
    // The launcher stops the PS (SIGTERM) once every worker has exited: a
    // worker's shutdown_servers() could stop a PS while its replies to the
    // others are still on their way.
    return 0;
  });
}

}  // namespace fusewire::bench::psb
