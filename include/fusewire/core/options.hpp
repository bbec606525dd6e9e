#pragma once
/// options: every tunable of fusewire in one typed struct, with defaults, a
/// validate() that names what is wrong, and from_env() reading the seeds'
/// environment knobs (DeepRec GRPC++, RDMA-TensorFlow) plus fusewire's own.
///
/// `env_knobs` is the single table of variables (name, default, meaning).
/// docs/configuration.md lists the same knobs by hand; tests/unit/docs/readme.cpp
/// checks that it has a row for each with its real default.

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <fusewire/util/text.hpp>
#include <fusewire/core/env.hpp>
#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {

/// Which side of the job a process is; picks the WORKER_* or PS_* knobs.
enum class role : std::uint8_t { worker, ps };

/// How a reactor waits for work: spin forever, spin a while then sleep, or sleep at once.
enum class reactor_mode : std::uint8_t { poll, adaptive, block };

constexpr std::string_view to_string(role r) noexcept { return r == role::ps ? "ps" : "worker"; }

constexpr std::string_view to_string(reactor_mode m) noexcept {
  switch (m) {
    case reactor_mode::poll:
      return "poll";
    case reactor_mode::adaptive:
      return "adaptive";
    case reactor_mode::block:
      return "block";
  }
  return "invalid";
}

/// "poll", "adaptive" or "block", in any letter case; nullopt otherwise.
constexpr std::optional<reactor_mode> reactor_mode_from_string(std::string_view s) noexcept {
  for (reactor_mode m : {reactor_mode::poll, reactor_mode::adaptive, reactor_mode::block}) {
    if (util::iequals(s, to_string(m))) return m;
  }
  return std::nullopt;
}

/// One environment variable: its name, the value that gives the default
/// behaviour ("" when leaving it unset means something no value does), and
/// what it controls.
struct knob {
  std::string_view name;
  std::string_view default_value;
  std::string_view meaning;
};

/// Every environment variable options::from_env() reads. Booleans accept
/// true/false, 1/0, yes/no, on/off (any case); sizes are decimal byte counts;
/// a variable set to the empty string counts as unset.
inline constexpr std::array<knob, 39> env_knobs{{
    {"WORKER_ENABLE_POLLING", "",
     "worker reactors: true = busy-poll, false = sleep when idle; unset = adaptive (see "
     "FUSEWIRE_IDLE_POLL_US)"},
    {"PS_ENABLE_POLLING", "", "parameter-server reactors: true = busy-poll, false = sleep when idle; unset = adaptive"},
    {"NETWORK_WORKER_CORE_NUMBER", "",
     "worker reactor (communication thread) count, 1 to 1024, capped by the number of connections; "
     "unset = min(16, connections) (a rendezvous endpoint: 1)"},
    {"NETWORK_PS_CORE_NUMBER", "",
     "parameter-server reactor count, 1 to 1024, capped by the number of connections; unset = "
     "min(16, connections) (a rendezvous endpoint: 1; ps::server: a lane per worker, at most 16)"},
    {"WORKER_DISABLE_PIN_CORES", "true", "false pins each worker reactor to one CPU of the process's cpuset"},
    {"PS_DISABLE_PIN_CORES", "true", "false pins each parameter-server reactor to one CPU of the process's cpuset"},
    {"TENSOR_FUSE", "false",
     "fuse the send/recv messages between the same two tasks in one ready-wave of a step into one message "
     "(graph::partition_options::from)"},
    {"TF_RDMA_ENABLED", "true", "use RDMA verbs when the device is present; false = TCP only"},
    {"TF_RDMA_DEV_NAME", "mlx5_0", "RDMA device (HCA) to use"},
    {"TF_RDMA_CHUNK_SIZE", "4194304", "bytes per chunk when a large tensor is split and its chunks sent in parallel"},
    {"TF_RDMA_ACC_SIZE", "8192", "small payloads are sent eagerly, coalesced into batches of up to this many bytes"},
    {"TF_RDMA_BUF_SIZE", "1073741824",
     "bytes of registered (pinned) RDMA memory one verbs reactor may hold, at most; a positive multiple of 1 GiB "
     "(1073741824)"},
    {"FUSEWIRE_REACTOR_MODE", "", "poll, adaptive or block; overrides WORKER_ENABLE_POLLING and PS_ENABLE_POLLING"},
    {"FUSEWIRE_IDLE_POLL_US", "200",
     "adaptive mode: microseconds a reactor keeps polling after its last work before it sleeps "
     "(0 to 1000000)"},
    {"FUSEWIRE_POOL_SIZE", "67108864",
     "bytes of the buffer pool, mapped up front; a multiple of FUSEWIRE_POOL_BLOCK_SIZE"},
    {"FUSEWIRE_POOL_BLOCK_SIZE", "65536",
     "bytes per pool block, the largest pooled buffer; a power of two from 64 to 1073741824"},
    {"FUSEWIRE_COALESCE", "true",
     "coalesce small sends to the same peer (up to TF_RDMA_ACC_SIZE bytes) into one frame"},
    {"FUSEWIRE_FUSE_DELAY_US", "0",
     "microseconds a coalescing batch may wait for more sends (0 to 1000000); 0 = only what is "
     "queued in the same reactor tick, no added latency"},
    {"FUSEWIRE_CHUNKING", "true", "split tensors larger than TF_RDMA_CHUNK_SIZE into chunks sent in parallel"},
    {"FUSEWIRE_CONNECT_TIMEOUT_MS", "60000",
     "milliseconds to keep retrying a peer that cannot be reached before failing (0 to "
     "86400000); 0 = retry forever"},
    {"FUSEWIRE_KEEPALIVE_MS", "10000",
     "milliseconds between keepalive probes on an idle connection (0 to 86400000); 0 = off"},
    {"FUSEWIRE_CLUSTER_TOKEN", "",
     "shared secret: when set, peers must prove they hold it when they connect; required unless every "
     "address of the cluster is loopback or FUSEWIRE_INSECURE is true"},
    {"FUSEWIRE_CLUSTER_TOKEN_FILE", "",
     "path of a file holding the cluster token (one trailing newline is dropped); instead of "
     "FUSEWIRE_CLUSTER_TOKEN, which must then be unset"},
    {"FUSEWIRE_INSECURE", "false",
     "true runs a cluster with non-loopback addresses without a cluster token (a warning is logged at start)"},
    {"FUSEWIRE_HANDSHAKE_TIMEOUT_MS", "10000",
     "milliseconds an accepted connection has to finish its handshake, and a connecting one to get its "
     "answer, before it is closed (100 to 86400000)"},
    {"FUSEWIRE_MAX_PENDING_HANDSHAKES", "256",
     "accepted connections that have not finished their handshake, at most (1 to 1000000); more are "
     "closed at once"},
    {"FUSEWIRE_MAX_PENDING_PER_SOURCE", "32", "of those, at most this many from one source address (1 to 1000000)"},
    {"FUSEWIRE_MAX_FRAME_BYTES", "268435456",
     "largest frame payload accepted from a peer (at least 4096); longer length fields are "
     "rejected before anything is allocated"},
    {"FUSEWIRE_MAX_TRANSFER_BYTES", "4294967296",
     "largest tensor a peer may announce for a chunked transfer or a receive request (at least "
     "FUSEWIRE_MAX_FRAME_BYTES); larger announcements are refused before anything is allocated"},
    {"FUSEWIRE_RECV_BUDGET_BYTES", "2147483648",
     "bytes this process holds for tensors that arrived before their receive was posted, and for "
     "partial chunked transfers (at least 65536); when full, peers are not read until it drains"},
    {"FUSEWIRE_RECV_PEER_BUDGET_BYTES", "536870912",
     "the same, for one peer (at least 65536, at most FUSEWIRE_RECV_BUDGET_BYTES)"},
    {"FUSEWIRE_TRANSFER_IDLE_MS", "60000",
     "milliseconds a partial chunked transfer may go without a new chunk before it is dropped (0 to "
     "86400000); 0 = never"},
    {"FUSEWIRE_UNMATCHED_MAX_AGE_MS", "600000",
     "milliseconds a tensor that arrived for no posted receive is kept before it is dropped and "
     "counted (0 to 86400000); 0 = kept until its receive or the peer's restart"},
    {"FUSEWIRE_STALL_MS", "5000",
     "milliseconds an operation may stay pending before a stall report names it, then again at "
     "doubling ages (0 to 86400000); 0 = off (SIGUSR1 snapshots still work)"},
    {"FUSEWIRE_STATS_FILE", "",
     "path the endpoint's counters are written to every FUSEWIRE_STATS_INTERVAL_MS ({task} becomes the task, "
     "e.g. worker-0); unset = none"},
    {"FUSEWIRE_STATS_INTERVAL_MS", "10000", "milliseconds between counter dumps (100 to 86400000)"},
    {"FUSEWIRE_STATS_FORMAT", "json",
     "json appends one JSON line per dump; prometheus rewrites the file in the Prometheus text format"},
    {"FUSEWIRE_TRACE", "",
     "path of a Chrome trace (chrome://tracing, Perfetto) of every send and receive, written when the endpoint "
     "closes ({task} becomes the task); unset = no trace"},
    {"FUSEWIRE_TRACE_EVENTS", "1000000",
     "spans a trace keeps, at most, per process (1000 to 100000000); later ones are counted, not kept"},
}};

/// Reactor count used when none is configured (and the seeds' cap).
inline constexpr unsigned default_reactor_cap = 16;

/// fusewire's configuration. Defaults match the seeds where they name one.
struct options {
  /// Reactor wait policy (WORKER/PS_ENABLE_POLLING, FUSEWIRE_REACTOR_MODE).
  reactor_mode mode = reactor_mode::adaptive;
  /// Adaptive mode: how long to keep polling after the last work (FUSEWIRE_IDLE_POLL_US).
  std::chrono::microseconds idle_poll{200};
  /// Reactor count; 0 = automatic, see reactor_count() (NETWORK_*_CORE_NUMBER).
  unsigned cores = 0;
  /// Pin each reactor to one CPU of the cpuset (!*_DISABLE_PIN_CORES).
  bool pin_cores = false;
  /// Fuse a plan's send/recv messages per ready-wave (TENSOR_FUSE); graph::partition_options::from reads it.
  bool tensor_fuse = false;
  /// Coalesce small sends per peer (FUSEWIRE_COALESCE).
  bool coalesce = true;
  /// Eager/coalescing threshold and batch limit in bytes (TF_RDMA_ACC_SIZE).
  std::size_t acc_size = 8192;
  /// How long a coalescing batch may wait for more (FUSEWIRE_FUSE_DELAY_US).
  std::chrono::microseconds fuse_delay{0};
  /// Split large tensors into chunks (FUSEWIRE_CHUNKING).
  bool chunking = true;
  /// Chunk size in bytes (TF_RDMA_CHUNK_SIZE).
  std::size_t chunk_size = 4194304;
  /// Use RDMA when available (TF_RDMA_ENABLED).
  bool rdma_enabled = true;
  /// RDMA device name (TF_RDMA_DEV_NAME).
  std::string rdma_device = "mlx5_0";
  /// Registered RDMA memory per verbs reactor in bytes, at most; a multiple of 1 GiB
  /// (TF_RDMA_BUF_SIZE). verbs_config::from makes it verbs_config::registered_limit.
  std::size_t rdma_buf_size = std::size_t{1} << 30;
  /// Buffer pool bytes (FUSEWIRE_POOL_SIZE).
  std::size_t pool_size = std::size_t{64} << 20;
  /// Buffer pool block bytes, a power of two (FUSEWIRE_POOL_BLOCK_SIZE).
  std::size_t pool_block_size = std::size_t{64} << 10;
  /// Give up on an unreachable peer after this long; 0 = never (FUSEWIRE_CONNECT_TIMEOUT_MS).
  std::chrono::milliseconds connect_timeout{60000};
  /// Keepalive probe interval on idle connections; 0 = off (FUSEWIRE_KEEPALIVE_MS).
  std::chrono::milliseconds keepalive{10000};
  /// Shared secret for the connection handshake; empty = none (FUSEWIRE_CLUSTER_TOKEN).
  std::string cluster_token;
  /// Largest frame payload accepted from a peer (FUSEWIRE_MAX_FRAME_BYTES).
  std::size_t max_frame_bytes = std::size_t{256} << 20;
  /// Run a cluster with non-loopback addresses without a token (FUSEWIRE_INSECURE).
  bool insecure = false;
  /// Deadline of a connection's handshake, both sides (FUSEWIRE_HANDSHAKE_TIMEOUT_MS).
  std::chrono::milliseconds handshake_timeout{10000};
  /// Accepted connections still in their handshake, at most (FUSEWIRE_MAX_PENDING_HANDSHAKES).
  std::size_t max_pending_handshakes = 256;
  /// Of those, at most this many from one source address (FUSEWIRE_MAX_PENDING_PER_SOURCE).
  std::size_t max_pending_per_source = 32;
  /// Largest tensor a peer may announce for one transfer (FUSEWIRE_MAX_TRANSFER_BYTES).
  std::size_t max_transfer_bytes = std::size_t{4} << 30;
  /// Bytes held for early arrivals and partial transfers, whole process (FUSEWIRE_RECV_BUDGET_BYTES).
  std::size_t recv_budget = std::size_t{2} << 30;
  /// The same, per peer (FUSEWIRE_RECV_PEER_BUDGET_BYTES).
  std::size_t recv_peer_budget = std::size_t{512} << 20;
  /// A partial transfer without progress for this long is dropped; 0 = never (FUSEWIRE_TRANSFER_IDLE_MS).
  std::chrono::milliseconds transfer_idle{60000};
  /// An unmatched arrival older than this is dropped; 0 = never (FUSEWIRE_UNMATCHED_MAX_AGE_MS).
  std::chrono::milliseconds unmatched_max_age{600000};
  /// Pending operations older than this are reported, again at doubling ages; 0 = off (FUSEWIRE_STALL_MS).
  std::chrono::milliseconds stall_report{5000};
  /// Where counters are dumped; empty = nowhere (FUSEWIRE_STATS_FILE).
  std::string stats_file;
  /// Time between counter dumps (FUSEWIRE_STATS_INTERVAL_MS).
  std::chrono::milliseconds stats_interval{10000};
  /// Counter dump format, "json" or "prometheus" (FUSEWIRE_STATS_FORMAT).
  std::string stats_format = "json";
  /// Where the timeline is written; empty = no trace (FUSEWIRE_TRACE).
  std::string trace_file;
  /// Spans the timeline keeps, at most (FUSEWIRE_TRACE_EVENTS).
  std::size_t trace_events = 1000000;

  /// Throws system_error(errc::invalid_config) naming the first bad field, its
  /// value, its environment variable and what is allowed.
  void validate() const;

  /// Defaults overridden by this process's environment, for role `r`; validated.
  /// Throws system_error(errc::invalid_config) naming the variable, its value
  /// and what is allowed.
  static options from_env(role r) { return from_env(r, process_env()); }

  /// from_env() reading variables through `lookup` instead of the process environment.
  static options from_env(role r, const env_lookup& lookup);

  /// Reactors to run for `connections` connections: min(cores, connections),
  /// or min(16, connections) when cores is 0; at least 1.
  unsigned reactor_count(std::size_t connections) const noexcept {
    const std::size_t cap = cores != 0 ? cores : default_reactor_cap;
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(cap, connections)));
  }

  friend bool operator==(const options&, const options&) = default;
};

namespace detail {

inline constexpr std::uint64_t gib = std::uint64_t{1} << 30;
inline constexpr std::uint64_t uint_max = std::numeric_limits<std::uint64_t>::max();
inline constexpr std::size_t max_token_file_bytes = 4096;

/// Which unsigned values a knob accepts, and how to say so.
struct uint_rule {
  std::uint64_t min = 0;
  std::uint64_t max = uint_max;
  std::uint64_t multiple_of = 1;
  bool power_of_two = false;
  std::string_view expected;

  constexpr bool accepts(std::uint64_t v) const noexcept {
    return v >= min && v <= max && v % multiple_of == 0 && (!power_of_two || (v & (v - 1)) == 0);
  }
};

inline constexpr uint_rule cores_rule{1, 1024, 1, false, "expected a number of cores (an integer from 1 to 1024)"};
inline constexpr uint_rule micros_rule{0, 1000000, 1, false, "expected microseconds (an integer from 0 to 1000000)"};
inline constexpr uint_rule millis_rule{0, 86400000, 1, false, "expected milliseconds (an integer from 0 to 86400000)"};
inline constexpr uint_rule trace_events_rule{1000, 100000000, 1, false,
                                             "expected a number of spans (an integer from 1000 to 100000000)"};
inline constexpr uint_rule stats_interval_rule{100, 86400000, 1, false,
                                               "expected milliseconds (an integer from 100 to 86400000)"};
inline constexpr uint_rule chunk_rule{1, uint_max, 1, false,
                                      "expected a size in bytes (a positive integer such as 4194304)"};
inline constexpr uint_rule acc_rule{1, uint_max, 1, false,
                                    "expected a size in bytes (a positive integer such as 8192)"};
inline constexpr uint_rule pool_size_rule{1, uint_max, 1, false,
                                          "expected a size in bytes (a positive integer such as 67108864)"};
inline constexpr uint_rule block_rule{64, gib, 1, true,
                                      "expected a power of two in bytes from 64 to 1073741824 (such as 65536)"};
inline constexpr uint_rule buf_rule{
    gib, uint_max, gib, false, "expected a positive multiple of 1 GiB in bytes (such as 1073741824 or 10737418240)"};
inline constexpr uint_rule frame_rule{4096, uint_max, 1, false,
                                      "expected a size in bytes (an integer of at least 4096, such as 268435456)"};
inline constexpr uint_rule handshake_rule{100, 86400000, 1, false,
                                          "expected milliseconds (an integer from 100 to 86400000)"};
inline constexpr uint_rule count_rule{1, 1000000, 1, false, "expected a count (an integer from 1 to 1000000)"};
inline constexpr uint_rule transfer_rule{4096, uint_max, 1, false,
                                         "expected a size in bytes (an integer of at least 4096, such as 4294967296)"};
inline constexpr uint_rule budget_rule{65536, uint_max, 1, false,
                                       "expected a size in bytes (an integer of at least 65536, such as 536870912)"};

[[noreturn]] inline void bad_env(std::string_view name, std::string_view value, std::string_view what) {
  throw_error(errc::invalid_config, std::string(name) + "=" + util::quoted(value) + ": " + std::string(what));
}

inline std::uint64_t env_uint(std::string_view name, std::string_view value, const uint_rule& rule) {
  std::uint64_t v = 0;
  switch (util::parse_uint(value, v)) {
    case util::uint_parse::ok:
      break;
    case util::uint_parse::not_a_number:
      bad_env(name, value, rule.expected);
    case util::uint_parse::out_of_range:
      if (rule.max == uint_max) bad_env(name, value, "too large (at most 18446744073709551615)");
      bad_env(name, value, rule.expected);
  }
  if (!rule.accepts(v)) bad_env(name, value, rule.expected);
  return v;
}

/// The cluster token held in file `path`: its bytes, less one trailing newline.
/// The error names the variable and the path, never the file's content.
inline std::string read_token_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    bad_env("FUSEWIRE_CLUSTER_TOKEN_FILE", path, std::string("cannot open it: ") + std::strerror(errno));
  }
  std::string token;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && token.size() <= max_token_file_bytes) token.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) bad_env("FUSEWIRE_CLUSTER_TOKEN_FILE", path, "cannot read it");
  if (token.size() > max_token_file_bytes) {
    bad_env("FUSEWIRE_CLUSTER_TOKEN_FILE", path, "the file is larger than 4096 bytes: not a token");
  }
  if (!token.empty() && token.back() == '\n') token.pop_back();
  if (!token.empty() && token.back() == '\r') token.pop_back();
  if (token.empty()) bad_env("FUSEWIRE_CLUSTER_TOKEN_FILE", path, "the file is empty");
  return token;
}

inline bool env_bool(std::string_view name, std::string_view value) {
  if (auto b = util::parse_bool(value)) return *b;
  bad_env(name, value, "expected a boolean (true/false, 1/0, yes/no, on/off)");
}

[[noreturn]] inline void bad_field(std::string_view field, const std::string& value, std::string_view env,
                                   std::string_view what) {
  throw_error(errc::invalid_config,
              "options." + std::string(field) + " = " + value + " (" + std::string(env) + "): " + std::string(what));
}

inline void check_field(std::string_view field, std::uint64_t v, std::string_view env, const uint_rule& rule) {
  if (!rule.accepts(v)) bad_field(field, std::to_string(v), env, rule.expected);
}

}  // namespace detail

inline void options::validate() const {
  using namespace detail;
  if (mode != reactor_mode::poll && mode != reactor_mode::adaptive && mode != reactor_mode::block) {
    bad_field("mode", std::to_string(static_cast<int>(mode)), "FUSEWIRE_REACTOR_MODE",
              "expected poll, adaptive or block");
  }
  if (idle_poll.count() < 0) {
    bad_field("idle_poll", std::to_string(idle_poll.count()), "FUSEWIRE_IDLE_POLL_US", micros_rule.expected);
  }
  check_field("idle_poll", static_cast<std::uint64_t>(idle_poll.count()), "FUSEWIRE_IDLE_POLL_US", micros_rule);
  if (cores != 0) {
    check_field("cores", cores, "NETWORK_WORKER_CORE_NUMBER or NETWORK_PS_CORE_NUMBER",
                uint_rule{1, 1024, 1, false, "expected 0 (automatic) or a number of cores from 1 to 1024"});
  }
  check_field("acc_size", acc_size, "TF_RDMA_ACC_SIZE", acc_rule);
  if (fuse_delay.count() < 0) {
    bad_field("fuse_delay", std::to_string(fuse_delay.count()), "FUSEWIRE_FUSE_DELAY_US", micros_rule.expected);
  }
  check_field("fuse_delay", static_cast<std::uint64_t>(fuse_delay.count()), "FUSEWIRE_FUSE_DELAY_US", micros_rule);
  check_field("chunk_size", chunk_size, "TF_RDMA_CHUNK_SIZE", chunk_rule);
  if (rdma_device.empty()) {
    bad_field("rdma_device", "''", "TF_RDMA_DEV_NAME", "expected an RDMA device name such as mlx5_0");
  }
  check_field("rdma_buf_size", rdma_buf_size, "TF_RDMA_BUF_SIZE", buf_rule);
  check_field("pool_size", pool_size, "FUSEWIRE_POOL_SIZE", pool_size_rule);
  check_field("pool_block_size", pool_block_size, "FUSEWIRE_POOL_BLOCK_SIZE", block_rule);
  auto check_millis = [](std::string_view field, std::chrono::milliseconds value, std::string_view env,
                         const uint_rule& rule = millis_rule) {
    if (value.count() < 0) bad_field(field, std::to_string(value.count()), env, rule.expected);
    check_field(field, static_cast<std::uint64_t>(value.count()), env, rule);
  };
  check_millis("connect_timeout", connect_timeout, "FUSEWIRE_CONNECT_TIMEOUT_MS");
  check_millis("keepalive", keepalive, "FUSEWIRE_KEEPALIVE_MS");
  check_field("max_frame_bytes", max_frame_bytes, "FUSEWIRE_MAX_FRAME_BYTES", frame_rule);
  check_millis("handshake_timeout", handshake_timeout, "FUSEWIRE_HANDSHAKE_TIMEOUT_MS", handshake_rule);
  check_field("max_pending_handshakes", max_pending_handshakes, "FUSEWIRE_MAX_PENDING_HANDSHAKES", count_rule);
  check_field("max_pending_per_source", max_pending_per_source, "FUSEWIRE_MAX_PENDING_PER_SOURCE", count_rule);
  check_field("max_transfer_bytes", max_transfer_bytes, "FUSEWIRE_MAX_TRANSFER_BYTES", transfer_rule);
  check_field("recv_budget", recv_budget, "FUSEWIRE_RECV_BUDGET_BYTES", budget_rule);
  check_field("recv_peer_budget", recv_peer_budget, "FUSEWIRE_RECV_PEER_BUDGET_BYTES", budget_rule);
  check_millis("transfer_idle", transfer_idle, "FUSEWIRE_TRANSFER_IDLE_MS");
  check_millis("unmatched_max_age", unmatched_max_age, "FUSEWIRE_UNMATCHED_MAX_AGE_MS");
  check_millis("stall_report", stall_report, "FUSEWIRE_STALL_MS");
  check_millis("stats_interval", stats_interval, "FUSEWIRE_STATS_INTERVAL_MS", stats_interval_rule);
  if (stats_format != "json" && stats_format != "prometheus") {
    bad_field("stats_format", "'" + stats_format + "'", "FUSEWIRE_STATS_FORMAT", "expected json or prometheus");
  }
  check_field("trace_events", trace_events, "FUSEWIRE_TRACE_EVENTS", trace_events_rule);
  if (max_transfer_bytes < max_frame_bytes) {
    throw_error(errc::invalid_config, "options.max_transfer_bytes = " + std::to_string(max_transfer_bytes) +
                                          " (FUSEWIRE_MAX_TRANSFER_BYTES) is below options.max_frame_bytes = " +
                                          std::to_string(max_frame_bytes) + " (FUSEWIRE_MAX_FRAME_BYTES)");
  }
  if (recv_peer_budget > recv_budget) {
    throw_error(errc::invalid_config, "options.recv_peer_budget = " + std::to_string(recv_peer_budget) +
                                          " (FUSEWIRE_RECV_PEER_BUDGET_BYTES) exceeds options.recv_budget = " +
                                          std::to_string(recv_budget) + " (FUSEWIRE_RECV_BUDGET_BYTES)");
  }

  if (pool_size % pool_block_size != 0) {
    throw_error(errc::invalid_config, "options.pool_size = " + std::to_string(pool_size) +
                                          " (FUSEWIRE_POOL_SIZE) is not a multiple of options.pool_block_size = " +
                                          std::to_string(pool_block_size) + " (FUSEWIRE_POOL_BLOCK_SIZE)");
  }
  if (chunking && chunk_size > max_frame_bytes) {
    throw_error(errc::invalid_config,
                "options.chunk_size = " + std::to_string(chunk_size) +
                    " (TF_RDMA_CHUNK_SIZE) exceeds options.max_frame_bytes = " + std::to_string(max_frame_bytes) +
                    " (FUSEWIRE_MAX_FRAME_BYTES): a chunk must fit in one frame");
  }
  if (coalesce && acc_size > max_frame_bytes) {
    throw_error(errc::invalid_config,
                "options.acc_size = " + std::to_string(acc_size) +
                    " (TF_RDMA_ACC_SIZE) exceeds options.max_frame_bytes = " + std::to_string(max_frame_bytes) +
                    " (FUSEWIRE_MAX_FRAME_BYTES): a coalesced batch must fit in one frame");
  }
}

inline options options::from_env(role r, const env_lookup& lookup) {
  using namespace detail;
  options o;
  const bool ps = r == role::ps;
  // An empty value counts as unset.
  auto get = [&](std::string_view name) -> std::optional<std::string> {
    std::optional<std::string> v = lookup(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  auto read_bool = [&](std::string_view name, bool& field) {
    if (auto v = get(name)) field = env_bool(name, *v);
  };
  auto read_size = [&](std::string_view name, std::size_t& field, const uint_rule& rule) {
    if (auto v = get(name)) field = static_cast<std::size_t>(env_uint(name, *v, rule));
  };
  auto read_millis = [&](std::string_view name, std::chrono::milliseconds& field, const uint_rule& rule) {
    if (auto v = get(name)) field = std::chrono::milliseconds(env_uint(name, *v, rule));
  };

  const std::string_view polling = ps ? "PS_ENABLE_POLLING" : "WORKER_ENABLE_POLLING";
  if (auto v = get(polling)) o.mode = env_bool(polling, *v) ? reactor_mode::poll : reactor_mode::block;
  const std::string_view core_number = ps ? "NETWORK_PS_CORE_NUMBER" : "NETWORK_WORKER_CORE_NUMBER";
  if (auto v = get(core_number)) o.cores = static_cast<unsigned>(env_uint(core_number, *v, cores_rule));
  const std::string_view no_pin = ps ? "PS_DISABLE_PIN_CORES" : "WORKER_DISABLE_PIN_CORES";
  if (auto v = get(no_pin)) o.pin_cores = !env_bool(no_pin, *v);
  read_bool("TENSOR_FUSE", o.tensor_fuse);
  read_bool("TF_RDMA_ENABLED", o.rdma_enabled);
  if (auto v = get("TF_RDMA_DEV_NAME")) o.rdma_device = *v;
  read_size("TF_RDMA_CHUNK_SIZE", o.chunk_size, chunk_rule);
  read_size("TF_RDMA_ACC_SIZE", o.acc_size, acc_rule);
  read_size("TF_RDMA_BUF_SIZE", o.rdma_buf_size, buf_rule);
  if (auto v = get("FUSEWIRE_REACTOR_MODE")) {
    auto m = reactor_mode_from_string(*v);
    if (!m) bad_env("FUSEWIRE_REACTOR_MODE", *v, "expected poll, adaptive or block");
    o.mode = *m;
  }
  if (auto v = get("FUSEWIRE_IDLE_POLL_US")) {
    o.idle_poll = std::chrono::microseconds(env_uint("FUSEWIRE_IDLE_POLL_US", *v, micros_rule));
  }
  read_size("FUSEWIRE_POOL_SIZE", o.pool_size, pool_size_rule);
  read_size("FUSEWIRE_POOL_BLOCK_SIZE", o.pool_block_size, block_rule);
  read_bool("FUSEWIRE_COALESCE", o.coalesce);
  if (auto v = get("FUSEWIRE_FUSE_DELAY_US")) {
    o.fuse_delay = std::chrono::microseconds(env_uint("FUSEWIRE_FUSE_DELAY_US", *v, micros_rule));
  }
  read_bool("FUSEWIRE_CHUNKING", o.chunking);
  read_millis("FUSEWIRE_CONNECT_TIMEOUT_MS", o.connect_timeout, millis_rule);
  read_millis("FUSEWIRE_KEEPALIVE_MS", o.keepalive, millis_rule);
  if (auto v = get("FUSEWIRE_CLUSTER_TOKEN")) o.cluster_token = *v;
  if (auto v = get("FUSEWIRE_CLUSTER_TOKEN_FILE")) {
    if (!o.cluster_token.empty()) {
      bad_env("FUSEWIRE_CLUSTER_TOKEN_FILE", *v, "FUSEWIRE_CLUSTER_TOKEN is set too: set only one of them");
    }
    o.cluster_token = read_token_file(*v);
  }
  read_bool("FUSEWIRE_INSECURE", o.insecure);
  read_millis("FUSEWIRE_HANDSHAKE_TIMEOUT_MS", o.handshake_timeout, handshake_rule);
  read_size("FUSEWIRE_MAX_PENDING_HANDSHAKES", o.max_pending_handshakes, count_rule);
  read_size("FUSEWIRE_MAX_PENDING_PER_SOURCE", o.max_pending_per_source, count_rule);
  read_size("FUSEWIRE_MAX_FRAME_BYTES", o.max_frame_bytes, frame_rule);
  read_size("FUSEWIRE_MAX_TRANSFER_BYTES", o.max_transfer_bytes, transfer_rule);
  read_size("FUSEWIRE_RECV_BUDGET_BYTES", o.recv_budget, budget_rule);
  read_size("FUSEWIRE_RECV_PEER_BUDGET_BYTES", o.recv_peer_budget, budget_rule);
  read_millis("FUSEWIRE_TRANSFER_IDLE_MS", o.transfer_idle, millis_rule);
  read_millis("FUSEWIRE_UNMATCHED_MAX_AGE_MS", o.unmatched_max_age, millis_rule);
  read_millis("FUSEWIRE_STALL_MS", o.stall_report, millis_rule);
  if (auto v = get("FUSEWIRE_STATS_FILE")) o.stats_file = *v;
  read_millis("FUSEWIRE_STATS_INTERVAL_MS", o.stats_interval, stats_interval_rule);
  if (auto v = get("FUSEWIRE_STATS_FORMAT")) {
    if (*v != "json" && *v != "prometheus") bad_env("FUSEWIRE_STATS_FORMAT", *v, "expected json or prometheus");
    o.stats_format = *v;
  }
  if (auto v = get("FUSEWIRE_TRACE")) o.trace_file = *v;
  read_size("FUSEWIRE_TRACE_EVENTS", o.trace_events, trace_events_rule);
  o.validate();
  return o;
}

/// One line for logs and benchmark headers; the cluster token is shown only as set/unset.
inline std::string to_string(const options& o) {
  auto b = [](bool v) { return v ? std::string("true") : std::string("false"); };
  std::string s;
  s += "mode=" + std::string(to_string(o.mode));
  s += " idle_poll_us=" + std::to_string(o.idle_poll.count());
  s += " cores=" + (o.cores == 0 ? std::string("auto") : std::to_string(o.cores));
  s += " pin_cores=" + b(o.pin_cores);
  s += " tensor_fuse=" + b(o.tensor_fuse);
  s += " coalesce=" + b(o.coalesce);
  s += " acc_size=" + std::to_string(o.acc_size);
  s += " fuse_delay_us=" + std::to_string(o.fuse_delay.count());
  s += " chunking=" + b(o.chunking);
  s += " chunk_size=" + std::to_string(o.chunk_size);
  s += " rdma=" + b(o.rdma_enabled);
  s += " rdma_device=" + o.rdma_device;
  s += " rdma_buf_size=" + std::to_string(o.rdma_buf_size);
  s += " pool_size=" + std::to_string(o.pool_size);
  s += " pool_block_size=" + std::to_string(o.pool_block_size);
  s += " connect_timeout_ms=" + std::to_string(o.connect_timeout.count());
  s += " keepalive_ms=" + std::to_string(o.keepalive.count());
  s += " cluster_token=" + std::string(o.cluster_token.empty() ? "unset" : "set");
  s += " max_frame_bytes=" + std::to_string(o.max_frame_bytes);
  s += " insecure=" + b(o.insecure);
  s += " handshake_timeout_ms=" + std::to_string(o.handshake_timeout.count());
  s += " max_pending_handshakes=" + std::to_string(o.max_pending_handshakes);
  s += " max_pending_per_source=" + std::to_string(o.max_pending_per_source);
  s += " max_transfer_bytes=" + std::to_string(o.max_transfer_bytes);
  s += " recv_budget=" + std::to_string(o.recv_budget);
  s += " recv_peer_budget=" + std::to_string(o.recv_peer_budget);
  s += " transfer_idle_ms=" + std::to_string(o.transfer_idle.count());
  s += " unmatched_max_age_ms=" + std::to_string(o.unmatched_max_age.count());
  s += " stall_ms=" + std::to_string(o.stall_report.count());
  s += " stats_file=" + (o.stats_file.empty() ? std::string("unset") : o.stats_file);
  s += " stats_interval_ms=" + std::to_string(o.stats_interval.count());
  s += " stats_format=" + o.stats_format;
  s += " trace=" + (o.trace_file.empty() ? std::string("unset") : o.trace_file);
  s += " trace_events=" + std::to_string(o.trace_events);
  return s;
}

}  // namespace v0
}  // namespace fusewire
