#pragma once
/// ps::shard's request path: decode one request, check it against the model,
/// the placement and the training mode, skip the pushes of a resent request,
/// and hand it on — to the pushes, the checkpoint, the barrier, or a reply
/// now or when its sync step completes.

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <string>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline void shard::handle(std::uint32_t worker, tensor_buffer request) {
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
  if ((req.flags & request_flags::hello) != 0) return hello(worker, req);
  if ((req.flags & request_flags::bye) != 0) return leave(worker, req);
  if (why = mismatch(req, fingerprint_); !why.empty()) return fail(worker, req.seq, errc::invalid_argument, why);
  errc bad = errc::ok;
  why = validate(req, bad);
  if (!why.empty()) return fail(worker, req.seq, bad, why);

  lost_[worker].clear();
  left_[worker] = false;
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
        ws.pushed_step = global_step_ + 1;
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
    // A resend of a request that already waits (no reply within the worker's
    // retry interval, or its connection broke) takes no second place in the
    // queue: the one waiting is answered when the step completes.
    if (duplicate && std::any_of(deferred_.begin(), deferred_.end(),
                                 [&](const deferred_request& d) { return d.worker == worker && d.seq == req.seq; })) {
      return;
    }
    const auto queued = static_cast<std::size_t>(std::count_if(
        deferred_.begin(), deferred_.end(), [worker](const deferred_request& d) { return d.worker == worker; }));
    if (queued >= opts_.max_waiting_per_worker) {
      return fail(worker, req.seq, errc::invalid_argument,
                  "worker index " + std::to_string(worker) + " already has " + std::to_string(queued) +
                      " requests waiting for step " + std::to_string(global_step_ + 1) +
                      " (server_options::max_waiting_per_worker)");
    }
    if (const std::string blocked = step_blocked_by(); !blocked.empty()) {
      return fail(worker, req.seq, errc::peer_lost,
                  "sync step " + std::to_string(global_step_ + 1) + " cannot complete: " + blocked);
    }
    ++stats_.deferred;
    deferred_.push_back({worker, std::move(request), reply_flags_value, req.seq});
  } else {
    answer(worker, req, reply_flags_value);
  }
  if (opts_.mode == training_mode::sync && contributors_.size() >= opts_.replicas) finish_step();
}

inline std::string shard::mismatch(const request_view& req, std::uint64_t fingerprint) const {
  if (req.fingerprint != fingerprint) {
    return "model fingerprint mismatch: the worker's model_spec (or PS count) differs from this PS's";
  }
  const bool sync_req = (req.flags & request_flags::sync) != 0;
  if (sync_req != (opts_.mode == training_mode::sync)) {
    return std::string("training mode mismatch: the worker trains ") + (sync_req ? "sync" : "async") + ", this PS " +
           std::string(to_string(opts_.mode));
  }
  return {};
}

inline void shard::hello(std::uint32_t worker, const request_view& req) {
  const std::size_t tasks = place_.num_ps() / opts_.lanes;
  if (const std::string why = mismatch(req, model_.fingerprint(tasks)); !why.empty()) {
    return fail(worker, req.seq, errc::invalid_argument, why);
  }
  if (!req.entries.empty()) return fail(worker, req.seq, errc::invalid_argument, "a hello carries entries");
  left_[worker] = false;  // a worker that left and started again
  reply_builder rb(req.seq, global_step_, incarnation_);
  rb.set_flags(base_flags() | reply_flags::lanes(opts_.lanes));
  reply_(worker, reply_message::of(rb.finish()));
}

inline void shard::leave(std::uint32_t worker, const request_view& req) {
  if (!req.entries.empty()) return fail(worker, req.seq, errc::invalid_argument, "a bye carries entries");
  left_[worker] = true;  // no reply: the worker is closing
}

inline void shard::worker_lost(std::uint32_t worker, const std::string& why) {
  if (worker >= num_workers_ || !lost_[worker].empty()) return;
  lost_[worker] = why.empty() ? std::string("lost") : why;
  const std::string name = opts_.worker_job + ":" + std::to_string(worker);
  if (barrier_.waiting() && !barrier_.arrived(worker)) {
    for (const auto& [w, seq] : barrier_.abandon()) {
      fail(w, seq, errc::peer_lost, "barrier: " + name + " was lost before it arrived (" + lost_[worker] + ")");
    }
  }
  if (opts_.mode == training_mode::sync) fail_blocked();
}

inline std::string shard::step_blocked_by() const {
  std::size_t possible = contributors_.size();
  std::string lost;
  for (std::uint32_t w = 0; w < num_workers_; ++w) {
    if (contributors_.contains(w)) continue;
    if (lost_[w].empty()) {
      ++possible;
    } else {
      lost += (lost.empty() ? "" : ", ") + opts_.worker_job + ":" + std::to_string(w) + " was lost (" + lost_[w] + ")";
    }
  }
  return possible >= opts_.replicas ? std::string() : lost;
}

inline void shard::fail_blocked() {
  if (deferred_.empty()) return;
  const std::string blocked = step_blocked_by();
  if (blocked.empty()) return;
  auto waiting = std::move(deferred_);
  deferred_.clear();
  for (const deferred_request& d : waiting) {
    fail(d.worker, d.seq, errc::peer_lost,
         "sync step " + std::to_string(global_step_ + 1) + " cannot complete: " + blocked);
  }
}

inline std::string shard::validate(const request_view& req, errc& code) const {
  std::uint64_t reply_values = 0;  // what the pulls ask for, in values
  std::uint64_t unknown_ids = 0;   // ids of rows not made yet, repeats counted
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
      // The same slice twice in one request would pull it twice (a small
      // request, a reply as large as the slice times the repeats) or apply
      // one gradient twice: no client sends that.
      for (std::size_t j = 0; j < i; ++j) {
        const entry_view& f = req.entries[j];
        if (f.kind == e.kind && f.var == e.var && f.slice == e.slice) {
          return where + ": " + var + " slice " + std::to_string(e.slice) + " is already in entry " +
                 std::to_string(j) + " of this request";
        }
      }
      if (e.kind == op::pull_dense) reply_values += static_cast<std::uint64_t>(d.info.element_count);
      continue;
    }
    const std::int64_t num_ids = v.shape[0];
    const auto dim = static_cast<std::uint64_t>(v.row_size());
    if (e.kind == op::pull_rows) reply_values += e.id_count * dim;
    for (std::uint64_t k = 0; k < e.id_count; ++k) {
      const std::int64_t id = e.id(k);
      if (!rows_[e.var].contains(id)) ++unknown_ids;
      if (num_ids > 0 && (id < 0 || id >= num_ids)) {
        return where + ": " + var + ": id " + std::to_string(id) + " out of range [0, " + std::to_string(num_ids) + ")";
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
  code = errc::invalid_argument;
  std::uint64_t fresh_values = 0;  // values of the distinct rows this request would create
  if (unknown_ids != 0) {
    const auto [rows, values] = new_rows(req);
    if (rows > opts_.max_new_rows) {
      return "the request would create " + std::to_string(rows) +
             " embedding rows, more than server_options::max_new_rows = " + std::to_string(opts_.max_new_rows);
    }
    fresh_values = values;
  }
  // A reply holds at most what this PS holds, with the rows this request
  // makes: repeats cannot turn a small request into a huge reply.
  if (reply_values > held_values() + fresh_values) {
    return "the request pulls " + std::to_string(reply_values) + " values, more than this PS holds (" +
           std::to_string(held_values() + fresh_values) + "): an id or a slice is repeated";
  }
  code = errc::ok;
  return {};
}

inline std::pair<std::uint64_t, std::uint64_t> shard::new_rows(const request_view& req) const {
  std::set<std::pair<std::uint32_t, std::int64_t>> fresh;
  std::uint64_t values = 0;
  for (const entry_view& e : req.entries) {
    if (!is_rows(e.kind)) continue;
    for (std::uint64_t k = 0; k < e.id_count; ++k) {
      if (!rows_[e.var].contains(e.id(k)) && fresh.emplace(e.var, e.id(k)).second) {
        values += static_cast<std::uint64_t>(model_.variables[e.var].row_size());
      }
    }
  }
  return {fresh.size(), values};
}

inline std::uint64_t shard::held_values() const noexcept {
  std::uint64_t n = dense_values_;
  for (std::size_t var = 0; var < rows_.size(); ++var) {
    if (!rows_[var].empty()) n += rows_[var].size() * static_cast<std::uint64_t>(model_.variables[var].row_size());
  }
  return n;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
