#include "results.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

namespace fusewire::bench {

latency_summary summarize(std::vector<std::int64_t>& samples_ns) {
  latency_summary s;
  if (samples_ns.empty()) return s;
  const std::size_t n = samples_ns.size();
  auto at_rank = [&](double q) {
    std::size_t k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(n)));
    k = std::clamp<std::size_t>(k, 1, n) - 1;
    std::nth_element(samples_ns.begin(), samples_ns.begin() + static_cast<std::ptrdiff_t>(k), samples_ns.end());
    return static_cast<double>(samples_ns[k]) / 1000.0;
  };
  s.p50_us = at_rank(0.50);
  s.p99_us = at_rank(0.99);
  const auto [lo, hi] = std::minmax_element(samples_ns.begin(), samples_ns.end());
  s.min_us = static_cast<double>(*lo) / 1000.0;
  s.max_us = static_cast<double>(*hi) / 1000.0;
  const long double sum = std::accumulate(samples_ns.begin(), samples_ns.end(), 0.0L);
  s.mean_us = static_cast<double>(sum / static_cast<long double>(n)) / 1000.0;
  return s;
}

usage_snapshot take_usage() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  usage_snapshot u;
  u.user_s = static_cast<double>(ru.ru_utime.tv_sec) + static_cast<double>(ru.ru_utime.tv_usec) / 1e6;
  u.sys_s = static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) / 1e6;
  u.max_rss_kib = ru.ru_maxrss;
  u.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return u;
}

process_usage usage_between(const usage_snapshot& from, const usage_snapshot& to, role_kind role, unsigned task) {
  process_usage u;
  u.role = role;
  u.task = task;
  u.user_s = to.user_s - from.user_s;
  u.sys_s = to.sys_s - from.sys_s;
  u.wall_s = to.wall_s - from.wall_s;
  u.max_rss_kib = to.max_rss_kib;
  return u;
}

repetition combine(const std::vector<worker_result>& workers) {
  repetition r;
  if (workers.empty()) return r;
  double weighted_mean = 0;
  std::uint64_t exchanges = 0;
  r.latency.min_us = std::numeric_limits<double>::max();
  for (const worker_result& w : workers) {
    r.calls += w.calls;
    r.seconds = std::max(r.seconds, w.seconds);
    if (w.seconds > 0) {
      r.rpc_per_s += static_cast<double>(w.calls) / w.seconds;
      r.mb_per_s += static_cast<double>(w.calls) * static_cast<double>(w.payload_bytes) / w.seconds / 1e6;
    }
    weighted_mean += w.latency.mean_us * static_cast<double>(w.exchanges);
    exchanges += w.exchanges;
    r.latency.p50_us += w.latency.p50_us / static_cast<double>(workers.size());
    r.latency.p99_us = std::max(r.latency.p99_us, w.latency.p99_us);
    r.latency.min_us = std::min(r.latency.min_us, w.latency.min_us);
    r.latency.max_us = std::max(r.latency.max_us, w.latency.max_us);
    r.usage.push_back(w.usage);
  }
  r.latency.mean_us = exchanges ? weighted_mean / static_cast<double>(exchanges) : 0;
  // Workers on one host read the same interface counters: count each
  // (host, interface) once, with its busiest reading.
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> per_interface;
  for (const worker_result& w : workers) {
    if (w.net_interface.empty() || w.usage.wall_s <= 0) continue;
    auto& [tx, rx] = per_interface[{w.hostname, w.net_interface}];
    tx = std::max(tx, static_cast<double>(w.net_tx_bytes) / w.usage.wall_s / 1e6);
    rx = std::max(rx, static_cast<double>(w.net_rx_bytes) / w.usage.wall_s / 1e6);
  }
  for (const auto& [where, rates] : per_interface) {
    r.net_tx_mb_per_s += rates.first;
    r.net_rx_mb_per_s += rates.second;
    if (r.net_interfaces.find(where.second) == std::string::npos) {
      r.net_interfaces += (r.net_interfaces.empty() ? "" : ",") + where.second;
    }
  }
  return r;
}

bool cell::ran() const noexcept {
  return std::any_of(reps.begin(), reps.end(), [](const repetition& r) { return r.ok; });
}

double headline(benchmark_kind b, const repetition& r) noexcept {
  switch (b) {
    case benchmark_kind::p2p_latency:
      return r.latency.p50_us;
    case benchmark_kind::p2p_bandwidth:
      return r.mb_per_s;
    case benchmark_kind::ps_throughput:
      return r.rpc_per_s;
  }
  return 0;
}

std::string headline_unit(benchmark_kind b) {
  switch (b) {
    case benchmark_kind::p2p_latency:
      return "p50 us";
    case benchmark_kind::p2p_bandwidth:
      return "MB/s";
    case benchmark_kind::ps_throughput:
      return "RPC/s";
  }
  return "";
}

void to_json(nlohmann::json& j, const latency_summary& v) {
  j = {{"mean_us", v.mean_us}, {"p50_us", v.p50_us}, {"p99_us", v.p99_us}, {"min_us", v.min_us}, {"max_us", v.max_us}};
}

void from_json(const nlohmann::json& j, latency_summary& v) {
  v.mean_us = j.at("mean_us").get<double>();
  v.p50_us = j.at("p50_us").get<double>();
  v.p99_us = j.at("p99_us").get<double>();
  v.min_us = j.at("min_us").get<double>();
  v.max_us = j.at("max_us").get<double>();
}

void to_json(nlohmann::json& j, const process_usage& v) {
  j = {{"role", std::string(option_name(v.role))},
       {"task", v.task},
       {"user_s", v.user_s},
       {"sys_s", v.sys_s},
       {"wall_s", v.wall_s},
       {"cpu_percent", v.cpu_percent()},
       {"max_rss_kib", v.max_rss_kib}};
}

void from_json(const nlohmann::json& j, process_usage& v) {
  v.role = parse_role(j.at("role").get<std::string>());
  v.task = j.at("task").get<unsigned>();
  v.user_s = j.at("user_s").get<double>();
  v.sys_s = j.at("sys_s").get<double>();
  v.wall_s = j.at("wall_s").get<double>();
  v.max_rss_kib = j.at("max_rss_kib").get<long>();
}

void to_json(nlohmann::json& j, const worker_result& v) {
  j = {{"task", v.task},
       {"calls", v.calls},
       {"exchanges", v.exchanges},
       {"seconds", v.seconds},
       {"payload_bytes", v.payload_bytes},
       {"buffers", v.buffers},
       {"latency", v.latency},
       {"usage", v.usage},
       {"hostname", v.hostname},
       {"net_interface", v.net_interface},
       {"net_tx_bytes", v.net_tx_bytes},
       {"net_rx_bytes", v.net_rx_bytes}};
}

void from_json(const nlohmann::json& j, worker_result& v) {
  v.task = j.at("task").get<unsigned>();
  v.calls = j.at("calls").get<std::uint64_t>();
  v.exchanges = j.at("exchanges").get<std::uint64_t>();
  v.seconds = j.at("seconds").get<double>();
  v.payload_bytes = j.at("payload_bytes").get<std::size_t>();
  v.buffers = j.at("buffers").get<std::size_t>();
  v.latency = j.at("latency").get<latency_summary>();
  v.usage = j.at("usage").get<process_usage>();
  v.hostname = j.value("hostname", std::string());
  v.net_interface = j.value("net_interface", std::string());
  v.net_tx_bytes = j.value("net_tx_bytes", std::uint64_t{0});
  v.net_rx_bytes = j.value("net_rx_bytes", std::uint64_t{0});
}

void to_json(nlohmann::json& j, const repetition& v) {
  j = {{"ok", v.ok},
       {"seconds", v.seconds},
       {"calls", v.calls},
       {"rpc_per_s", v.rpc_per_s},
       {"mb_per_s", v.mb_per_s},
       {"net_tx_mb_per_s", v.net_tx_mb_per_s},
       {"net_rx_mb_per_s", v.net_rx_mb_per_s},
       {"net_interfaces", v.net_interfaces},
       {"latency", v.latency},
       {"usage", v.usage}};
  if (!v.ok) j["error"] = v.error;
}

void to_json(nlohmann::json& j, const cell& v) {
  j = {{"backend", v.backend.label()},
       {"benchmark", std::string(option_name(v.benchmark))},
       {"payload", v.payload_label},
       {"scheme", std::string(option_name(v.payload.kind))},
       {"mode", std::string(option_name(v.mode))},
       {"payload_bytes", v.payload_bytes},
       {"buffers", v.buffers},
       {"ps", v.ps},
       {"workers", v.workers},
       {"repetitions", v.reps}};
  if (!v.skipped.empty()) j["skipped"] = v.skipped;
  if (v.ran()) {
    const spread h = spread_of(v, [&](const repetition& r) { return headline(v.benchmark, r); });
    j["headline"] = {{"unit", headline_unit(v.benchmark)}, {"min", h.min}, {"median", h.median}, {"max", h.max}};
  }
}

}  // namespace fusewire::bench
