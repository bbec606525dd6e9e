#include "roles.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fusewire/core/error.hpp>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "backend.hpp"
#include "netstat.hpp"
#include "results.hpp"

namespace fusewire::bench {
namespace {

using clock_type = std::chrono::steady_clock;

void emit(const nlohmann::json& event) {
  const std::string line = event.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

/// Reads one command line from the launcher; "" at end of input.
std::string read_command() {
  std::string line;
  if (!std::getline(std::cin, line)) return {};
  return line;
}

std::string describe(const role_config& c) {
  std::string scheme = std::string(option_name(c.payload.kind));
  return c.backend.label() + " " + std::string(option_name(c.benchmark)) + " " + scheme + " " +
         std::string(option_name(c.mode));
}

transport_settings effective_transport(const role_config& c) {
  transport_settings t = c.transport;
  if (c.backend.mode) t.mode = *c.backend.mode;
  return t;
}

void maybe_pin(const role_config& c) {
  if (!c.transport.pin) return;
  const unsigned slot = c.role == role_kind::ps ? c.task : static_cast<unsigned>(c.cluster.ps.size()) + c.task;
  const int cpu = pin_to_slot(slot);
  if (!c.managed && cpu >= 0)
    std::fprintf(stderr, "fwbench %s %u: pinned to CPU %d\n", std::string(option_name(c.role)).c_str(), c.task, cpu);
}

}  // namespace

int pin_to_slot(unsigned index) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &allowed)) cpus.push_back(i);
  }
  if (cpus.empty()) return -1;
  const int cpu = cpus[index % cpus.size()];
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (::sched_setaffinity(0, sizeof one, &one) != 0) return -1;
  return cpu;
}

int run_ps(const role_config& config) {
  const backend_info& info = require_backend(config.backend);
  maybe_pin(config);
  // Ctrl-C and SIGTERM go to one thread that stops the server; block them
  // before any library starts its own threads.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  server_config sc;
  sc.listen = config.cluster.ps.at(config.task);
  sc.reply = reply_for(config.benchmark);
  sc.mode = config.mode;
  sc.transport = effective_transport(config);
  sc.cluster = config.cluster;
  sc.task = config.task;
  // Shared with the detached control threads, which may outlive this call.
  struct control_state {
    std::shared_ptr<server> srv;
    std::mutex mutex;
    usage_snapshot mark;
  };
  auto control = std::make_shared<control_state>();
  control->srv = info.make_server(sc);
  control->mark = take_usage();
  std::thread([control, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    control->srv->stop();
  }).detach();

  if (config.managed) {
    emit({{"event", "listening"}, {"port", control->srv->port()}});
    std::thread([control] {
      while (true) {
        const std::string command = read_command();
        if (command == "mark") {
          const usage_snapshot now = take_usage();
          std::lock_guard lock(control->mutex);
          control->mark = now;
          continue;
        }
        if (command.empty() || command == "stop") break;
      }
      control->srv->stop();
    }).detach();
  } else {
    std::fprintf(stderr, "fwbench ps %u: %s listening on %s:%u; Ctrl-C stops it\n", config.task,
                 describe(config).c_str(), sc.listen.host.c_str(), control->srv->port());
  }
  control->srv->run();
  usage_snapshot mark;
  {
    std::lock_guard lock(control->mutex);
    mark = control->mark;
  }
  const process_usage usage = usage_between(mark, take_usage(), role_kind::ps, config.task);
  if (config.managed) {
    emit({{"event", "done"}, {"usage", usage}});
  } else {
    std::fprintf(stderr,
                 "fwbench ps %u: stopped; cpu user %.2f s, sys %.2f s over %.1f s (%.0f%%), peak RSS %.1f MiB\n",
                 config.task, usage.user_s, usage.sys_s, usage.wall_s, usage.cpu_percent(),
                 static_cast<double>(usage.max_rss_kib) / 1024.0);
  }
  return 0;
}

int run_worker(const role_config& config) {
  const backend_info& info = require_backend(config.backend);
  maybe_pin(config);
  // Every worker sends the same payload, so that the size reported for a
  // run is the size every worker sent.
  const buffer_plan plan = plan_payload(config.payload, 0);
  const payload data(plan, config.payload.seed + config.task);

  client_config cc;
  cc.ps = config.cluster.ps;
  cc.reply = reply_for(config.benchmark);
  cc.mode = config.mode;
  cc.transport = effective_transport(config);
  cc.workers = config.cluster.workers;
  cc.task = config.task;
  std::unique_ptr<client> cli = info.make_client(cc);

  const bool tty = !config.managed && ::isatty(STDERR_FILENO);
  if (config.managed) {
    emit({{"event", "ready"}});
    if (read_command() != "go") return 1;
  } else {
    std::fprintf(stderr, "fwbench worker %u: %s, %zu buffers = %s, to %zu PS\n", config.task, describe(config).c_str(),
                 data.count(), format_size(data.total_size()).c_str(), config.cluster.ps.size());
  }

  const std::size_t expected = data.total_size() * config.cluster.ps.size();
  check_replied(cli->exchange(data.buffers(), true), expected);

  auto progress = [&](const char* phase, double elapsed, double total, std::uint64_t calls) {
    if (config.managed) {
      emit({{"event", "progress"}, {"phase", phase}, {"elapsed", elapsed}, {"total", total}, {"calls", calls}});
    } else if (tty) {
      std::fprintf(stderr, "\r  %s %.0f/%.0f s, %llu calls   ", phase, elapsed, total,
                   static_cast<unsigned long long>(calls));
    }
  };

  exchange_run warm;
  warm.payload = data.buffers();
  warm.expected_reply = expected;
  const auto warm_start = clock_type::now();
  warm.until = warm_start +
               std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(config.time.warmup_s));
  warm.tick = [&](std::uint64_t n) {
    progress("warmup", std::chrono::duration<double>(clock_type::now() - warm_start).count(), config.time.warmup_s, n);
  };
  cli->run(warm);

  std::vector<std::int64_t> samples;
  samples.reserve(1 << 16);
  // RDMA: the device's port counters (TF_RDMA_DEV_NAME, else the first device).
  const char* rdma_dev = std::getenv("TF_RDMA_DEV_NAME");
  const std::string rdma_device = rdma_dev ? rdma_dev : "";
  auto read_counters = [&,
                        net_interface = info.rdma ? std::string() : interface_towards(config.cluster.ps.front().host)] {
    return info.rdma ? read_rdma_counters(rdma_device) : read_net_counters(net_interface);
  };
  const net_counters net_before = read_counters();
  const usage_snapshot before = take_usage();
  const auto start = clock_type::now();
  exchange_run measured;
  measured.payload = data.buffers();
  measured.expected_reply = expected;
  measured.until =
      start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(config.time.run_s));
  measured.samples = &samples;
  measured.tick = [&](std::uint64_t n) {
    progress("run", std::chrono::duration<double>(clock_type::now() - start).count(), config.time.run_s,
             n * config.cluster.ps.size());
  };
  cli->run(measured);
  const auto now = clock_type::now();
  const usage_snapshot after = take_usage();
  const net_counters net_after = read_counters();
  cli.reset();

  worker_result result;
  result.task = config.task;
  result.exchanges = samples.size();
  result.calls = samples.size() * config.cluster.ps.size();
  // The round trips follow each other without gaps, so their sum is the
  // measured time (and not what a late wake-up of this thread adds to it).
  std::int64_t measured_ns = 0;
  for (std::int64_t s : samples) measured_ns += s;
  result.seconds =
      samples.empty() ? std::chrono::duration<double>(now - start).count() : static_cast<double>(measured_ns) / 1e9;
  result.payload_bytes = data.total_size();
  result.buffers = data.count();
  result.latency = summarize(samples);
  result.usage = usage_between(before, after, role_kind::worker, config.task);
  if (!net_before.interface.empty() && net_before.interface == net_after.interface) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    result.hostname = host;
    result.net_interface = net_before.interface;
    result.net_tx_bytes = net_after.tx_bytes - net_before.tx_bytes;
    result.net_rx_bytes = net_after.rx_bytes - net_before.rx_bytes;
  }

  if (config.managed) {
    emit({{"event", "result"}, {"result", result}});
    return 0;
  }
  if (tty) std::fprintf(stderr, "\r%60s\r", "");
  const double rate = static_cast<double>(result.calls) / result.seconds;
  std::printf("fwbench worker %u: %s\n", config.task, describe(config).c_str());
  std::printf("  %llu calls in %.2f s: %.0f RPC/s, %.1f MB/s\n", static_cast<unsigned long long>(result.calls),
              result.seconds, rate, rate * static_cast<double>(result.payload_bytes) / 1e6);
  std::printf("  round trip: mean %.1f us, p50 %.1f us, p99 %.1f us (min %.1f, max %.1f)\n", result.latency.mean_us,
              result.latency.p50_us, result.latency.p99_us, result.latency.min_us, result.latency.max_us);
  std::printf("  cpu user %.2f s, sys %.2f s (%.0f%%), peak RSS %.1f MiB\n", result.usage.user_s, result.usage.sys_s,
              result.usage.cpu_percent(), static_cast<double>(result.usage.max_rss_kib) / 1024.0);
  if (!result.net_interface.empty() && result.usage.wall_s > 0) {
    std::printf("  network (%s): sent %.1f MB/s, received %.1f MB/s\n", result.net_interface.c_str(),
                static_cast<double>(result.net_tx_bytes) / result.usage.wall_s / 1e6,
                static_cast<double>(result.net_rx_bytes) / result.usage.wall_s / 1e6);
  }
  return 0;
}

}  // namespace fusewire::bench
