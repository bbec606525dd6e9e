#pragma once
/// ps::server_options: how a PS task (its shard) trains and checkpoints, and
/// where its checkpoint file lives.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include <fusewire/ps/model.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

/// How a PS task trains and checkpoints.
struct server_options {
  training_mode mode = training_mode::async;
  /// Job whose tasks send requests (each gets one posted receive).
  std::string worker_job = "worker";
  /// sync: pushes averaged per step; 0 = the number of tasks in worker_job.
  std::size_t replicas = 0;
  /// Where checkpoints go (file checkpoint_path(dir, index, num_ps)); empty = none.
  std::filesystem::path checkpoint_dir;
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
  /// Lanes of the PS task this shard is one lane of (1 to 256): the shard's
  /// index and num_ps are then a lane's (ps index * lanes + lane, num_ps *
  /// lanes), and a hello names this count (request_flags::hello).
  std::uint32_t lanes = 1;
};

/// Most lanes one PS task runs.
inline constexpr std::uint32_t max_lanes = 256;

/// "<dir>/ps-<index>-of-<num_ps>.ckpt".
inline std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::uint32_t ps_index,
                                             std::size_t num_ps) {
  return dir / ("ps-" + std::to_string(ps_index) + "-of-" + std::to_string(num_ps) + ".ckpt");
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
