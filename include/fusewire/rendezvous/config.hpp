#pragma once
/// What a rendezvous::endpoint is made with (endpoint_config: options, tuning,
/// transport, log sink) and the counters it reports (endpoint_stats).

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

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
};

/// Receives the endpoint's log lines (refused peers, bad frames); called on the reactor thread.
using log_sink = std::function<void(std::string_view)>;

/// Gives `line` to `sink`, or writes it to stderr when `sink` is empty. A sink
/// that throws loses the line: logging never fails the caller.
inline void write_log(const log_sink& sink, const std::string& line) noexcept {
  if (!sink) {
    std::fprintf(stderr, "%s\n", line.c_str());
    return;
  }
  try {
    sink(line);
  } catch (...) {
  }
}

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
