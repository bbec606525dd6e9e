#pragma once
/// The state of one verbs RC connection (`verbs_conn_state`): setup over
/// rdmacm, user operations, close. Its send path, flow control, bulk window
/// and read path are defined in the headers beside it (verbs/connection.hpp
/// includes them all).

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
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/transport/verbs/device.hpp>
#include <fusewire/transport/verbs/engine.hpp>
#include <fusewire/transport/verbs/message_header.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// The state of one RC connection, shared by its handle, the context (while it
/// has a QP) and posted tasks.
class verbs_conn_state final : public ref_counted, public closable, public verbs_cm_target {
 public:
  using established_fn = util::unique_function<void(std::error_code)>;

  enum class phase : std::uint8_t { resolving_addr, resolving_route, connecting, open, gone };

  verbs_conn_state(verbs_context& ctx, rdma_cm_id* id, phase p)
      : ctx_(&ctx), reactor_(&ctx.reactor()), id_(id), phase_(p) {
    reactor_->add_closable(*this);
    if (id_ != nullptr) id_->context = static_cast<verbs_cm_target*>(this);
  }

  ~verbs_conn_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
  }

  verbs_reactor& reactor() const noexcept { return *reactor_; }
  bool is_open() const noexcept { return open_; }
  const std::string& peer() const noexcept { return peer_; }
  const verbs_stats& stats() const noexcept { return stats_; }
  rdma_cm_id* id() const noexcept { return id_; }

  /// Fails a connect whose first step could not start (handler runs later).
  void fail_on_start(std::error_code ec) { fail_setup(ec); }

  /// Runs once when the connection is established or failed to be.
  void on_established(established_fn f) { established_ = std::move(f); }

  /// Creates the QP on the shared CQ and SRQ; false (and `ec`) on failure.
  bool create_qp(std::error_code& ec) {
    if (id_->verbs != ctx_->device()) {
      ec = make_error_code(errc::invalid_argument);
      ctx_->reactor().report("verbs: the address routes over device " +
                             std::string(id_->verbs ? ibv_get_device_name(id_->verbs->device) : "?") +
                             ", but this reactor uses " + ctx_->device_name() + " (TF_RDMA_DEV_NAME)");
      return false;
    }
    if (!ctx_->reserve_qp()) {
      ec = make_error_code(errc::connection_refused);
      ctx_->reactor().report("verbs: reactor has max_connections=" + std::to_string(ctx_->config().max_connections) +
                             " queue pairs already; refusing another");
      return false;
    }
    ibv_qp_init_attr qa{};
    qa.send_cq = ctx_->cq();
    qa.recv_cq = ctx_->cq();
    qa.srq = ctx_->srq();
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = ctx_->config().sq_depth;
    qa.cap.max_send_sge = 1;
    qa.sq_sig_all = 1;
    if (rdma_create_qp(id_, ctx_->pd(), &qa) != 0) {
      ec = std::error_code(errno, std::system_category());
      ctx_->unreserve_qp();
      return false;
    }
    qp_reserved_ = true;
    sq_free_ = ctx_->config().sq_depth;
    ctx_->add_qp(id_->qp->qp_num, this);
    return true;
  }

  /// What we put in rdmacm's private data.
  std::array<std::byte, verbs_hello::size> hello() const {
    std::array<std::byte, verbs_hello::size> out{};
    verbs_hello h;
    h.credits = ctx_->config().credits;
    h.message_size = static_cast<std::uint32_t>(ctx_->config().message_size);
    h.store(out.data());
    return out;
  }

  /// Reads the peer's hello; false if it is missing or malformed.
  bool take_hello(const std::vector<std::byte>& pdata) {
    verbs_hello h;
    if (!h.load(pdata.data(), pdata.size())) return false;
    credits_ = static_cast<int>(h.credits);
    peer_message_size_ = std::min<std::size_t>(h.message_size, ctx_->config().message_size);
    return true;
  }

  inline void on_cm_event(const event& e) override;

  // ---- user operations ------------------------------------------------------

  template <class H>
  void async_write(std::span<const const_buffer> sg, H&& handler) {
    reactor_->work_started();
    write_op op;
    op.handler = std::forward<H>(handler);
    for (const_buffer b : sg) {
      if (!b.empty()) op.sg.push_back(b);
    }
    op.total = total_size(sg);
    op.start = tx_queued_;
    if (!open_) {
      op.preset = make_error_code(errc::connection_closed);
    } else {
      tx_queued_ += op.total;
    }
    op.end = op.start + (op.preset ? 0 : op.total);
    writes_.push_back(std::move(op));
    write_task_.schedule(*reactor_);
  }

  template <class H>
  void async_write_remote(const tensor_buffer& src, remote_region dst, H&& handler) {
    reactor_->work_started();
    write_op op;
    op.handler = std::forward<H>(handler);
    op.remote = true;
    op.total = src.size();
    op.src = src.data();
    op.region = dst;
    if (src.reg() == nullptr) {
      op.preset = make_error_code(errc::invalid_argument);
    } else if (src.size() > dst.size || src.size() > (std::size_t{1} << 30)) {
      op.preset = make_error_code(errc::size_mismatch);
    } else if (!open_) {
      op.preset = make_error_code(errc::connection_closed);
    } else {
      op.lkey = src.reg()->lkey;
    }
    op.start = tx_queued_;
    if (!op.preset && op.total != 0) ++tx_queued_;
    op.end = tx_queued_;
    writes_.push_back(std::move(op));
    write_task_.schedule(*reactor_);
  }

  template <class H>
  void async_read(mutable_buffer dst, H&& handler) {
    reactor_->work_started();
    read_op op;
    op.dst = dst;
    op.exact = std::forward<H>(handler);
    if (!open_) op.preset = make_error_code(errc::connection_closed);
    reads_.push_back(std::move(op));
    read_task_.schedule(*reactor_);
  }

  template <class H>
  void async_read_some(H&& handler) {
    reactor_->work_started();
    read_op op;
    op.some = std::forward<H>(handler);
    if (!open_) op.preset = make_error_code(errc::connection_closed);
    reads_.push_back(std::move(op));
    read_task_.schedule(*reactor_);
  }

  /// Local close: pending operations fail with errc::cancelled; the QP is
  /// disconnected (its sends flush) and destroyed once they are reaped.
  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    read_task_.schedule(*reactor_);  // posting them cannot fail: the tasks are members
    write_task_.schedule(*reactor_);
    rx_buffered_.clear();
    rx_buffered_bytes_ = 0;
    if (phase_ != phase::open && established_) {
      fail_setup(make_error_code(errc::cancelled));
      return;
    }
    disconnect();
  }

  void shutdown() noexcept override { close(); }

  // ---- called by the context ---------------------------------------------------

  void on_message(const std::byte* p, std::size_t len);  // verbs/read_path.hpp
  void revoke_window();                                  // verbs/bulk_window.hpp
  bool revocable() const noexcept;                       // verbs/bulk_window.hpp
  void on_chunk_landed(std::uint32_t imm);               // verbs/bulk_window.hpp
  void on_send_complete(const ibv_wc& wc);               // verbs/write_path.hpp

  /// A receive completed with an error on this QP.
  void on_recv_error(const ibv_wc& wc) {
    fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                std::string("verbs: receive from ") + peer_ + " failed: " + ibv_wc_status_str(wc.status));
  }

  /// Retried when a send slot was freed.
  void on_slot_available() { pump_tx(); }

  /// True once the context may destroy the QP and id.
  bool retirable() const noexcept { return phase_ == phase::gone && inflight_.empty(); }

  /// Destroys QP and id (context, after draining the CQ).
  void destroy_transport() noexcept {
    if (id_ == nullptr) return;
    if (id_->qp != nullptr) rdma_destroy_qp(id_);
    if (qp_reserved_) {
      ctx_->unreserve_qp();
      qp_reserved_ = false;
    }
    rdma_destroy_id(id_);
    id_ = nullptr;
    inflight_.clear();
    landing_.clear();
    landing_offset_ = 0;
    grants_.clear();
    grant_used_ = 0;
  }

  /// The context is going away: forget the device.
  void detach() noexcept {
    open_ = false;
    phase_ = phase::gone;
    destroy_transport();
  }

 private:
  friend class verbs_context;

  struct write_op {
    boost::container::small_vector<const_buffer, 4> sg;
    std::size_t total = 0;
    std::size_t start = 0;  // stream offset of its first byte
    std::size_t end = 0;    // stream offset after its last byte
    util::unique_function<void(std::error_code, std::size_t)> handler;
    std::error_code preset;
    bool remote = false;  // a one-sided write: one tx unit, no stream bytes
    const std::byte* src = nullptr;
    std::uint32_t lkey = 0;
    remote_region region;
  };
  struct read_op {
    mutable_buffer dst;
    std::size_t filled = 0;
    util::unique_function<void(std::error_code, std::size_t)> exact;
    util::unique_function<void(std::error_code, tensor_buffer)> some;
    std::error_code preset;
  };
  /// Set in an RDMA write's immediate: the sender is done with that grant.
  static constexpr std::uint32_t imm_last = std::uint32_t{1} << 31;

  struct sent_message {
    tensor_buffer slot;
    std::size_t end;  // tx stream offset after this message's data
  };

  template <class F, class... Args>
  void complete(F& handler, Args&&... args) {
    reactor_->work_finished();
    reactor_->invoke(handler, std::forward<Args>(args)...);
  }

  // ---- connection setup -------------------------------------------------------

  void fail_setup(std::error_code ec) {
    established_fn f = std::move(established_);
    established_ = nullptr;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    phase_ = phase::gone;
    if (id_ != nullptr && id_->qp != nullptr && !disconnecting_) {
      disconnecting_ = true;
      rdma_disconnect(id_);
    }
    ctx_->retire(this);
    if (f) {
      ref_ptr<verbs_conn_state> guard(this);
      reactor_->post([f = std::move(f), ec]() mutable { f(ec); });
    }
  }

  void established() {
    phase_ = phase::open;
    sockaddr* a = rdma_get_peer_addr(id_);
    socket_address sa;
    if (a != nullptr) {
      sa.size = a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
      std::memcpy(&sa.storage, a, sa.size);
      peer_ = to_string(sa);
    }
    if (established_) {
      established_fn f = std::move(established_);
      established_ = nullptr;
      f(std::error_code());
    }
    pump_tx();
  }

  void disconnect() noexcept {
    if (phase_ == phase::open && !disconnecting_ && id_ != nullptr) {
      disconnecting_ = true;
      rdma_disconnect(id_);
    }
  }

  void maybe_retire() {
    if (phase_ == phase::gone && inflight_.empty()) ctx_->retire(this);
  }

  /// The stream broke: pending writes fail with `write_ec`, reads with
  /// `read_ec` once the bytes that arrived are consumed.
  void fail_stream(std::error_code write_ec, std::error_code read_ec, const std::string& why = {}) {
    if (!why.empty() && open_) reactor_->report(why);
    if (!write_error_) write_error_ = write_ec;
    if (!read_error_) read_error_ = read_ec;
    disconnect();
    read_task_.schedule(*reactor_);
    write_task_.schedule(*reactor_);
  }

  // ---- sending -----------------------------------------------------------------

  int returnable() const noexcept;  // verbs/credits.hpp

  enum class step : std::uint8_t { posted, idle, broken };

  bool withholding() const noexcept;                                              // verbs/credits.hpp
  bool is_bulk(const write_op& w) const noexcept;                                 // verbs/bulk_window.hpp
  const write_op* next_write() const noexcept;                                    // verbs/write_path.hpp
  std::size_t bulk_run(std::size_t limit) const noexcept;                         // verbs/bulk_window.hpp
  bool wants_grant() const noexcept;                                              // verbs/bulk_window.hpp
  void pump_tx();                                                                 // verbs/write_path.hpp
  bool post(ibv_send_wr& wr, ibv_sge& sge, tensor_buffer& buf, std::size_t len);  // verbs/credits.hpp

  bool post(ibv_send_wr& wr, ibv_sge& sge, const std::byte* data, std::size_t len, std::uint32_t lkey,
            bool uses_credit);                                                  // verbs/credits.hpp
  step post_chunk();                                                            // verbs/bulk_window.hpp
  step post_remote();                                                           // verbs/write_path.hpp
  step post_message();                                                          // verbs/credits.hpp
  void copy_stream(std::byte* out, std::size_t len);                            // verbs/bulk_window.hpp
  std::size_t gather(std::byte* out, std::size_t room, const write_op*& bulk);  // verbs/write_path.hpp
  void complete_acked_writes();                                                 // verbs/write_path.hpp
  void pump_writes();                                                           // verbs/write_path.hpp

  // ---- receiving -----------------------------------------------------------------

  void deliver(const std::byte* p, std::size_t n);  // verbs/read_path.hpp
  void pump_reads();                                // verbs/read_path.hpp

  verbs_context* ctx_;
  verbs_reactor* reactor_;
  rdma_cm_id* id_;
  phase phase_;
  bool open_ = true;
  bool disconnecting_ = false;
  bool qp_reserved_ = false;
  member_task<verbs_conn_state> read_task_{*this, &verbs_conn_state::pump_reads};    ///< pump_reads, posted
  member_task<verbs_conn_state> write_task_{*this, &verbs_conn_state::pump_writes};  ///< pump_writes, posted
  bool retired_ = false;
  established_fn established_;
  std::string peer_;
  std::size_t peer_message_size_ = 0;
  int credits_ = 0;  // messages we may still send
  int owed_ = 0;     // credits we owe the peer (messages received, slots reposted)
  unsigned sq_free_ = 0;
  std::error_code read_error_, write_error_;
  std::deque<write_op> writes_;
  std::deque<read_op> reads_;
  std::deque<sent_message> inflight_;
  struct grant {
    std::uint64_t addr;
    std::uint32_t rkey;
    std::uint32_t len;
  };
  std::deque<grant> grants_;      // sender: the peer's chunk buffers we may write, oldest first
  std::uint32_t grant_used_ = 0;  // sender: bytes already written into grants_.front()
  bool announced_ = false;        // sender: the peer knows we write in bulk (keeps our window full)
  bool release_pending_ = false;  // sender: a revoke arrived; hand back release_owed_ grants
  std::uint32_t release_owed_ = 0;
  std::deque<tensor_buffer> landing_;  // receiver: chunk buffers granted to the peer, oldest first
  std::size_t landing_offset_ = 0;     // receiver: where the next write lands in landing_.front()
  bool window_active_ = false;         // receiver: the peer announced bulk writes; keep its window full
  bool revoking_ = false;              // receiver: revoke sent (or due), release not yet here
  bool revoke_pending_ = false;        // receiver: revoke not yet sent
  std::deque<tensor_buffer> rx_buffered_;
  std::size_t rx_buffered_bytes_ = 0;
  std::size_t tx_queued_ = 0, tx_posted_ = 0, tx_acked_ = 0;
  verbs_stats stats_;
};

inline void verbs_conn_state::on_cm_event(const event& e) {
  ref_ptr<verbs_conn_state> guard(this);
  const std::uint32_t timeout = static_cast<std::uint32_t>(ctx_->config().resolve_timeout_ms);
  switch (e.type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (phase_ != phase::resolving_addr) return;
      if (!established_) return fail_setup(make_error_code(errc::cancelled));
      phase_ = phase::resolving_route;
      if (rdma_resolve_route(id_, static_cast<int>(timeout)) != 0) fail_setup(cm_error(errno));
      return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (phase_ != phase::resolving_route) return;
      std::error_code ec;
      if (!create_qp(ec)) return fail_setup(ec);
      phase_ = phase::connecting;
      const auto pdata = hello();
      rdma_conn_param param{};
      param.private_data = pdata.data();
      param.private_data_len = static_cast<std::uint8_t>(pdata.size());
      param.responder_resources = 1;
      param.initiator_depth = 1;
      param.retry_count = 7;
      param.rnr_retry_count = 7;
      if (rdma_connect(id_, &param) != 0) fail_setup(cm_error(errno));
      return;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
      if (phase_ != phase::connecting) return;
      if (!e.private_data.empty() && credits_ == 0 && !take_hello(e.private_data)) {
        return fail_setup(make_error_code(errc::handshake_failed));
      }
      if (credits_ == 0) return fail_setup(make_error_code(errc::handshake_failed));
      established();
      return;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_REJECTED:
      if (phase_ == phase::open) {
        fail_stream(make_error_code(errc::connection_reset), make_error_code(errc::connection_closed));
        phase_ = phase::gone;
        maybe_retire();
        return;
      }
      fail_setup(make_error_code(errc::connection_refused));
      return;
    case RDMA_CM_EVENT_DISCONNECTED:
      // Everything the peer sent before disconnecting is already in the CQ.
      ctx_->poll_cq();
      if (!disconnecting_) {
        disconnecting_ = true;
        rdma_disconnect(id_);
      }
      if (phase_ == phase::open) {
        fail_stream(make_error_code(errc::connection_reset), make_error_code(errc::connection_closed));
      } else if (established_) {
        fail_setup(make_error_code(errc::connection_refused));
      }
      phase_ = phase::gone;
      maybe_retire();
      return;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                  "verbs: device removed under the connection to " + peer_);
      if (established_) fail_setup(make_error_code(errc::device_error));
      phase_ = phase::gone;
      maybe_retire();
      return;
    default:
      return;
  }
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire

// The members declared above and defined beside this header (and the context's,
// which need this class complete), so that this header is complete on its own.
#include <fusewire/transport/verbs/bulk_window.hpp>
#include <fusewire/transport/verbs/context_impl.hpp>
#include <fusewire/transport/verbs/credits.hpp>
#include <fusewire/transport/verbs/read_path.hpp>
#include <fusewire/transport/verbs/write_path.hpp>
