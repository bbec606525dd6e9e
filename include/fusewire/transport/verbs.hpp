#pragma once
/// verbs: the RDMA transport on rdma-core (libibverbs + librdmacm), a model of
/// fusewire::transport. See transport/concepts.hpp for the contract every
/// transport keeps; this file says what is particular to RDMA.
///
/// Design:
/// - Connections are RC queue pairs set up with rdmacm (RDMA_PS_TCP port space,
///   so host:port addressing works as with TCP). Each reactor owns one
///   `verbs_engine` which owns, per reactor and shared by all its QPs: one
///   protection domain, one completion queue (with its completion channel),
///   one shared receive queue, one rdmacm event channel and one registered
///   buffer_pool of message slots (registered once per slab through the
///   pool's registration hook, never per message or tensor). The QP, CQ and
///   memory budget is fixed per reactor (config::max_connections), it does not
///   grow with the cluster.
/// - The byte stream is carried by SEND messages of at most
///   config::message_size bytes (header + data) copied into registered slots:
///   consecutive small writes are coalesced into one message; large writes are
///   cut into messages and pipelined up to the credit window.
/// - Flow control: each side grants the other config::credits receive
///   credits (one per message; the SRQ holds credits x max_connections
///   slots, so it is never overrun); credits come back piggybacked on every
///   message, or in a header-only message once half are owed. Data needs two
///   credits, a credit return one, so two peers can never both be stuck. A
///   receiver holding more than config::rx_buffer_limit unread bytes stops
///   returning credits: a reader that does not read stops the writer, as TCP
///   does. Every send is signalled and counted, so the send queue and the CQ
///   (sized srq + max_connections x sq_depth) are never overrun either.
/// - Bulk writes (larger than config::rdma_write_threshold) go by
///   RDMA_WRITE_WITH_IMM into registered chunk buffers of the receiver (its
///   staging pool), without a round trip per write: the first bulk write on a
///   connection announces itself (RTS flag) and the receiver answers with a
///   window of config::max_grants chunk grants, which it keeps topped up as
///   chunks are filled and delivered. The sender packs consecutive bulk bytes
///   into the granted chunks (at offsets; the immediate carries the length
///   and whether the chunk is finished). A window stays with its connection
///   until the receiver's staging pool runs short: then the receiver revokes
///   idle windows (REVOKE), the sender hands back the grants it has not
///   written (RELEASE, after its writes, so RC ordering makes it exact) and
///   announces again when it next has bulk bytes.
/// - The reactor drives the device: every tick polls the CQ (busy-polling in
///   reactor_mode::poll) and, every config::cm_poll_interval ticks, the rdmacm
///   channel; before sleeping (adaptive/block) the CQ is armed and the reactor
///   waits in epoll on the completion channel, the rdmacm channel and its wake fd.
/// - Errors: a failed work completion fails the operations of that connection
///   with errc::device_error (never aborts); the peer disconnecting (also when
///   it was killed: its kernel tears the connection down) ends the stream —
///   reads get errc::connection_closed after the bytes that arrived, pending
///   writes errc::connection_reset.
/// - fork(): RDMA memory and queues are not usable in a child. Create every
///   verbs object after fork() (e.g. in each forked worker), or call
///   ibv_fork_init() (or set RDMAV_FORK_SAFE=1) before any verbs object exists
///   if the parent keeps using RDMA while it forks other programs; a child must
///   never touch the parent's connections.
///
/// Device: config::device (TF_RDMA_DEV_NAME, default mlx5_0); if absent, the
/// first device with an active port, with a warning through the reactor's
/// error reporter. Addresses given to listen/connect must route over that device.

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
#include <fusewire/util/unique_function.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/transport/detail/verbs_device.hpp>

namespace fusewire {
inline namespace v0 {

/// How the verbs transport uses a device; fixed per reactor by the first
/// transport that listens or connects on it.
struct verbs_config {
  std::string device = "mlx5_0";              ///< TF_RDMA_DEV_NAME; absent: first active device (warning)
  std::size_t message_size = 64 * 1024;       ///< bytes per SEND slot (header + data); a power of two >= 4096
  unsigned credits = 16;                      ///< receive credits granted to each connection (>= 4)
  unsigned max_connections = 64;              ///< QPs per reactor; fixes the SRQ, CQ and slot budget
  unsigned sq_depth = 64;                     ///< send work requests per QP
  unsigned send_slots = 256;                  ///< registered send slots per reactor, shared by its QPs
  std::size_t rx_buffer_limit = 4u << 20;     ///< unread bytes per connection before credits are withheld
  std::size_t rdma_write_threshold = 8192;    ///< writes larger than this go by RDMA write (TF_RDMA_ACC_SIZE); 0 = never
  std::size_t chunk_size = 4u << 20;          ///< RDMA write chunk (TF_RDMA_CHUNK_SIZE, rounded up to a power of two)
  unsigned staging_blocks = 16;               ///< chunk buffers per reactor (peers' windows, outgoing copies)
  unsigned max_grants = 2;                    ///< chunk grants each bulk-writing peer holds ahead (the window)
  int backlog = 256;                          ///< rdma_listen backlog
  int resolve_timeout_ms = 5000;              ///< rdma_resolve_addr / rdma_resolve_route timeout

  /// Device and sizes from fusewire's options (TF_RDMA_DEV_NAME; TF_RDMA_ACC_SIZE
  /// bounds nothing here: every message is eager up to message_size).
  static verbs_config from(const options& o) {
    verbs_config c;
    c.device = o.rdma_device;
    c.rdma_write_threshold = o.acc_size;
    std::size_t chunk = 4096;
    while (chunk < o.chunk_size && chunk < (std::size_t{1} << 30)) chunk <<= 1;
    c.chunk_size = chunk;
    return c;
  }

  /// Throws std::system_error(errc::invalid_argument) naming the bad field.
  void validate() const {
    auto bad = [](const std::string& what) { throw_error(errc::invalid_argument, "verbs_config." + what); };
    if (message_size < 4096 || (message_size & (message_size - 1)) != 0 || message_size > (1u << 30)) {
      bad("message_size = " + std::to_string(message_size) + ": must be a power of two from 4096 to 1073741824");
    }
    if (credits < 4 || credits > 4096) bad("credits = " + std::to_string(credits) + ": must be 4..4096");
    if (max_connections == 0 || max_connections > 65536) {
      bad("max_connections = " + std::to_string(max_connections) + ": must be 1..65536");
    }
    if (sq_depth < 2 || sq_depth > 16384) bad("sq_depth = " + std::to_string(sq_depth) + ": must be 2..16384");
    if (send_slots == 0) bad("send_slots = 0: must be at least 1");
    if (chunk_size < 4096 || (chunk_size & (chunk_size - 1)) != 0 || chunk_size > (std::size_t{1} << 30)) {
      bad("chunk_size = " + std::to_string(chunk_size) + ": must be a power of two from 4096 to 1073741824");
    }
    if (rdma_write_threshold != 0 && staging_blocks == 0) bad("staging_blocks = 0: must be at least 1");
    if (max_grants == 0 || max_grants > 64) bad("max_grants = " + std::to_string(max_grants) + ": must be 1..64");
    if (backlog < 1) bad("backlog = " + std::to_string(backlog) + ": must be at least 1");
    if (resolve_timeout_ms < 1) bad("resolve_timeout_ms = " + std::to_string(resolve_timeout_ms) + ": must be >= 1");
  }
};

/// Counters of one verbs connection (reactor thread).
struct verbs_stats {
  std::uint64_t messages_sent = 0;     ///< SEND work requests posted
  std::uint64_t messages_received = 0;
  std::uint64_t credit_updates = 0;    ///< header-only messages that only returned credits
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t credit_stalls = 0;     ///< times sending waited for credits
  std::uint64_t slot_stalls = 0;       ///< times sending waited for a free send slot
  std::uint64_t rdma_writes = 0;       ///< RDMA writes posted (WITH_IMM pieces of the stream, and one-sided)
  std::uint64_t bytes_rdma_written = 0;
  std::uint64_t grants_sent = 0;       ///< chunk buffers offered to the peer
  std::uint64_t announces = 0;         ///< bulk announcements (RTS) sent: round trips paid for a window
  std::uint64_t revokes_sent = 0;      ///< windows taken back from the peer because staging ran short
};

namespace detail {
class verbs_context;
class verbs_listener_state_access;
}

/// The reactor engine of the verbs transport: polls its reactor's CQ and
/// rdmacm channel every tick, sleeps in epoll on the completion channel, the
/// rdmacm channel and the wake fd. The device resources are created lazily by
/// the first listen/connect on the reactor.
class verbs_engine {
 public:
  struct config {
    unsigned cm_poll_interval = 16;  ///< ticks between non-blocking checks of the rdmacm channel (>= 1)
  };

  verbs_engine(const config& cfg, detail::engine_hooks& hooks)
      : hooks_(&hooks), cm_interval_(std::max(1u, cfg.cm_poll_interval)) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) throw std::system_error(errno, std::system_category(), "verbs_engine: epoll_create1 failed");
    watch(hooks.wake_fd(), wake_tag);
  }
  verbs_engine(const verbs_engine&) = delete;
  verbs_engine& operator=(const verbs_engine&) = delete;
  inline ~verbs_engine();

  inline bool poll();
  inline void wait(std::optional<std::chrono::nanoseconds> timeout);
  inline bool busy() const noexcept;
  static constexpr std::string_view name() noexcept { return "verbs"; }

  /// The device resources, or nullptr before the first listen/connect. Reactor thread.
  detail::verbs_context* context() noexcept { return context_.get(); }
  detail::engine_hooks& hooks() noexcept { return *hooks_; }

  /// Installs the device resources and watches their fds. Reactor thread.
  inline void attach(std::unique_ptr<detail::verbs_context> ctx);

 private:
  static constexpr std::uint32_t wake_tag = 0, cq_tag = 1, cm_tag = 2;

  void watch(int fd, std::uint32_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = tag;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw std::system_error(errno, std::system_category(), "verbs_engine: epoll_ctl failed");
    }
  }

  detail::engine_hooks* hooks_;
  unsigned cm_interval_;
  unsigned tick_ = 0;
  int epoll_fd_ = -1;
  std::unique_ptr<detail::verbs_context> context_;
};

static_assert(reactor_engine<verbs_engine>);

/// A reactor driving a verbs device.
using verbs_reactor = basic_reactor<verbs_engine>;
/// A group of verbs reactors.
using verbs_reactor_group = basic_reactor_group<verbs_engine>;

class verbs_connection;
class verbs_listener;

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
      const std::size_t locked = pc.total_bytes;
      pc.register_slab = [pd = pd_, locked](void* base, std::size_t len) {
        return register_memory(*pd, base, len, locked);
      };
      pc.unregister_slab = [pd = pd_](const registration& r, void*, std::size_t) { deregister_memory(r); };
      slots_.emplace(std::move(pc));
      if (config_.rdma_write_threshold != 0) {
        buffer_pool_config sc;
        sc.block_size = config_.chunk_size;
        sc.total_bytes = std::size_t{config_.staging_blocks} * config_.chunk_size;
        const std::size_t all = locked + sc.total_bytes;
        sc.register_slab = [pd = pd_, all](void* base, std::size_t len) { return register_memory(*pd, base, len, all); };
        sc.unregister_slab = [pd = pd_](const registration& r, void*, std::size_t) { deregister_memory(r); };
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
  ibv_cq* cq() const noexcept { return cq_; }
  ibv_srq* srq() const noexcept { return srq_; }
  rdma_event_channel* cm_channel() const noexcept { return cm_channel_; }
  int comp_fd() const noexcept { return comp_channel_->fd; }
  std::string device_name() const { return ibv_get_device_name(device_->device); }

  /// A free registered send slot, or false (the caller waits in `blocked`).
  bool take_send_slot(tensor_buffer& out) noexcept {
    return !slots_->allocate(config_.message_size, 0, out);
  }

  /// A free registered chunk buffer for RDMA writes, or false.
  bool take_staging(tensor_buffer& out) noexcept {
    return staging_ && !staging_->allocate(config_.chunk_size, 0, out);
  }
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

/// The state of one RC connection, shared by its handle, the context (while it
/// has a QP) and posted tasks.
class verbs_conn_state final : public ref_counted, public closable, public verbs_cm_target {
 public:
  using established_fn = util::unique_function<void(std::error_code)>;

  enum class phase : std::uint8_t { resolving_addr, resolving_route, connecting, open, gone };

  verbs_conn_state(verbs_context& ctx, rdma_cm_id* id, phase p) : ctx_(&ctx), reactor_(&ctx.reactor()), id_(id), phase_(p) {
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

  void on_cm_event(const event& e) override;

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

  /// A SEND arrived on this QP (slot bytes are valid during the call only).
  void on_message(const std::byte* p, std::size_t len) {
    ref_ptr<verbs_conn_state> guard(this);
    verbs_header h;
    if (!h.load(p, len)) {
      fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                  "verbs: malformed message from " + peer_ + " (" + std::to_string(len) + " bytes)");
      return;
    }
    ++stats_.messages_received;
    credits_ += static_cast<int>(h.credits);
    ++owed_;
    if (h.data_len != 0 && open_) {
      stats_.bytes_received += h.data_len;
      deliver(p + verbs_header::size, h.data_len);
    }
    if ((h.flags & verbs_header::flag_release) != 0) {
      // Our revoke reached the peer after its writes: the grants it hands
      // back are the newest ones we granted.
      if (!revoking_ || h.released > landing_.size()) {
        fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                    "verbs: unexpected release of " + std::to_string(h.released) + " grants from " + peer_);
        return;
      }
      for (std::uint32_t i = 0; i < h.released; ++i) landing_.pop_back();
      if (landing_.empty()) landing_offset_ = 0;
      revoking_ = false;
      if (h.released != 0) ctx_->buffer_released();
    }
    if ((h.flags & verbs_header::flag_rts) != 0) window_active_ = true;
    if ((h.flags & verbs_header::flag_grant) != 0) {
      if (h.grant_len == 0 || h.grant_len > ctx_->config().chunk_size) {
        fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                    "verbs: bad RDMA write grant of " + std::to_string(h.grant_len) + " bytes from " + peer_);
        return;
      }
      grants_.push_back({h.grant_addr, h.grant_rkey, h.grant_len});
    }
    if ((h.flags & verbs_header::flag_revoke) != 0) {
      release_owed_ = static_cast<std::uint32_t>(grants_.size());
      release_pending_ = true;
      grants_.clear();
      grant_used_ = 0;
      announced_ = false;
    }
    pump_tx();
  }

  /// Takes back this connection's window of grants if it has one (the staging
  /// pool ran dry); the peer answers with a release.
  void revoke_window() {
    if (phase_ != phase::open || !window_active_ || revoking_ || landing_.empty()) return;
    window_active_ = false;
    revoking_ = true;
    revoke_pending_ = true;
    write_task_.schedule(*reactor_);
  }
  /// True if revoke_window() would do something.
  bool revocable() const noexcept {
    return phase_ == phase::open && window_active_ && !revoking_ && !landing_.empty();
  }

  /// An RDMA_WRITE_WITH_IMM landed in the oldest chunk buffer we granted, at
  /// landing_offset_; `imm` is its length, with imm_last if the sender is done
  /// with that chunk.
  void on_chunk_landed(std::uint32_t imm) {
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

  void on_send_complete(const ibv_wc& wc) {
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

  /// Credits we may return now (none while the reader lags too far behind).
  int returnable() const noexcept {
    return rx_buffered_bytes_ >= ctx_->config().rx_buffer_limit ? 0 : owed_;
  }

  enum class step : std::uint8_t { posted, idle, broken };

  bool withholding() const noexcept { return rx_buffered_bytes_ >= ctx_->config().rx_buffer_limit; }
  bool is_bulk(const write_op& w) const noexcept {
    const std::size_t t = ctx_->config().rdma_write_threshold;
    return t != 0 && w.total > t && !w.preset && !w.remote;
  }

  /// The write holding the next stream unit to post, or nullptr.
  const write_op* next_write() const noexcept {
    for (const write_op& w : writes_) {
      if (!w.preset && w.end > tx_posted_) return &w;
    }
    return nullptr;
  }

  /// Bytes of consecutive bulk writes from tx_posted_ on, at most `limit`.
  std::size_t bulk_run(std::size_t limit) const noexcept {
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
  bool wants_grant() const noexcept {
    return window_active_ && !revoking_ && landing_.size() < ctx_->config().max_grants && !withholding();
  }

  void pump_tx() {
    if (phase_ != phase::open || disconnecting_ || write_error_ || id_ == nullptr) return;
    while (sq_free_ > 0) {
      step r = post_chunk();
      if (r == step::idle) r = post_remote();
      if (r == step::idle) r = post_message();
      if (r != step::posted) return;
    }
  }

  bool post(ibv_send_wr& wr, ibv_sge& sge, tensor_buffer& buf, std::size_t len) {
    return post(wr, sge, buf.data(), len, buf.reg()->lkey, true);
  }

  bool post(ibv_send_wr& wr, ibv_sge& sge, const std::byte* data, std::size_t len, std::uint32_t lkey,
            bool uses_credit) {
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

  /// The next bulk bytes (across consecutive bulk writes) into the oldest
  /// grant, at the offset where the previous piece ended.
  step post_chunk() {
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

  /// A one-sided write whose turn has come (it needs no receive credit).
  step post_remote() {
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

  /// One SEND carrying what is due: eager bytes (coalesced up to the next bulk
  /// or one-sided write), a bulk announcement, a grant, a revoke, a release,
  /// returned credits. With one credit left only a credit update goes.
  step post_message() {
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

  /// Copies the next `len` stream bytes (from tx_posted_) into `out`.
  void copy_stream(std::byte* out, std::size_t len) {
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

  /// Copies queued eager stream bytes from tx_posted_ on into `out`; returns
  /// how many. Stops before a bulk write; if it reached one, `bulk` names it.
  std::size_t gather(std::byte* out, std::size_t room, const write_op*& bulk) {
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

  void complete_acked_writes() {
    while (!writes_.empty() && !writes_.front().preset && writes_.front().end <= tx_acked_ && open_ &&
           !write_error_) {
      write_op op = std::move(writes_.front());
      writes_.pop_front();
      complete(op.handler, std::error_code(), op.total);
    }
    // A refused operation now at the front completes from the pump, in order.
    if (!writes_.empty() && writes_.front().preset) write_task_.schedule(*reactor_);
  }

  void pump_writes() {
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

  // ---- receiving -----------------------------------------------------------------

  void deliver(const std::byte* p, std::size_t n) {
    while (n != 0) {
      if (rx_buffered_.empty() && !reads_.empty() && !reads_.front().preset) {
        read_op& r = reads_.front();
        if (r.exact) {
          const std::size_t k = std::min(n, r.dst.size() - r.filled);
          std::memcpy(r.dst.data() + r.filled, p, k);
          r.filled += k;
          p += k;
          n -= k;
          if (r.filled == r.dst.size()) {
            read_op op = std::move(r);
            reads_.pop_front();
            complete(op.exact, std::error_code(), op.filled);
            if (!open_) return;
          }
          continue;
        }
        read_op op = std::move(r);
        reads_.pop_front();
        complete(op.some, std::error_code(), tensor_buffer::copy_of(const_buffer(p, n)));
        return;
      }
      rx_buffered_.push_back(tensor_buffer::copy_of(const_buffer(p, n)));
      rx_buffered_bytes_ += n;
      if (!reads_.empty()) read_task_.schedule(*reactor_);
      return;
    }
  }

  void pump_reads() {
    ref_ptr<verbs_conn_state> guard(this);
    const bool was_withholding = rx_buffered_bytes_ >= ctx_->config().rx_buffer_limit;
    while (!reads_.empty()) {
      read_op& r = reads_.front();
      std::error_code ec = r.preset;
      if (!ec && !open_) ec = make_error_code(errc::cancelled);
      if (!ec && !rx_buffered_.empty()) {
        if (r.exact) {
          while (!rx_buffered_.empty() && r.filled < r.dst.size()) {
            tensor_buffer& b = rx_buffered_.front();
            const std::size_t k = std::min(b.size(), r.dst.size() - r.filled);
            std::memcpy(r.dst.data() + r.filled, b.data(), k);
            r.filled += k;
            rx_buffered_bytes_ -= k;
            if (k == b.size()) {
              rx_buffered_.pop_front();
            } else {
              b.trim_front(k);
            }
          }
          if (r.filled < r.dst.size()) break;
          read_op op = std::move(r);
          reads_.pop_front();
          complete(op.exact, std::error_code(), op.filled);
        } else {
          tensor_buffer b = std::move(rx_buffered_.front());
          rx_buffered_.pop_front();
          rx_buffered_bytes_ -= b.size();
          read_op op = std::move(r);
          reads_.pop_front();
          complete(op.some, std::error_code(), std::move(b));
        }
        continue;
      }
      if (!ec && r.exact && r.filled == r.dst.size()) {
        read_op op = std::move(r);
        reads_.pop_front();
        complete(op.exact, std::error_code(), op.filled);
        continue;
      }
      if (!ec) ec = read_error_;
      if (!ec) break;
      read_op op = std::move(r);
      reads_.pop_front();
      if (op.exact) {
        complete(op.exact, ec, op.filled);
      } else {
        complete(op.some, ec, tensor_buffer());
      }
    }
    if (was_withholding && rx_buffered_bytes_ < ctx_->config().rx_buffer_limit) pump_tx();
  }

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
  int credits_ = 0;   // messages we may still send
  int owed_ = 0;      // credits we owe the peer (messages received, slots reposted)
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
  std::deque<grant> grants_;          // sender: the peer's chunk buffers we may write, oldest first
  std::uint32_t grant_used_ = 0;      // sender: bytes already written into grants_.front()
  bool announced_ = false;            // sender: the peer knows we write in bulk (keeps our window full)
  bool release_pending_ = false;      // sender: a revoke arrived; hand back release_owed_ grants
  std::uint32_t release_owed_ = 0;
  std::deque<tensor_buffer> landing_; // receiver: chunk buffers granted to the peer, oldest first
  std::size_t landing_offset_ = 0;    // receiver: where the next write lands in landing_.front()
  bool window_active_ = false;        // receiver: the peer announced bulk writes; keep its window full
  bool revoking_ = false;             // receiver: revoke sent (or due), release not yet here
  bool revoke_pending_ = false;       // receiver: revoke not yet sent
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

namespace detail {
/// Names for error messages.
struct verbs_connection_name {
  static constexpr const char* value = "verbs_connection";
};
struct verbs_listener_name {
  static constexpr const char* value = "verbs_listener";
};
}  // namespace detail

/// An RC connection on a verbs_reactor; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
/// An async_write's handler runs once the peer's adapter acknowledged the
/// messages carrying its last byte; async_read_some delivers the bytes of (at
/// least) one message. No native_handle(): there is no file descriptor.
class verbs_connection
    : public detail::basic_connection_handle<detail::verbs_conn_state, verbs_reactor, detail::verbs_connection_name> {
 public:
  verbs_connection() noexcept = default;

  /// One-sided RDMA write of registered `src` into the peer's `dst` (from its
  /// verbs::describe()), in order with this connection's other writes; the
  /// peer is not notified (send it a message afterwards). `src` must stay
  /// valid until `handler(ec, bytes)` runs. Errors: errc::invalid_argument
  /// (src not registered), errc::size_mismatch (src larger than dst or 1 GiB),
  /// errc::device_error (the peer's adapter refused: bad key or range; this
  /// fails the connection).
  template <io_handler H>
  void async_write_remote(const tensor_buffer& src, remote_region dst, H&& handler) {
    state("async_write_remote").async_write_remote(src, dst, std::forward<H>(handler));
  }

  /// Message and credit counters. Reactor thread.
  verbs_stats stats() const { return state_ ? state_->stats() : verbs_stats{}; }

 private:
  friend class verbs;
  friend class detail::verbs_listener_state_access;

  explicit verbs_connection(detail::ref_ptr<detail::verbs_conn_state> s) noexcept
      : basic_connection_handle(std::move(s)) {}
};

namespace detail {

/// Lets the listener wrap accepted states in handles.
class verbs_listener_state_access {
 public:
  static verbs_connection make(ref_ptr<verbs_conn_state> s) noexcept { return verbs_connection(std::move(s)); }
};

/// A listening rdmacm id, shared by its handle and pending work.
class verbs_listener_state final : public ref_counted, public closable, public verbs_cm_target {
 public:
  using handler_type = util::unique_function<void(std::error_code, verbs_connection)>;

  verbs_listener_state(verbs_context& ctx, rdma_cm_id* id, std::uint16_t port)
      : ctx_(&ctx), reactor_(&ctx.reactor()), id_(id), port_(port) {
    id_->context = static_cast<verbs_cm_target*>(this);
    reactor_->add_closable(*this);
  }
  ~verbs_listener_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
    destroy_id();
  }

  verbs_reactor& reactor() const noexcept { return *reactor_; }
  std::uint16_t port() const noexcept { return port_; }
  bool is_open() const noexcept { return open_; }

  void async_accept(handler_type handler) {
    reactor_->work_started();
    pending_.push_back(std::move(handler));
    schedule();
  }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    destroy_id();
    for (auto& c : ready_) c->close();
    ready_.clear();
    schedule();  // completes the pending accepts with errc::cancelled
  }

  void shutdown() noexcept override { close(); }

  void on_cm_event(const event& e) override {
    if (e.type != RDMA_CM_EVENT_CONNECT_REQUEST) return;
    if (!open_ || reactor_->stopping()) {
      rdma_reject(e.id, nullptr, 0);
      rdma_destroy_id(e.id);
      return;
    }
    ref_ptr<verbs_conn_state> conn(new verbs_conn_state(*ctx_, e.id, verbs_conn_state::phase::connecting));
    std::error_code ec;
    if (!conn->take_hello(e.private_data)) {
      reactor_->report("verbs: refused a connection request without a valid fusewire hello");
      ec = make_error_code(errc::handshake_failed);
    } else {
      conn->create_qp(ec);
    }
    if (ec) {
      rdma_reject(e.id, nullptr, 0);
      conn->detach();
      return;
    }
    conn->on_established([self = ref_ptr<verbs_listener_state>(this), conn](std::error_code err) {
      if (err) return;
      if (!self->open_) {
        conn->close();
        return;
      }
      self->ready_.push_back(conn);
      self->schedule();
    });
    const auto pdata = conn->hello();
    rdma_conn_param param{};
    param.private_data = pdata.data();
    param.private_data_len = static_cast<std::uint8_t>(pdata.size());
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_accept(e.id, &param) != 0) {
      reactor_->report("verbs: rdma_accept failed: " + std::system_category().message(errno));
      conn->close();
    }
  }

 private:
  void destroy_id() noexcept {
    if (id_ != nullptr) {
      rdma_destroy_id(id_);
      id_ = nullptr;
    }
  }

  void schedule() noexcept { pump_task_.schedule(*reactor_); }

  void pump() {
    while (!pending_.empty()) {
      if (!open_) {
        handler_type h = std::move(pending_.front());
        pending_.pop_front();
        reactor_->work_finished();
        reactor_->invoke(h, make_error_code(errc::cancelled), verbs_connection());
        continue;
      }
      if (ready_.empty()) break;
      handler_type h = std::move(pending_.front());
      pending_.pop_front();
      ref_ptr<verbs_conn_state> c = std::move(ready_.front());
      ready_.pop_front();
      reactor_->work_finished();
      reactor_->invoke(h, std::error_code(), verbs_listener_state_access::make(std::move(c)));
    }
  }

  verbs_context* ctx_;
  verbs_reactor* reactor_;
  rdma_cm_id* id_;
  std::uint16_t port_;
  bool open_ = true;
  member_task<verbs_listener_state> pump_task_{*this, &verbs_listener_state::pump};  ///< pump, posted
  std::deque<handler_type> pending_;
  std::deque<ref_ptr<verbs_conn_state>> ready_;
};

}  // namespace detail

/// A listening rdmacm id on a verbs_reactor; a model of fusewire::listener.
class verbs_listener
    : public detail::basic_listener_handle<detail::verbs_listener_state, verbs_connection, detail::verbs_listener_name> {
 public:
  verbs_listener() noexcept = default;

 private:
  friend class verbs;
  explicit verbs_listener(detail::ref_ptr<detail::verbs_listener_state> s) noexcept
      : basic_listener_handle(std::move(s)) {}
};

/// The RDMA verbs transport; a model of fusewire::transport. Cheap to copy (it
/// is only its config); the device resources live in each reactor's engine.
class verbs {
 public:
  using transport_concept = transport_tag;
  using reactor_type = verbs_reactor;
  using connection_type = verbs_connection;
  using listener_type = verbs_listener;
  using config = verbs_config;

  /// The default config, with the device from TF_RDMA_DEV_NAME when set.
  verbs() {
    if (const char* dev = std::getenv("TF_RDMA_DEV_NAME"); dev != nullptr && *dev != '\0') config_.device = dev;
  }
  /// Throws std::system_error(errc::invalid_argument) naming a bad field.
  explicit verbs(config cfg) : config_(std::move(cfg)) { config_.validate(); }

  static constexpr std::string_view name() noexcept { return "verbs"; }
  const config& settings() const noexcept { return config_; }

  /// True if an RDMA device with an active port is present and rdmacm's
  /// device node can be opened; otherwise `why` says what is missing. Any
  /// thread. Safe before fork(): it initialises no librdmacm state and closes
  /// every device it opened.
  static bool available(std::string& why) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) {
      if (list != nullptr) ibv_free_device_list(list);
      why = "no RDMA device found (ibv_devices lists none; load a NIC driver, or rdma_rxe for soft-RoCE: "
            "rdma link add rxe0 type rxe netdev <if>)";
      return false;
    }
    bool active = false;
    for (int i = 0; i < n && !active; ++i) {
      if (ibv_context* ctx = ibv_open_device(list[i])) {
        active = detail::has_active_port(ctx);
        ibv_close_device(ctx);
      }
    }
    ibv_free_device_list(list);
    if (!active) {
      why = "no RDMA device has an active port";
      return false;
    }
    const int fd = ::open("/dev/infiniband/rdma_cm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      why = "cannot open /dev/infiniband/rdma_cm (" + std::system_category().message(errno) + "; load rdma_ucm)";
      return false;
    }
    ::close(fd);
    return true;
  }

  /// Connects to host:port from `reactor` (its thread only): `handler(error_code,
  /// verbs_connection)`, never inline. errc::connection_refused when nobody
  /// listens there or the address does not route over RDMA; errc::invalid_argument
  /// for a bad host.
  template <connection_handler<verbs_connection> H>
  void connect(verbs_reactor& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    detail::pending_connect<verbs_connection, verbs_reactor> op(reactor, "verbs", std::forward<H>(handler));
    detail::socket_address addr;
    if (!op.start(host, port, addr)) return;
    std::error_code ec;
    detail::verbs_context* ctx = context(reactor, ec);
    if (ctx == nullptr) return op.fail(ec);
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ctx->cm_channel(), &id, nullptr, RDMA_PS_TCP) != 0) {
      return op.fail(std::error_code(errno, std::system_category()));
    }
    detail::ref_ptr<detail::verbs_conn_state> state(
        new detail::verbs_conn_state(*ctx, id, detail::verbs_conn_state::phase::resolving_addr));
    state->on_established([op = std::move(op), state](std::error_code e) mutable {
      verbs_connection conn;
      if (!e) conn = verbs_connection(std::move(state));
      state.reset();
      op.finish(e, std::move(conn));
    });
    if (rdma_resolve_addr(id, nullptr, const_cast<sockaddr*>(addr.get()), config_.resolve_timeout_ms) != 0) {
      const int err = errno;
      state->fail_on_start(detail::cm_error(err));
    }
  }

  /// A listener on host:port (port 0: one is chosen; see port()). Throws
  /// std::system_error naming the address on failure.
  verbs_listener listen(verbs_reactor& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    std::string why;
    verbs_listener l = listen(reactor, host, port, ec, &why);
    if (ec) {
      throw std::system_error(ec, "verbs::listen(" + std::string(host) + ":" + std::to_string(port) + ")" +
                                      (why.empty() ? "" : " [" + why + "]"));
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  verbs_listener listen(verbs_reactor& reactor, std::string_view host, std::uint16_t port,
                        std::error_code& ec) const {
    return listen(reactor, host, port, ec, nullptr);
  }

  /// A buffer pool whose slabs are registered (once each) with `reactor`'s
  /// device, for zero-copy one-sided writes: its buffers may be described to
  /// peers and used as async_write_remote sources. The pool may outlive the
  /// reactor. Throws std::system_error naming the memlock limit if
  /// registration fails. Reactor thread.
  buffer_pool make_registered_pool(verbs_reactor& reactor, buffer_pool_config cfg) const {
    detail::check_reactor_thread(reactor, "verbs", "make_registered_pool");
    std::error_code ec;
    std::string why;
    detail::verbs_context* ctx = context(reactor, ec, &why);
    if (ctx == nullptr) throw std::system_error(ec, "verbs::make_registered_pool: " + why);
    const std::size_t locked = cfg.total_bytes;
    cfg.register_slab = [pd = ctx->pd_handle(), locked](void* base, std::size_t len) {
      return detail::register_memory(*pd, base, len, locked);
    };
    cfg.unregister_slab = [pd = ctx->pd_handle()](const registration& r, void*, std::size_t) {
      detail::deregister_memory(r);
    };
    return buffer_pool(std::move(cfg));
  }

  /// What a peer needs to write into registered `b` (address, remote key,
  /// size). Throws std::system_error(errc::invalid_argument) for unregistered memory.
  static remote_region describe(const tensor_buffer& b) {
    if (b.reg() == nullptr) {
      throw_error(errc::invalid_argument,
                  "verbs::describe: the buffer is not registered memory (allocate it from make_registered_pool)");
    }
    return {reinterpret_cast<std::uintptr_t>(b.data()), b.reg()->rkey, b.size()};
  }

  /// The device resources of `reactor`, created on first use with this
  /// transport's config; nullptr and `ec` if the device cannot be opened
  /// (the reason goes to the reactor's error reporter). Reactor thread.
  detail::verbs_context* context(verbs_reactor& reactor, std::error_code& ec) const {
    return context(reactor, ec, nullptr);
  }

 private:
  detail::verbs_context* context(verbs_reactor& reactor, std::error_code& ec, std::string* why) const {
    ec.clear();
    verbs_engine& engine = reactor.engine();
    if (detail::verbs_context* ctx = engine.context()) return ctx;
    try {
      engine.attach(std::make_unique<detail::verbs_context>(reactor, config_));
    } catch (const std::system_error& e) {
      ec = e.code();
      if (why != nullptr) *why = e.what();
      reactor.report(e.what());
      return nullptr;
    } catch (const std::exception& e) {
      ec = make_error_code(errc::device_error);
      if (why != nullptr) *why = e.what();
      reactor.report(e.what());
      return nullptr;
    }
    return engine.context();
  }

  verbs_listener listen(verbs_reactor& reactor, std::string_view host, std::uint16_t port, std::error_code& ec,
                        std::string* why) const {
    detail::check_reactor_thread(reactor, "verbs", "listen");
    const detail::socket_address addr = detail::resolve(host, port, ec);
    if (ec) return {};
    detail::verbs_context* ctx = context(reactor, ec, why);
    if (ctx == nullptr) return {};
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ctx->cm_channel(), &id, nullptr, RDMA_PS_TCP) != 0) {
      ec = std::error_code(errno, std::system_category());
      return {};
    }
    if (rdma_bind_addr(id, const_cast<sockaddr*>(addr.get())) != 0) {
      ec = std::error_code(errno, std::system_category());
      rdma_destroy_id(id);
      return {};
    }
    if (id->verbs != nullptr && id->verbs != ctx->device()) {
      ec = make_error_code(errc::invalid_argument);
      if (why != nullptr) {
        *why = "the address belongs to device " + std::string(ibv_get_device_name(id->verbs->device)) +
               ", not " + ctx->device_name() + " (TF_RDMA_DEV_NAME)";
      }
      rdma_destroy_id(id);
      return {};
    }
    if (rdma_listen(id, config_.backlog) != 0) {
      ec = std::error_code(errno, std::system_category());
      rdma_destroy_id(id);
      return {};
    }
    const std::uint16_t bound = ntohs(rdma_get_src_port(id));
    return verbs_listener(
        detail::ref_ptr<detail::verbs_listener_state>(new detail::verbs_listener_state(*ctx, id, bound)));
  }

  config config_;
};

static_assert(transport<verbs>);
static_assert(rdma_transport<verbs>);
static_assert(!handoff_transport<verbs>);  // a connection is a queue pair, not a socket: no fd to hand off
static_assert(!readahead_connection<verbs::connection_type>);  // a verbs stream's reads complete through its CQ

/// Calls `fn(verbs(cfg))` when `o.rdma_enabled` (TF_RDMA_ENABLED) and an RDMA
/// device is usable, else `fn(Fallback{})` (e.g. uring_tcp or asio_tcp): the
/// caller writes its code once, generic over the transport. When RDMA is
/// enabled but unusable, `on_fallback` (if given) hears why.
template <transport Fallback, class F>
  requires std::invocable<F&, verbs> && std::invocable<F&, Fallback>
decltype(auto) with_rdma_or(const options& o, F&& fn, const std::function<void(std::string_view)>& on_fallback = {}) {
  if (o.rdma_enabled) {
    std::string why;
    if (verbs::available(why)) return fn(verbs(verbs_config::from(o)));
    if (on_fallback) on_fallback("TF_RDMA_ENABLED is true but RDMA is unusable (" + why + "); using " +
                                 std::string(Fallback::name()));
  }
  return fn(Fallback{});
}

}  // namespace v0
}  // namespace fusewire
