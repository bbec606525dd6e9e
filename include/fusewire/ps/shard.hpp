#pragma once
/// ps::shard: everything one PS lane holds and does — its dense slices and
/// embedding rows, their optimizer slots, the sync-step aggregation and
/// barrier, de-duplication of resent requests, and checkpoints — with no
/// network in it. It also keeps the worker barrier (client::barrier) when it
/// is lane 0 of PS 0. ps::server drives one shard per lane, each through
/// its lane's strand (one call at a time, on whichever reactor runs the
/// lane); tests drive it directly.
///
/// Not thread-safe by design (share-nothing): one call at a time, each
/// ordered after the one before (one thread, or a strand). Replies leave
/// through the reply function given at construction, within that call:
/// inline from handle(), or — for a sync pull waiting for its step — from
/// the handle() call that completes the step.
///
/// No copy of a large dense slice on the way in or out: a push's optimizer
/// reads the gradient where it lies in the request (when the host is
/// little-endian and the values are aligned for float; else it copies them
/// first), and a pull's reply shares each dense slice of at least
/// share_min_bytes instead of copying it (reply_message: the reply keeps a
/// handle to the slice's values until it is sent). Copy-on-write keeps a reply
/// a snapshot: an update of a slice that a reply still holds first moves the
/// slice to a fresh buffer (shard_stats::cow_copies), so the reply never sees
/// half of an update; with no reply holding it, the slice is updated in place.
///
/// Checkpoints: save() writes the whole state to one file that a crash leaves
/// old or new, never torn; restore() loads it (the format is in
/// detail/shard_checkpoint.hpp).
///
/// The members are defined by idea in detail/: shard_values (dense slices and
/// embedding rows), shard_request (the request path), shard_push (async and
/// sync pushes), shard_reply (pull, error and barrier replies),
/// shard_checkpoint and shard_wait (what a step or the barrier waits for).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/detail/barrier_tally.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/server_options.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

/// Counters of one shard (read them on its thread, or after it stopped).
struct shard_stats {
  std::uint64_t requests = 0;      ///< requests handled (duplicates included)
  std::uint64_t duplicates = 0;    ///< resent requests whose pushes were skipped
  std::uint64_t errors = 0;        ///< error replies sent
  std::uint64_t stale_pushes = 0;  ///< sync: pushes for a finished step, dropped
  std::uint64_t deferred = 0;      ///< sync: pulls that waited for their step
  std::uint64_t checkpoints = 0;   ///< checkpoint files written
  /// Bytes of dense values that replies sent from the slices' own buffers, without a copy.
  std::uint64_t shared_reply_bytes = 0;
  /// Updates (a push, a sync step, a restore) of a dense slice that a reply
  /// still held, so that it moved to a fresh buffer (copying its values,
  /// except for a restore) before the update.
  std::uint64_t cow_copies = 0;
  /// Push entries whose gradient was copied out of the request before the
  /// optimizer read it (its values not aligned for float, or a big-endian host).
  std::uint64_t gradient_copies = 0;
};

/// One worker as a waiting sync step or barrier generation sees it (stall
/// reports: shard::step_wait(), shard::barrier_wait()).
struct worker_wait {
  std::uint32_t worker = 0;  ///< index in server_options::worker_job
  bool arrived = false;      ///< pushed for the step / reached the barrier generation
  std::string lost;          ///< why shard::worker_lost() marked it; empty = not lost
  bool seen = false;         ///< a valid request from it reached this PS
  /// sync: the last step it pushed for (1 = the first), 0 = none; a push for
  /// the step before the waiting one says the worker is one step behind.
  std::uint64_t pushed_step = 0;
  std::size_t requests_waiting = 0;  ///< sync: its requests waiting here for the step
};

/// What a sync step or a barrier generation waits for; see worker_wait.
struct wait_state {
  /// It has begun (a push or a waiting pull for the step; a worker at the
  /// barrier) and not completed.
  bool waiting = false;
  std::uint64_t number = 0;          ///< the step (global_step() + 1) or the barrier generation
  std::size_t needed = 0;            ///< arrivals it needs: sync, the replicas; a barrier, every worker
  std::vector<worker_wait> workers;  ///< every worker, by index

  /// Indexes of the workers that arrived / have not, ascending.
  std::vector<std::uint32_t> arrived() const { return pick(true); }
  std::vector<std::uint32_t> missing() const { return pick(false); }

 private:
  std::vector<std::uint32_t> pick(bool arrived_ones) const {
    std::vector<std::uint32_t> out;
    for (const worker_wait& w : workers) {
      if (w.arrived == arrived_ones) out.push_back(w.worker);
    }
    return out;
  }
};

/// One PS task's state; see the file comment.
class shard {
 public:
  /// Sends `reply` to worker index `worker` (of server_options::worker_job).
  /// It keeps `reply` (its owners) until the bytes were sent: a dense slice
  /// it shares is copied before its next update while it is held.
  using reply_fn = std::function<void(std::uint32_t worker, reply_message reply)>;
  /// Gives the buffer of n bytes (64-byte aligned) that a dense slice's
  /// values live in, and its copy-on-write copies; replies send from it.
  /// The server passes one that allocates from the transport's shared pool
  /// where it has one. Empty: tensor_buffer::allocate.
  using value_allocator = std::function<tensor_buffer(std::size_t n)>;

  /// A pulled dense slice of at least this many bytes is sent from its own
  /// buffer; a smaller one is copied into the reply (a copy that small costs
  /// less than a scatter-gather segment and a shared handle).
  static constexpr std::size_t share_min_bytes = 4096;

  /// Throws system_error(errc::invalid_argument) for a bad spec, ps_index >=
  /// num_ps, or sync with 0 replicas; restores from the checkpoint file when
  /// opts.restore and it exists (throws naming the file if it is unusable).
  shard(model_spec model, std::uint32_t ps_index, std::size_t num_ps, server_options opts, std::size_t num_workers,
        reply_fn reply, std::uint64_t incarnation = 0, value_allocator allocate_values = {})
      : model_(std::move(model)),
        place_(model_, num_ps, opts.lanes),
        index_(ps_index),
        opts_(std::move(opts)),
        num_workers_(num_workers),
        reply_(std::move(reply)),
        incarnation_(incarnation),
        allocate_values_(std::move(allocate_values)),
        fingerprint_(model_.fingerprint(num_ps)),
        workers_(num_workers),
        barrier_(num_workers),
        lost_(num_workers),
        left_(num_workers, false) {
    if (ps_index >= num_ps) {
      throw_error(errc::invalid_argument,
                  "ps index " + std::to_string(ps_index) + " >= num_ps " + std::to_string(num_ps));
    }
    if (opts_.lanes == 0 || opts_.lanes > max_lanes || num_ps % opts_.lanes != 0) {
      throw_error(errc::invalid_argument, "shard: lanes = " + std::to_string(opts_.lanes) + " (allowed: 1 to " +
                                              std::to_string(max_lanes) + ", dividing num_ps " +
                                              std::to_string(num_ps) + ")");
    }
    if (opts_.replicas == 0) opts_.replicas = num_workers;
    if (opts_.mode == training_mode::sync && opts_.replicas == 0) {
      throw_error(errc::invalid_argument, "sync training needs replicas >= 1 (there are no workers)");
    }
    init_values();
    if (opts_.restore && !opts_.checkpoint_dir.empty()) {
      const auto file = checkpoint_file();
      std::error_code ec;
      if (std::filesystem::exists(file, ec)) restore(file);
    }
  }

  const model_spec& model() const noexcept { return model_; }
  const placement& place() const noexcept { return place_; }
  std::uint32_t index() const noexcept { return index_; }
  /// The options it runs with (replicas resolved: never 0 in sync mode).
  const server_options& options() const noexcept { return opts_; }
  /// Steps applied so far (async: push requests applied; sync: completed steps); survives a checkpoint.
  std::uint64_t global_step() const noexcept { return global_step_; }
  const shard_stats& stats() const noexcept { return stats_; }
  /// True once a worker asked this PS to shut down.
  bool shutdown_requested() const noexcept { return shutdown_; }
  /// The step a checkpoint restored at start (0 if none).
  std::uint64_t restored_step() const noexcept { return restored_step_; }
  /// checkpoint_path(opts.checkpoint_dir, index, num_ps); empty if no directory.
  std::filesystem::path checkpoint_file() const {
    return opts_.checkpoint_dir.empty() ? std::filesystem::path()
                                        : checkpoint_path(opts_.checkpoint_dir, index_, place_.num_ps());
  }

  /// Values of dense variable `var`'s slice `slice` if this PS holds it, else
  /// empty; valid until the shard next updates the slice (copy-on-write may
  /// move it to a new buffer) or is destroyed.
  std::span<const float> dense_values(std::uint32_t var, std::uint32_t slice) const {
    if (var >= dense_index_.size() || slice >= dense_index_[var].size() || dense_index_[var][slice] == npos) return {};
    return dense_[dense_index_[var][slice]].values_view();
  }
  /// Embedding row `id` of `var` if it was created here, else empty.
  std::span<const float> row_values(std::uint32_t var, std::int64_t id) const {
    if (var >= rows_.size()) return {};
    auto it = rows_[var].find(id);
    if (it == rows_[var].end()) return {};
    return {it->second.data.data(), static_cast<std::size_t>(model_.variables[var].row_size())};
  }
  /// Barrier generations every worker passed so far.
  std::uint64_t barrier_generation() const noexcept { return barrier_.generation(); }
  /// Rows of `var` created here so far.
  std::size_t row_count(std::uint32_t var) const { return var < rows_.size() ? rows_[var].size() : 0; }

  /// Handles one request from worker index `worker`; its reply goes to the reply
  /// function (now, or when its sync step completes). Never throws for bad input:
  /// a malformed or invalid request gets an error reply naming what was wrong.
  void handle(std::uint32_t worker, tensor_buffer request);

  /// Worker index `worker` is gone (its connection broke; `why` says how).
  /// What can no longer complete without it — a sync step it has not pushed
  /// for (when the others cannot make up the replicas), the worker barrier it
  /// has not reached — is answered now with errc::peer_lost naming it, instead
  /// of leaving the others to time out. Its next request clears the mark.
  void worker_lost(std::uint32_t worker, const std::string& why);
  /// Whether worker_lost() marked `worker` and it sent nothing since.
  bool worker_is_lost(std::uint32_t worker) const noexcept { return worker < lost_.size() && !lost_[worker].empty(); }
  /// Whether `worker` said it is closing its client (request_flags::bye) and
  /// sent nothing since: its connections' end is then a departure, no loss.
  bool worker_left(std::uint32_t worker) const noexcept { return worker < left_.size() && left_[worker]; }

  // ---- what a step or the barrier waits for (detail/shard_wait.hpp) ----
  /// sync: whether step global_step() + 1 has begun (a push for it, or a pull
  /// waiting for it) and not completed. Cheap: for a check after each request.
  bool step_waiting() const noexcept {
    return opts_.mode == training_mode::sync && (!contributors_.empty() || !deferred_.empty());
  }
  /// Whether some worker waits at the barrier (generation barrier_generation()).
  bool barrier_waiting() const noexcept { return barrier_.waiting(); }
  /// sync: step global_step() + 1 — which workers pushed for it and which
  /// not, and what this PS knows of each (waiting is false in async mode).
  wait_state step_wait() const;
  /// The barrier's current generation: which workers reached it and which not.
  wait_state barrier_wait() const;

  /// Writes every value, slot and the global step to `file` atomically (temp + rename).
  /// Throws system_error naming the file.
  void save(const std::filesystem::path& file);

  /// Loads `file` written by save() for the same model and PS. Throws
  /// system_error(errc::invalid_argument) naming the file and what is wrong;
  /// the shard is unchanged then.
  void restore(const std::filesystem::path& file);

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  struct dense_state {
    std::uint32_t var = 0;
    std::uint32_t slice = 0;
    slice_info info;
    std::uint64_t updates = 0;
    /// info.element_count floats (64-byte aligned), shared by the replies
    /// being sent: write them only through writable_values().
    tensor_buffer values;
    std::vector<float> slots;  ///< each optimizer slot, element_count floats each
    std::vector<float> acc;    ///< sync: gradient sum of the current step
    bool touched = false;

    std::span<const float> values_view() const noexcept {
      return {reinterpret_cast<const float*>(values.data()), values.size() / sizeof(float)};
    }
  };

  struct row_state {
    std::uint64_t updates = 0;
    std::vector<float> data;  ///< dim values, then each optimizer slot (dim each)
  };

  struct worker_state {
    bool seen = false;
    std::uint64_t incarnation = 0;
    std::uint64_t last_seq = 0;
    std::uint64_t pushed_step = 0;  ///< sync: the last step it pushed for (stall reports; not checkpointed)
  };

  struct deferred_request {
    std::uint32_t worker;
    tensor_buffer request;
    std::uint32_t flags;
    std::uint64_t seq = 0;
  };

  // ---- values (detail/shard_values.hpp) ----
  /// Sizes the per-variable tables and fills the dense slices this PS holds.
  void init_values();
  std::size_t row_width(std::uint32_t var) const;
  row_state& row(std::uint32_t var, std::int64_t id);
  /// `d`'s values, to be updated. While a reply still holds them, they first
  /// move to a fresh buffer — a copy of them if `keep`, else uninitialised —
  /// and the reply keeps the old one (copy-on-write).
  std::span<float> writable_values(dense_state& d, bool keep = true);
  /// A buffer for a slice of n floats, from allocate_values_ if set.
  tensor_buffer slice_buffer(std::size_t n) const;

  // ---- requests (detail/shard_request.hpp) ----
  /// Empty if every entry is valid; else what is wrong (and `code`).
  std::string validate(const request_view& req, errc& code) const;
  /// Distinct embedding rows `req` would create, and their values.
  std::pair<std::uint64_t, std::uint64_t> new_rows(const request_view& req) const;
  /// Values of every dense slice and embedding row this PS holds.
  std::uint64_t held_values() const noexcept;

  // ---- pushes (detail/shard_push.hpp) ----
  /// Applies (async) or accumulates (sync) one push entry.
  void apply_push(const entry_view& e, float scale, bool accumulate);
  /// The gradient of push entry `e`: its values in the request itself when
  /// detail::floats_in_place() allows, else a copy of them in grad_.
  std::span<const float> gradient(const entry_view& e);
  /// sync: every replica pushed; average, apply once, advance, answer waiting pulls.
  void finish_step();

  // ---- replies (detail/shard_reply.hpp) ----
  void answer(std::uint32_t worker, const request_view& req, std::uint32_t flags);
  void fail(std::uint32_t worker, std::uint64_t seq, errc e, std::string why);
  /// Why a request of this model fingerprint and its training-mode flag
  /// cannot be served here; empty when it can.
  std::string mismatch(const request_view& req, std::uint64_t fingerprint) const;
  /// request_flags::hello: checks the model and mode, answers with the lane count.
  void hello(std::uint32_t worker, const request_view& req);
  void leave(std::uint32_t worker, const request_view& req);
  /// Flags every reply carries.
  std::uint32_t base_flags() const noexcept { return restored_ ? 0 : reply_flags::fresh; }
  /// client::barrier(): see detail::barrier_tally.
  void arrive(std::uint32_t worker, const request_view& req);

  // ---- checkpoints (detail/shard_checkpoint.hpp) ----
  void maybe_autosave();
  static std::uint64_t fnv_bytes(std::span<const std::byte> b) noexcept;

  model_spec model_;
  placement place_;
  std::uint32_t index_;
  server_options opts_;
  std::size_t num_workers_;
  reply_fn reply_;
  std::uint64_t incarnation_;
  value_allocator allocate_values_;
  std::uint64_t fingerprint_;
  std::uint64_t global_step_ = 0;
  std::uint64_t restored_step_ = 0;
  bool restored_ = false;  ///< a checkpoint was loaded (else replies carry reply_flags::fresh)
  bool shutdown_ = false;
  shard_stats stats_;
  std::vector<dense_state> dense_;
  std::uint64_t dense_values_ = 0;                     ///< values of every slice in dense_ (fixed once made)
  std::vector<std::vector<std::size_t>> dense_index_;  ///< [var][slice] -> index in dense_, or npos
  std::vector<std::unordered_map<std::int64_t, row_state>> rows_;
  std::vector<std::unordered_map<std::int64_t, std::vector<float>>> acc_rows_;
  std::vector<worker_state> workers_;
  detail::barrier_tally barrier_;
  std::set<std::uint32_t> contributors_;
  std::vector<std::string> lost_;  ///< per worker: why it was lost, empty = not lost
  std::vector<bool> left_;         ///< per worker: it sent a bye (see worker_left)
  /// sync: the lost workers the current step still waits for, named, or empty if it can complete.
  std::string step_blocked_by() const;
  void fail_blocked();
  std::vector<deferred_request> deferred_;
  std::vector<float> grad_;  ///< a gradient that could not be read in place
  std::set<std::int64_t> seen_ids_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire

// The shard's member definitions, by idea. Each includes this header, so each
// compiles on its own.
#include <fusewire/ps/detail/shard_checkpoint.hpp>
#include <fusewire/ps/detail/shard_push.hpp>
#include <fusewire/ps/detail/shard_reply.hpp>
#include <fusewire/ps/detail/shard_request.hpp>
#include <fusewire/ps/detail/shard_values.hpp>
#include <fusewire/ps/detail/shard_wait.hpp>
