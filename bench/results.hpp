#pragma once
/// What fwbench measures: per process (CPU time, peak RSS), per worker
/// (calls, round trips, network bytes), per repetition and per configuration
/// ("cell").

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "config.hpp"
#include "payload.hpp"

namespace fusewire::bench {

/// Round-trip statistics in microseconds.
struct latency_summary {
  double mean_us = 0;
  double p50_us = 0;
  double p99_us = 0;
  double min_us = 0;
  double max_us = 0;
};

/// Exact statistics of `samples_ns` (reordered in place); zeros when empty.
latency_summary summarize(std::vector<std::int64_t>& samples_ns);

/// getrusage(RUSAGE_SELF) at one moment, plus the wall clock.
struct usage_snapshot {
  double user_s = 0;
  double sys_s = 0;
  long max_rss_kib = 0;
  double wall_s = 0;  ///< steady clock, seconds
};

usage_snapshot take_usage();

/// One process's resource use over the measured window (RSS: peak of its life).
struct process_usage {
  role_kind role = role_kind::worker;
  unsigned task = 0;
  double user_s = 0;
  double sys_s = 0;
  double wall_s = 0;
  long max_rss_kib = 0;

  /// CPU time over wall time, in percent (100 = one core busy).
  double cpu_percent() const noexcept { return wall_s > 0 ? 100.0 * (user_s + sys_s) / wall_s : 0; }
};

process_usage usage_between(const usage_snapshot& from, const usage_snapshot& to, role_kind role, unsigned task);

/// What one worker reports after its run.
struct worker_result {
  unsigned task = 0;
  std::uint64_t calls = 0;      ///< RPCs (exchanges x PS count)
  std::uint64_t exchanges = 0;  ///< payload sent to every PS and every reply in
  double seconds = 0;
  std::size_t payload_bytes = 0;
  std::size_t buffers = 0;
  latency_summary latency;  ///< per exchange
  process_usage usage;
  /// The host's interface counters over the measured window (usage.wall_s):
  /// the interface carrying this worker's traffic to the first PS.
  std::string hostname;
  std::string net_interface;  ///< empty: not measured
  std::uint64_t net_tx_bytes = 0;
  std::uint64_t net_rx_bytes = 0;
};

/// One repetition of one configuration (all its workers together).
struct repetition {
  bool ok = true;
  std::string error;
  double seconds = 0;
  std::uint64_t calls = 0;
  double rpc_per_s = 0;     ///< sum over workers
  double mb_per_s = 0;      ///< payload bytes sent per second (1 MB = 10^6 B), sum over workers
  latency_summary latency;  ///< one worker: exact; several: mean of p50s, worst p99
  std::vector<process_usage> usage;
  /// Bytes per second (10^6) the interfaces carrying the traffic sent and
  /// received, headers included: per (host, interface) the largest figure
  /// of its workers (they all see the same counters), summed over them. On one
  /// host everything crosses lo, so sent equals received.
  double net_tx_mb_per_s = 0;
  double net_rx_mb_per_s = 0;
  std::string net_interfaces;  ///< "lo", "eth0", ...; empty when not measured
};

/// Combines the workers of one repetition.
repetition combine(const std::vector<worker_result>& workers);

/// One configuration: backend x benchmark x payload x mode, with its repetitions.
struct cell {
  backend_choice backend;
  benchmark_kind benchmark = benchmark_kind::p2p_latency;
  std::string payload_label;  ///< "uniform", "skew", ..., or "10 B" for a single buffer
  payload_spec payload;
  wire_mode mode = wire_mode::raw;
  std::size_t payload_bytes = 0;
  std::size_t buffers = 0;
  unsigned ps = 1;
  unsigned workers = 1;
  std::string skipped;  ///< why it did not run (backend not built); empty when it ran
  std::vector<repetition> reps;

  bool ran() const noexcept;  ///< at least one repetition succeeded
};

/// The benchmark's headline number of a repetition: p50 round trip (µs) for
/// p2p-latency, MB/s for p2p-bandwidth, RPC/s for ps-throughput.
double headline(benchmark_kind b, const repetition& r) noexcept;
/// True when a smaller headline is better (latency).
constexpr bool lower_is_better(benchmark_kind b) noexcept { return b == benchmark_kind::p2p_latency; }
std::string headline_unit(benchmark_kind b);

/// min / median / max of a number over the successful repetitions.
struct spread {
  double min = 0;
  double median = 0;
  double max = 0;
  std::size_t count = 0;
};

template <typename Get>
  requires std::is_invocable_r_v<double, Get, const repetition&>
spread spread_of(const cell& c, Get get) {
  std::vector<double> values;
  for (const repetition& r : c.reps) {
    if (r.ok) values.push_back(get(r));
  }
  spread s;
  s.count = values.size();
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  const std::size_t n = values.size();
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return s;
}

void to_json(nlohmann::json& j, const latency_summary& v);
void from_json(const nlohmann::json& j, latency_summary& v);
void to_json(nlohmann::json& j, const process_usage& v);
void from_json(const nlohmann::json& j, process_usage& v);
void to_json(nlohmann::json& j, const worker_result& v);
void from_json(const nlohmann::json& j, worker_result& v);
void to_json(nlohmann::json& j, const repetition& v);
void to_json(nlohmann::json& j, const cell& v);

}  // namespace fusewire::bench
