#pragma once
/// One reactor's verbs device resources (`verbs_context`: PD, CQ, SRQ,
/// rdmacm channel, registered pools), the rdmacm event target, and the
/// engine's members that drive the context.

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
#include <fusewire/transport/verbs/device.hpp>
#include <fusewire/transport/verbs/engine.hpp>
#include <fusewire/transport/verbs/message_header.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// Something that receives rdmacm events for its id (stored in id->context).
class verbs_cm_target {
 public:
  struct event {
    rdma_cm_event_type type;
    int status;
    rdma_cm_id* id;
    std::vector<std::byte> private_data;
  };
  virtual void on_cm_event(const event& e) = 0;

 protected:
  ~verbs_cm_target() = default;
};

class verbs_conn_state;

/// One reactor's device resources (see the file comment). Reactor thread only.
class verbs_context {
 public:
  static constexpr std::uint64_t recv_tag = std::uint64_t{1} << 63;

  verbs_context(verbs_reactor& reactor, const verbs_config& cfg) : reactor_(&reactor), config_(cfg) {
    config_.validate();
    std::string warning;
    device_ = choose_device(config_.device, warning);
    if (!warning.empty()) reactor.report(warning);
    cm_channel_ = rdma_create_event_channel();
    if (cm_channel_ == nullptr) {
      throw std::system_error(errno, std::system_category(), "verbs: rdma_create_event_channel failed");
    }
    set_nonblocking(cm_channel_->fd);
    try {
      pd_ = std::make_shared<verbs_pd>(device_);
      comp_channel_ = ibv_create_comp_channel(device_);
      if (comp_channel_ == nullptr) fail_errno("ibv_create_comp_channel");
      set_nonblocking(comp_channel_->fd);
      srq_depth_ = config_.credits * config_.max_connections;
      cq_depth_ = srq_depth_ + config_.max_connections * config_.sq_depth;
      cq_ = ibv_create_cq(device_, static_cast<int>(cq_depth_), nullptr, comp_channel_, 0);
      if (cq_ == nullptr) fail_errno("ibv_create_cq(" + std::to_string(cq_depth_) + " entries)");
      ibv_srq_init_attr sa{};
      sa.attr.max_wr = srq_depth_;
      sa.attr.max_sge = 1;
      srq_ = ibv_create_srq(pd_->get(), &sa);
      if (srq_ == nullptr) fail_errno("ibv_create_srq(" + std::to_string(srq_depth_) + " entries)");

      buffer_pool_config pc;
      pc.block_size = config_.message_size;
      pc.total_bytes = (std::size_t{srq_depth_} + config_.send_slots) * config_.message_size;
      register_slabs(pc);
      slots_.emplace(std::move(pc));
      if (config_.rdma_write_threshold != 0) {
        buffer_pool_config sc;
        sc.block_size = config_.chunk_size;
        sc.total_bytes = std::size_t{config_.staging_blocks} * config_.chunk_size;
        register_slabs(sc);
        staging_.emplace(std::move(sc));
      }
      recv_slots_.resize(srq_depth_);
      for (std::uint32_t i = 0; i < srq_depth_; ++i) {
        recv_slots_[i] = slots_->allocate(config_.message_size, 0);
        post_recv(i);
      }
    } catch (...) {
      release_device();
      throw;
    }
  }

  verbs_context(const verbs_context&) = delete;
  verbs_context& operator=(const verbs_context&) = delete;
  inline ~verbs_context();

  verbs_reactor& reactor() const noexcept { return *reactor_; }
  const verbs_config& config() const noexcept { return config_; }
  ibv_context* device() const noexcept { return device_; }
  ibv_pd* pd() const noexcept { return pd_->get(); }
  const std::shared_ptr<verbs_pd>& pd_handle() const noexcept { return pd_; }
  /// Registered bytes of this reactor, held to config().registered_limit (TF_RDMA_BUF_SIZE).
  registered_budget& budget() const noexcept { return *budget_; }

  /// Makes `cfg`'s pool register each slab in this reactor's protection
  /// domain, within its TF_RDMA_BUF_SIZE budget. The hooks own what they
  /// need, so the pool may outlive this context.
  void register_slabs(buffer_pool_config& cfg) const {
    cfg.register_slab = [pd = pd_, budget = budget_](void* base, std::size_t len) {
      return register_memory(*pd, *budget, base, len);
    };
    cfg.unregister_slab = [pd = pd_, budget = budget_](const registration& r, void*, std::size_t len) {
      deregister_memory(r, *budget, len);
    };
  }
  ibv_cq* cq() const noexcept { return cq_; }
  ibv_srq* srq() const noexcept { return srq_; }
  rdma_event_channel* cm_channel() const noexcept { return cm_channel_; }
  int comp_fd() const noexcept { return comp_channel_->fd; }
  std::string device_name() const { return ibv_get_device_name(device_->device); }

  /// A free registered send slot, or false (the caller waits in `blocked`).
  bool take_send_slot(tensor_buffer& out) noexcept { return !slots_->allocate(config_.message_size, 0, out); }

  /// A free registered chunk buffer for RDMA writes, or false.
  bool take_staging(tensor_buffer& out) noexcept { return staging_ && !staging_->allocate(config_.chunk_size, 0, out); }
  void buffer_released() noexcept { slot_freed_ = true; }
  /// The staging pool ran dry: asks one connection (not `exclude`) whose
  /// window of grants may sit idle to take it back.
  inline void reclaim_staging(const verbs_conn_state* exclude);

  /// Counts a QP against max_connections; false when the budget is used up.
  bool reserve_qp() noexcept {
    if (qps_reserved_ >= config_.max_connections) return false;
    ++qps_reserved_;
    return true;
  }
  void unreserve_qp() noexcept { --qps_reserved_; }

  inline void add_qp(std::uint32_t qp_num, verbs_conn_state* c);
  inline void remove_qp(std::uint32_t qp_num) noexcept;
  void wait_for_slot(verbs_conn_state* c);
  void send_posted() noexcept { ++inflight_; }
  void send_completed() noexcept { --inflight_; }
  bool busy() const noexcept { return inflight_ != 0; }

  /// Polls the CQ (and the rdmacm channel if `with_cm`); true if anything ran.
  inline bool poll(bool with_cm);
  /// Arms the CQ for the completion channel, then polls once more (a
  /// completion may have slipped in before arming); true if it found work.
  bool arm() {
    ibv_req_notify_cq(cq_, 0);
    return poll_cq();
  }
  /// Consumes completion-channel events (the channel fd is non-blocking).
  void ack_cq_events() noexcept {
    ibv_cq* cq = nullptr;
    void* user = nullptr;
    unsigned n = 0;
    while (ibv_get_cq_event(comp_channel_, &cq, &user) == 0) ++n;
    if (n != 0) ibv_ack_cq_events(cq_, n);
  }

  /// Marks a connection whose QP can go once its sends are flushed.
  void retire(verbs_conn_state* c);

 private:
  [[noreturn]] void fail_errno(const std::string& what) {
    throw std::system_error(errno != 0 ? errno : ENOMEM, std::system_category(),
                            "verbs: " + what + " on " + device_name() + " failed");
  }
  static void set_nonblocking(int fd) noexcept { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

  void post_recv(std::uint32_t index) {
    tensor_buffer& slot = recv_slots_[index];
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uintptr_t>(slot.data());
    sge.length = static_cast<std::uint32_t>(slot.size());
    sge.lkey = slot.reg()->lkey;
    ibv_recv_wr wr{};
    wr.wr_id = recv_tag | index;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_srq_recv(srq_, &wr, &bad); rc != 0) {
      reactor_->report("verbs: ibv_post_srq_recv failed: " + std::system_category().message(rc));
    }
  }

  inline bool poll_cq();
  inline bool poll_cm();
  inline void reap();

  void release_device() noexcept {
    recv_slots_.clear();
    slots_.reset();
    staging_.reset();
    if (srq_ != nullptr) ibv_destroy_srq(srq_);
    if (cq_ != nullptr) {
      ack_cq_events();
      ibv_destroy_cq(cq_);
    }
    if (comp_channel_ != nullptr) ibv_destroy_comp_channel(comp_channel_);
    pd_.reset();
    if (cm_channel_ != nullptr) rdma_destroy_event_channel(cm_channel_);
    srq_ = nullptr;
    cq_ = nullptr;
    comp_channel_ = nullptr;
    cm_channel_ = nullptr;
  }

  verbs_reactor* reactor_;
  verbs_config config_;
  ibv_context* device_ = nullptr;
  std::shared_ptr<verbs_pd> pd_;
  std::shared_ptr<registered_budget> budget_ = std::make_shared<registered_budget>(config_.registered_limit);
  rdma_event_channel* cm_channel_ = nullptr;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_srq* srq_ = nullptr;
  std::uint32_t srq_depth_ = 0;
  std::uint32_t cq_depth_ = 0;
  std::optional<buffer_pool> slots_;
  std::optional<buffer_pool> staging_;
  std::vector<tensor_buffer> recv_slots_;
  std::unordered_map<std::uint32_t, ref_ptr<verbs_conn_state>> qps_;
  std::vector<ref_ptr<verbs_conn_state>> blocked_;
  std::vector<ref_ptr<verbs_conn_state>> retiring_;
  std::size_t inflight_ = 0;
  unsigned qps_reserved_ = 0;
  bool slot_freed_ = false;

  friend class verbs_conn_state;
};

}  // namespace detail

inline verbs_engine::~verbs_engine() {
  context_.reset();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

inline void verbs_engine::attach(std::unique_ptr<detail::verbs_context> ctx) {
  watch(ctx->comp_fd(), cq_tag);
  watch(ctx->cm_channel()->fd, cm_tag);
  context_ = std::move(ctx);
}

inline bool verbs_engine::poll() {
  if (!context_) return false;
  return context_->poll(++tick_ % cm_interval_ == 0);
}

inline void verbs_engine::wait(std::optional<std::chrono::nanoseconds> timeout) {
  if (context_ && context_->arm()) return;
  int ms = -1;
  if (timeout) ms = static_cast<int>(std::min<std::int64_t>((timeout->count() + 999999) / 1000000, 1 << 30));
  epoll_event events[4];
  const int n = ::epoll_wait(epoll_fd_, events, 4, ms);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u32 == wake_tag) {
      std::uint64_t value = 0;
      [[maybe_unused]] const ssize_t r = ::read(hooks_->wake_fd(), &value, sizeof value);
    } else if (events[i].data.u32 == cq_tag && context_) {
      context_->ack_cq_events();
    }
  }
  if (context_) context_->poll(true);
}

inline bool verbs_engine::busy() const noexcept { return context_ && context_->busy(); }

}  // namespace v0
}  // namespace fusewire

// The context's members that drive connections need their complete state.
#include <fusewire/transport/verbs/connection_state.hpp>
