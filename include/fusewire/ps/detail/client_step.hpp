#pragma once
/// ps::client's step: one request per PS for a batch — in sync mode carrying
/// the step this worker pushes for and the step its pulls wait on — then the
/// replies: each is decoded and checked against its request, and the pulled
/// values are scattered into the batch.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/ps/batch.hpp>
#include <fusewire/ps/client.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

template <transport Transport>
void client<Transport>::plan_split(attempt& a) {
  if constexpr (std::endian::native != std::endian::little) return;  // values arrive little-endian
  const std::vector<sink>& sinks = a.plan->sinks;
  if (sinks.empty() || sinks.back().kind != op::pull_dense || sinks.back().count * 4 < split_from) return;
  std::size_t values = 0;
  for (const sink& s : sinks) values += s.count;
  const sink& last = sinks.back();
  a.split_head = reply_header_bytes + sinks.size() * reply_entry_header_bytes + (values - last.count) * 4;
  // Floats are written as bytes (the reply's little-endian f32 is their representation here).
  a.tail = mutable_buffer(reinterpret_cast<std::byte*>(last.out + last.offset), last.count * 4);
}

template <transport Transport>
void client<Transport>::run_impl(batch& b, std::uint32_t control_flags, bool all_ps, std::error_code& ec,
                                 std::chrono::milliseconds timeout, bool ping) {
  ec.clear();
  b.error_.clear();
  ++stats_.runs;
  {
    std::string why;
    if (!ensure_lanes(timeout, ec, why)) {
      b.error_ = std::move(why);
      return;
    }
  }
  const std::size_t num_ps = ps_tasks_.size();
  // Fused: one group (one request per PS). Unfused: a group per pull/push.
  std::deque<std::vector<ps_plan>> groups;
  std::deque<std::vector<std::int64_t>> id_store;
  std::deque<std::vector<float>> grad_store;
  std::deque<row_targets> pos_store;
  const bool fused = copts_.fuse || control_flags != 0 || b.items_.size() <= 1;
  if (fused) {
    if (!plan(b, 0, b.items_.size(), groups.emplace_back(num_ps), id_store, grad_store, pos_store, ec)) return;
  } else {
    for (std::size_t i = 0; i < b.items_.size(); ++i) {
      if (!plan(b, i, i + 1, groups.emplace_back(num_ps), id_store, grad_store, pos_store, ec)) return;
    }
  }
  const bool sync = copts_.mode == training_mode::sync;
  const bool pushes =
      std::any_of(b.items_.begin(), b.items_.end(), [](const batch::item& it) { return is_push(it.kind); });
  std::vector<attempt> attempts;
  for (auto& plans : groups) {
    for (std::uint32_t p = 0; p < num_ps; ++p) {
      std::uint32_t flags = control_flags | (sync ? request_flags::sync : 0u);
      std::uint64_t push_step = 0;
      if (sync && pushes && control_flags == 0 && !ping) {
        flags |= request_flags::contributes;
        push_step = ps_step_[p];
        want_[p] = ps_step_[p] + 1;
      }
      if (plans[p].rb.empty() && (flags & ~request_flags::sync) == 0 && !all_ps) continue;
      const std::uint64_t min_step = sync && control_flags == 0 && !ping ? want_[p] : 0;
      plans[p].rb.set_header(incarnation_, ++seq_[p], fingerprint_, push_step, min_step, flags);
      attempt& a = attempts.emplace_back();
      a.ps = p;
      a.plan = &plans[p];
      a.seq = seq_[p];
      a.request = plans[p].rb.finish_gathered(gather_from);
      stats_.bytes_sent += a.request.bytes;
      ++stats_.requests;
      // One request per PS: its reply has a receive of its own.
      if (fused) plan_split(a);
    }
  }
  std::string why;
  const auto step_begin = clock::now();
  const bool answered = exchange(attempts, timeout, ec, why);
  if (ep_->tracing()) {
    std::string to;
    for (const attempt& a : attempts) to += (to.empty() ? "" : ", ") + target_name(a.ps);
    ep_->trace_mark(control_flags == 0 && !ping ? "ps step" : "ps control", step_begin, clock::now(),
                    "requests to " + to + (answered ? std::string() : "; failed: " + why));
  }
  if (!answered) {
    b.error_ = std::move(why);
    return;
  }
  // Decode every reply; scatter pulled values.
  std::error_code first_ec;
  std::string first_why;
  for (attempt& a : attempts) {
    const std::uint32_t p = a.ps;
    reply_view r;
    std::error_code dec;
    std::string dwhy;
    decode_reply(a.reply.bytes(), r, dec, dwhy, a.landed ? const_buffer(a.tail) : const_buffer());
    const std::string who = target_name(p);
    if (dec) {
      if (!first_ec) first_ec = dec, first_why = who + ": bad reply: " + dwhy;
      continue;
    }
    if (ps_incarnation_[p] != r.incarnation) {
      if (ps_incarnation_[p] != 0 && !ps_restarted(p, r.step, (r.flags & reply_flags::fresh) != 0)) {
        ec = make_error_code(errc::state_lost);
        b.error_ = who + " restarted without a checkpoint (it was at step " + std::to_string(ps_step_[p]) +
                   "): its values were initialised again. Give the PS a checkpoint_dir and checkpoint_every, "
                   "or set client_config::allow_reinitialized_ps to go on from fresh values";
        return;
      }
      ps_incarnation_[p] = r.incarnation;
    }
    ps_step_[p] = sync ? r.step : std::max(ps_step_[p], r.step);
    if ((r.flags & reply_flags::stale) != 0) ++stats_.stale;
    stats_.bytes_received += a.reply.size() + (a.landed ? a.tail.size() : 0);
    if (a.landed) ++stats_.direct_pulls;
    if (r.status != 0) {
      if (!first_ec) first_ec = make_error_code(static_cast<errc>(r.status)), first_why = r.message;
      continue;
    }
    const auto& sinks = a.plan->sinks;
    if (r.entries.size() != sinks.size()) {
      if (!first_ec) {
        first_ec = make_error_code(errc::malformed_frame);
        first_why = who + ": reply has " + std::to_string(r.entries.size()) + " entries, expected " +
                    std::to_string(sinks.size());
      }
      continue;
    }
    for (std::size_t i = 0; i < sinks.size(); ++i) {
      const sink& s = sinks[i];
      const reply_entry_view& e = r.entries[i];
      if (e.kind != s.kind || e.var != s.var || e.slice != s.slice || e.value_count != s.count) {
        if (!first_ec) {
          first_ec = make_error_code(errc::malformed_frame);
          first_why = who + ": reply entry " + std::to_string(i) + " does not match the request";
        }
        break;
      }
      if (s.kind == op::pull_dense) {
        // Values a split receive put in place are there already.
        if (e.values != reinterpret_cast<const std::byte*>(s.out + s.offset))
          e.copy_values(s.out + s.offset, 0, s.count);
      } else {
        const auto& pos = *s.positions;
        for (const auto& [at, row] : pos) e.copy_values(s.out + at * s.dim, row * s.dim, s.dim);
      }
    }
    for (const repeat& again : a.plan->repeats) {
      const sink& s = sinks[again.sink];
      std::copy_n(s.out + s.offset, s.count, again.out + s.offset);
    }
  }
  if (first_ec) {
    ec = first_ec;
    b.error_ = std::move(first_why);
  }
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
