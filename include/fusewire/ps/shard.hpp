#pragma once
/// ps::shard: everything one PS task holds and does — its dense slices and
/// embedding rows, their optimizer slots, the sync-step aggregation and
/// barrier, de-duplication of resent requests, and checkpoints — with no
/// network in it. It also keeps the worker barrier (client::barrier) when it
/// is PS 0. ps::server drives one shard from its endpoint's reactor
/// thread; tests drive it directly.
///
/// Not thread-safe by design (share-nothing): one thread calls every member.
/// Replies leave through the reply function given at construction, on that
/// same thread: inline from handle(), or — for a sync pull waiting for its
/// step — from the handle() call that completes the step.
///
/// Checkpoint file (little-endian), written to "<file>.tmp", fsync'ed, then
/// renamed over <file> (a crash leaves the old file or the new one):
///
///     "FWPSCKP1"  u64 model fingerprint  u32 ps index  u32 num_ps  u64 global step
///     u32 dense slice count; per slice: u32 var, u32 slice, u64 updates, u64 floats, f32 values+slots
///     u32 embedding count;   per table: u32 var, u64 rows; per row: i64 id, u64 updates, f32 values+slots
///     u32 worker count;      per worker: u8 seen, u64 client incarnation, u64 last sequence number
///                            (so a request applied just before a crash is not applied again after restore)
///     u64 FNV-1a of every byte before it

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/detail/barrier_tally.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/optimizer.hpp>

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
};

/// "<dir>/ps-<index>-of-<num_ps>.ckpt".
inline std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::uint32_t ps_index,
                                             std::size_t num_ps) {
  return dir / ("ps-" + std::to_string(ps_index) + "-of-" + std::to_string(num_ps) + ".ckpt");
}

/// Counters of one shard (read them on its thread, or after it stopped).
struct shard_stats {
  std::uint64_t requests = 0;      ///< requests handled (duplicates included)
  std::uint64_t duplicates = 0;    ///< resent requests whose pushes were skipped
  std::uint64_t errors = 0;        ///< error replies sent
  std::uint64_t stale_pushes = 0;  ///< sync: pushes for a finished step, dropped
  std::uint64_t deferred = 0;      ///< sync: pulls that waited for their step
  std::uint64_t checkpoints = 0;   ///< checkpoint files written
};

/// One PS task's state; see the file comment.
class shard {
 public:
  /// Sends `reply` to worker index `worker` (of server_options::worker_job).
  using reply_fn = std::function<void(std::uint32_t worker, tensor_buffer reply)>;

  /// Throws system_error(errc::invalid_argument) for a bad spec, ps_index >=
  /// num_ps, or sync with 0 replicas; restores from the checkpoint file when
  /// opts.restore and it exists (throws naming the file if it is unusable).
  shard(model_spec model, std::uint32_t ps_index, std::size_t num_ps, server_options opts, std::size_t num_workers,
        reply_fn reply, std::uint64_t incarnation = 0)
      : model_(std::move(model)),
        place_(model_, num_ps),
        index_(ps_index),
        opts_(std::move(opts)),
        num_workers_(num_workers),
        reply_(std::move(reply)),
        incarnation_(incarnation),
        fingerprint_(model_.fingerprint(num_ps)),
        workers_(num_workers),
        barrier_(num_workers) {
    if (ps_index >= num_ps) {
      throw_error(errc::invalid_argument,
                  "ps index " + std::to_string(ps_index) + " >= num_ps " + std::to_string(num_ps));
    }
    if (opts_.replicas == 0) opts_.replicas = num_workers;
    if (opts_.mode == training_mode::sync && opts_.replicas == 0) {
      throw_error(errc::invalid_argument, "sync training needs replicas >= 1 (there are no workers)");
    }
    const std::size_t nvars = model_.variables.size();
    dense_index_.resize(nvars);
    rows_.resize(nvars);
    acc_rows_.resize(nvars);
    for (std::uint32_t v = 0; v < nvars; ++v) {
      const variable_spec& spec = model_.variables[v];
      if (spec.kind != variable_kind::dense) continue;
      const auto slices = place_.slices(v);
      dense_index_[v].assign(slices.size(), npos);
      for (std::uint32_t s = 0; s < slices.size(); ++s) {
        if (slices[s].ps != index_) continue;
        dense_index_[v][s] = dense_.size();
        dense_state d;
        d.var = v;
        d.slice = s;
        d.info = slices[s];
        const optimizer_config& opt = model_.optimizer_of(v);
        const auto n = static_cast<std::size_t>(slices[s].element_count);
        d.data.resize(n * (1 + opt.slots()));
        const std::uint64_t row_size = static_cast<std::uint64_t>(spec.row_size());
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint64_t flat = static_cast<std::uint64_t>(slices[s].element_begin) + i;
          d.data[i] = spec.init.value(spec.name, flat / row_size, flat % row_size);
        }
        for (std::size_t k = 0; k < opt.slots(); ++k) {
          std::fill_n(d.data.begin() + static_cast<std::ptrdiff_t>(n * (1 + k)), n, initial_slot_value(opt, k));
        }
        dense_.push_back(std::move(d));
      }
    }
    if (opts_.restore && !opts_.checkpoint_dir.empty()) {
      const auto file = checkpoint_file();
      std::error_code ec;
      if (std::filesystem::exists(file, ec)) restore(file);
    }
  }

  const model_spec& model() const noexcept { return model_; }
  const placement& place() const noexcept { return place_; }
  std::uint32_t index() const noexcept { return index_; }
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

  /// Values of dense variable `var`'s slice `slice` if this PS holds it, else empty.
  std::span<const float> dense_values(std::uint32_t var, std::uint32_t slice) const {
    if (var >= dense_index_.size() || slice >= dense_index_[var].size() || dense_index_[var][slice] == npos) return {};
    const dense_state& d = dense_[dense_index_[var][slice]];
    return {d.data.data(), static_cast<std::size_t>(d.info.element_count)};
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
  void handle(std::uint32_t worker, tensor_buffer request) {
    ++stats_.requests;
    request_view req;
    std::error_code ec;
    std::string why;
    decode_request(request.bytes(), req, ec, why);
    if (!ec && worker >= num_workers_) {
      ec = make_error_code(errc::invalid_argument);
      why = "worker index " + std::to_string(worker) + " >= " + std::to_string(num_workers_);
    }
    if (ec) return fail(worker, req.seq, static_cast<errc>(ec.value()), "malformed request: " + why);
    if (req.fingerprint != fingerprint_) {
      return fail(worker, req.seq, errc::invalid_argument,
                  "model fingerprint mismatch: the worker's model_spec (or PS count) differs from this PS's");
    }
    const bool sync_req = (req.flags & request_flags::sync) != 0;
    if (sync_req != (opts_.mode == training_mode::sync)) {
      return fail(worker, req.seq, errc::invalid_argument,
                  std::string("training mode mismatch: the worker trains ") + (sync_req ? "sync" : "async") +
                      ", this PS " + std::string(to_string(opts_.mode)));
    }
    errc bad = errc::ok;
    why = validate(req, bad);
    if (!why.empty()) return fail(worker, req.seq, bad, why);

    worker_state& ws = workers_[worker];
    const bool duplicate = ws.seen && ws.incarnation == req.incarnation && req.seq <= ws.last_seq;
    std::uint32_t reply_flags_value = 0;
    if (duplicate) {
      ++stats_.duplicates;
    } else {
      ws.seen = true;
      ws.incarnation = req.incarnation;
      ws.last_seq = req.seq;
      const bool has_push =
          std::any_of(req.entries.begin(), req.entries.end(), [](const entry_view& e) { return is_push(e.kind); });
      if (opts_.mode == training_mode::async) {
        if (has_push) {
          for (const entry_view& e : req.entries) {
            if (is_push(e.kind)) apply_push(e, 1.0f, false);
          }
          ++global_step_;
          maybe_autosave();
        }
      } else if (has_push || (req.flags & request_flags::contributes) != 0) {
        if (req.push_step < global_step_) {
          ++stats_.stale_pushes;
          reply_flags_value |= reply_flags::stale;
        } else {
          for (const entry_view& e : req.entries) {
            if (is_push(e.kind)) apply_push(e, 1.0f, true);
          }
          contributors_.insert(worker);
        }
      }
    }
    if ((req.flags & request_flags::save) != 0) {
      try {
        if (opts_.checkpoint_dir.empty()) throw_error(errc::invalid_argument, "this PS has no checkpoint_dir");
        save(checkpoint_file());
      } catch (const std::system_error& e) {
        const errc code =
            e.code().category() == error_category() ? static_cast<errc>(e.code().value()) : errc::invalid_argument;
        return fail(worker, req.seq, code, std::string("checkpoint failed: ") + e.what());
      }
    }
    if ((req.flags & request_flags::shutdown) != 0) shutdown_ = true;
    if ((req.flags & request_flags::barrier) != 0) return arrive(worker, req);
    const bool waits = opts_.mode == training_mode::sync && req.min_step == global_step_ + 1;
    if (waits) {
      ++stats_.deferred;
      deferred_.push_back({worker, std::move(request), reply_flags_value});
    } else {
      answer(worker, req, reply_flags_value);
    }
    if (opts_.mode == training_mode::sync && contributors_.size() >= opts_.replicas) finish_step();
  }

  /// Writes every value, slot and the global step to `file` atomically (temp + rename).
  /// Throws system_error naming the file.
  void save(const std::filesystem::path& file) {
    std::vector<std::byte> out;
    auto put = [&out](auto v) {
      const std::size_t at = out.size();
      out.resize(at + sizeof(v));
      std::byte* p = out.data() + at;
      detail::put(p, v);
    };
    auto put_floats = [&out](const std::vector<float>& f) {
      const std::size_t at = out.size();
      out.resize(at + f.size() * 4);
      std::byte* p = out.data() + at;
      detail::put_array(p, f.data(), f.size());
    };
    for (char c : std::string_view("FWPSCKP1")) out.push_back(static_cast<std::byte>(c));
    put(fingerprint_);
    put(index_);
    put(static_cast<std::uint32_t>(place_.num_ps()));
    put(global_step_);
    put(static_cast<std::uint32_t>(dense_.size()));
    for (const dense_state& d : dense_) {
      put(d.var);
      put(d.slice);
      put(d.updates);
      put(static_cast<std::uint64_t>(d.data.size()));
      put_floats(d.data);
    }
    std::uint32_t tables = 0;
    for (std::uint32_t v = 0; v < model_.variables.size(); ++v)
      tables += model_.variables[v].kind == variable_kind::embedding;
    put(tables);
    for (std::uint32_t v = 0; v < model_.variables.size(); ++v) {
      if (model_.variables[v].kind != variable_kind::embedding) continue;
      put(v);
      put(static_cast<std::uint64_t>(rows_[v].size()));
      // Sorted by id so the same state always writes the same bytes.
      std::vector<std::int64_t> ids;
      ids.reserve(rows_[v].size());
      for (const auto& [id, r] : rows_[v]) ids.push_back(id);
      std::sort(ids.begin(), ids.end());
      for (std::int64_t id : ids) {
        const row_state& r = rows_[v].at(id);
        put(id);
        put(r.updates);
        put_floats(r.data);
      }
    }
    put(static_cast<std::uint32_t>(workers_.size()));
    for (const worker_state& w : workers_) {
      put(static_cast<std::uint8_t>(w.seen));
      put(w.incarnation);
      put(w.last_seq);
    }
    put(fnv_bytes(out));
    write_atomically(file, out);
    ++stats_.checkpoints;
  }

  /// Loads `file` written by save() for the same model and PS. Throws
  /// system_error(errc::invalid_argument) naming the file and what is wrong;
  /// the shard is unchanged then.
  void restore(const std::filesystem::path& file) {
    const std::string name = file.string();
    auto bad = [&](const std::string& what) -> void {
      throw_error(errc::invalid_argument, "checkpoint " + name + ": " + what);
    };
    std::vector<std::byte> in;
    {
      std::FILE* f = std::fopen(name.c_str(), "rb");
      if (f == nullptr) throw std::system_error(errno, std::generic_category(), "checkpoint " + name + ": cannot open");
      std::byte chunk[65536];
      std::size_t n = 0;
      while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) in.insert(in.end(), chunk, chunk + n);
      std::fclose(f);
    }
    if (in.size() < 8 + 8 + 4 + 4 + 8 + 4 + 4 + 4 + 8) bad("too short (" + std::to_string(in.size()) + " bytes)");
    const std::size_t body = in.size() - 8;
    if (detail::get<std::uint64_t>(in.data() + body) != fnv_bytes(std::span<const std::byte>(in.data(), body))) {
      bad("checksum mismatch (corrupt or truncated)");
    }
    if (std::memcmp(in.data(), "FWPSCKP1", 8) != 0) bad("not a fusewire PS checkpoint");
    std::size_t pos = 8;
    auto need = [&](std::size_t n) {
      if (n > body - pos) bad("truncated at byte " + std::to_string(pos));
    };
    auto take = [&]<class T>(T) {
      need(sizeof(T));
      const T v = detail::get<T>(in.data() + pos);
      pos += sizeof(T);
      return v;
    };
    if (take(std::uint64_t{}) != fingerprint_) bad("written for a different model_spec or PS count");
    const auto idx = take(std::uint32_t{});
    const auto nps = take(std::uint32_t{});
    if (idx != index_ || nps != place_.num_ps()) {
      bad("written by ps " + std::to_string(idx) + " of " + std::to_string(nps) + ", this is ps " +
          std::to_string(index_) + " of " + std::to_string(place_.num_ps()));
    }
    const auto step = take(std::uint64_t{});
    std::vector<dense_state> dense = dense_;
    const auto nd = take(std::uint32_t{});
    if (nd != dense.size()) bad(std::to_string(nd) + " dense slices, expected " + std::to_string(dense.size()));
    for (std::uint32_t i = 0; i < nd; ++i) {
      const auto var = take(std::uint32_t{});
      const auto slice = take(std::uint32_t{});
      if (var >= dense_index_.size() || slice >= dense_index_[var].size() || dense_index_[var][slice] == npos) {
        bad("dense slice " + std::to_string(var) + "/" + std::to_string(slice) + " does not belong to this PS");
      }
      dense_state& d = dense[dense_index_[var][slice]];
      d.updates = take(std::uint64_t{});
      const auto n = take(std::uint64_t{});
      if (n != d.data.size())
        bad("slice of '" + model_.variables[var].name + "' has " + std::to_string(n) + " floats, expected " +
            std::to_string(d.data.size()));
      need(n * 4);
      detail::get_array(in.data() + pos, d.data.data(), d.data.size());
      pos += n * 4;
    }
    std::vector<std::unordered_map<std::int64_t, row_state>> rows(model_.variables.size());
    const auto nt = take(std::uint32_t{});
    for (std::uint32_t t = 0; t < nt; ++t) {
      const auto var = take(std::uint32_t{});
      if (var >= model_.variables.size() || model_.variables[var].kind != variable_kind::embedding)
        bad("table " + std::to_string(var) + " is not an embedding");
      const auto count = take(std::uint64_t{});
      const std::size_t width = row_width(var);
      if (count > (body - pos) / (16 + width * 4)) bad("row count " + std::to_string(count) + " exceeds the file");
      rows[var].reserve(count);
      for (std::uint64_t r = 0; r < count; ++r) {
        const auto id = take(std::int64_t{});
        row_state rs;
        rs.updates = take(std::uint64_t{});
        rs.data.resize(width);
        need(width * 4);
        detail::get_array(in.data() + pos, rs.data.data(), width);
        pos += width * 4;
        rows[var].emplace(id, std::move(rs));
      }
    }
    const auto nw = take(std::uint32_t{});
    if (nw != workers_.size())
      bad("written for " + std::to_string(nw) + " workers, this PS has " + std::to_string(workers_.size()));
    std::vector<worker_state> workers(nw);
    for (worker_state& w : workers) {
      w.seen = take(std::uint8_t{}) != 0;
      w.incarnation = take(std::uint64_t{});
      w.last_seq = take(std::uint64_t{});
    }
    if (pos != body) bad(std::to_string(body - pos) + " unexpected bytes before the checksum");
    workers_ = std::move(workers);
    dense_ = std::move(dense);
    rows_ = std::move(rows);
    global_step_ = step;
    restored_step_ = step;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  struct dense_state {
    std::uint32_t var = 0;
    std::uint32_t slice = 0;
    slice_info info;
    std::uint64_t updates = 0;
    std::vector<float> data;  ///< values, then each optimizer slot
    std::vector<float> acc;   ///< sync: gradient sum of the current step
    bool touched = false;
  };

  struct row_state {
    std::uint64_t updates = 0;
    std::vector<float> data;  ///< dim values, then each optimizer slot (dim each)
  };

  struct worker_state {
    bool seen = false;
    std::uint64_t incarnation = 0;
    std::uint64_t last_seq = 0;
  };

  struct deferred_request {
    std::uint32_t worker;
    tensor_buffer request;
    std::uint32_t flags;
  };

  static std::uint64_t fnv_bytes(std::span<const std::byte> b) noexcept {
    return fnv1a(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  }

  static void write_atomically(const std::filesystem::path& file, const std::vector<std::byte>& bytes) {
    const std::string name = file.string();
    const std::string tmp = name + ".tmp";
    auto sys_fail = [&](const std::string& what) {
      const int e = errno;
      throw std::system_error(e, std::generic_category(), "checkpoint " + name + ": " + what);
    };
    if (file.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(file.parent_path(), ec);
    }
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) sys_fail("cannot create " + tmp);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        ::close(fd);
        errno = e;
        sys_fail("write failed");
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      sys_fail("fsync failed");
    }
    ::close(fd);
    if (::rename(tmp.c_str(), name.c_str()) != 0) sys_fail("rename from " + tmp + " failed");
    const std::string dir = file.has_parent_path() ? file.parent_path().string() : std::string(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

  std::size_t row_width(std::uint32_t var) const {
    return static_cast<std::size_t>(model_.variables[var].row_size()) * (1 + model_.optimizer_of(var).slots());
  }

  void fail(std::uint32_t worker, std::uint64_t seq, errc e, std::string why) {
    ++stats_.errors;
    reply_builder rb(seq, global_step_, incarnation_);
    rb.set_error(e == errc::ok ? errc::invalid_argument : e, "ps " + std::to_string(index_) + ": " + why);
    reply_(worker, rb.finish());
  }

  /// Empty if every entry is valid; else what is wrong (and `code`).
  std::string validate(const request_view& req, errc& code) const {
    for (std::size_t i = 0; i < req.entries.size(); ++i) {
      const entry_view& e = req.entries[i];
      const std::string where = "entry " + std::to_string(i) + " (" + std::string(to_string(e.kind)) + ")";
      code = errc::invalid_argument;
      if (e.var >= model_.variables.size()) {
        return where + ": variable index " + std::to_string(e.var) + " out of range (model has " +
               std::to_string(model_.variables.size()) + ")";
      }
      const variable_spec& v = model_.variables[e.var];
      const std::string var = "variable '" + v.name + "'";
      if (is_rows(e.kind) != (v.kind == variable_kind::embedding)) {
        return where + ": " + var +
               (v.kind == variable_kind::embedding ? " is an embedding (use pull_rows/push_rows)"
                                                   : " is dense (use pull/push)");
      }
      if (!is_rows(e.kind)) {
        if (e.slice >= dense_index_[e.var].size() || dense_index_[e.var][e.slice] == npos) {
          return where + ": " + var + " slice " + std::to_string(e.slice) + " is not on ps " + std::to_string(index_);
        }
        const auto& d = dense_[dense_index_[e.var][e.slice]];
        if (e.kind == op::push_dense && e.value_count != static_cast<std::uint64_t>(d.info.element_count)) {
          code = errc::size_mismatch;
          return where + ": " + var + " slice " + std::to_string(e.slice) + ": gradient of " +
                 std::to_string(e.value_count) + " values, the slice has " + std::to_string(d.info.element_count);
        }
        continue;
      }
      const std::int64_t num_ids = v.shape[0];
      for (std::uint64_t k = 0; k < e.id_count; ++k) {
        const std::int64_t id = e.id(k);
        if (num_ids > 0 && (id < 0 || id >= num_ids)) {
          return where + ": " + var + ": id " + std::to_string(id) + " out of range [0, " + std::to_string(num_ids) +
                 ")";
        }
        if (place_.ps_of_id(id) != index_) {
          return where + ": " + var + ": id " + std::to_string(id) + " belongs to ps " +
                 std::to_string(place_.ps_of_id(id)) + ", not ps " + std::to_string(index_);
        }
      }
      if (e.kind == op::push_rows && e.value_count != e.id_count * static_cast<std::uint64_t>(v.row_size())) {
        code = errc::size_mismatch;
        return where + ": " + var + ": " + std::to_string(e.value_count) + " gradient values for " +
               std::to_string(e.id_count) + " ids of dim " + std::to_string(v.row_size());
      }
    }
    code = errc::ok;
    return {};
  }

  row_state& row(std::uint32_t var, std::int64_t id) {
    auto [it, fresh] = rows_[var].try_emplace(id);
    if (fresh) {
      const variable_spec& v = model_.variables[var];
      const auto dim = static_cast<std::size_t>(v.row_size());
      const optimizer_config& opt = model_.optimizer_of(var);
      it->second.data.resize(row_width(var));
      for (std::size_t c = 0; c < dim; ++c)
        it->second.data[c] = v.init.value(v.name, static_cast<std::uint64_t>(id), c);
      for (std::size_t k = 0; k < opt.slots(); ++k) {
        std::fill_n(it->second.data.begin() + static_cast<std::ptrdiff_t>(dim * (1 + k)), dim,
                    initial_slot_value(opt, k));
      }
    }
    return it->second;
  }

  /// Applies (async) or accumulates (sync) one push entry.
  void apply_push(const entry_view& e, float scale, bool accumulate) {
    const optimizer_config& opt = model_.optimizer_of(e.var);
    if (e.kind == op::push_dense) {
      dense_state& d = dense_[dense_index_[e.var][e.slice]];
      const auto n = static_cast<std::size_t>(d.info.element_count);
      grad_.resize(n);
      e.copy_values(grad_.data(), 0, n);
      if (accumulate) {
        if (!d.touched) {
          d.acc.assign(n, 0.0f);
          d.touched = true;
        }
        for (std::size_t i = 0; i < n; ++i) d.acc[i] += grad_[i];
        return;
      }
      apply_update(opt, std::span<float>(d.data.data(), n), std::span<float>(d.data.data() + n, n * opt.slots()), grad_,
                   d.updates, scale);
      return;
    }
    const auto dim = static_cast<std::size_t>(model_.variables[e.var].row_size());
    grad_.resize(dim);
    // Duplicate ids: their gradients are summed and applied once.
    std::unordered_map<std::int64_t, std::vector<float>> summed;
    bool has_dups = false;
    if (e.id_count > 1 && !accumulate) {
      seen_ids_.clear();
      for (std::uint64_t k = 0; k < e.id_count; ++k) {
        if (!seen_ids_.insert(e.id(k)).second) {
          has_dups = true;
          break;
        }
      }
    }
    for (std::uint64_t k = 0; k < e.id_count; ++k) {
      const std::int64_t id = e.id(k);
      e.copy_values(grad_.data(), k * dim, dim);
      if (accumulate) {
        auto [it, fresh] = acc_rows_[e.var].try_emplace(id);
        if (fresh) it->second.assign(dim, 0.0f);
        for (std::size_t c = 0; c < dim; ++c) it->second[c] += grad_[c];
        continue;
      }
      if (has_dups) {
        auto [it, fresh] = summed.try_emplace(id);
        if (fresh) it->second.assign(dim, 0.0f);
        for (std::size_t c = 0; c < dim; ++c) it->second[c] += grad_[c];
        continue;
      }
      row_state& r = row(e.var, id);
      apply_update(opt, std::span<float>(r.data.data(), dim), std::span<float>(r.data.data() + dim, dim * opt.slots()),
                   grad_, r.updates, scale);
    }
    if (has_dups) {
      // Apply in first-occurrence order (deterministic).
      seen_ids_.clear();
      for (std::uint64_t k = 0; k < e.id_count; ++k) {
        const std::int64_t id = e.id(k);
        if (!seen_ids_.insert(id).second) continue;
        row_state& r = row(e.var, id);
        apply_update(opt, std::span<float>(r.data.data(), dim),
                     std::span<float>(r.data.data() + dim, dim * opt.slots()), summed[id], r.updates, scale);
      }
    }
  }

  /// sync: every replica pushed; average, apply once, advance, answer waiting pulls.
  void finish_step() {
    const float scale = 1.0f / static_cast<float>(opts_.replicas);
    for (dense_state& d : dense_) {
      if (!d.touched) continue;
      const optimizer_config& opt = model_.optimizer_of(d.var);
      const auto n = static_cast<std::size_t>(d.info.element_count);
      apply_update(opt, std::span<float>(d.data.data(), n), std::span<float>(d.data.data() + n, n * opt.slots()), d.acc,
                   d.updates, scale);
      d.touched = false;
    }
    for (std::uint32_t v = 0; v < acc_rows_.size(); ++v) {
      if (acc_rows_[v].empty()) continue;
      const optimizer_config& opt = model_.optimizer_of(v);
      const auto dim = static_cast<std::size_t>(model_.variables[v].row_size());
      std::vector<std::int64_t> ids;
      ids.reserve(acc_rows_[v].size());
      for (const auto& [id, g] : acc_rows_[v]) ids.push_back(id);
      std::sort(ids.begin(), ids.end());
      for (std::int64_t id : ids) {
        row_state& r = row(v, id);
        apply_update(opt, std::span<float>(r.data.data(), dim),
                     std::span<float>(r.data.data() + dim, dim * opt.slots()), acc_rows_[v][id], r.updates, scale);
      }
      acc_rows_[v].clear();
    }
    contributors_.clear();
    ++global_step_;
    maybe_autosave();
    auto waiting = std::move(deferred_);
    deferred_.clear();
    for (deferred_request& d : waiting) {
      request_view req;
      std::error_code ec;
      std::string why;
      decode_request(d.request.bytes(), req, ec, why);  // validated when it arrived
      if (req.min_step <= global_step_) {
        answer(d.worker, req, d.flags);
      } else {
        deferred_.push_back(std::move(d));
      }
    }
  }

  /// client::barrier(): see detail::barrier_tally.
  void arrive(std::uint32_t worker, const request_view& req) {
    switch (barrier_.arrive(worker, req.push_step, req.seq)) {
      case detail::barrier_tally::outcome::waiting:
        return;
      case detail::barrier_tally::outcome::passed: {
        reply_builder rb(req.seq, global_step_, incarnation_);
        return reply_(worker, rb.finish());
      }
      case detail::barrier_tally::outcome::out_of_step:
        return fail(worker, req.seq, errc::invalid_argument,
                    "barrier: worker index " + std::to_string(worker) + " is at generation " +
                        std::to_string(req.push_step) + ", the others wait at " +
                        std::to_string(barrier_.generation()));
      case detail::barrier_tally::outcome::released:
        break;
    }
    const auto released = barrier_.take_released();
    for (std::uint32_t w = 0; w < released.size(); ++w) {
      reply_builder rb(released[w], global_step_, incarnation_);
      reply_(w, rb.finish());
    }
  }

  void maybe_autosave() {
    if (opts_.checkpoint_every == 0 || opts_.checkpoint_dir.empty() || global_step_ % opts_.checkpoint_every != 0)
      return;
    try {
      save(checkpoint_file());
    } catch (const std::exception&) {
      ++stats_.errors;  // the next step tries again; a worker's explicit save reports the error
    }
  }

  void answer(std::uint32_t worker, const request_view& req, std::uint32_t flags) {
    reply_builder rb(req.seq, global_step_, incarnation_);
    rb.set_flags(flags);
    for (const entry_view& e : req.entries) {
      if (e.kind == op::pull_dense) {
        const dense_state& d = dense_[dense_index_[e.var][e.slice]];
        const auto n = static_cast<std::size_t>(d.info.element_count);
        std::span<float> out = rb.add(op::pull_dense, e.var, e.slice, n);
        std::copy_n(d.data.data(), n, out.data());
      } else if (e.kind == op::pull_rows) {
        const auto dim = static_cast<std::size_t>(model_.variables[e.var].row_size());
        std::span<float> out = rb.add(op::pull_rows, e.var, 0, static_cast<std::size_t>(e.id_count) * dim);
        for (std::uint64_t k = 0; k < e.id_count; ++k) {
          const row_state& r = row(e.var, e.id(k));
          std::copy_n(r.data.data(), dim, out.data() + k * dim);
        }
      }
    }
    reply_(worker, rb.finish());
  }

  model_spec model_;
  placement place_;
  std::uint32_t index_;
  server_options opts_;
  std::size_t num_workers_;
  reply_fn reply_;
  std::uint64_t incarnation_;
  std::uint64_t fingerprint_;
  std::uint64_t global_step_ = 0;
  std::uint64_t restored_step_ = 0;
  bool shutdown_ = false;
  shard_stats stats_;
  std::vector<dense_state> dense_;
  std::vector<std::vector<std::size_t>> dense_index_;  ///< [var][slice] -> index in dense_, or npos
  std::vector<std::unordered_map<std::int64_t, row_state>> rows_;
  std::vector<std::unordered_map<std::int64_t, std::vector<float>>> acc_rows_;
  std::vector<worker_state> workers_;
  detail::barrier_tally barrier_;
  std::set<std::uint32_t> contributors_;
  std::vector<deferred_request> deferred_;
  std::vector<float> grad_;
  std::set<std::int64_t> seen_ids_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
