#pragma once
/// ps::shard's replies: the pulled values of a request, an error naming what
/// was wrong, and the answers of a worker barrier. A pull's reply shares
/// the values of each large dense slice rather than copying them; embedding
/// rows are copied into it, one block per entry.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <fusewire/core/error.hpp>
#include <fusewire/ps/detail/barrier_tally.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/shard.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline void shard::answer(std::uint32_t worker, const request_view& req, std::uint32_t flags) {
  // A dense slice of at least share_min_bytes goes out from its own buffer
  // (the reply holds a handle to it until it is sent); on a little-endian
  // host only, where its floats are the wire's bytes. Each shared slice takes
  // two scatter-gather segments (it and the headers after it), so at most
  // half of a frame's segments are shared slices; the rest are copied.
  constexpr bool can_share = std::endian::native == std::endian::little;
  const std::size_t max_shared = (wire::limits{}.max_segments - 1) / 2;
  auto shared = [&](const dense_state& d, std::size_t& count) {
    if (!can_share || d.values.size() < share_min_bytes || count == max_shared) return false;
    ++count;
    return true;
  };
  std::uint32_t entries = 0;
  std::size_t values = 0;  // copied into the reply
  std::size_t count = 0;
  for (const entry_view& e : req.entries) {
    if (e.kind == op::pull_dense) {
      ++entries;
      const dense_state& d = dense_[dense_index_[e.var][e.slice]];
      if (!shared(d, count)) values += static_cast<std::size_t>(d.info.element_count);
    } else if (e.kind == op::pull_rows) {
      ++entries;
      values += static_cast<std::size_t>(e.id_count) * static_cast<std::size_t>(model_.variables[e.var].row_size());
    }
  }
  reply_encoder rb(req.seq, global_step_, incarnation_, flags | base_flags(), entries, values);
  count = 0;
  for (const entry_view& e : req.entries) {
    if (e.kind == op::pull_dense) {
      const dense_state& d = dense_[dense_index_[e.var][e.slice]];
      const std::span<const float> v = d.values_view();
      rb.begin(op::pull_dense, e.var, e.slice, v.size());
      if (shared(d, count)) {
        rb.share(d.values.share());
        stats_.shared_reply_bytes += d.values.size();
      } else {
        rb.append(v);
      }
    } else if (e.kind == op::pull_rows) {
      const auto dim = static_cast<std::size_t>(model_.variables[e.var].row_size());
      rb.begin(op::pull_rows, e.var, 0, static_cast<std::size_t>(e.id_count) * dim);
      for (std::uint64_t k = 0; k < e.id_count; ++k) rb.append({row(e.var, e.id(k)).data.data(), dim});
    }
  }
  reply_(worker, rb.finish_message());
}

inline void shard::fail(std::uint32_t worker, std::uint64_t seq, errc e, std::string why) {
  ++stats_.errors;
  reply_builder rb(seq, global_step_, incarnation_);
  rb.set_flags(base_flags());
  rb.set_error(e == errc::ok ? errc::invalid_argument : e, "ps " + std::to_string(index_) + ": " + why);
  reply_(worker, reply_message::of(rb.finish()));
}

inline void shard::arrive(std::uint32_t worker, const request_view& req) {
  switch (barrier_.arrive(worker, req.push_step, req.seq)) {
    case detail::barrier_tally::outcome::waiting:
      return;
    case detail::barrier_tally::outcome::passed: {
      reply_builder rb(req.seq, global_step_, incarnation_);
      rb.set_flags(base_flags());
      return reply_(worker, reply_message::of(rb.finish()));
    }
    case detail::barrier_tally::outcome::out_of_step:
      return fail(worker, req.seq, errc::invalid_argument,
                  "barrier: worker index " + std::to_string(worker) + " is at generation " +
                      std::to_string(req.push_step) + ", the others wait at " + std::to_string(barrier_.generation()));
    case detail::barrier_tally::outcome::released:
      break;
  }
  const auto released = barrier_.take_released();
  for (std::uint32_t w = 0; w < released.size(); ++w) {
    reply_builder rb(released[w], global_step_, incarnation_);
    rb.set_flags(base_flags());
    reply_(w, reply_message::of(rb.finish()));
  }
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
