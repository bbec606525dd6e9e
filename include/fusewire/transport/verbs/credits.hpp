#pragma once
/// Flow control of a verbs connection: the receive credits it may spend and
/// owes, the send-queue slots, and the one SEND per turn that carries eager
/// bytes, returned credits and window control. See the credit rules in
/// transport/verbs.hpp.

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

/// Credits we may return now (none while the reader lags too far behind).
inline int verbs_conn_state::returnable() const noexcept {
  return rx_buffered_bytes_ >= ctx_->config().rx_buffer_limit ? 0 : owed_;
}

inline bool verbs_conn_state::withholding() const noexcept {
  return rx_buffered_bytes_ >= ctx_->config().rx_buffer_limit;
}

inline bool verbs_conn_state::post(ibv_send_wr& wr, ibv_sge& sge, tensor_buffer& buf, std::size_t len) {
  return post(wr, sge, buf.data(), len, buf.reg()->lkey, true);
}

inline bool verbs_conn_state::post(ibv_send_wr& wr, ibv_sge& sge, const std::byte* data, std::size_t len,
                                   std::uint32_t lkey, bool uses_credit) {
  sge.addr = reinterpret_cast<std::uintptr_t>(data);
  sge.length = static_cast<std::uint32_t>(len);
  sge.lkey = lkey;
  wr.wr_id = reinterpret_cast<std::uintptr_t>(this);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(id_->qp, &wr, &bad); rc != 0) {
    fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                "verbs: ibv_post_send to " + peer_ + " failed: " + std::system_category().message(rc));
    return false;
  }
  if (uses_credit) --credits_;
  --sq_free_;
  ctx_->send_posted();
  return true;
}

/// One SEND carrying what is due: eager bytes (coalesced up to the next bulk
/// or one-sided write), a bulk announcement, a grant, a revoke, a release,
/// returned credits. With one credit left only a credit update goes.
inline verbs_conn_state::step verbs_conn_state::post_message() {
  const write_op* next = open_ ? next_write() : nullptr;
  const bool data = next != nullptr && !next->remote && !is_bulk(*next);
  bool rts = next != nullptr && is_bulk(*next) && !announced_;
  const bool grant = wants_grant();
  const bool control = revoke_pending_ || release_pending_;
  const bool update = returnable() >= static_cast<int>(ctx_->config().credits / 2);
  if (!data && !rts && !grant && !control && !update) return step::idle;
  const bool full = credits_ >= 2;
  if (!full && !(update && credits_ >= 1)) {
    ++stats_.credit_stalls;
    return step::idle;
  }
  tensor_buffer slot;
  if (!ctx_->take_send_slot(slot)) {
    ++stats_.slot_stalls;
    ctx_->wait_for_slot(this);
    return step::idle;
  }
  tensor_buffer chunk;
  bool granting = false;
  if (full && grant) {
    granting = ctx_->take_staging(chunk);
    if (!granting) {
      ++stats_.slot_stalls;
      ctx_->reclaim_staging(this);
      ctx_->wait_for_slot(this);
      if (!data && !rts && !control && !update) return step::idle;
    }
  }
  verbs_header h;
  h.credits = static_cast<std::uint32_t>(returnable());
  std::size_t n = 0;
  const bool revoking = full && revoke_pending_;
  const bool releasing = full && release_pending_;
  if (full) {
    if (data) {
      const write_op* bulk = nullptr;
      n = gather(slot.data() + verbs_header::size, peer_message_size_ - verbs_header::size, bulk);
      if (bulk != nullptr && !announced_) rts = true;
    }
    if (rts) h.flags |= verbs_header::flag_rts;
    if (granting) {
      h.flags |= verbs_header::flag_grant;
      h.grant_addr = reinterpret_cast<std::uintptr_t>(chunk.data());
      h.grant_rkey = chunk.reg()->rkey;
      h.grant_len = static_cast<std::uint32_t>(chunk.size());
    }
    if (revoking) h.flags |= verbs_header::flag_revoke;
    if (releasing) {
      h.flags |= verbs_header::flag_release;
      h.released = release_owed_;
    }
  } else {
    rts = false;
  }
  h.data_len = static_cast<std::uint32_t>(n);
  h.store(slot.data());
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  if (!post(wr, sge, slot, verbs_header::size + n)) return step::broken;
  owed_ -= static_cast<int>(h.credits);
  tx_posted_ += n;
  if (rts) {
    announced_ = true;
    ++stats_.announces;
  }
  if (granting) {
    landing_.push_back(std::move(chunk));
    ++stats_.grants_sent;
  }
  if (revoking) {
    revoke_pending_ = false;
    ++stats_.revokes_sent;
  }
  if (releasing) {
    release_pending_ = false;
    release_owed_ = 0;
  }
  ++stats_.messages_sent;
  stats_.bytes_sent += n;
  if (n == 0 && h.flags == 0) ++stats_.credit_updates;
  inflight_.push_back({std::move(slot), tx_posted_});
  return step::posted;
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
