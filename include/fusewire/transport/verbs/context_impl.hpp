#pragma once
/// The verbs_context members that drive its connections (CQ and rdmacm
/// polling, slot waits, retiring); they need a complete verbs_conn_state.

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
#include <fusewire/transport/verbs/connection_state.hpp>
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

inline void verbs_context::add_qp(std::uint32_t qp_num, verbs_conn_state* c) {
  qps_[qp_num] = ref_ptr<verbs_conn_state>(c);
}

inline void verbs_context::remove_qp(std::uint32_t qp_num) noexcept { qps_.erase(qp_num); }

inline void verbs_context::wait_for_slot(verbs_conn_state* c) {
  for (const auto& b : blocked_) {
    if (b.get() == c) return;
  }
  blocked_.push_back(ref_ptr<verbs_conn_state>(c));
}

inline void verbs_context::reclaim_staging(const verbs_conn_state* exclude) {
  for (auto& [num, c] : qps_) {
    if (c.get() != exclude && c->revocable()) {
      c->revoke_window();
      return;
    }
  }
}

inline void verbs_context::retire(verbs_conn_state* c) {
  if (c->retired_) return;
  c->retired_ = true;
  retiring_.push_back(ref_ptr<verbs_conn_state>(c));
}

inline bool verbs_context::poll_cq() {
  bool worked = false;
  ibv_wc wc[32];
  for (int round = 0; round < 16; ++round) {
    const int n = ibv_poll_cq(cq_, 32, wc);
    if (n <= 0) break;
    worked = true;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& w = wc[i];
      if ((w.wr_id & recv_tag) != 0) {
        const auto index = static_cast<std::uint32_t>(w.wr_id & ~recv_tag);
        auto it = qps_.find(w.qp_num);
        if (it != qps_.end()) {
          ref_ptr<verbs_conn_state> c = it->second;
          try {
            if (w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
              c->on_chunk_landed(ntohl(w.imm_data));
            } else if (w.status == IBV_WC_SUCCESS) {
              c->on_message(recv_slots_[index].data(), w.byte_len);
            } else if (w.status != IBV_WC_WR_FLUSH_ERR) {
              c->on_recv_error(w);
            }
          } catch (...) {
            reactor_->report("verbs: exception while handling a receive: " + describe_current_exception());
          }
        }
        if (index < recv_slots_.size()) post_recv(index);
      } else {
        auto* c = reinterpret_cast<verbs_conn_state*>(static_cast<std::uintptr_t>(w.wr_id));
        slot_freed_ = true;
        try {
          c->on_send_complete(w);
        } catch (...) {
          reactor_->report("verbs: exception while handling a send completion: " + describe_current_exception());
        }
      }
    }
    if (n < 32) break;
  }
  if (slot_freed_ && !blocked_.empty()) {
    slot_freed_ = false;
    std::vector<ref_ptr<verbs_conn_state>> waiting;
    waiting.swap(blocked_);
    for (auto& c : waiting) c->on_slot_available();
  }
  slot_freed_ = false;
  return worked;
}

inline bool verbs_context::poll_cm() {
  bool worked = false;
  rdma_cm_event* raw = nullptr;
  while (rdma_get_cm_event(cm_channel_, &raw) == 0) {
    worked = true;
    verbs_cm_target::event e;
    e.type = raw->event;
    e.status = raw->status;
    e.id = raw->id;
    const void* pd = raw->param.conn.private_data;
    const std::size_t plen = raw->param.conn.private_data_len;
    if (pd != nullptr && plen != 0) {
      e.private_data.assign(static_cast<const std::byte*>(pd), static_cast<const std::byte*>(pd) + plen);
    }
    rdma_cm_id* target_id = raw->event == RDMA_CM_EVENT_CONNECT_REQUEST ? raw->listen_id : raw->id;
    auto* target = static_cast<verbs_cm_target*>(target_id != nullptr ? target_id->context : nullptr);
    rdma_ack_cm_event(raw);
    if (target == nullptr) {
      if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST) rdma_reject(e.id, nullptr, 0);
      continue;
    }
    try {
      target->on_cm_event(e);
    } catch (...) {
      reactor_->report("verbs: exception while handling a connection event: " + describe_current_exception());
    }
  }
  return worked;
}

inline void verbs_context::reap() {
  if (retiring_.empty()) return;
  // A stale completion must never meet a recycled QP number: drain first.
  poll_cq();
  std::vector<ref_ptr<verbs_conn_state>> keep;
  std::vector<ref_ptr<verbs_conn_state>> now;
  now.swap(retiring_);
  for (auto& c : now) {
    if (!c->inflight_.empty()) {
      keep.push_back(std::move(c));
      continue;
    }
    if (c->id_ != nullptr && c->id_->qp != nullptr) remove_qp(c->id_->qp->qp_num);
    c->destroy_transport();
  }
  for (auto& c : keep) retiring_.push_back(std::move(c));
}

inline bool verbs_context::poll(bool with_cm) {
  bool worked = poll_cq();
  if (with_cm) worked |= poll_cm();
  reap();
  return worked;
}

inline verbs_context::~verbs_context() {
  for (auto& c : retiring_) c->detach();
  retiring_.clear();
  blocked_.clear();
  auto qps = std::move(qps_);
  qps_.clear();
  for (auto& [num, c] : qps) c->detach();
  release_device();
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
