#pragma once
/// rendezvous::endpoint: TensorFlow-style keyed send/recv between the tasks of
/// a cluster, over any fusewire::transport.
///
/// One endpoint per process (its task_id, the cluster_spec, options). It
/// listens on its task's fast-path endpoint and connects to a peer on the
/// first send to it (reconnecting with backoff, for at most
/// options.connect_timeout). A task that has no connection to a peer but holds
/// one the peer made to it sends on that one (endpoint_tuning::reverse_lanes:
/// a PS replies on its worker's connection, so one connection serves both
/// directions and TCP's acknowledgements ride on the data); otherwise it makes
/// its own. Two tasks never race to connect: each keeps the connection it
/// started sending on until that connection breaks.
///
/// Semantics:
/// - send(peer, key, …) and recv(peer, key, …) may come in either order.
/// - A recv that posted a destination of the right size gets the payload read
///   from the socket straight into it (no intermediate copy). A tensor that
///   arrives before its recv is read into a pool block (core buffer_pool) when
///   it fits one, else a fresh buffer bounded by options.max_frame_bytes, and
///   is later handed to the recv without a copy — or copied once into the
///   destination if that recv posted one.
/// - Ordering: per (peer, key), tensors are delivered in the order they were
///   sent (FIFO), and recvs are matched in the order they were posted — also
///   across plain, fused and chunked frames and across striping lanes. No
///   order holds between different keys or different peers. A chunked tensor
///   is matched to its recv when its first chunk arrives (that chunk travels on
///   the peer's ordered connection), so a later small tensor on the same key
///   may COMPLETE before it, but always goes to the later recv.
/// - Completion: send `void(std::error_code)`, recv `void(std::error_code,
///   tensor_buffer)`, exactly once, on the reactor thread that owns the peer, never
///   inline from the initiating call (unless the endpoint was already closed:
///   then errc::cancelled, inline). A send completes once its bytes were
///   handed to the kernel. Handlers must not block.
/// - Deadlines: each operation may have a timeout; it then fails with
///   errc::timed_out. A send or recv whose bytes are already moving when its
///   deadline passes closes that connection (the stream is mid-frame; for a
///   chunked transfer: all of that peer's connections) and reports
///   errc::timed_out once the transport let go of its buffers.
/// - Failure: a peer whose connection breaks fails the receives waiting for it
///   and the sends in flight to it with errc::connection_reset; the
///   connections of one peer process (its striping lanes) live and die
///   together: one that breaks takes the others down; one the peer closed in
///   order (end of stream) ends alone once it delivered everything sent on it,
///   so a peer that sends a chunked tensor and exits does not lose its tail.
///   Until it connects again, a new receive from it fails at once
///   with the same error unless its tensor already arrived. An unreachable
///   peer fails queued sends with errc::connection_refused after
///   options.connect_timeout; a peer that restarts is reconnected to on the
///   next send (with backoff, 5 ms doubling to 500 ms); close() fails every
///   pending operation with errc::cancelled. Garbage or truncated frames close
///   that peer's connections (logged); the endpoint keeps serving the others.
///   A connection both tasks send on (reverse lanes) is both: when it breaks,
///   our sends on it and our receives from that peer fail as above, and so do
///   the peer's.
/// - Keepalive (options.keepalive = k, 0 = off): every k an idle connection we
///   send on sends a ping, which the peer answers with a pong on the same
///   connection; no pong within 2k drops that peer's connections (sends in
///   flight fail with connection_reset); a connection the peer sends on with
///   no frame for 3k is closed (receives waiting for that peer fail). A lane
///   is idle when nothing was written on it for k/2, so a live peer's frames
///   are at most about 1.5k apart. A keepalive tick that runs more than k/2
///   late (this reactor stalled: frames may sit unread) sends its pings but
///   judges no peer. Sockets also get SO_KEEPALIVE from the transport.
/// - Fusion (options.coalesce): sends of at most options.acc_size bytes to the
///   same peer are batched (up to acc_size bytes in all) and leave as one fused
///   frame at the end of the reactor tick (options.fuse_delay = 0) or at most
///   options.fuse_delay after the batch's first send; a full batch leaves at
///   once, and a larger send first flushes the batch, so the per-(peer, key)
///   FIFO above still holds. The receiver reads a fused frame's payload into
///   one buffer and hands each tensor over as an alias of its bytes.
/// - Chunking (options.chunking, options.chunk_size): a tensor above
///   chunk_size leaves as ceil(n / chunk_size) chunk frames; chunk 0 on the
///   peer's ordered connection, the rest round-robin over
///   endpoint_tuning::stripes - 1 extra connections to that peer (made on the
///   first chunked send; until they are up, chunks share the first). Chunks are
///   read straight into the posted destination when chunk 0 found a recv of
///   the right size waiting, else into one buffer for the whole tensor (handed
///   over without a copy, or copied once into a destination posted later). A
///   chunk whose head arrives before chunk 0's leaves its payload (and its
///   lane's later frames) unread until chunk 0 has been matched.
///   A chunked tensor may be up to wire::limits::max_transfer_bytes; an
///   unchunked one up to options.max_frame_bytes. All lanes of a peer run on
///   that peer's reactor (the kernel copies them in parallel).
/// - Reactors (endpoint_tuning::reactors, default 1): with several, the
///   cluster's tasks are dealt over them round-robin in spec order, and each
///   reactor owns its peers' connections, pending operations, timers, pool
///   share and handlers; nothing is shared between reactors. Reactor 0
///   listens; a connection it accepts for another reactor's peer moves there
///   (its socket is released and adopted, transport handoff_transport) before
///   the last handshake message, so the peer's first frame is read by its
///   owner. An operation started on another thread, or in a handler of
///   another reactor, reaches the owner through that reactor's inbox. The
///   log sink may then be called from several reactor threads at once.
/// - Payloads are raw bytes (described on the wire as uint8[n]).
/// - RDMA (an rdma_transport such as verbs): a recv posted into registered
///   memory (allocate_registered) above options.acc_size is advertised to the
///   sender, which RDMA-writes the tensor straight into it; the semantics above
///   are unchanged. See rendezvous/detail/rdma_direct.hpp.
///
/// Threads: every public member may be called from any thread (work is handed
/// to the peer's reactor through its inbox; called on that reactor's thread,
/// from a handler, an operation starts at once, with no hand-off); the
/// blocking helpers must not be called on any of the endpoint's reactor threads.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/util/small_fifo.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/protocol/channel.hpp>
#include <fusewire/protocol/handshake.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/util/timer_queue.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/rendezvous/detail/op_blocks.hpp>
#include <fusewire/rendezvous/detail/rdma_direct.hpp>
#include <fusewire/rendezvous/detail/segments.hpp>
#include <fusewire/rendezvous/detail/slot_table.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/wire/fused.hpp>
#include <fusewire/wire/meta.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

/// The clock deadlines are measured on.
using clock = std::chrono::steady_clock;
/// A timeout of zero: the operation waits as long as it takes.
inline constexpr clock::duration no_deadline = clock::duration::zero();

/// Completion of a send: `void(std::error_code)`.
template <class H>
concept send_completion = std::move_constructible<std::decay_t<H>> && std::invocable<std::decay_t<H>&, std::error_code>;
/// Completion of a recv: `void(std::error_code, tensor_buffer)`.
template <class H>
concept recv_completion =
    std::move_constructible<std::decay_t<H>> && std::invocable<std::decay_t<H>&, std::error_code, tensor_buffer>;

/// What the blocking and coroutine forms of recv return.
struct recv_result {
  std::error_code ec;
  tensor_buffer buffer;
};

/// Counters of one endpoint; read from any thread (approximate while it runs).
struct endpoint_stats {
  std::uint64_t tensor_frames_sent = 0;  ///< frames carrying one tensor
  std::uint64_t fused_frames_sent = 0;   ///< frames carrying several small tensors
  std::uint64_t tensors_fused = 0;       ///< tensors that left inside fused frames
  std::uint64_t chunk_frames_sent = 0;   ///< chunk frames of large tensors
  std::uint64_t keepalive_pings = 0;     ///< pings sent on idle connections
  std::uint64_t connections_made = 0;      ///< connections this endpoint made (handshake done)
  std::uint64_t connections_accepted = 0;  ///< connections peers made to it (handshake done)
  std::uint64_t connections_reused = 0;    ///< times it sent to a peer on a connection that peer made
};

/// Endpoint settings that `options` does not carry.
struct endpoint_tuning {
  /// Connections per peer that the chunks of one large tensor are striped over
  /// (1 to 16; 1 = chunks share the peer's one connection). Extra connections
  /// are made on the first chunked send to that peer.
  unsigned stripes = 2;
  /// Send to a peer on a connection that peer made to us, when we have none to
  /// it yet (a PS replies on its worker's connection): one connection per pair
  /// of tasks instead of one per direction, and TCP's acknowledgements ride on
  /// the data instead of travelling alone (about 2 us of a 10 B round trip on
  /// loopback). Used when the peer allowed it too (it offers
  /// protocol::feature_reverse in its handshake when its own tuning allows it).
  /// RDMA transports never do (their adverts need a connection per direction).
  bool reverse_lanes = true;
  /// Reactors (threads) the endpoint runs. Each owns a share of the peers (the
  /// cluster's tasks dealt round-robin in spec order): all of one peer's
  /// connections, operations, timers and completion handlers live on its
  /// reactor, and the reactors share nothing. 0 = options.cores when set
  /// (NETWORK_WORKER_CORE_NUMBER / NETWORK_PS_CORE_NUMBER), else 1. Capped by
  /// the number of peers. Transports whose connections cannot move between
  /// reactors (handoff_transport), RDMA ones among them, always run 1.
  unsigned reactors = 0;
};

/// Receives the endpoint's log lines (refused peers, bad frames); called on the reactor thread.
using log_sink = std::function<void(std::string_view)>;

namespace detail {

using fusewire::util::coarse_now;  // keepalive bookkeeping stamps every frame with it

/// A socket on its way from one reactor to another: closed unless someone took it.
class owned_fd {
 public:
  explicit owned_fd(int fd) noexcept : fd_(fd) {}
  owned_fd(owned_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  owned_fd& operator=(owned_fd&&) = delete;
  ~owned_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

/// Awaits one operation started by `Start(handler)`; resumes on the reactor thread.
template <class Result, class Start>
class op_awaitable {
 public:
  explicit op_awaitable(Start start) : start_(std::move(start)) {}
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    start_([this, h](auto&&... args) {
      result_ = Result{std::forward<decltype(args)>(args)...};
      h.resume();
    });
  }
  Result await_resume() { return std::move(result_); }

 private:
  Start start_;
  Result result_{};
};

}  // namespace detail

/// One process's rendezvous endpoint over transport `Transport`; see the file comment.
template <transport Transport>
class endpoint {
 public:
  using transport_type = Transport;
  using reactor_type = typename Transport::reactor_type;
  using group_type = basic_reactor_group<typename reactor_type::engine_type>;
  using connection_type = typename Transport::connection_type;
  using channel_type = protocol::channel<connection_type>;
  using send_handler = fusewire::util::unique_function<void(std::error_code)>;
  using recv_handler = fusewire::util::unique_function<void(std::error_code, tensor_buffer)>;

  /// Starts the reactor and listens on `self`'s fast-path endpoint. Throws
  /// std::system_error: errc::invalid_argument if `spec` has no task `self`,
  /// errc::invalid_config for bad options, errc::not_supported for a cluster
  /// token in a build without libcrypto, or the listen error naming the address.
  endpoint(task_id self, cluster_spec spec, options opts, Transport t = Transport{}, log_sink log = {},
           endpoint_tuning tuning = {})
      : self_(std::move(self)),
        spec_(std::move(spec)),
        opts_(std::move(opts)),
        tuning_(tuning),
        transport_(std::move(t)) {
    opts_.validate();
    if (tuning_.stripes < 1 || tuning_.stripes > 16) {
      throw_error(errc::invalid_config, "endpoint_tuning.stripes = " + std::to_string(tuning_.stripes) +
                                            ": must be 1 to 16 connections per peer");
    }
    const net_address here = spec_.fast_path_endpoint(self_);
    if (!opts_.cluster_token.empty() && !protocol::detail::has_crypto) {
      throw_error(errc::not_supported, "options.cluster_token is set but this build has no libcrypto "
                                       "(FUSEWIRE_HAS_CRYPTO); rebuild with OpenSSL or unset the token");
    }
    if (tuning_.reactors > 1024) {
      throw_error(errc::invalid_config, "endpoint_tuning.reactors = " + std::to_string(tuning_.reactors) +
                                            ": must be 0 (options.cores, else 1) to 1024");
    }
    shards_ = reactor_count();
    unsigned position = 0;  // the tasks in spec order: a job's task i is at its base + i
    for (const task_id& t : spec_.tasks()) {
      if (t.index == 0) job_base_.emplace(t.job, position);
      ++position;
    }
    reactor_config cfg = make_reactor_config(opts_, 1);
    cfg.count = shards_;
    group_ = std::make_unique<group_type>(cfg);
    for (unsigned i = 0; i < shards_; ++i) cores_.push_back(std::make_unique<core>(*this, i, log));
    std::error_code ec;
    // Reactor 0 listens, and an accepted connection moves to its peer's reactor
    // after the handshake: every other reactor is started before it listens, so
    // a connection handed over finds its new owner running.
    for (unsigned i = shards_; i-- > 0;) {
      auto started = group_->submit(i, [this, i, here]() -> std::error_code {
        return cores_[i]->start(i == 0 ? &here : nullptr);
      });
      if (const std::error_code e = started.get(); e && !ec) ec = e;
    }
    if (ec) {
      group_->stop();
      cores_.clear();
      throw std::system_error(ec, "rendezvous endpoint " + self_.to_string() + ": cannot listen on " + here.to_string());
    }
  }

  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  /// close(), then releases everything.
  ~endpoint() {
    close();
    group_->join();
    cores_.clear();
  }

  const task_id& self() const noexcept { return self_; }
  /// Frame counters (see endpoint_stats).
  endpoint_stats stats() const noexcept {
    return {tensor_frames_.load(std::memory_order_relaxed), fused_frames_.load(std::memory_order_relaxed),
            tensors_fused_.load(std::memory_order_relaxed), chunk_frames_.load(std::memory_order_relaxed),
            pings_.load(std::memory_order_relaxed), made_.load(std::memory_order_relaxed),
            accepted_.load(std::memory_order_relaxed), reused_.load(std::memory_order_relaxed)};
  }
  const cluster_spec& spec() const noexcept { return spec_; }
  /// Reactors (threads) it runs (endpoint_tuning::reactors).
  unsigned reactors() const noexcept { return shards_; }
  static constexpr std::string_view transport_name() noexcept { return Transport::name(); }

  // ---- RDMA direct placement (rendezvous/detail/rdma_direct.hpp) ----
  /// A buffer of `n` bytes registered with this endpoint's RDMA device (one
  /// registration per call: for tensors reused every step). A recv into it of
  /// more than options.acc_size bytes lets the sender RDMA-write the tensor
  /// straight into it; a send from it needs no staging copy. Any thread but
  /// the endpoint's reactor; throws std::system_error (registration failed:
  /// the memlock limit, or errc::invalid_argument on the reactor thread).
  tensor_buffer allocate_registered(std::size_t n)
    requires rdma_transport<Transport>
  {
    if (on_reactor()) throw_error(errc::invalid_argument, "endpoint::allocate_registered: called on the reactor thread");
    return group_->submit(0, [this, n] { return cores_[0]->direct_.allocate(*cores_[0], n); }).get();
  }
  /// Counters of the direct-placement path.
  direct_stats rdma_stats() const noexcept
    requires rdma_transport<Transport>
  {
    return cores_[0]->direct_.stats();
  }
  // ---- end RDMA direct placement ----

  /// Sends `tensor` to task `peer` under `key`; the endpoint keeps `tensor`
  /// alive until `h(error_code)` ran. Errors: errc::invalid_argument (no such
  /// peer, key longer than the wire allows), errc::frame_too_large (above
  /// options.max_frame_bytes), connection_refused, connection_reset, timed_out, cancelled.
  template <send_completion H>
  void send(const task_id& peer, std::string key, tensor_buffer tensor, H&& h, clock::duration timeout = no_deadline) {
    auto op = std::make_shared<send_op>();
    op->sg.push_back(tensor.bytes());
    op->owned = std::move(tensor);
    start(prepare_send(resolve(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
  }

  /// Sends the scatter-gather list `payload` (not gathered: each buffer goes
  /// to the kernel as is). The bytes must stay valid until `h` ran; the span
  /// itself may be a temporary. At most wire::limits::max_segments buffers.
  template <send_completion H>
  void send(const task_id& peer, std::string key, std::span<const const_buffer> payload, H&& h,
            clock::duration timeout = no_deadline) {
    auto op = std::make_shared<send_op>();
    op->sg.assign(payload.begin(), payload.end());
    start(prepare_send(resolve(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
  }

  /// Receives the tensor `peer` sends under `key`: `h(error_code, tensor_buffer)`.
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, H&& h, clock::duration timeout = no_deadline) {
    start(prepare_recv(std::make_shared<recv_op>(), resolve(peer), std::move(key), tensor_buffer(), false,
                       recv_handler(std::forward<H>(h)), timeout));
  }

  /// As above, landing the payload in `destination` (its size must equal the
  /// tensor's, else errc::size_mismatch). `h` gets an alias of `destination`.
  /// A non-owning destination (tensor_buffer::view) must stay valid until `h` ran.
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, tensor_buffer destination, H&& h,
            clock::duration timeout = no_deadline) {
    start(prepare_recv(std::make_shared<recv_op>(), resolve(peer), std::move(key), std::move(destination), true,
                       recv_handler(std::forward<H>(h)), timeout));
  }

  /// Blocking send; errc::invalid_argument if called on the endpoint's reactor thread.
  std::error_code send_sync(const task_id& peer, std::string key, tensor_buffer tensor,
                            clock::duration timeout = no_deadline) {
    if (on_reactor()) return make_error_code(errc::invalid_argument);
    std::promise<std::error_code> done;
    auto fut = done.get_future();
    send(peer, std::move(key), std::move(tensor), [&done](std::error_code ec) { done.set_value(ec); }, timeout);
    return fut.get();
  }

  /// Blocking scatter-gather send.
  std::error_code send_sync(const task_id& peer, std::string key, std::span<const const_buffer> payload,
                            clock::duration timeout = no_deadline) {
    if (on_reactor()) return make_error_code(errc::invalid_argument);
    std::promise<std::error_code> done;
    auto fut = done.get_future();
    send(peer, std::move(key), payload, [&done](std::error_code ec) { done.set_value(ec); }, timeout);
    return fut.get();
  }

  /// Blocking recv; errc::invalid_argument if called on the endpoint's reactor thread.
  recv_result recv_sync(const task_id& peer, std::string key, clock::duration timeout = no_deadline) {
    return recv_sync_impl(peer, std::move(key), tensor_buffer(), false, timeout);
  }

  /// Blocking recv into `destination`.
  recv_result recv_sync(const task_id& peer, std::string key, tensor_buffer destination,
                        clock::duration timeout = no_deadline) {
    return recv_sync_impl(peer, std::move(key), std::move(destination), true, timeout);
  }

  /// `co_await ep.async_send(...)` -> std::error_code; the coroutine resumes on the reactor thread.
  auto async_send(task_id peer, std::string key, tensor_buffer tensor, clock::duration timeout = no_deadline) {
    auto start = [this, peer = std::move(peer), key = std::move(key), tensor = std::move(tensor),
                  timeout](auto handler) mutable {
      send(peer, std::move(key), std::move(tensor), std::move(handler), timeout);
    };
    return detail::op_awaitable<std::error_code, decltype(start)>(std::move(start));
  }

  /// `co_await ep.async_recv(...)` -> recv_result; the coroutine resumes on the reactor thread.
  auto async_recv(task_id peer, std::string key, clock::duration timeout = no_deadline) {
    auto start = [this, peer = std::move(peer), key = std::move(key), timeout](auto handler) mutable {
      recv(peer, std::move(key), std::move(handler), timeout);
    };
    return detail::op_awaitable<recv_result, decltype(start)>(std::move(start));
  }

  /// co_await form of recv into `destination`.
  auto async_recv(task_id peer, std::string key, tensor_buffer destination, clock::duration timeout = no_deadline) {
    auto start = [this, peer = std::move(peer), key = std::move(key), dst = std::move(destination),
                  timeout](auto handler) mutable {
      recv(peer, std::move(key), std::move(dst), std::move(handler), timeout);
    };
    return detail::op_awaitable<recv_result, decltype(start)>(std::move(start));
  }

 private:
  struct send_op;
  struct recv_op;
  /// One operation checked off the reactor, ready to start on it.
  struct pending_op {
    std::shared_ptr<send_op> send;  ///< set for a send
    std::shared_ptr<recv_op> recv;  ///< set for a recv
    std::error_code error;          ///< completes with this on the reactor instead of starting
    clock::duration timeout{};
    unsigned shard = 0;  ///< the reactor that owns the peer
  };
  /// A peer as an operation needs it: its name and whether the cluster has it.
  struct peer_info {
    std::string name;
    bool known = false;
    unsigned shard = 0;       ///< the reactor that owns it
    std::uint64_t hash = 0;  ///< detail::peer_hash_of(name)
  };

 public:
  /// Sends and recvs collected on one thread and handed to the reactor in ONE
  /// task by submit(): a step that starts hundreds of operations pays one
  /// cross-thread hand-off instead of one per operation. Each operation behaves
  /// exactly as the same send/recv called at submit() time, in the order they
  /// were added (so per-(peer, key) FIFO holds, also against the thread's
  /// earlier direct calls); timeouts count from the moment the reactor starts
  /// them. If the endpoint is closed at submit(), every handler runs inline with
  /// errc::cancelled, in order. The destructor submits what is left. Not
  /// thread-safe: one batch per thread; it must not outlive its endpoint.
  ///
  /// Streaming (`hand_off` > 0): every `hand_off` operations added are
  /// submitted at once, so the reactor starts them (and the peer receives
  /// them) while the thread is still adding more; their handlers may then run
  /// before submit() (inline from the adding call if the endpoint is closed).
  /// Everything else above holds, per group (`rendezvous_bench --stream N`
  /// measures it).
  class batch {
   public:
    /// A batch of `ep`'s operations; `hand_off` = 0 submits only at submit(), else in groups of that many.
    explicit batch(endpoint& ep, std::size_t hand_off = 0)
        : ep_(&ep), hand_off_(hand_off), sends_(ep.send_blocks_), recvs_(ep.recv_blocks_) {}
    batch(const batch&) = delete;
    batch& operator=(const batch&) = delete;
    ~batch() { submit(); }

    /// As endpoint::send (tensor form).
    template <send_completion H>
    void send(const task_id& peer, std::string key, tensor_buffer tensor, H&& h,
              clock::duration timeout = no_deadline) {
      auto op = sends_.make();
      op->sg.push_back(tensor.bytes());
      op->owned = std::move(tensor);
      ops_.push_back(
          ep_->prepare_send(peer_of(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
      streamed();
    }

    /// As endpoint::send (scatter-gather form): the bytes must stay valid until `h` ran.
    template <send_completion H>
    void send(const task_id& peer, std::string key, std::span<const const_buffer> payload, H&& h,
              clock::duration timeout = no_deadline) {
      auto op = sends_.make();
      op->sg.assign(payload.begin(), payload.end());
      ops_.push_back(
          ep_->prepare_send(peer_of(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
      streamed();
    }

    /// As endpoint::recv.
    template <recv_completion H>
    void recv(const task_id& peer, std::string key, H&& h, clock::duration timeout = no_deadline) {
      ops_.push_back(ep_->prepare_recv(recvs_.make(), peer_of(peer), std::move(key), tensor_buffer(), false,
                                       recv_handler(std::forward<H>(h)), timeout));
      streamed();
    }

    /// As endpoint::recv into `destination`.
    template <recv_completion H>
    void recv(const task_id& peer, std::string key, tensor_buffer destination, H&& h,
              clock::duration timeout = no_deadline) {
      ops_.push_back(ep_->prepare_recv(recvs_.make(), peer_of(peer), std::move(key), std::move(destination), true,
                                       recv_handler(std::forward<H>(h)), timeout));
      streamed();
    }

    /// Operations collected since the last submit().
    std::size_t size() const noexcept { return ops_.size(); }

    /// Hands every collected operation to the reactor in one task; the batch is then empty and reusable.
    void submit() {
      if (ops_.empty()) return;
      const std::size_t n = ops_.size();
      std::vector<pending_op> ops = std::move(ops_);
      ops_.clear();
      ops_.reserve(n);  // a steady step adds as many again
      ep_->start_many(std::move(ops));
    }

   private:
    void streamed() {
      if (hand_off_ != 0 && ops_.size() >= hand_off_) submit();
    }

    /// Resolves `peer` once per run of operations to the same peer.
    const peer_info& peer_of(const task_id& peer) {
      if (!last_peer_ || peer.index != last_peer_->index || peer.job != last_peer_->job) {
        last_peer_ = peer;
        last_info_ = ep_->resolve(peer);
      }
      return last_info_;
    }

    endpoint* ep_;
    std::size_t hand_off_ = 0;
    std::vector<pending_op> ops_;
    std::optional<task_id> last_peer_;
    peer_info last_info_;
    detail::op_blocks<send_op> sends_;
    detail::op_blocks<recv_op> recvs_;
  };

  /// Closes the listener and every connection; every pending operation
  /// completes with errc::cancelled (exactly once), later ones too. Idempotent;
  /// any thread (on the reactor thread it does not wait for the reactor to exit).
  void close() {
    if (closed_.exchange(true)) return;
    if (on_reactor()) {
      // The other reactors shut their cores down from their inboxes: a stopping
      // group keeps every reactor turning until all of them are quiescent.
      const unsigned here = reactor_type::current()->index();
      for (unsigned i = 0; i < shards_; ++i) {
        if (i != here) (void)group_->submit_to(i, [this, i] { cores_[i]->shutdown(); });
      }
      cores_[here]->shutdown();
      group_->stop();
      return;
    }
    std::vector<std::future<void>> done;
    for (unsigned i = 0; i < shards_; ++i) done.push_back(group_->submit(i, [this, i] { cores_[i]->shutdown(); }));
    for (auto& d : done) {
      try {
        d.get();
      } catch (const std::system_error&) {
        // That reactor already stopped: nothing is pending on it.
      }
    }
    group_->stop();
  }

 private:
  template <class, class>
  friend class detail::rdma_direct;  // RDMA direct placement

  struct send_op {
    std::string peer;
    std::string key;
    tensor_buffer owned;
    detail::segments sg;
    send_handler h;
    timer_id timer;
    std::uint32_t pending_chunks = 0;  ///< chunk writes not completed yet
    std::error_code chunk_error;       ///< first failed chunk write
    bool in_flight = false;
    bool timed_out = false;
    bool done = false;
  };

  struct incoming;

  struct recv_op {
    recv_op() = default;
    recv_op(const recv_op&) = delete;
    recv_op& operator=(const recv_op&) = delete;
    ~recv_op() { unlink(); }

    /// Reactor thread: joins the list of started, not yet completed receives.
    void link(recv_op*& head) noexcept {
      list_head = &head;
      prev = nullptr;
      next = head;
      if (head != nullptr) head->prev = this;
      head = this;
    }
    void unlink() noexcept {
      if (list_head == nullptr) return;
      if (prev != nullptr) {
        prev->next = next;
      } else {
        *list_head = next;
      }
      if (next != nullptr) next->prev = prev;
      list_head = nullptr;
      prev = next = nullptr;
    }

    std::weak_ptr<recv_op> self;  ///< its own owner, for RDMA transports only (see core::owner_of)
    std::uint64_t slot_hash = 0;  ///< detail::slot_hash_of(peer, key), computed by the starting thread
    std::string peer;
    std::string key;
    tensor_buffer dst;
    bool has_dst = false;
    recv_handler h;
    timer_id timer;
    std::shared_ptr<channel_type> bound;  ///< the channel reading into dst, if any
    std::shared_ptr<incoming> xfer;       ///< the chunked transfer it waits for, if any
    bool timed_out = false;
    bool done = false;
    recv_op** list_head = nullptr;  ///< set while linked into core::recv_ops_
    recv_op* prev = nullptr;
    recv_op* next = nullptr;
  };

  struct out_peer {
    task_id task;
    std::shared_ptr<channel_type> ch;
    bool ready = false;
    bool connecting = false;
    std::deque<std::shared_ptr<send_op>> waiting;
    std::vector<std::shared_ptr<send_op>> batch;  ///< small sends waiting for the end of this tick
    std::size_t batch_bytes = 0;
    std::size_t batch_meta = 4;
    bool flush_posted = false;
    timer_id flush_timer;  ///< options.fuse_delay > 0: when the batch leaves at the latest
    clock::time_point first_attempt{};
    clock::duration backoff{};
    std::vector<std::shared_ptr<channel_type>> extra;  ///< striping lanes (chunks 1.. only)
    bool extra_started = false;
    std::size_t next_extra = 0;
    std::uint64_t generation = 0;  ///< bumped whenever the lanes are dropped
    clock::time_point last_write{};
  };

  /// (peer, its incarnation, transfer id): one chunked transfer being received.
  using transfer_key = std::tuple<std::string, std::uint64_t, std::uint64_t>;

  /// A chunked tensor being received: its chunks may arrive on any lane of the peer.
  struct incoming {
    transfer_key id;
    std::string key;
    std::uint64_t total = 0;
    std::uint32_t count = 0;
    std::uint32_t chunks_left = 0;
    unsigned reads = 0;    ///< chunk payload reads in progress into buf
    bool ordered = false;  ///< chunk 0 (sent on the peer's ordered lane) seen: matched to a recv
    bool failed = false;
    std::error_code error;
    tensor_buffer buf;
    std::shared_ptr<recv_op> op;
    /// Chunks whose head arrived before chunk 0: their payloads wait in their
    /// lanes' sockets until chunk 0 says where the tensor goes.
    struct parked_chunk {
      std::shared_ptr<void> lane;  ///< the channel (type-erased: incoming does not know it)
      std::uint64_t offset = 0;
      std::uint64_t len = 0;
    };
    std::vector<parked_chunk> parked;
  };

  /// A tensor that arrived before its recv, or a chunked one still arriving (`pending`).
  struct arrival {
    tensor_buffer buf;
    std::shared_ptr<incoming> pending;
  };

  struct slot {
    fusewire::util::small_fifo<arrival> arrived;
    fusewire::util::small_fifo<std::shared_ptr<recv_op>> waiting;
    bool empty() const noexcept { return arrived.empty() && waiting.empty(); }
  };

  /// A connection we read the peer's frames on: one it made to us, or one we
  /// made that it sends on too (reverse lanes).
  struct inbound {
    std::shared_ptr<channel_type> ch;
    std::string peer;  ///< empty until the handshake named it
    std::uint64_t incarnation = 0;
    clock::time_point last_frame{};
    bool reverse = false;     ///< the peer reads our frames on it (it offered protocol::feature_reverse)
    out_peer* out = nullptr;  ///< set while it is one of our send lanes to that peer too
  };

  /// Everything the reactor owns; touched only on the reactor thread.
  class core {
   public:
    core(endpoint& ep, unsigned index, log_sink log)
        : ep_(ep),
          index_(index),
          log_(std::move(log)),
          limits_(protocol::limits_for(ep.opts_.max_frame_bytes)),
          pool_(pool_config(ep.opts_, ep.shards_)) {
      identity_.self = ep.self_;
      identity_.token = ep.opts_.cluster_token;
      if (reverse_allowed()) identity_.features = protocol::feature_reverse;
      // One per process, not per core: a peer keys chunked transfers by it, and
      // their lanes may have been handshaken by different reactors.
      identity_.incarnation = ep.incarnation_;
    }

    core(const core&) = delete;
    core& operator=(const core&) = delete;
    template <class, class>
    friend class detail::rdma_direct;  // RDMA direct placement
    ~core() {
      while (recv_ops_ != nullptr) recv_ops_->unlink();
    }

    /// On its reactor; `here` = where to listen (reactor 0's core only).
    std::error_code start(const fusewire::net_address* here) {
      reactor_ = reactor_type::current();
      if (here != nullptr) {
        std::error_code ec;
        listener_ = ep_.transport_.listen(*reactor_, here->host, here->port, ec);
        if (ec) return ec;
        accept();
      }
      if (ep_.opts_.keepalive.count() != 0) arm_keepalive();
      return {};
    }

    void shutdown() {
      if (closing_) return;
      closing_ = true;
      if (reactor_ == nullptr) return;  // never started (another reactor failed to)
      listener_.close();
      if (keepalive_timer_) reactor_->cancel(keepalive_timer_);
      for (auto& [name, p] : out_) {
        if (p.ch) p.ch->close();
        for (auto& lane : p.extra) lane->close();
        if (p.flush_timer) reactor_->cancel(p.flush_timer);
        auto waiting = std::move(p.waiting);
        for (auto& op : waiting) complete(*op, make_error_code(errc::cancelled));
        auto batch = std::move(p.batch);
        for (auto& op : batch) complete(*op, make_error_code(errc::cancelled));
      }
      for (auto& [raw, in] : in_) in.ch->close();
      // Chunked transfers complete once no chunk read still writes into their buffer.
      std::vector<std::shared_ptr<incoming>> xs;
      for (auto& [k, x] : transfers_) xs.push_back(x);
      for (auto& x : xs) {
        if (!x->failed) {
          x->failed = true;
          x->error = make_error_code(errc::cancelled);
        }
        finish_transfer(x);
      }
      // Bound receives complete from their read handler (the transport still holds dst).
      std::vector<std::pair<recv_op*, std::shared_ptr<recv_op>>> ops;
      for (recv_op* op = recv_ops_; op != nullptr; op = op->next) {
        if (!op->bound && !op->xfer) ops.emplace_back(op, owner_of(*op));
      }
      for (auto& [op, keep] : ops) complete(*op, make_error_code(errc::cancelled), tensor_buffer());
      slots_.clear();
      if constexpr (rdma_transport<Transport>) direct_.clear();  // RDMA direct placement
    }

    void post_send(std::shared_ptr<send_op> op, clock::duration timeout) {
      if (closing_) return complete(*op, make_error_code(errc::cancelled));
      out_peer& p = out_peer_of(op->peer);
      if (timeout > clock::duration::zero()) {
        op->timer = reactor_->run_after(timeout, [this, op](std::error_code ec) {
          if (!ec) on_send_deadline(op);
        });
      }
      if (p.ready || (!p.connecting && adopt(p, op->peer))) return enqueue(p, std::move(op));
      p.waiting.push_back(std::move(op));
      if (!p.connecting) {
        p.connecting = true;
        p.first_attempt = clock::now();
        p.backoff = std::chrono::milliseconds(5);
        connect(p);
      }
    }

    /// The outbound state of `peer`, made on first use. A reactor's sends mostly
    /// go to the peer of its previous send: that one is found without a map
    /// lookup (out_ never drops an entry, so the pointer stays valid).
    out_peer& out_peer_of(const std::string& peer) {
      if (last_out_ != nullptr && detail::same_bytes(last_out_->first, peer)) return last_out_->second;
      auto [it, fresh] = out_.try_emplace(peer);
      if (fresh) it->second.task = task_id::parse(peer);
      last_out_ = &*it;
      return it->second;
    }

    void post_recv(std::shared_ptr<recv_op> op, clock::duration timeout) {
      if (closing_) return complete(*op, make_error_code(errc::cancelled), tensor_buffer());
      op->link(recv_ops_);
      slot& s = slot_for(op->peer, op->key, op->slot_hash);
      if (!s.arrived.empty()) {
        arrival a = std::move(s.arrived.front());
        s.arrived.pop_front();
        if (a.pending) {
          // A chunked tensor still arriving: this recv gets it when its last chunk is in.
          arm_recv_deadline(op, timeout);
          a.pending->op = op;
          op->xfer = std::move(a.pending);
          return;
        }
        hand_over(*op, std::move(a.buf));
        return;
      }
      if (!down_.empty() && down_.contains(op->peer)) {
        return complete(*op, make_error_code(errc::connection_reset), tensor_buffer());
      }
      arm_recv_deadline(op, timeout);
      if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: advertise dst
        if (s.waiting.empty()) direct_.advertise(*this, *op);
      }
      s.waiting.push_back(std::move(op));
    }

    void arm_recv_deadline(const std::shared_ptr<recv_op>& op, clock::duration timeout) {
      if (timeout > clock::duration::zero()) {
        op->timer = reactor_->run_after(timeout, [this, op](std::error_code ec) {
          if (!ec) on_recv_deadline(op);
        });
      }
    }

    void complete(send_op& op, std::error_code ec) {
      if (op.done) return;
      op.done = true;
      if (op.timer) reactor_->cancel(op.timer);
      op.owned.reset();
      send_handler h = std::move(op.h);
      if (initiating_ != 0) {
        return reactor_->post([this, h = std::move(h), ec]() mutable { reactor_->invoke(h, ec); });
      }
      reactor_->invoke(h, ec);
    }

    void complete(recv_op& op, std::error_code ec, tensor_buffer b) {
      if (op.done) return;
      op.done = true;
      if (op.timer) reactor_->cancel(op.timer);
      op.bound.reset();
      op.xfer.reset();
      op.unlink();
      op.dst.reset();
      recv_handler h = std::move(op.h);
      if (initiating_ != 0) {
        return reactor_->post(
            [this, h = std::move(h), ec, b = std::move(b)]() mutable { reactor_->invoke(h, ec, std::move(b)); });
      }
      reactor_->invoke(h, ec, std::move(b));
    }

    /// Starts operations called on the reactor thread itself, at once (no task,
    /// no tick): what completes while they start (a tensor already arrived, a
    /// peer known down, a batch flushed to a lost peer) completes from a posted
    /// task, so no handler runs inline from its initiating call and a handler
    /// that starts another operation does not recurse.
    template <class Run>
    void initiate(Run&& run) {
      struct depth {
        int& n;
        explicit depth(int& v) : n(++v) {}
        ~depth() { --n; }
      } guard(initiating_);
      run();
    }

   private:
    slot* find_slot(std::string_view peer, std::string_view key) noexcept { return slots_.find(peer, key); }

    // A started receive that is neither bound to a read nor waiting for a chunked
    // transfer is in its slot's queue (or, for RDMA, held by the direct-placement
    // state, which its `self` covers): its owner, found without a weak_ptr per op.
    std::shared_ptr<recv_op> owner_of(recv_op& op) {
      if constexpr (rdma_transport<Transport>) {
        if (auto p = op.self.lock()) return p;
      }
      if (slot* s = find_slot(op.peer, op.key)) {
        for (const std::shared_ptr<recv_op>& p : s->waiting) {
          if (p.get() == &op) return p;
        }
      }
      return nullptr;
    }

    // Invalidates references to empty slots only when it sweeps: callers hold no other slot.
    slot& slot_for(std::string_view peer, std::string_view key) { return slots_.get(peer, key); }
    /// slot_for() with `h` = detail::slot_hash_of(peer, key), computed by the caller.
    slot& slot_for(std::string_view peer, std::string_view key, std::uint64_t h) { return slots_.get(peer, key, h); }

    void log(const std::string& line) {
      const std::string text = "fusewire rendezvous " + ep_.self_.to_string() + ": " + line;
      if (log_) {
        try {
          log_(text);
        } catch (...) {
        }
      } else {
        std::fprintf(stderr, "%s\n", text.c_str());
      }
    }

    // ---- sending side -------------------------------------------------------

    void connect(out_peer& p) {
      fusewire::net_address where;
      try {
        where = ep_.spec_.fast_path_endpoint(p.task);
      } catch (const std::system_error& e) {
        p.connecting = false;
        return fail_waiting(p, e.code());
      }
      ep_.transport_.connect(*reactor_, where.host, where.port, [this, pp = &p](std::error_code ec, connection_type c) {
        if (closing_) return c.close();
        if (ec) return retry(*pp, ec);
        auto ch = std::make_shared<channel_type>(std::move(c), limits_);
        protocol::handshake_connect(ch, identity_, pp->task, [this, pp, ch](std::error_code e, protocol::peer_identity who) {
          if (closing_) return ch->close();
          if (e) {
            ch->close();
            if (e == make_error_code(errc::auth_failed) || e == make_error_code(errc::handshake_failed)) {
              log("handshake with " + pp->task.to_string() + " failed: " + e.message());
              pp->connecting = false;
              return fail_waiting(*pp, e);
            }
            return retry(*pp, e);
          }
          pp->ch = ch;
          pp->ready = true;
          pp->connecting = false;
          pp->last_write = util::coarse_now();
          ep_.made_.fetch_add(1, std::memory_order_relaxed);
          watch_lane(*pp, ch, who.incarnation);
          auto waiting = std::move(pp->waiting);
          for (auto& op : waiting) {
            if (!op->done) enqueue(*pp, op);
          }
        });
      });
    }

    void retry(out_peer& p, std::error_code ec) {
      const auto limit = ep_.opts_.connect_timeout;
      if (limit.count() != 0 && clock::now() + p.backoff - p.first_attempt > limit) {
        p.connecting = false;
        (void)ec;
        return fail_waiting(p, make_error_code(errc::connection_refused));
      }
      reactor_->run_after(p.backoff, [this, pp = &p](std::error_code e) {
        if (e || closing_) return;
        connect(*pp);
      });
      p.backoff = std::min<clock::duration>(p.backoff * 2, std::chrono::milliseconds(500));
    }

    void fail_waiting(out_peer& p, std::error_code ec) {
      auto waiting = std::move(p.waiting);
      for (auto& op : waiting) complete(*op, ec);
    }

    // The peer answers our pings with pongs. When we offered it reverse lanes,
    // any other frame means it sends on this connection too: from then on the
    // connection is read like one it made (on_frame). An error, or any other
    // frame without that offer, means it is gone.
    void watch_lane(out_peer& p, std::shared_ptr<channel_type> ch, std::uint64_t incarnation) {
      ch->read_head([this, pp = &p, ch, incarnation](std::error_code ec, protocol::frame_head head) {
        if (closing_) return;
        if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: a receiver's advert
          if (!ec && head.header.type == wire::frame_type::recv_request && ch->is_open()) {
            direct_.on_advert(*this, *pp, ch, head);
            return watch_lane(*pp, ch, incarnation);
          }
        }
        if (!ec && head.header.type == wire::frame_type::pong) {
          if (ch->is_open()) {
            unanswered_.erase(ch.get());
            return watch_lane(*pp, ch, incarnation);
          }
          return;
        }
        if (!ec && reverse_allowed() && ch->is_open() && (pp->ch == ch || std::ranges::count(pp->extra, ch) != 0)) {
          inbound& in = in_[ch.get()];
          in.ch = ch;
          in.peer = pp->task.to_string();
          in.incarnation = incarnation;
          in.last_frame = util::coarse_now();
          in.out = pp;
          down_.erase(in.peer);
          return on_frame(ch, ec, std::move(head));
        }
        drop_outbound(*pp, ch);
      });
    }

    bool reverse_allowed() const noexcept { return ep_.tuning_.reverse_lanes && !rdma_transport<Transport>; }

    // Reverse lanes: a connection `name` made to us, on which it reads our
    // frames, becomes our ordered lane to it (we keep it until it breaks).
    bool adopt(out_peer& p, const std::string& name) {
      if (!reverse_allowed()) return false;
      for (auto& [raw, in] : in_) {
        if (!in.reverse || in.out != nullptr || in.peer != name || !in.ch->is_open()) continue;
        in.out = &p;
        p.ch = in.ch;
        p.ready = true;
        p.last_write = util::coarse_now();
        ep_.reused_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      return false;
    }

    // The lanes of one peer live and die together: a chunked transfer may use any of them.
    void drop_outbound(out_peer& p, const std::shared_ptr<channel_type>& ch) {
      ch->close();
      unanswered_.erase(ch.get());
      const bool ours = p.ch == ch || std::find(p.extra.begin(), p.extra.end(), ch) != p.extra.end();
      if (!ours) return;
      if (p.ch) {
        p.ch->close();
        unanswered_.erase(p.ch.get());
      }
      for (auto& lane : p.extra) {
        lane->close();
        unanswered_.erase(lane.get());
      }
      p.ch.reset();
      p.extra.clear();
      p.extra_started = false;
      p.ready = false;
      ++p.generation;
    }

    // Striping lanes: extra connections to the peer that carry chunks 1.. of large
    // tensors. Best effort: a lane that cannot be made is not retried (chunks then
    // use the lanes there are) until the peer's lanes are dropped and remade.
    void connect_lanes(out_peer& p) {
      p.extra_started = true;
      fusewire::net_address where;
      try {
        where = ep_.spec_.fast_path_endpoint(p.task);
      } catch (const std::system_error&) {
        return;
      }
      const std::uint64_t gen = p.generation;
      for (unsigned i = 1; i < ep_.tuning_.stripes; ++i) {
        ep_.transport_.connect(*reactor_, where.host, where.port,
                               [this, pp = &p, gen](std::error_code ec, connection_type c) {
                                 if (closing_ || ec || pp->generation != gen || !pp->ready) return c.close();
                                 auto ch = std::make_shared<channel_type>(std::move(c), limits_);
                                 protocol::handshake_connect(ch, identity_, pp->task, [this, pp, ch, gen](std::error_code e, protocol::peer_identity who) {
                                   if (closing_ || e || pp->generation != gen || !pp->ready) return ch->close();
                                   pp->extra.push_back(ch);
                                   ep_.made_.fetch_add(1, std::memory_order_relaxed);
                                   watch_lane(*pp, ch, who.incarnation);
                                 });
                               });
      }
    }

    // Small sends are batched until the end of the reactor tick (or until
    // acc_size bytes), then go out as one fused frame; anything else first
    // flushes the batch, so the peer sees every send in call order.
    void enqueue(out_peer& p, std::shared_ptr<send_op> op) {
      if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: write into an advertised dst
        if (direct_.on_send(*this, p, op)) return;
      }
      const std::size_t n = total_size(op->sg.view());
      const bool small = ep_.opts_.coalesce && n <= ep_.opts_.acc_size;
      if (!small) {
        flush(p);
        if (ep_.opts_.chunking && n > ep_.opts_.chunk_size) return write_chunked(p, std::move(op));
        return write(p, std::move(op));
      }
      // 2 + key + descriptor (2 + 8) + size (8): one fused entry; the peer takes at most 64 KiB of meta.
      const std::size_t meta = 20 + op->key.size();
      if (p.batch_bytes + n > ep_.opts_.acc_size || p.batch_meta + meta > wire::limits{}.max_meta_bytes) flush(p);
      p.batch_bytes += n;
      p.batch_meta += meta;
      p.batch.push_back(std::move(op));
      if (!p.flush_posted) {
        p.flush_posted = true;
        if (ep_.opts_.fuse_delay.count() == 0) {
          reactor_->post([this, pp = &p] {
            pp->flush_posted = false;
            if (!closing_) flush(*pp);
          });
        } else {
          p.flush_timer = reactor_->run_after(ep_.opts_.fuse_delay, [this, pp = &p](std::error_code ec) {
            if (ec) return;  // cancelled: the batch already left
            pp->flush_timer = {};
            pp->flush_posted = false;
            if (!closing_) flush(*pp);
          });
        }
      }
    }

    void flush(out_peer& p) {
      if (p.flush_timer) {
        const timer_id t = p.flush_timer;
        p.flush_timer = {};
        p.flush_posted = false;
        reactor_->cancel(t);
      }
      std::vector<std::shared_ptr<send_op>> batch;
      batch.reserve(p.batch.size());
      for (auto& op : p.batch) {
        if (!op->done) batch.push_back(std::move(op));
      }
      p.batch.clear();
      p.batch_bytes = 0;
      p.batch_meta = 4;
      if (batch.empty()) return;
      if (!p.ready) {
        for (auto& op : batch) complete(*op, make_error_code(errc::connection_reset));
        return;
      }
      if (batch.size() == 1) return write(p, std::move(batch.front()));
      // Every entry is uint8[n] (the meta size of an entry does not depend on n).
      tensor_descriptor desc;
      desc.type = dtype::uint8;
      desc.rank = 1;
      std::size_t meta_bytes = 4;
      std::size_t segment_count = 0;
      for (auto& op : batch) {
        meta_bytes += wire::fused_builder::entry_size(op->key, desc);
        segment_count += op->sg.size();
      }
      auto meta_buffer = std::make_shared<std::vector<std::byte>>(meta_bytes);
      wire::limits lim;
      lim.max_meta_bytes = static_cast<std::uint32_t>(std::min<std::size_t>(meta_bytes, 0xffffffffu));
      wire::fused_builder builder(*meta_buffer, lim);
      auto sg = std::make_shared<std::vector<const_buffer>>();
      sg->reserve(segment_count);
      for (auto& op : batch) {
        desc.dims[0] = static_cast<std::int64_t>(total_size(op->sg.view()));
        if (builder.append(op->key, desc)) {
          for (auto& o : batch) complete(*o, make_error_code(errc::invalid_argument));
          return;
        }
        for (const_buffer b : op->sg) sg->push_back(b);
        op->in_flight = true;
      }
      ep_.fused_frames_.fetch_add(1, std::memory_order_relaxed);
      ep_.tensors_fused_.fetch_add(batch.size(), std::memory_order_relaxed);
      p.last_write = util::coarse_now();
      auto ch = p.ch;
      ch->write(builder.meta(), *sg,
                [this, pp = &p, ch, batch = std::move(batch), meta_buffer, sg](std::error_code ec) {
                  if (ec) drop_outbound(*pp, ch);
                  for (auto& op : batch) {
                    if (op->timed_out) {
                      complete(*op, make_error_code(errc::timed_out));
                    } else if (ec) {
                      complete(*op, make_error_code(closing_ ? errc::cancelled : errc::connection_reset));
                    } else {
                      complete(*op, {});
                    }
                  }
                });
    }

    void write(out_peer& p, std::shared_ptr<send_op> op) {
      wire::tensor_meta meta;
      meta.key = op->key;
      const auto payload = op->sg.view();  // views into *op, which the handler keeps
      const std::uint64_t n = total_size(payload);
      meta.descriptor = tensor_descriptor::make(dtype::uint8, {static_cast<std::int64_t>(n)});
      meta.segments = wire::segment_list(payload);
      op->in_flight = true;
      ep_.tensor_frames_.fetch_add(1, std::memory_order_relaxed);
      p.last_write = util::coarse_now();
      // One reference count taken for the handler (the lane), none for a local
      // copy, and the op moved in: this runs between a frame's arrival and the
      // answer's sendmsg.
      channel_type& lane = *p.ch;
      lane.write(meta, payload, [this, pp = &p, op = std::move(op), ch = p.ch](std::error_code ec) {
        if (op->timed_out) return complete(*op, make_error_code(errc::timed_out));
        if (ec) {
          drop_outbound(*pp, ch);
          return complete(*op, make_error_code(closing_ ? errc::cancelled : errc::connection_reset));
        }
        complete(*op, {});
      });
    }

    // A tensor above options.chunk_size leaves as chunk frames: chunk 0 on the
    // peer's ordered lane (so the receiver matches it to a recv in send order),
    // the others round-robin over the striping lanes. The send completes when
    // every chunk write did; any failed one drops the peer's lanes.
    void write_chunked(out_peer& p, std::shared_ptr<send_op> op) {
      const std::uint64_t n = total_size(op->sg.view());
      // Chunks of equal size (rounded up to 64 bytes, at most chunk_size): 6.3 MB
      // over two lanes goes as 2 x 3.16 MB, not 4 MiB + 2.1 MB with one lane idle
      // half the time (+1-10 % skew bandwidth measured).
      const std::uint64_t max_cs = ep_.opts_.chunk_size;
      const std::uint64_t even = (n + (n + max_cs - 1) / max_cs - 1) / ((n + max_cs - 1) / max_cs);
      const std::uint64_t cs = std::min(max_cs, (even + 63) / 64 * 64);
      const auto count = static_cast<std::uint32_t>((n + cs - 1) / cs);
      if (ep_.tuning_.stripes > 1 && !p.extra_started) connect_lanes(p);
      op->in_flight = true;
      op->pending_chunks = count;
      p.last_write = util::coarse_now();
      wire::chunk_meta meta;
      meta.transfer_id = ep_.next_id_.fetch_add(1, std::memory_order_relaxed);
      meta.total_len = n;
      meta.count = count;
      meta.key = op->key;
      meta.descriptor = tensor_descriptor::make(dtype::uint8, {static_cast<std::int64_t>(n)});
      std::size_t seg = 0, seg_off = 0;
      std::vector<const_buffer> part;
      for (std::uint32_t i = 0; i < count; ++i) {
        meta.offset = std::uint64_t{i} * cs;
        std::uint64_t need = std::min(cs, n - meta.offset);
        meta.index = i;
        part.clear();
        while (need != 0 && seg < op->sg.size()) {
          const const_buffer b = op->sg[seg];
          const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(need, b.size() - seg_off));
          if (take != 0) part.push_back(b.subspan(seg_off, take));
          seg_off += take;
          need -= take;
          if (seg_off == b.size()) {
            ++seg;
            seg_off = 0;
          }
        }
        std::shared_ptr<channel_type> lane = p.ch;
        if (i != 0 && !p.extra.empty()) lane = p.extra[p.next_extra++ % p.extra.size()];
        ep_.chunk_frames_.fetch_add(1, std::memory_order_relaxed);
        lane->write(meta, part, [this, pp = &p, op, lane](std::error_code ec) {
          if (ec) {
            if (!op->chunk_error) op->chunk_error = ec;
            drop_outbound(*pp, lane);
          }
          if (--op->pending_chunks != 0) return;
          if (op->timed_out) return complete(*op, make_error_code(errc::timed_out));
          if (op->chunk_error) return complete(*op, make_error_code(closing_ ? errc::cancelled : errc::connection_reset));
          complete(*op, {});
        });
      }
    }

    void on_send_deadline(const std::shared_ptr<send_op>& op) {
      if (op->done) return;
      op->timer = {};
      auto it = out_.find(op->peer);
      if (!op->in_flight || it == out_.end()) {
        if (it != out_.end()) {
          std::erase(it->second.waiting, op);
          std::erase(it->second.batch, op);
        }
        return complete(*op, make_error_code(errc::timed_out));
      }
      op->timed_out = true;
      if (it->second.ch) drop_outbound(it->second, it->second.ch);
    }

    // ---- receiving side -----------------------------------------------------

    void accept() {
      listener_.async_accept([this](std::error_code ec, connection_type c) {
        if (closing_) return c.close();
        if (ec) {
          if (ec == make_error_code(errc::cancelled)) return;
          log("accept failed: " + ec.message());
          return accept();
        }
        accept();
        auto ch = std::make_shared<channel_type>(std::move(c), limits_);
        in_.emplace(ch.get(), inbound{ch, {}});
        protocol::handshake_accept_deferred(
            ch, identity_, ep_.spec_,
            [this, ch](std::error_code e, protocol::peer_identity peer, std::string why, protocol::pending_ack ack) {
              if (closing_) return;
              if (e) {
                log("refused connection from " + remote(*ch) + ": " + e.message() +
                    (why.empty() ? std::string() : " (" + why + ")"));
                ch->close();
                in_.erase(ch.get());
                return;
              }
              const unsigned owner = ep_.shard_of(peer.task);
              if (owner == index_) return admit(ch, std::move(peer), std::move(ack));
              if constexpr (handoff_transport<Transport>) hand_off(ch, owner, std::move(peer), std::move(ack));
            });
      });
    }

    // The peer is verified and waits for our hello_ack; once that is written,
    // its frames are read here. It counts as connected already now, not from
    // when the ack's write completes: it sends as soon as it has the ack, and a
    // receive for it started before that completion ran must wait, not fail as
    // if the peer were still down.
    void admit(const std::shared_ptr<channel_type>& ch, protocol::peer_identity peer, protocol::pending_ack ack) {
      inbound& in = in_.try_emplace(ch.get(), inbound{ch, {}}).first->second;
      in.peer = peer.task.to_string();
      in.incarnation = peer.incarnation;
      in.last_frame = util::coarse_now();
      in.reverse = (peer.features & protocol::feature_reverse) != 0;
      down_.erase(in.peer);
      protocol::write_ack(*ch, ack, [this, ch](std::error_code e) {
        if (closing_) return;
        // Lost before its first frame: its receives fail as on any lost connection.
        if (e) return inbound_failed(ch, e, "sending hello_ack");
        ep_.accepted_.fetch_add(1, std::memory_order_relaxed);
        read_next(ch);
      });
    }

    // A connection accepted here whose peer another reactor owns: its socket
    // moves there (the peer sends nothing until it has our hello_ack, which the
    // owner sends), so every frame of that peer is read where its receives wait.
    void hand_off(const std::shared_ptr<channel_type>& ch, unsigned owner, protocol::peer_identity peer,
                  protocol::pending_ack ack)
      requires handoff_transport<Transport>
    {
      in_.erase(ch.get());
      ch->connection().async_release([this, ch, owner, peer = std::move(peer), ack = std::move(ack)](
                                         std::error_code e, int fd) mutable {
        detail::owned_fd socket(fd);
        if (closing_ || e == make_error_code(errc::cancelled)) return;
        if (e == make_error_code(errc::invalid_argument)) {
          return log("refused connection from " + peer.task.to_string() + " (" + remote(*ch) +
                     "): it sent before the handshake ended");
        }
        if (e) {
          return log("lost the connection from " + peer.task.to_string() + " (" + remote(*ch) +
                     ") while moving it to reactor " + std::to_string(owner) + ": " + e.message());
        }
        core* target = ep_.cores_[owner].get();
        // Refused (the endpoint is stopping): the task dies unrun and closes the socket.
        (void)ep_.group_->submit_to(owner, [target, socket = std::move(socket), peer = std::move(peer),
                                            ack = std::move(ack)]() mutable {
          target->take_accepted(std::move(socket), std::move(peer), std::move(ack));
        });
      });
    }

    void take_accepted(detail::owned_fd socket, protocol::peer_identity peer, protocol::pending_ack ack)
      requires handoff_transport<Transport>
    {
      if (closing_) return;
      std::error_code ec;
      connection_type c = ep_.transport_.adopt(*reactor_, socket.release(), ec);
      if (ec) return log("cannot take over the connection from " + peer.task.to_string() + ": " + ec.message());
      admit(std::make_shared<channel_type>(std::move(c), limits_), std::move(peer), std::move(ack));
    }

    static std::string remote(channel_type& ch) {
      try {
        return ch.remote_endpoint();
      } catch (...) {
        return "?";
      }
    }

    void read_next(const std::shared_ptr<channel_type>& ch) {
      // Init-captures: a copy-capture of a const& parameter would be a const
      // member, copied (an atomic increment) on every move of the continuation.
      ch->read_head([this, ch = ch](std::error_code ec, protocol::frame_head head) { on_frame(ch, ec, std::move(head)); });
    }

    void on_frame(const std::shared_ptr<channel_type>& ch, std::error_code ec, protocol::frame_head head) {
      if (closing_) return;
      if (ec) return inbound_failed(ch, ec);
      auto it = in_.find(ch.get());
      if (it == in_.end()) return;
      it->second.last_frame = util::coarse_now();
      if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: count tensors, take placed frames
        if (direct_.on_inbound_frame(*this, ch, it->second, head)) return;
      }
      const std::string peer = it->second.peer;
      if (const auto* t = std::get_if<wire::tensor_meta>(&head.body)) return on_tensor(ch, peer, *t, head.header);
      if (std::holds_alternative<wire::fused_meta>(head.body)) return on_fused(ch, peer, std::move(head));
      if (const auto* c = std::get_if<wire::chunk_meta>(&head.body)) return on_chunk(ch, it->second, *c, head.header);
      switch (head.header.type) {
        case wire::frame_type::ping: {
          wire::pong_meta pong;
          if (const auto* ping = std::get_if<wire::ping_meta>(&head.body)) pong.timestamp = ping->timestamp;
          ch->write(pong, std::span<const const_buffer>{}, [](std::error_code) {});
          return read_next(ch);
        }
        case wire::frame_type::pong:  // an answer to our ping on a lane we send on too (reverse lanes)
          unanswered_.erase(ch.get());
          return read_next(ch);
        case wire::frame_type::goodbye: return inbound_failed(ch, make_error_code(errc::connection_closed));
        default:
          return inbound_failed(ch, make_error_code(errc::not_supported),
                                std::string("unexpected ") + std::string(wire::frame_type_name(head.header.type)) +
                                    " frame");
      }
    }

    void on_tensor(const std::shared_ptr<channel_type>& ch, const std::string& peer, const wire::tensor_meta& t,
                   const wire::frame_header& h) {
      const std::size_t n = static_cast<std::size_t>(h.payload_len);
      if (slot* s = find_slot(peer, t.key)) {
        auto& waiting = s->waiting;
        while (!waiting.empty() && waiting.front()->done) waiting.pop_front();
        if (!waiting.empty() && waiting.front()->has_dst && waiting.front()->dst.size() == n) {
          // Zero copy: the payload goes from the socket into the posted destination.
          std::shared_ptr<recv_op> op = std::move(waiting.front());
          waiting.pop_front();
          const mutable_buffer dst = op->dst.bytes();
          // The destination is handed over as is (moved, not shared: complete()
          // would drop the op's reference right away): on the way from the
          // frame's arrival to the handler, reference counts cost atomics.
          if (ch->try_read_payload(dst)) {  // it arrived with the head: done in this step
            complete(*op, {}, std::move(op->dst));
            if (!closing_) read_next(ch);
            return;
          }
          op->bound = ch;
          ch->read_payload(dst, [this, ch = ch, op](std::error_code e) {
            if (e || op->timed_out) {
              complete(*op, make_error_code(op->timed_out ? errc::timed_out
                                            : closing_    ? errc::cancelled
                                                          : errc::connection_reset),
                       tensor_buffer());
              if (!closing_) inbound_failed(ch, e ? e : make_error_code(errc::timed_out));
              return;
            }
            complete(*op, {}, std::move(op->dst));
            if (!closing_) read_next(ch);
          });
          return;
        }
      }
      tensor_buffer buf;
      try {
        buf = protocol::payload_buffer(&pool_, 0, n);
      } catch (const std::bad_alloc&) {
        return inbound_failed(ch, make_error_code(errc::out_of_memory), "no memory for " + std::to_string(n) + " bytes");
      }
      const mutable_buffer dst = buf.bytes();
      if (ch->try_read_payload(dst)) {
        deliver(peer, t.key, std::move(buf));
        if (!closing_) read_next(ch);
        return;
      }
      ch->read_payload(dst, [this, ch = ch, peer = peer, key = std::string(t.key), buf = std::move(buf)](std::error_code e) mutable {
        if (closing_) return;
        if (e) return inbound_failed(ch, e);
        deliver(peer, key, std::move(buf));
        read_next(ch);
      });
    }

    // A fused frame: its payload is read into one buffer, and each entry is
    // handed over as an alias of its bytes (no copy).
    void on_fused(const std::shared_ptr<channel_type>& ch, const std::string& peer, protocol::frame_head head) {
      const std::size_t n = static_cast<std::size_t>(head.header.payload_len);
      tensor_buffer buf;
      try {
        buf = protocol::payload_buffer(&pool_, 0, n);
      } catch (const std::bad_alloc&) {
        return inbound_failed(ch, make_error_code(errc::out_of_memory), "no memory for " + std::to_string(n) + " bytes");
      }
      const mutable_buffer dst = buf.bytes();
      if (ch->try_read_payload(dst)) return deliver_fused(ch, peer, head, buf);
      ch->read_payload(dst, [this, ch = ch, peer = peer, head = std::move(head), buf = std::move(buf)](std::error_code e) mutable {
        if (closing_) return;
        if (e) return inbound_failed(ch, e);
        deliver_fused(ch, peer, head, buf);
      });
    }

    void deliver_fused(const std::shared_ptr<channel_type>& ch, const std::string& peer, const protocol::frame_head& head,
                       const tensor_buffer& buf) {
      const std::uint64_t peer_hash = detail::peer_hash_of(peer);
      for (const wire::fused_entry& entry : std::get<wire::fused_meta>(head.body)) {
        deliver(peer, entry.key, buf.share(static_cast<std::size_t>(entry.offset), static_cast<std::size_t>(entry.size)),
                detail::slot_hash_of(peer_hash, entry.key));
      }
      if (!closing_) read_next(ch);
    }

    // A chunk of a large tensor: its payload is read straight into the
    // transfer's buffer (the posted destination when chunk 0 found a recv of the
    // right size waiting, else one buffer for the whole tensor). A chunk whose
    // head comes before chunk 0's parks its lane until chunk 0 has been matched.
    void on_chunk(const std::shared_ptr<channel_type>& ch, const inbound& in, const wire::chunk_meta& c,
                  const wire::frame_header& h) {
      transfer_key k{in.peer, in.incarnation, c.transfer_id};
      auto it = transfers_.find(k);
      std::shared_ptr<incoming> x;
      if (it == transfers_.end()) {
        x = std::make_shared<incoming>();
        x->id = k;
        x->key = std::string(c.key);
        x->total = c.total_len;
        x->count = c.count;
        x->chunks_left = c.count;
        transfers_.emplace(std::move(k), x);
      } else {
        x = it->second;
        if (x->key != c.key || x->total != c.total_len || x->count != c.count || x->failed) {
          return inbound_failed(ch, make_error_code(errc::malformed_frame), "chunk does not match its transfer");
        }
      }
      if (!x->ordered) {
        if (c.index != 0) {
          // Chunk 0 (on the ordered lane) decides which recv, and so which
          // destination, this tensor goes to: until it comes, this lane waits
          // with the payload unread (not staged in a buffer of its own and
          // copied later).
          x->parked.push_back({ch, c.offset, h.payload_len});
          return;
        }
        bind_transfer(x);
      }
      read_chunk(ch, x, c.offset, h.payload_len);
      for (auto& pc : std::exchange(x->parked, {})) {  // empty unless chunk 0 was just bound
        read_chunk(std::static_pointer_cast<channel_type>(pc.lane), x, pc.offset, pc.len);
      }
    }

    // Reads one chunk's payload into the transfer's buffer (the recv's
    // destination when it has one of the right size), then the lane's next frame.
    void read_chunk(const std::shared_ptr<channel_type>& ch, const std::shared_ptr<incoming>& x, std::uint64_t offset,
                    std::uint64_t len) {
      if (x->failed || !ch->is_open()) return;
      if (x->buf.empty() && x->total != 0) {
        try {
          x->buf = tensor_buffer::allocate(static_cast<std::size_t>(x->total));
        } catch (const std::bad_alloc&) {
          return inbound_failed(ch, make_error_code(errc::out_of_memory),
                                "no memory for " + std::to_string(x->total) + " bytes");
        }
      }
      const mutable_buffer dst = x->buf.bytes().subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(len));
      ++x->reads;
      ch->read_payload(dst, [this, ch = ch, x = x](std::error_code e) {
        --x->reads;
        if (e && !x->failed) {
          x->failed = true;
          x->error = make_error_code(closing_ ? errc::cancelled : errc::connection_reset);
        }
        if (!e) --x->chunks_left;
        finish_transfer(x);
        if (closing_) return;
        if (e) return inbound_failed(ch, e);
        read_next(ch);
      });
    }

    // Chunk 0 travels on the sender's ordered lane: matching it to a recv here
    // keeps per-(peer, key) FIFO with the peer's other frames.
    void bind_transfer(const std::shared_ptr<incoming>& x) {
      x->ordered = true;
      slot& s = slot_for(std::get<0>(x->id), x->key);
      while (!s.waiting.empty() && s.waiting.front()->done) s.waiting.pop_front();
      if (!s.waiting.empty()) {
        std::shared_ptr<recv_op> op = std::move(s.waiting.front());
        s.waiting.pop_front();
        if (x->buf.empty() && op->has_dst && op->dst.size() == x->total) x->buf = op->dst.share();
        op->xfer = x;
        x->op = std::move(op);
      } else {
        s.arrived.push_back(arrival{tensor_buffer(), x});
      }
    }

    // Completes a transfer once its last chunk is in (or it failed) and no chunk
    // read still writes into its buffer.
    void finish_transfer(const std::shared_ptr<incoming>& x) {
      if (x->reads != 0) return;
      if (!x->failed && (x->chunks_left != 0 || !x->ordered)) return;
      auto it = transfers_.find(x->id);
      if (it == transfers_.end() || it->second != x) return;  // already finished
      transfers_.erase(it);
      std::shared_ptr<recv_op> op = std::move(x->op);
      if (op) op->xfer.reset();
      if (x->failed) {
        if (op) return complete(*op, op->timed_out ? make_error_code(errc::timed_out) : x->error, tensor_buffer());
        drop_arrival(x);
        return;
      }
      tensor_buffer buf = std::move(x->buf);
      if (op) {
        if (op->has_dst && op->dst.size() == buf.size() && op->dst.data() == buf.data()) {
          tensor_buffer out = op->dst.share();
          return complete(*op, {}, std::move(out));
        }
        return hand_over(*op, std::move(buf));
      }
      slot* s = find_slot(std::get<0>(x->id), x->key);
      if (s == nullptr) return;
      for (arrival& a : s->arrived) {
        if (a.pending == x) {
          a.pending.reset();
          a.buf = std::move(buf);
          return;
        }
      }
    }

    void drop_arrival(const std::shared_ptr<incoming>& x) {
      slot* s = find_slot(std::get<0>(x->id), x->key);
      if (s == nullptr) return;
      s->arrived.erase_if([&](const arrival& a) { return a.pending == x; });
    }

    void fail_transfers(const std::string& peer, std::uint64_t incarnation, std::error_code ec) {
      std::vector<std::shared_ptr<incoming>> xs;
      for (auto& [k, x] : transfers_) {
        if (std::get<0>(k) == peer && std::get<1>(k) == incarnation) xs.push_back(x);
      }
      for (auto& x : xs) {
        if (!x->failed) {
          x->failed = true;
          x->error = ec;
        }
        finish_transfer(x);
      }
    }

    void deliver(std::string_view peer, std::string_view key, tensor_buffer b) {
      deliver(peer, key, std::move(b), detail::slot_hash_of(peer, key));
    }

    /// deliver() with `h` = detail::slot_hash_of(peer, key).
    void deliver(std::string_view peer, std::string_view key, tensor_buffer b, std::uint64_t h) {
      if constexpr (rdma_transport<Transport>) direct_.on_delivered(peer, key);  // RDMA direct placement
      slot& s = slot_for(peer, key, h);
      while (!s.waiting.empty()) {
        std::shared_ptr<recv_op> op = std::move(s.waiting.front());
        s.waiting.pop_front();
        if (op->done) continue;
        hand_over(*op, std::move(b));
        return;
      }
      s.arrived.push_back(arrival{std::move(b), nullptr});
    }

    void hand_over(recv_op& op, tensor_buffer b) {
      if (!op.has_dst) return complete(op, {}, std::move(b));
      if (op.dst.size() != b.size()) return complete(op, make_error_code(errc::size_mismatch), tensor_buffer());
      if (b.size() != 0) std::memcpy(op.dst.data(), b.data(), b.size());
      tensor_buffer out = op.dst.share();
      complete(op, {}, std::move(out));
    }

    void on_recv_deadline(const std::shared_ptr<recv_op>& op) {
      if (op->done) return;
      op->timer = {};
      if (op->bound) {
        op->timed_out = true;
        op->bound->close();
        return;
      }
      if (op->xfer) {
        // Chunks may still be arriving on any lane: close the peer's lanes, then
        // complete once no read writes into the destination any more.
        op->timed_out = true;
        std::shared_ptr<incoming> x = op->xfer;
        if (!x->failed) {
          x->failed = true;
          x->error = make_error_code(errc::timed_out);
        }
        for (auto& [raw, in] : in_) {
          if (in.peer == std::get<0>(x->id) && in.incarnation == std::get<1>(x->id)) {
            std::shared_ptr<channel_type> lane = in.ch;
            inbound_failed(lane, make_error_code(errc::timed_out), "a receive deadline passed mid-transfer");
            break;
          }
        }
        finish_transfer(x);
        return;
      }
      if (slot* s = find_slot(op->peer, op->key)) s->waiting.erase(op);
      if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: held until the advert is answered
        if (direct_.hold_timed_out(op)) return;
      }
      complete(*op, make_error_code(errc::timed_out), tensor_buffer());
    }

    void inbound_failed(const std::shared_ptr<channel_type>& ch, std::error_code ec, std::string why = {}) {
      auto it = in_.find(ch.get());
      if (it == in_.end()) return;
      const std::string peer = it->second.peer;
      const std::uint64_t incarnation = it->second.incarnation;
      out_peer* const out = it->second.out;
      in_.erase(it);
      ch->close();
      // A lane we send on too (reverse lanes) takes our lanes to that peer down with it.
      if (out != nullptr) drop_outbound(*out, ch);
      const bool orderly = ec == make_error_code(errc::connection_closed);
      if (!orderly) {
        log("closing connection from " + (peer.empty() ? std::string("?") : peer) + " (" + remote(*ch) +
            "): " + ec.message() + (why.empty() ? std::string() : " (" + why + ")"));
      }
      if (peer.empty()) return;
      const auto same_process = [&](const auto& in) { return in.peer == peer && in.incarnation == incarnation; };
      if (orderly) {
        // An end of stream comes after every byte sent on that lane; the peer's other lanes may still
        // hold chunks of a transfer (a peer that exits closes them one by one): each ends on its own.
        for (const auto& other : in_) {
          if (same_process(other.second)) return;
        }
      } else {
        // The lanes of one peer process live and die together: a chunked transfer may use any of them.
        std::vector<std::pair<out_peer*, std::shared_ptr<channel_type>>> outs;
        for (auto i = in_.begin(); i != in_.end();) {
          if (same_process(i->second)) {
            i->second.ch->close();
            if (i->second.out != nullptr) outs.emplace_back(i->second.out, i->second.ch);
            i = in_.erase(i);
          } else {
            ++i;
          }
        }
        for (auto& [o, lane] : outs) drop_outbound(*o, lane);
      }
      fail_transfers(peer, incarnation, make_error_code(errc::connection_reset));
      if constexpr (rdma_transport<Transport>) direct_.on_peer_lost(*this, peer);  // RDMA direct placement
      // Receives waiting for that peer would wait for nothing.
      for (const auto& other : in_) {
        if (other.second.peer == peer) return;  // another connection from it is still up
      }
      // Until it connects again, new receives from it (with nothing already arrived) fail at once.
      down_.insert(peer);
      std::vector<std::pair<recv_op*, std::shared_ptr<recv_op>>> failed;
      for (recv_op* op = recv_ops_; op != nullptr; op = op->next) {
        if (op->peer == peer && !op->bound && !op->xfer) failed.emplace_back(op, owner_of(*op));
      }
      for (auto& [op, keep] : failed) {
        if (keep) {
          if (slot* s = find_slot(op->peer, op->key)) s->waiting.erase(keep);
        }
        complete(*op, make_error_code(errc::connection_reset), tensor_buffer());
      }
    }

    // Keepalive (options.keepalive = k): every k, an idle outbound lane gets a
    // ping; a lane whose ping is unanswered after 2k is dropped (its sends fail),
    // and an inbound connection with no frame for 3k is closed (its receives
    // fail); see keepalive_tick for when silence is judged.
    void arm_keepalive() {
      keepalive_due_ = clock::now() + ep_.opts_.keepalive;
      keepalive_timer_ = reactor_->run_at(keepalive_due_, [this](std::error_code ec) {
        keepalive_timer_ = {};
        if (ec || closing_) return;
        keepalive_tick();
        arm_keepalive();
      });
    }

    void keepalive_tick() {
      const auto k = ep_.opts_.keepalive;
      const auto now = util::coarse_now();
      for (auto& [name, p] : out_) {
        if (!p.ready || !p.ch) continue;
        auto ping_if_idle = [&](const std::shared_ptr<channel_type>& lane) {
          // Idle since about the last tick (half a period: the coarse stamps
          // and the timer jitter must not stretch a gap to 2k).
          if (unanswered_.contains(lane.get()) || now - p.last_write < k / 2) return;
          wire::ping_meta ping;
          ping.timestamp = static_cast<std::uint64_t>(now.time_since_epoch().count());
          unanswered_.emplace(lane.get(), now);
          ep_.pings_.fetch_add(1, std::memory_order_relaxed);
          lane->write(ping, std::span<const const_buffer>{}, [](std::error_code) {});
        };
        ping_if_idle(p.ch);
        for (auto& lane : p.extra) ping_if_idle(lane);
      }
      // Silence is judged after the reactor has polled its sockets once more
      // (a posted task runs after this tick's I/O), and not at all when this
      // tick is more than k/2 late: then this reactor itself stalled and the
      // peers' frames may still be waiting unread.
      if (clock::now() - keepalive_due_ < k / 2) {
        reactor_->post([this] {
          if (!closing_) judge_silence();
        });
      }
    }

    void judge_silence() {
      const auto k = ep_.opts_.keepalive;
      const auto now = util::coarse_now();
      for (auto& [name, p] : out_) {
        if (!p.ready || !p.ch) continue;
        std::vector<std::shared_ptr<channel_type>> lanes{p.ch};
        lanes.insert(lanes.end(), p.extra.begin(), p.extra.end());
        for (auto& lane : lanes) {
          auto u = unanswered_.find(lane.get());
          if (u == unanswered_.end() || now - u->second < 2 * k) continue;
          log("peer " + name + " did not answer keepalive pings for " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - u->second).count()) +
              " ms; dropping its connections");
          drop_outbound(p, lane);  // the peer's lanes live and die together
          break;
        }
      }
      std::vector<std::shared_ptr<channel_type>> silent;
      for (auto& [raw, in] : in_) {
        if (!in.peer.empty() && now - in.last_frame >= 3 * k) silent.push_back(in.ch);
      }
      for (auto& ch : silent) {
        inbound_failed(ch, make_error_code(errc::timed_out),
                       "no frame for " + std::to_string(3 * k.count()) + " ms (keepalive)");
      }
    }

    // This core's share of options.pool_size (one pool per reactor, nothing shared).
    static buffer_pool_config pool_config(const options& o, unsigned shards) {
      buffer_pool_config c = buffer_pool_config::from(o, 1);
      c.total_bytes = std::max(c.block_size, o.pool_size / shards / c.block_size * c.block_size);
      return c;
    }

    endpoint& ep_;
    unsigned index_;  ///< its reactor's index in the group
    log_sink log_;
    wire::limits limits_;
    buffer_pool pool_;
    protocol::local_identity identity_;
    reactor_type* reactor_ = nullptr;
    typename Transport::listener_type listener_;
    bool closing_ = false;
    int initiating_ = 0;  ///< > 0 while initiate() runs: completions are posted
    std::map<std::string, out_peer> out_;
    std::pair<const std::string, out_peer>* last_out_ = nullptr;  ///< see out_peer_of()
    std::map<channel_type*, inbound> in_;
    /// Empty slots stay (a steady step reuses them) until the table doubles: then they are swept.
    detail::slot_table<slot> slots_;
    recv_op* recv_ops_ = nullptr;  ///< started receives not completed yet (intrusive list; no allocation)
    std::set<std::string> down_;  ///< peers whose connections all broke
    std::map<transfer_key, std::shared_ptr<incoming>> transfers_;
    std::map<channel_type*, clock::time_point> unanswered_;  ///< outbound lanes with a ping in flight, since when
    timer_id keepalive_timer_;
    clock::time_point keepalive_due_{};  ///< when the armed keepalive tick should run

   public:
    /// RDMA direct placement (nothing for other transports).
    [[no_unique_address]] typename detail::direct_state_for<Transport, recv_op>::type direct_;
  };

  bool on_reactor() const noexcept {
    reactor_type* r = reactor_type::current();
    return r != nullptr && &r->group() == group_.get();
  }

  /// A peer's name and whether the cluster has it. A thread's calls mostly name
  /// the peer of its previous call (a worker's PS, a PS's worker): the last
  /// answer is kept per thread, keyed by this endpoint's serial number.
  peer_info resolve(const task_id& peer) const {
    struct last_answer {
      std::uint64_t endpoint = 0;
      std::uint32_t index = 0;
      std::string job;
      peer_info info;
    };
    thread_local last_answer last;
    if (last.endpoint == serial_ && last.index == peer.index && last.job == peer.job) return last.info;
    peer_info info{peer.to_string(), spec_.contains(peer), 0, 0};
    if (info.known) info.shard = shard_of(peer);
    info.hash = detail::peer_hash_of(info.name);
    last.endpoint = 0;  // until the whole answer is stored
    last.index = peer.index;
    last.job = peer.job;
    last.info = info;
    last.endpoint = serial_;
    return info;
  }

  /// How many reactors to run (see endpoint_tuning::reactors).
  unsigned reactor_count() const noexcept {
    if constexpr (!handoff_transport<Transport> || rdma_transport<Transport>) {
      return 1;
    } else {
      const unsigned asked = tuning_.reactors != 0 ? tuning_.reactors : std::max(1u, opts_.cores);
      const std::size_t peers = spec_.size() > 1 ? spec_.size() - 1 : 1;
      return static_cast<unsigned>(std::min<std::size_t>(asked, peers));
    }
  }

  /// The reactor that owns task `t` (one of the cluster's): the tasks dealt
  /// round-robin in spec order, so a PS's workers (or a worker's PSs) spread
  /// evenly. Both ends of a connection compute it for their own side only.
  unsigned shard_of(const task_id& t) const {
    if (shards_ == 1) return 0;
    auto it = job_base_.find(t.job);
    const unsigned base = it != job_base_.end() ? it->second : 0;
    return (base + t.index) % shards_;
  }

  /// True on the reactor that owns shard `shard`.
  bool on_shard(unsigned shard) const noexcept {
    reactor_type* r = reactor_type::current();
    return r != nullptr && &r->group() == group_.get() && r->index() == shard;
  }

  static std::uint64_t next_serial() noexcept {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  std::error_code check_send(const peer_info& peer, const std::string& key, const send_op& op) const {
    if (!peer.known || key.size() > wire::limits{}.max_key_bytes) return make_error_code(errc::invalid_argument);
    if (op.sg.size() > wire::limits{}.max_segments) return make_error_code(errc::invalid_argument);
    const std::uint64_t n = total_size(op.sg.view());
    const bool chunked = opts_.chunking && n > opts_.chunk_size;
    if (n > (chunked ? wire::limits{}.max_transfer_bytes : opts_.max_frame_bytes)) {
      return make_error_code(errc::frame_too_large);
    }
    return {};
  }

  pending_op prepare_send(const peer_info& peer, std::string key, std::shared_ptr<send_op> op, send_handler h,
                          clock::duration timeout) {
    op->peer = peer.name;
    op->h = std::move(h);
    pending_op p;
    p.error = check_send(peer, key, *op);
    if (!p.error) op->key = std::move(key);
    p.send = std::move(op);
    p.timeout = timeout;
    p.shard = peer.shard;
    return p;
  }

  pending_op prepare_recv(std::shared_ptr<recv_op> op, const peer_info& peer, std::string key, tensor_buffer dst,
                          bool has_dst, recv_handler h, clock::duration timeout) {
    if constexpr (rdma_transport<Transport>) op->self = op;  // RDMA direct placement
    op->peer = peer.name;
    op->key = std::move(key);
    op->slot_hash = detail::slot_hash_of(peer.hash, op->key);
    op->dst = std::move(dst);
    op->has_dst = has_dst;
    op->h = std::move(h);
    pending_op p;
    if (!peer.known || op->key.size() > wire::limits{}.max_key_bytes) {
      p.error = make_error_code(errc::invalid_argument);
    }
    p.recv = std::move(op);
    p.timeout = timeout;
    p.shard = peer.shard;
    return p;
  }

  /// Reactor thread.
  void run_pending(pending_op& p) {
    core& c = *cores_[p.shard];
    if (p.send) {
      if (p.error) return c.complete(*p.send, p.error);
      return c.post_send(std::move(p.send), p.timeout);
    }
    if (p.error) return c.complete(*p.recv, p.error, tensor_buffer());
    c.post_recv(std::move(p.recv), p.timeout);
  }

  /// The endpoint is closed: the handler runs inline with errc::cancelled.
  static void cancel_pending(pending_op& p) {
    if (p.send) return (void)p.send->h(make_error_code(errc::cancelled));
    p.recv->h(make_error_code(errc::cancelled), tensor_buffer());
  }

  void start(pending_op p) {
    if (closed_.load()) return cancel_pending(p);
    if constexpr (!rdma_transport<Transport>) {  // RDMA direct placement keeps every start posted
      if (on_shard(p.shard)) return cores_[p.shard]->initiate([&] { run_pending(p); });
    }
    pending_op keep{p.send, p.recv, {}, {}, 0};
    const unsigned shard = p.shard;
    if (group_->submit_to(shard, [this, p = std::move(p)]() mutable { run_pending(p); })) cancel_pending(keep);
  }

  /// Hands `ops` to their peers' reactors: one task per reactor, each in the order added.
  void start_many(std::vector<pending_op> ops) {
    if (ops.empty()) return;
    const unsigned first = ops.front().shard;
    if (std::ranges::all_of(ops, [first](const pending_op& p) { return p.shard == first; })) {
      return start_on(first, std::move(ops));
    }
    std::vector<std::vector<pending_op>> by_shard(shards_);
    for (pending_op& p : ops) by_shard[p.shard].push_back(std::move(p));
    for (unsigned i = 0; i < shards_; ++i) {
      if (!by_shard[i].empty()) start_on(i, std::move(by_shard[i]));
    }
  }

  void start_on(unsigned shard, std::vector<pending_op> ops) {
    if constexpr (!rdma_transport<Transport>) {
      if (!closed_.load() && on_shard(shard)) {
        return cores_[shard]->initiate([&] {
          for (pending_op& p : ops) run_pending(p);
        });
      }
    }
    if (!closed_.load()) {
      auto shared = std::make_shared<std::vector<pending_op>>(std::move(ops));
      if (!group_->submit_to(shard, [this, shared] {
            for (pending_op& p : *shared) run_pending(p);
          })) {
        return;
      }
      ops = std::move(*shared);
    }
    for (pending_op& p : ops) cancel_pending(p);
  }

  recv_result recv_sync_impl(const task_id& peer, std::string key, tensor_buffer dst, bool has_dst,
                             clock::duration timeout) {
    if (on_reactor()) return {make_error_code(errc::invalid_argument), {}};
    std::promise<recv_result> done;
    auto fut = done.get_future();
    start(prepare_recv(std::make_shared<recv_op>(), resolve(peer), std::move(key), std::move(dst), has_dst,
                       [&done](std::error_code ec, tensor_buffer b) { done.set_value(recv_result{ec, std::move(b)}); },
                       timeout));
    return fut.get();
  }

  const std::uint64_t serial_ = next_serial();  ///< never 0, never reused in this process
  task_id self_;
  cluster_spec spec_;
  options opts_;
  endpoint_tuning tuning_;
  Transport transport_;
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> next_id_{1};
  std::atomic<std::uint64_t> tensor_frames_{0}, fused_frames_{0}, tensors_fused_{0}, chunk_frames_{0}, pings_{0};
  std::atomic<std::uint64_t> made_{0}, accepted_{0}, reused_{0};
  unsigned shards_ = 1;  ///< reactors in group_, one core each
  const std::uint64_t incarnation_ = [] {  ///< random per endpoint: what its handshakes present
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
  }();
  std::map<std::string, unsigned, std::less<>> job_base_;  ///< a job's first task's position in spec order
  std::unique_ptr<group_type> group_;
  std::vector<std::unique_ptr<core>> cores_;
  /// Batched operation records, reused from step to step (see detail/op_blocks.hpp).
  std::shared_ptr<typename detail::op_blocks<send_op>::cache_type> send_blocks_ =
      std::make_shared<typename detail::op_blocks<send_op>::cache_type>();
  std::shared_ptr<typename detail::op_blocks<recv_op>::cache_type> recv_blocks_ =
      std::make_shared<typename detail::op_blocks<recv_op>::cache_type>();
};

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
