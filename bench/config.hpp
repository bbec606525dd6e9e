#pragma once
/// fwbench's vocabulary: benchmarks, wire modes, wait modes, and the settings
/// a run, a PS or a worker is started with.

#include <chrono>
#include <cstdint>
#include <fusewire/core/error.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster.hpp"
#include "payload.hpp"

namespace fusewire::bench {

/// The three benchmarks of TF-gRPC-Bench.
enum class benchmark_kind : std::uint8_t { p2p_latency, p2p_bandwidth, ps_throughput };

/// Non-serialized (raw buffers on the wire) or serialized (one protobuf message
/// with `repeated bytes`, encoded by the sender and decoded on receipt).
enum class wire_mode : std::uint8_t { raw, serialized };

/// How a waiting thread waits: spin, spin a while then sleep, or sleep at once.
enum class wait_mode : std::uint8_t { poll, adaptive, block };

/// What the PS sends back: the payload itself, or an 8-byte count of what it received.
enum class reply_kind : std::uint8_t { echo, ack };

/// A process's part in a cluster.
enum class role_kind : std::uint8_t { ps, worker };

constexpr std::string_view option_name(benchmark_kind b) noexcept {
  switch (b) {
    case benchmark_kind::p2p_latency:
      return "p2p-latency";
    case benchmark_kind::p2p_bandwidth:
      return "p2p-bandwidth";
    case benchmark_kind::ps_throughput:
      return "ps-throughput";
  }
  return "?";
}

constexpr std::string_view option_name(wire_mode m) noexcept {
  return m == wire_mode::raw ? "non-serialized" : "serialized";
}

constexpr std::string_view option_name(wait_mode m) noexcept {
  switch (m) {
    case wait_mode::poll:
      return "poll";
    case wait_mode::adaptive:
      return "adaptive";
    case wait_mode::block:
      return "block";
  }
  return "?";
}

constexpr std::string_view option_name(role_kind r) noexcept { return r == role_kind::ps ? "ps" : "worker"; }

/// Latency echoes (the paper's echo function); bandwidth and throughput acknowledge.
constexpr reply_kind reply_for(benchmark_kind b) noexcept {
  return b == benchmark_kind::p2p_latency ? reply_kind::echo : reply_kind::ack;
}

inline benchmark_kind parse_benchmark(std::string_view text, std::string_view option = "--benchmark") {
  for (benchmark_kind b : {benchmark_kind::p2p_latency, benchmark_kind::p2p_bandwidth, benchmark_kind::ps_throughput}) {
    if (text == option_name(b)) return b;
  }
  throw_error(errc::invalid_argument, std::string(option) + " '" + std::string(text) +
                                          "' is not a benchmark; choose p2p-latency, p2p-bandwidth or ps-throughput");
}

inline wire_mode parse_wire_mode(std::string_view text, std::string_view option = "--mode") {
  if (text == "non-serialized" || text == "raw") return wire_mode::raw;
  if (text == "serialized") return wire_mode::serialized;
  throw_error(errc::invalid_argument,
              std::string(option) + " '" + std::string(text) + "' is not a mode; choose non-serialized or serialized");
}

inline wait_mode parse_wait_mode(std::string_view text, std::string_view option = "--reactor-mode") {
  for (wait_mode m : {wait_mode::poll, wait_mode::adaptive, wait_mode::block}) {
    if (text == option_name(m)) return m;
  }
  throw_error(errc::invalid_argument, std::string(option) + " '" + std::string(text) +
                                          "' is not a reactor mode; choose poll, adaptive or block");
}

inline role_kind parse_role(std::string_view text, std::string_view option = "--role") {
  if (text == "ps") return role_kind::ps;
  if (text == "worker") return role_kind::worker;
  throw_error(errc::invalid_argument,
              std::string(option) + " '" + std::string(text) + "' is not a role; choose ps or worker");
}

/// A backend as named on the command line: "floor", "zmq", "grpc", or
/// "name:mode" to fix its wait mode ("floor:poll", "floor:block").
struct backend_choice {
  std::string name;
  std::optional<wait_mode> mode;

  /// "floor:poll" when a mode is fixed, else just the name.
  std::string label() const { return mode ? name + ":" + std::string(option_name(*mode)) : name; }
  friend bool operator==(const backend_choice&, const backend_choice&) = default;
};

inline backend_choice parse_backend_choice(std::string_view text, std::string_view option = "--backend") {
  backend_choice choice;
  const std::size_t colon = text.find(':');
  choice.name = std::string(text.substr(0, colon));
  if (choice.name.empty()) {
    throw_error(errc::invalid_argument,
                std::string(option) + " '" + std::string(text) + "': the backend name is empty");
  }
  if (colon != std::string_view::npos) choice.mode = parse_wait_mode(text.substr(colon + 1), option);
  return choice;
}

/// Settings shared by every process of a run (what a backend is built with).
struct transport_settings {
  wait_mode mode = wait_mode::adaptive;
  std::chrono::microseconds idle_poll{200};  ///< adaptive: spin this long before sleeping
  bool fusion = false;                       ///< fusewire backends: tensor fusion on
  /// fusewire-shm/-auto: tensors in the transport's shared pool (allocate_registered),
  /// so that a peer on this host copies them once, straight out of the pool.
  bool shared_pool = false;
  bool pin = false;           ///< pin each process to one CPU of its cpuset
  unsigned grpc_threads = 1;  ///< gRPC PS: completion-queue threads
  /// fusewire-uring: writes of at least this many bytes use SEND_ZC (0: never);
  /// unset: the transport's default (uring_tcp::config::zc_threshold).
  std::optional<std::size_t> zc_threshold;
  /// fusewire backends: SO_SNDBUF of connections to a peer on this host (0: the
  /// kernel's autotuning); unset: the transport's default (local_send_buffer).
  std::optional<std::size_t> local_send_buffer;
  double connect_timeout_s = 30;  ///< worker: give up connecting after this
  friend bool operator==(const transport_settings&, const transport_settings&) = default;
};

/// How long each measurement runs.
struct timing {
  double warmup_s = 2;
  double run_s = 10;
  unsigned repetitions = 1;
  friend bool operator==(const timing&, const timing&) = default;
};

/// One PS or worker process, as started with `--role` (by hand or by the launcher).
struct role_config {
  role_kind role = role_kind::worker;
  unsigned task = 0;
  cluster_spec cluster;
  backend_choice backend{"floor", std::nullopt};
  benchmark_kind benchmark = benchmark_kind::p2p_latency;
  wire_mode mode = wire_mode::raw;
  payload_spec payload;
  transport_settings transport;
  timing time;
  bool managed = false;  ///< started by the launcher: JSON lines on stdout, commands on stdin
  friend bool operator==(const role_config&, const role_config&) = default;
};

/// Output files a run writes after its table.
struct output_files {
  std::string json;
  std::string csv;
  std::string plot;
  bool plot_optional = false;  ///< a default, not asked for: no gnuplot is a note, not a failure
};

/// A whole configuration run on this host: every combination of the lists.
struct run_config {
  std::vector<backend_choice> backends;  ///< empty: every built backend
  std::vector<benchmark_kind> benchmarks{benchmark_kind::p2p_latency};
  std::vector<scheme> schemes{scheme::uniform};
  std::vector<wire_mode> modes{wire_mode::raw};
  unsigned ps = 1;       ///< ps-throughput only; p2p runs one PS and one worker
  unsigned workers = 1;  ///< ps-throughput only
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;  ///< first PS port; 0: each PS picks a free one
  payload_spec payload;
  transport_settings transport;
  timing time;
  output_files outputs;
  bool quiet = false;
};

/// `fwbench compare`: the subject against every other backend on a fixed matrix.
struct compare_config {
  bool quick = false;
  std::string subject = "fusewire";  ///< "fusewire" = best built fusewire TCP transport
  run_config base;                   ///< timing, outputs, ps/workers
};

}  // namespace fusewire::bench
