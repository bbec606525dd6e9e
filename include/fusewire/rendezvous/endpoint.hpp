#pragma once
/// rendezvous::endpoint: TensorFlow-style keyed send/recv between the tasks of
/// a cluster, over any fusewire::transport.
///
/// One endpoint per process (its task_id, the cluster_spec, an endpoint_config). It
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
///   A chunked tensor may be up to options.max_transfer_bytes; an
///   unchunked one up to options.max_frame_bytes. All lanes of a peer run on
///   that peer's reactor (the kernel copies them in parallel).
/// - Limits (rendezvous/detail/recv_budget.hpp): tensors that arrived before
///   their recv, and chunked ones read into the endpoint's own buffer, are
///   held within options.recv_peer_budget per peer and options.recv_budget in
///   all (the reactors share it). A frame that does not fit is left unread,
///   and so is its connection (TCP backpressure), until receives take enough
///   or a recv for that very tensor is posted. A partial transfer with no
///   chunk for options.transfer_idle fails (errc::timed_out) and closes the
///   peer's connections; a tensor no recv took within
///   options.unmatched_max_age, and whatever a restarted peer's previous
///   process left, are dropped. Each is counted in stats().
/// - Reactors (endpoint_tuning::reactors: 0, the default, means options.cores
///   when set, else 1; at most one per peer, and always 1 on a transport whose
///   connections cannot move between reactors): with several, the cluster's
///   tasks are dealt over them round-robin in spec order, and each
///   reactor owns its peers' connections, pending operations, timers, pool
///   share and handlers; nothing is shared between reactors. Reactor 0
///   listens; a connection it accepts for another reactor's peer moves there
///   (its socket is released and adopted, transport handoff_transport) before
///   the last handshake message, so the peer's first frame is read by its
///   owner. An operation started on another thread, or in a handler of
///   another reactor, reaches the owner through that reactor's inbox. The
///   log sink may then be called from several reactor threads at once.
/// - Payloads are raw bytes (described on the wire as uint8[n]).
/// - Observability (docs/observability.md): an operation pending longer than
///   options.stall_report is named in the log (peer, key, bytes, age, the
///   connection, what is missing), again at doubling ages; pending() and
///   SIGUSR1 give the same on demand; counters() per peer, dumped to
///   options.stats_file; options.trace_file keeps a timeline of every operation.
/// - RDMA (an rdma_transport such as verbs): a recv posted into registered
///   memory (allocate_registered) above options.acc_size is advertised to the
///   sender, which RDMA-writes the tensor straight into it; the semantics above
///   are unchanged. See rendezvous/detail/rdma_direct.hpp.
///
/// Threads: every public member may be called from any thread (work is handed
/// to the peer's reactor through its inbox; called on that reactor's thread,
/// from a handler, an operation starts at once, with no hand-off); the
/// blocking helpers must not be called on any of the endpoint's reactor threads.

#include <signal.h>
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
#include <mutex>
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
#include <fusewire/util/log_limiter.hpp>
#include <fusewire/util/node_cache.hpp>
#include <fusewire/util/small_fifo.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/security.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/protocol/frame_channel.hpp>
#include <fusewire/protocol/handshake.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/util/timer_queue.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/rendezvous/config.hpp>
#include <fusewire/rendezvous/detail/op_awaitable.hpp>
#include <fusewire/rendezvous/detail/op_blocks.hpp>
#include <fusewire/rendezvous/detail/rdma_direct.hpp>
#include <fusewire/rendezvous/detail/report_signal.hpp>
#include <fusewire/rendezvous/detail/trace.hpp>
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

/// One process's rendezvous endpoint over transport `Transport`; see the file comment.
template <transport Transport>
class endpoint {
 public:
  using transport_type = Transport;
  using reactor_type = typename Transport::reactor_type;
  using group_type = basic_reactor_group<typename reactor_type::engine_type>;
  using connection_type = typename Transport::connection_type;
  using channel_type = protocol::frame_channel<connection_type>;
  using send_handler = fusewire::util::unique_function<void(std::error_code)>;
  using recv_handler = fusewire::util::unique_function<void(std::error_code, tensor_buffer)>;

  /// What the constructor takes besides the task and the cluster (see endpoint_config).
  using config_type = endpoint_config<Transport>;

  /// Starts the reactors and listens on `self`'s fast-path endpoint, e.g.
  /// `endpoint<uring_tcp> ep(me, spec, {.options = o, .tuning = {.stripes = 4}})`.
  /// Throws std::system_error: errc::invalid_argument if `spec` has no task
  /// `self`, errc::invalid_config for bad options or tuning, errc::not_supported
  /// for a cluster token in a build without libcrypto, or the listen error
  /// naming the address.
  endpoint(task_id self, cluster_spec spec, config_type config = {})
      : self_(std::move(self)),
        spec_(std::move(spec)),
        opts_(std::move(config.options)),
        tuning_(config.tuning),
        transport_(std::move(config.transport)) {
    opts_.validate();
    if (const std::optional<std::string> warning = check_cluster_security(opts_, spec_)) {
      write_log(config.log, "fusewire rendezvous " + self_.to_string() + ": " + *warning);
    }
    if (tuning_.stripes < 1 || tuning_.stripes > 16) {
      throw_error(errc::invalid_config, "endpoint_tuning.stripes = " + std::to_string(tuning_.stripes) +
                                            ": must be 1 to 16 connections per peer");
    }
    const net_address here = spec_.fast_path_endpoint(self_);
    if (!opts_.cluster_token.empty() && !protocol::detail::has_crypto) {
      throw_error(errc::not_supported,
                  "options.cluster_token is set but this build has no libcrypto "
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
    if constexpr (observe_enabled) cells_ = std::make_unique<peer_cells[]>(spec_.size());
    detail::install_report_signal();
    reactor_config cfg = make_reactor_config(opts_, 1);
    cfg.count = shards_;
    group_ = std::make_unique<group_type>(cfg);
    for (unsigned i = 0; i < shards_; ++i) shard_list_.push_back(std::make_unique<shard>(*this, i, config.log));
    std::error_code ec;
    // Reactor 0 listens, and an accepted connection moves to its peer's reactor
    // after the handshake: every other reactor is started before it listens, so
    // a connection handed over finds its new owner running.
    for (unsigned i = shards_; i-- > 0;) {
      auto started = group_->submit(
          i, [this, i, here]() -> std::error_code { return shard_list_[i]->start(i == 0 ? &here : nullptr); });
      if (const std::error_code e = started.get(); e && !ec) ec = e;
    }
    if (ec) {
      group_->stop();
      shard_list_.clear();
      throw std::system_error(ec,
                              "rendezvous endpoint " + self_.to_string() + ": cannot listen on " + here.to_string());
    }
    if (!opts_.stats_file.empty()) group_->submit(0, [this] { shard_list_[0]->arm_stats_dump(); }).get();
  }

  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  /// close(), then releases everything.
  ~endpoint() {
    close();
    group_->join();
    write_trace();
    shard_list_.clear();
  }

  const task_id& self() const noexcept { return self_; }

  /// Why this endpoint last lost its connections with `peer`: the first cause
  /// it saw (the error, and what led to it: "deadline exceeded (no frame for
  /// 30000 ms (keepalive))", "connection reset by peer", "did not answer
  /// keepalive pings for 20012 ms"); empty when none broke since the peer last
  /// connected. A receive from a peer whose connections broke fails with
  /// errc::connection_reset whatever the cause; this says which. Any thread.
  std::string why_lost(const task_id& peer) const {
    std::lock_guard lock(lost_mutex_);
    const auto it = lost_.find(peer.to_string());
    return it == lost_.end() ? std::string() : it->second;
  }

  /// Frame counters (see endpoint_stats).
  endpoint_stats stats() const noexcept {
    constexpr auto relaxed = std::memory_order_relaxed;
    endpoint_stats s;
    s.tensor_frames_sent = tensor_frames_.load(relaxed);
    s.fused_frames_sent = fused_frames_.load(relaxed);
    s.tensors_fused = tensors_fused_.load(relaxed);
    s.chunk_frames_sent = chunk_frames_.load(relaxed);
    s.keepalive_pings = pings_.load(relaxed);
    s.connections_made = made_.load(relaxed);
    s.connections_accepted = accepted_.load(relaxed);
    s.connections_reused = reused_.load(relaxed);
    s.recv_held_bytes = held_.load(relaxed);
    s.recv_pauses = recv_pauses_.load(relaxed);
    s.transfers_dropped_idle = transfers_dropped_idle_.load(relaxed);
    s.transfers_dropped_restart = transfers_dropped_restart_.load(relaxed);
    s.arrivals_dropped_restart = arrivals_dropped_restart_.load(relaxed);
    s.arrivals_dropped_age = arrivals_dropped_age_.load(relaxed);
    s.frames_too_large = frames_too_large_.load(relaxed);
    return s;
  }
  /// Per-peer counters (see peer_counters), one entry per other task of the
  /// cluster in spec order; any thread, no hand-off to the reactors (each
  /// counter has one writer, the peer's reactor; reads are approximate while
  /// it runs). All zero in a build with FUSEWIRE_NO_OBSERVE.
  std::vector<peer_counters> counters() const;
  /// Each reactor's busy and idle time and pool use (see reactor_usage); any thread.
  std::vector<reactor_usage> reactor_usages() const;

  /// The operations not completed yet, oldest first, with what each waits
  /// for (docs/observability.md). Any thread but the endpoint's reactors
  /// (there it returns an empty list: it asks every reactor and waits).
  std::vector<pending_operation> pending();

  /// Whether options.trace_file (FUSEWIRE_TRACE) is set: a timeline is kept.
  bool tracing() const noexcept { return observe_enabled && !opts_.trace_file.empty(); }

  /// Adds a span named `name` from `begin` to `end` to the timeline's "steps"
  /// track (a PS step, a training step), with `detail` as its argument. Any
  /// thread; nothing when not tracing().
  void trace_mark(std::string name, clock::time_point begin, clock::time_point end, std::string detail = {}) {
    if (!tracing()) return;
    std::lock_guard lock(marks_mutex_);
    marks_.add({begin, end, std::move(name), {}, std::move(detail), 0, 'm', true});
  }

  /// pending() as the readable block a stall report logs.
  std::string pending_report() { return format_report("pending operations", pending()); }

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
    if (on_reactor())
      throw_error(errc::invalid_argument, "endpoint::allocate_registered: called on the reactor thread");
    return group_->submit(0, [this, n] { return shard_list_[0]->direct_.allocate(*shard_list_[0], n); }).get();
  }
  /// For a transport with shared memory (shm, or per_host with shm near):
  /// `n` bytes of its shared pool. A send from it to a peer on this host is
  /// copied once, by the peer, straight out of the pool; elsewhere it is
  /// ordinary memory. Any thread (see shm::allocate_shared).
  tensor_buffer allocate_registered(std::size_t n)
    requires(!rdma_transport<Transport> && shared_memory_transport<Transport>)
  {
    return transport_.allocate_shared(n);
  }
  /// Counters of the direct-placement path.
  direct_stats rdma_stats() const noexcept
    requires rdma_transport<Transport>
  {
    return shard_list_[0]->direct_.stats();
  }
  // ---- end RDMA direct placement ----

  /// Sends `tensor` to task `peer` under `key`; the endpoint keeps `tensor`
  /// alive until `h(error_code)` ran. Errors: errc::invalid_argument (no such
  /// peer, key longer than the wire allows), errc::frame_too_large (above
  /// options.max_frame_bytes), connection_refused, connection_reset, timed_out, cancelled.
  template <send_completion H>
  void send(const task_id& peer, std::string key, tensor_buffer tensor, H&& h, clock::duration timeout = no_deadline) {
    auto op = new_send_op();
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
    auto op = new_send_op();
    op->sg.assign(payload.begin(), payload.end());
    start(prepare_send(resolve(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
  }

  /// Receives the tensor `peer` sends under `key`: `h(error_code, tensor_buffer)`.
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, H&& h, clock::duration timeout = no_deadline) {
    start(prepare_recv(new_recv_op(), resolve(peer), std::move(key), tensor_buffer(), false,
                       recv_handler(std::forward<H>(h)), timeout));
  }

  /// As above, landing the payload in `destination` (its size must equal the
  /// tensor's, else errc::size_mismatch). `h` gets an alias of `destination`.
  /// A non-owning destination (tensor_buffer::view) must stay valid until `h` ran.
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, tensor_buffer destination, H&& h,
            clock::duration timeout = no_deadline) {
    start(prepare_recv(new_recv_op(), resolve(peer), std::move(key), std::move(destination), true,
                       recv_handler(std::forward<H>(h)), timeout));
  }

  /// As above with a split destination: a tensor of head.size() + tail.size()
  /// bytes lands in `head` (its first bytes) and `tail` (the rest), straight
  /// from the connection where it can; `h` then gets an alias of `head`. A
  /// tensor of any other size is handed to `h` as a buffer of its own, with no
  /// error, and neither part is written. So a caller tells the two apart by
  /// the data pointer. Both parts must be non-empty (else
  /// errc::invalid_argument) and `tail` must stay valid until `h` ran. Over
  /// RDMA the tensor takes the frame path (it is not placed directly).
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, tensor_buffer head, mutable_buffer tail, H&& h,
            clock::duration timeout = no_deadline) {
    auto op = new_recv_op();
    const bool valid = !head.empty() && !tail.empty();
    op->tail = tail;
    pending_op p = prepare_recv(std::move(op), resolve(peer), std::move(key), std::move(head), true,
                                recv_handler(std::forward<H>(h)), timeout);
    if (!valid) p.error = make_error_code(errc::invalid_argument);
    start(std::move(p));
  }

  /// Blocking send; errc::invalid_argument if called on the endpoint's reactor thread.
  std::error_code send_sync(const task_id& peer, std::string key, tensor_buffer tensor,
                            clock::duration timeout = no_deadline) {
    if (on_reactor()) return make_error_code(errc::invalid_argument);
    std::promise<std::error_code> done;
    auto fut = done.get_future();
    send(
        peer, std::move(key), std::move(tensor), [&done](std::error_code ec) { done.set_value(ec); }, timeout);
    return fut.get();
  }

  /// Blocking scatter-gather send.
  std::error_code send_sync(const task_id& peer, std::string key, std::span<const const_buffer> payload,
                            clock::duration timeout = no_deadline) {
    if (on_reactor()) return make_error_code(errc::invalid_argument);
    std::promise<std::error_code> done;
    auto fut = done.get_future();
    send(
        peer, std::move(key), payload, [&done](std::error_code ec) { done.set_value(ec); }, timeout);
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
    auto start = [this, peer = std::move(peer), key = std::move(key), dst = std::move(destination), timeout](
                     auto handler) mutable { recv(peer, std::move(key), std::move(dst), std::move(handler), timeout); };
    return detail::op_awaitable<recv_result, decltype(start)>(std::move(start));
  }

 private:
  struct send_op;
  struct recv_op;
  /// A record per operation, from this thread's node cache (util/node_cache.hpp):
  /// a message's send and receive records cost no malloc.
  static std::shared_ptr<send_op> new_send_op() {
    return std::allocate_shared<send_op>(util::recycling_allocator<send_op>{});
  }
  static std::shared_ptr<recv_op> new_recv_op() {
    return std::allocate_shared<recv_op>(util::recycling_allocator<recv_op>{});
  }
  /// An operation whose peer is not in the cluster (counts nowhere).
  static constexpr std::uint32_t no_peer = 0xffffffffu;
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
    unsigned shard = 0;             ///< the reactor that owns it
    std::uint64_t hash = 0;         ///< detail::peer_hash_of(name)
    std::uint32_t index = no_peer;  ///< its position in the cluster spec
  };

 public:
  /// Sends and recvs collected on one thread and handed to the reactors in one
  /// task (see rendezvous/op_batch.hpp).
  class op_batch;

  /// Closes the listener and every connection; every pending operation
  /// completes with errc::cancelled (exactly once), later ones too. Idempotent;
  /// any thread (on the reactor thread it does not wait for the reactor to exit).
  void close() {
    if (closed_.exchange(true)) return;
    if (on_reactor()) {
      // The other reactors shut their shards down from their inboxes: a stopping
      // group keeps every reactor turning until all of them are quiescent.
      const unsigned here = reactor_type::current()->index();
      for (unsigned i = 0; i < shards_; ++i) {
        if (i != here) (void)group_->submit_to(i, [this, i] { shard_list_[i]->shutdown(); });
      }
      shard_list_[here]->shutdown();
      group_->stop();
      return;
    }
    std::vector<std::future<void>> done;
    for (unsigned i = 0; i < shards_; ++i) done.push_back(group_->submit(i, [this, i] { shard_list_[i]->shutdown(); }));
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

  // The records a shard keeps (rendezvous/detail/operations.hpp; send_op and
  // recv_op are declared above).
  struct out_peer;
  struct recv_account;
  struct held_bytes;
  class held_ref;
  struct incoming;
  struct arrival;
  struct slot;
  struct inbound;
  /// (peer, its incarnation, transfer id): one chunked transfer being received.
  using transfer_key = std::tuple<std::string, std::uint64_t, std::uint64_t>;
  /// Everything one reactor owns (rendezvous/detail/shard.hpp).
  class shard;

  bool on_reactor() const noexcept {
    reactor_type* r = reactor_type::current();
    return r != nullptr && &r->group() == group_.get();
  }

  // Counters, stall reports and counter dumps (rendezvous/detail/observe.hpp).
  /// One peer's counters; each has one writer (the peer's reactor), so a bump
  /// is a plain load and store, no locked instruction.
  struct alignas(64) peer_cells {
    std::atomic<std::uint64_t> sends{0}, bytes_sent{0}, send_errors{0}, recvs{0}, bytes_received{0}, recv_errors{0};
    std::atomic<std::uint64_t> tensor_frames{0}, fused_frames{0}, tensors_fused{0}, chunk_frames{0};
    std::atomic<std::uint64_t> connects{0}, lost{0}, sends_started{0}, recvs_started{0};
    // Rare, and written from whichever reactor meets the event: locked adds.
    std::atomic<std::uint64_t> recv_pauses{0}, dropped{0}, frames_too_large{0};
  };
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  /// The cells of the peer at `index` in spec order, or nullptr (unknown peer, or no counters built).
  peer_cells* cells(std::uint32_t index) const noexcept {
    if constexpr (!observe_enabled) return nullptr;
    return index < spec_.size() ? &cells_[index] : nullptr;
  }
  std::uint32_t index_of(const task_id& t) const noexcept;
  /// Counts a limit event (recv_pause, drop, frame too large) against the peer
  /// named `peer` ("job:index"); nothing when the name is not in the spec.
  void count_peer_event(std::string_view peer, std::atomic<std::uint64_t> peer_cells::*cell,
                        std::uint64_t n = 1) const noexcept;
  static std::string format_report(std::string_view title, std::vector<pending_operation> ops);
  void write_trace();

  // Which reactor owns a peer; handing operations to it (rendezvous/detail/dispatch.hpp).
  const peer_info& resolve(const task_id& peer) const;
  unsigned reactor_count() const noexcept;
  unsigned shard_of(const task_id& t) const;
  bool on_shard(unsigned shard) const noexcept;
  static std::uint64_t next_serial() noexcept;
  std::error_code check_send(const peer_info& peer, const std::string& key, const send_op& op) const;
  pending_op prepare_send(const peer_info& peer, std::string key, std::shared_ptr<send_op> op, send_handler h,
                          clock::duration timeout);
  pending_op prepare_recv(std::shared_ptr<recv_op> op, const peer_info& peer, std::string key, tensor_buffer dst,
                          bool has_dst, recv_handler h, clock::duration timeout);
  void run_pending(pending_op& p);
  static void cancel_pending(pending_op& p);
  void start(pending_op p);
  void start_many(std::vector<pending_op> ops);
  void start_on(unsigned shard, std::vector<pending_op> ops);
  recv_result recv_sync_impl(const task_id& peer, std::string key, tensor_buffer dst, bool has_dst,
                             clock::duration timeout);

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
  std::atomic<std::uint64_t> frames_too_large_{0};
  /// Bytes the shards hold for early arrivals and their own transfer buffers
  /// (options.recv_budget; rendezvous/detail/recv_budget.hpp). A line of its
  /// own: a fused frame's arrival reads it, the send counters above change per frame.
  alignas(64) std::atomic<std::size_t> held_{0};
  alignas(64) std::atomic<std::uint64_t> recv_pauses_{0};
  std::atomic<std::uint64_t> transfers_dropped_idle_{0}, transfers_dropped_restart_{0};
  std::atomic<std::uint64_t> arrivals_dropped_restart_{0}, arrivals_dropped_age_{0};
  unsigned shards_ = 1;                    ///< reactors in group_, one shard each
  const std::uint64_t incarnation_ = [] {  ///< random per endpoint: what its handshakes present
    std::random_device rd;
    return (std::uint64_t{rd()} << 32) ^ rd();
  }();
  std::map<std::string, unsigned, std::less<>> job_base_;  ///< a job's first task's position in spec order
  std::unique_ptr<peer_cells[]> cells_;                    ///< one per task of the spec (counters())
  std::mutex marks_mutex_;
  /// why_lost(): peer -> the first cause since it last connected. Written
  /// only when connections break or come up.
  mutable std::mutex lost_mutex_;
  std::map<std::string, std::string, std::less<>> lost_;
  void note_lost(const std::string& peer, std::string why) {
    std::lock_guard lock(lost_mutex_);
    lost_.try_emplace(peer, std::move(why));
  }
  void note_back(const std::string& peer) {
    std::lock_guard lock(lost_mutex_);
    lost_.erase(peer);
  }
  /// trace_mark()'s spans (at most 100,000).
  detail::trace_buffer marks_{observe_enabled && !opts_.trace_file.empty() ? std::size_t{100000} : std::size_t{0}};
  std::unique_ptr<group_type> group_;
  std::vector<std::unique_ptr<shard>> shard_list_;
  /// Batched operation records, reused from step to step (see detail/op_blocks.hpp).
  std::shared_ptr<typename detail::op_blocks<send_op>::cache_type> send_blocks_ =
      std::make_shared<typename detail::op_blocks<send_op>::cache_type>();
  std::shared_ptr<typename detail::op_blocks<recv_op>::cache_type> recv_blocks_ =
      std::make_shared<typename detail::op_blocks<recv_op>::cache_type>();
};

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire

// The pieces, defined out of line.
#include <fusewire/rendezvous/detail/operations.hpp>
#include <fusewire/rendezvous/detail/shard.hpp>
#include <fusewire/rendezvous/detail/dispatch.hpp>
#include <fusewire/rendezvous/op_batch.hpp>
