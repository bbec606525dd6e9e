#pragma once
/// The bulk (chunked RDMA write) window of a verbs connection: the sender packs
/// bulk bytes into the peer's granted chunk buffers; the receiver lands them,
/// keeps the window topped up and revokes it when staging runs short.

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/transport/verbs/config.hpp>
#include <fusewire/transport/verbs/connection_state.hpp>
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/transport/verbs/message_header.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// Takes back this connection's window of grants if it has one (the staging
/// pool ran dry); the peer answers with a release.
inline void verbs_conn_state::revoke_window() {
  if (phase_ != phase::open || !window_active_ || revoking_ || landing_.empty()) return;
  window_active_ = false;
  revoking_ = true;
  revoke_pending_ = true;
  write_task_.schedule(*reactor_);
}

/// True if revoke_window() would do something.
inline bool verbs_conn_state::revocable() const noexcept {
  return phase_ == phase::open && window_active_ && !revoking_ && !landing_.empty();
}

/// An RDMA_WRITE_WITH_IMM landed in the oldest chunk buffer we granted, at
/// landing_offset_; `imm` is its length, with imm_last if the sender is done
/// with that chunk.
inline void verbs_conn_state::on_chunk_landed(std::uint32_t imm) {
  ref_ptr<verbs_conn_state> guard(this);
  ++stats_.messages_received;
  ++owed_;
  const std::uint32_t len = imm & ~imm_last;
  if (landing_.empty() || landing_offset_ + len > landing_.front().size()) {
    fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                "verbs: unexpected RDMA write of " + std::to_string(len) + " bytes from " + peer_);
    return;
  }
  if (open_) {
    stats_.bytes_received += len;
    deliver(landing_.front().data() + landing_offset_, len);
  }
  landing_offset_ += len;
  if ((imm & imm_last) != 0) {
    landing_.pop_front();
    landing_offset_ = 0;
    ctx_->buffer_released();
  }
  pump_tx();
}

inline bool verbs_conn_state::is_bulk(const write_op& w) const noexcept {
  const std::size_t t = ctx_->config().rdma_write_threshold;
  return t != 0 && w.total > t && !w.preset && !w.remote;
}

/// Bytes of consecutive bulk writes from tx_posted_ on, at most `limit`.
inline std::size_t verbs_conn_state::bulk_run(std::size_t limit) const noexcept {
  std::size_t n = 0;
  for (const write_op& w : writes_) {
    if (w.preset || w.end <= tx_posted_) continue;
    if (!is_bulk(w)) break;
    n += w.end - std::max(w.start, tx_posted_);
    if (n >= limit) return limit;
  }
  return n;
}

/// Receiver: the peer's window lacks a grant we may give now.
inline bool verbs_conn_state::wants_grant() const noexcept {
  return window_active_ && !revoking_ && landing_.size() < ctx_->config().max_grants && !withholding();
}

/// The next bulk bytes (across consecutive bulk writes) into the oldest
/// grant, at the offset where the previous piece ended.
inline verbs_conn_state::step verbs_conn_state::post_chunk() {
  if (!open_ || grants_.empty()) return step::idle;
  const write_op* next = next_write();
  if (next == nullptr || !is_bulk(*next)) return step::idle;
  if (credits_ < 2) {
    ++stats_.credit_stalls;
    return step::idle;
  }
  const grant g = grants_.front();
  const std::size_t len = bulk_run(g.len - grant_used_);
  tensor_buffer chunk;
  if (!ctx_->take_staging(chunk)) {
    ++stats_.slot_stalls;
    ctx_->reclaim_staging(nullptr);
    ctx_->wait_for_slot(this);
    return step::idle;
  }
  copy_stream(chunk.data(), len);
  const bool last = grant_used_ + len == g.len;
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(static_cast<std::uint32_t>(len) | (last ? imm_last : 0));
  wr.wr.rdma.remote_addr = g.addr + grant_used_;
  wr.wr.rdma.rkey = g.rkey;
  if (!post(wr, sge, chunk, len)) return step::broken;
  if (last) {
    grants_.pop_front();
    grant_used_ = 0;
  } else {
    grant_used_ += static_cast<std::uint32_t>(len);
  }
  tx_posted_ += len;
  ++stats_.rdma_writes;
  stats_.bytes_rdma_written += len;
  stats_.bytes_sent += len;
  inflight_.push_back({std::move(chunk), tx_posted_});
  return step::posted;
}

/// Copies the next `len` stream bytes (from tx_posted_) into `out`.
inline void verbs_conn_state::copy_stream(std::byte* out, std::size_t len) {
  std::size_t copied = 0;
  for (const write_op& w : writes_) {
    if (copied == len || w.remote) break;
    if (w.preset || w.end <= tx_posted_ + copied) continue;
    std::size_t skip = tx_posted_ + copied - w.start;
    for (const_buffer b : w.sg) {
      if (copied == len) break;
      if (skip >= b.size()) {
        skip -= b.size();
        continue;
      }
      const std::size_t k = std::min(b.size() - skip, len - copied);
      std::memcpy(out + copied, b.data() + skip, k);
      copied += k;
      skip = 0;
    }
  }
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
