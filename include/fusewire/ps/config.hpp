#pragma once
/// ps::server_config and ps::client_config: everything a PS task or a worker
/// is set up with besides who it is, the cluster and the model — one
/// aggregate each, written with designated initializers:
///
///     ps::server<fw::asio_tcp> server({"ps", 0}, spec, model, {.options = net, .mode = ps::training_mode::sync});
///     ps::client<fw::asio_tcp> client({"worker", 0}, spec, model, {.options = net, .step_timeout = 10s});

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include <fusewire/core/options.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/server_options.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

/// How a PS task is set up; see the file comment. The training and checkpoint
/// fields mean (and default to) what they do in server_options, which the shard takes.
template <transport Transport>
struct server_config {
  /// The endpoint's options (reactor mode, pool size, connect timeout, ...).
  fusewire::options options{};
  training_mode mode = training_mode::async;
  /// Job whose tasks send requests (each gets one posted receive) and meet at client::barrier().
  std::string worker_job = "worker";
  /// sync: pushes averaged per step; 0 = the number of tasks in worker_job.
  std::size_t replicas = 0;
  /// Where checkpoints go (file checkpoint_path(dir, index, num_ps)); empty = none.
  std::filesystem::path checkpoint_dir{};
  /// Save after every N applied steps; 0 = only when a worker asks (client::save_checkpoint).
  std::uint64_t checkpoint_every = 0;
  /// At start, load the checkpoint file if it exists.
  bool restore = true;
  /// Embedding rows one request may create (pulls and pushes of ids not seen
  /// yet); a request that would create more is refused, so that no request
  /// can grow the PS's memory without bound.
  std::size_t max_new_rows = 65536;
  /// sync: requests of one worker that may wait here for their step at once;
  /// more are refused (a worker normally has one; its resends of a waiting
  /// request count as that one).
  std::size_t max_waiting_per_worker = 4;
  /// A worker whose connection breaks (not one that closed its client) is
  /// lost — a sync step or a barrier that waits for it fails with
  /// errc::peer_lost naming it — only once this long has passed since its
  /// last request without a new one: over a lossy link a connection can break
  /// under a live worker, which connects again and resends at once. 0 = lost
  /// at once; negative is refused.
  std::chrono::milliseconds reconnect_grace{5000};
  /// Lanes: share-nothing shards of this PS task, each run one job at a
  /// time on the endpoint's reactors (server.hpp), 1 to max_lanes. 0 = options.cores (NETWORK_PS_CORE_NUMBER,
  /// default 16) capped by the number of workers. Every PS task of a job must
  /// run the same number (a worker refuses a mix).
  std::uint32_t lanes = 0;
  Transport transport{};
  /// Where the endpoint's diagnostics go; empty = nowhere.
  rendezvous::log_sink log{};

  /// The fields the shard takes.
  server_options shard_options() const {
    server_options so;
    so.mode = mode;
    so.worker_job = worker_job;
    so.replicas = replicas;
    so.checkpoint_dir = checkpoint_dir;
    so.checkpoint_every = checkpoint_every;
    so.restore = restore;
    so.max_new_rows = max_new_rows;
    so.max_waiting_per_worker = max_waiting_per_worker;
    return so;
  }
};

/// How a worker talks to the PS tasks; see the file comment.
template <transport Transport>
struct client_config {
  /// The endpoint's options (reactor mode, pool size, connect timeout, ...).
  fusewire::options options{};
  /// Must match the servers' mode (a PS refuses requests of the other mode).
  training_mode mode = training_mode::async;
  /// Job of the PS tasks; their count is num_ps.
  std::string ps_job = "ps";
  /// A run() fails with errc::timed_out if some PS has not answered by then.
  std::chrono::milliseconds step_timeout{30000};
  /// Resend a request that got no reply for this long.
  std::chrono::milliseconds retry_interval{2000};
  /// true: one fused request per PS per run(). false: one request per pull/push
  /// and slice (all in flight at once) — the baseline fusion is measured against;
  /// async only.
  bool fuse = true;
  /// A PS that restarted without its checkpoint holds freshly initialised
  /// values: false (the default) fails run() with errc::state_lost naming it;
  /// true goes on training from those values, and says so in the log.
  bool allow_reinitialized_ps = false;
  Transport transport{};
  /// Where the endpoint's diagnostics go; empty = nowhere.
  rendezvous::log_sink log{};
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
