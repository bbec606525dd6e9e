#pragma once
/// The write path of a verbs connection: pumping queued writes into SENDs,
/// chunks and one-sided writes, completing them as the peer acknowledges.

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

inline void verbs_conn_state::on_send_complete(const ibv_wc& wc) {
  ref_ptr<verbs_conn_state> guard(this);
  if (inflight_.empty()) return;
  sent_message m = std::move(inflight_.front());
  inflight_.pop_front();
  ++sq_free_;
  ctx_->send_completed();
  m.slot.reset();
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR || (phase_ == phase::open && !disconnecting_)) {
      fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                  std::string("verbs: send to ") + peer_ + " failed: " + ibv_wc_status_str(wc.status));
    }
  } else {
    tx_acked_ = m.end;
    complete_acked_writes();
  }
  if (phase_ == phase::gone || disconnecting_) {
    maybe_retire();
  } else {
    pump_tx();
  }
}

/// The write holding the next stream unit to post, or nullptr.
inline const verbs_conn_state::write_op* verbs_conn_state::next_write() const noexcept {
  for (const write_op& w : writes_) {
    if (!w.preset && w.end > tx_posted_) return &w;
  }
  return nullptr;
}

inline void verbs_conn_state::pump_tx() {
  if (phase_ != phase::open || disconnecting_ || write_error_ || id_ == nullptr) return;
  while (sq_free_ > 0) {
    step r = post_chunk();
    if (r == step::idle) r = post_remote();
    if (r == step::idle) r = post_message();
    if (r != step::posted) return;
  }
}

/// A one-sided write whose turn has come (it needs no receive credit).
inline verbs_conn_state::step verbs_conn_state::post_remote() {
  if (!open_ || tx_posted_ >= tx_queued_) return step::idle;
  const write_op* next = next_write();
  if (next == nullptr || !next->remote || next->start != tx_posted_) return step::idle;
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = next->region.addr;
  wr.wr.rdma.rkey = next->region.rkey;
  if (!post(wr, sge, next->src, next->total, next->lkey, false)) return step::broken;
  tx_posted_ += 1;
  ++stats_.rdma_writes;
  stats_.bytes_rdma_written += next->total;
  inflight_.push_back({tensor_buffer(), tx_posted_});
  return step::posted;
}

/// Copies queued eager stream bytes from tx_posted_ on into `out`; returns
/// how many. Stops before a bulk write; if it reached one, `bulk` names it.
inline std::size_t verbs_conn_state::gather(std::byte* out, std::size_t room, const write_op*& bulk) {
  std::size_t copied = 0;
  bulk = nullptr;
  for (const write_op& w : writes_) {
    if (w.preset || w.end <= tx_posted_ + copied) continue;
    if (w.remote) break;
    if (is_bulk(w)) {
      if (w.start == tx_posted_ + copied) bulk = &w;
      break;
    }
    if (copied == room) break;
    std::size_t skip = tx_posted_ + copied - w.start;
    for (const_buffer b : w.sg) {
      if (copied == room) break;
      if (skip >= b.size()) {
        skip -= b.size();
        continue;
      }
      const std::size_t k = std::min(b.size() - skip, room - copied);
      std::memcpy(out + copied, b.data() + skip, k);
      copied += k;
      skip = 0;
    }
  }
  return copied;
}

inline void verbs_conn_state::complete_acked_writes() {
  while (!writes_.empty() && !writes_.front().preset && writes_.front().end <= tx_acked_ && open_ && !write_error_) {
    write_op op = std::move(writes_.front());
    writes_.pop_front();
    complete(op.handler, std::error_code(), op.total);
  }
  // A refused operation now at the front completes from the pump, in order.
  if (!writes_.empty() && writes_.front().preset) write_task_.schedule(*reactor_);
}

inline void verbs_conn_state::pump_writes() {
  ref_ptr<verbs_conn_state> guard(this);
  for (;;) {
    complete_acked_writes();
    if (writes_.empty()) break;
    write_op& front = writes_.front();
    std::error_code ec = front.preset;
    if (!ec && !open_) ec = make_error_code(errc::cancelled);
    if (!ec) ec = write_error_;
    if (!ec) break;
    write_op op = std::move(front);
    writes_.pop_front();
    std::size_t done = tx_acked_ > op.start ? std::min(op.total, tx_acked_ - op.start) : 0;
    if (op.remote) done = tx_acked_ >= op.end ? op.total : 0;
    complete(op.handler, ec, op.preset ? 0 : done);
  }
  pump_tx();
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
