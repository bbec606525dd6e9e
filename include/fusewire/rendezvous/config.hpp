#pragma once
/// What a rendezvous::endpoint is made with (endpoint_config: options, tuning,
/// transport, log sink) and what it reports: counters (endpoint_stats,
/// peer_counters) and the operations it waits on (pending_operation).

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fusewire/core/log.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

/// Counters of one endpoint; read from any thread (approximate while it runs).
struct endpoint_stats {
  std::uint64_t tensor_frames_sent = 0;    ///< frames carrying one tensor
  std::uint64_t fused_frames_sent = 0;     ///< frames carrying several small tensors
  std::uint64_t tensors_fused = 0;         ///< tensors that left inside fused frames
  std::uint64_t chunk_frames_sent = 0;     ///< chunk frames of large tensors
  std::uint64_t keepalive_pings = 0;       ///< pings sent on idle connections
  std::uint64_t connections_made = 0;      ///< connections this endpoint made (handshake done)
  std::uint64_t connections_accepted = 0;  ///< connections peers made to it (handshake done)
  std::uint64_t connections_reused = 0;    ///< times it sent to a peer on a connection that peer made
  /// Receive budget (docs/rendezvous.md, "Limits"): bytes held now for tensors
  /// that arrived before their receive and for chunked transfers into the
  /// endpoint's own buffers (options.recv_budget, recv_peer_budget).
  std::uint64_t recv_held_bytes = 0;
  std::uint64_t recv_pauses = 0;                ///< times a connection stopped being read because a budget was full
  std::uint64_t transfers_dropped_idle = 0;     ///< partial chunked transfers dropped after options.transfer_idle
  std::uint64_t transfers_dropped_restart = 0;  ///< partial transfers dropped because their peer restarted
  std::uint64_t arrivals_dropped_restart = 0;   ///< unreceived tensors dropped because their peer restarted
  std::uint64_t arrivals_dropped_age = 0;       ///< unreceived tensors dropped after options.unmatched_max_age
  std::uint64_t frames_too_large = 0;  ///< frames or transfers above max_frame_bytes / max_transfer_bytes (closed)
};

/// False when built with FUSEWIRE_NO_OBSERVE defined: the per-peer counters
/// and the operations' start stamps are compiled out (stall reports then give
/// no ages and peer_counters stay zero). For measuring what they cost.
#if defined(FUSEWIRE_NO_OBSERVE)
inline constexpr bool observe_enabled = false;
#else
inline constexpr bool observe_enabled = true;
#endif

/// One reactor of an endpoint (endpoint::reactor_usages()): where its time went and
/// how much of its buffer pool is in use. Any thread, approximate while it runs.
struct reactor_usage {
  unsigned reactor = 0;
  std::uint64_t busy_ns = 0;   ///< in loop iterations that did work
  std::uint64_t idle_ns = 0;   ///< in iterations that found nothing, asleep included
  std::uint64_t sleep_ns = 0;  ///< asleep in the kernel (block and adaptive modes)
  std::uint64_t ticks = 0;     ///< loop iterations
  std::uint64_t tasks = 0;     ///< tasks handed to it (operations started, replies, timers' work)
  /// The reactor's share of the receive pool (options.pool_size): blocks, the
  /// ones holding early arrivals now, and allocations that found it exhausted.
  std::uint64_t pool_blocks = 0;
  std::uint64_t pool_blocks_in_use = 0;
  std::uint64_t pool_exhausted = 0;
};

/// Counters of the traffic with one peer (endpoint::counters()); each is
/// written by the reactor that owns the peer and read from any thread.
struct peer_counters {
  std::string peer;                      ///< task name, e.g. "ps:0"
  std::uint64_t sends = 0;               ///< sends completed without error
  std::uint64_t bytes_sent = 0;          ///< their payload bytes
  std::uint64_t send_errors = 0;         ///< sends completed with an error (timeouts, resets, cancels)
  std::uint64_t recvs = 0;               ///< receives completed without error
  std::uint64_t bytes_received = 0;      ///< their payload bytes
  std::uint64_t recv_errors = 0;         ///< receives completed with an error
  std::uint64_t tensor_frames_sent = 0;  ///< frames carrying one tensor
  std::uint64_t fused_frames_sent = 0;   ///< frames carrying several small tensors
  std::uint64_t tensors_fused = 0;       ///< tensors inside those (tensors per fused frame = this / fused_frames_sent)
  std::uint64_t chunk_frames_sent = 0;   ///< chunk frames of large tensors
  std::uint64_t connects = 0;            ///< connections made to it (handshake done); above 1 = reconnects
  std::uint64_t connections_lost = 0;    ///< times its connections broke (not counting an orderly close)
  std::uint64_t pending_sends = 0;       ///< sends started, not completed (a queue depth)
  std::uint64_t pending_recvs = 0;       ///< receives started, not completed
  /// What its traffic cost in limits (docs/rendezvous.md, "Limits"): times its
  /// connections stopped being read because a receive budget was full; its
  /// tensors and partial transfers dropped (no receive within
  /// unmatched_max_age, no chunk within transfer_idle, or it restarted); its
  /// frames refused as too large (the connection is closed).
  std::uint64_t recv_pauses = 0;
  std::uint64_t dropped = 0;
  std::uint64_t frames_too_large = 0;
};

/// One send or receive an endpoint has not completed (endpoint::pending(),
/// stall reports): what it is, how long it has waited and what it waits for.
struct pending_operation {
  bool is_send = false;
  std::string peer;  ///< task name
  std::string key;
  std::uint64_t bytes = 0;          ///< a send's payload, a receive's destination (0: none posted)
  std::chrono::milliseconds age{};  ///< since it started on its reactor
  /// Where it is, e.g. "waiting for a connection", "in a fusion batch",
  /// "written, not yet taken by the kernel", "waiting for the tensor".
  std::string stage;
  /// The peer's connection: "connected", "connecting", "reconnecting",
  /// "handshaking", "closed" or "refused".
  std::string connection;
  std::string last_error;  ///< the last error on the peer's connections ("" if none)
  std::string missing;     ///< which side is missing, in words
};

/// Endpoint settings that `options` does not carry.
struct endpoint_tuning {
  /// Connections per peer that the chunks of one large tensor are striped over
  /// (1 to 16; 1 = chunks share the peer's one connection). Extra connections
  /// are made on the first chunked send to that peer.
  unsigned stripes = 2;
  /// Send to a peer on a connection that peer made to us, when we have none to
  /// it yet (a PS replies on its worker's connection): one connection per pair
  /// of tasks instead of one per direction, and TCP's acknowledgements ride on
  /// the data instead of travelling alone (about 2 us of a 10 B round trip on
  /// loopback). Used when the peer allowed it too (it offers
  /// protocol::feature_reverse in its handshake when its own tuning allows it).
  /// RDMA transports never do (their adverts need a connection per direction).
  bool reverse_lanes = true;
  /// Reactors (threads) the endpoint runs. Each owns a share of the peers (the
  /// cluster's tasks dealt round-robin in spec order): all of one peer's
  /// connections, operations, timers and completion handlers live on its
  /// reactor, and the reactors share nothing. 0 = options.cores when set
  /// (NETWORK_WORKER_CORE_NUMBER / NETWORK_PS_CORE_NUMBER), else 1. Capped by
  /// the number of peers. Transports whose connections cannot move between
  /// reactors (handoff_transport), RDMA ones among them, always run 1.
  unsigned reactors = 0;
  /// Keys whose receives wait for requests that may come at any time (a
  /// server's request key): stall reports leave them out (pending() still
  /// lists them).
  std::vector<std::string> idle_keys{};
};

/// Receives the endpoint's log lines (refused peers, bad frames); called on the
/// reactor thread. The same sink type as every other layer's (core/log.hpp).
using fusewire::log_sink;
using fusewire::write_log;

/// Everything a rendezvous::endpoint<Transport> is made with besides its task
/// and the cluster, one aggregate with designated initializers:
/// `{.options = o, .tuning = {.stripes = 2}, .transport = uring_tcp(cfg)}`.
template <transport Transport>
struct endpoint_config {
  fusewire::options options{};  ///< checked by options::validate() (errc::invalid_config)
  endpoint_tuning tuning{};
  Transport transport{};  ///< the transport instance, with its own settings
  log_sink log{};         ///< empty: the lines go to stderr
};

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
