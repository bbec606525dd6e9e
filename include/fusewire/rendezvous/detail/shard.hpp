#pragma once
/// endpoint::shard: one reactor's share of a rendezvous endpoint (its peers'
/// connections, operations, timers).

#include <fusewire/rendezvous/detail/owned_fd.hpp>
#include <fusewire/rendezvous/endpoint.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

// Its member functions are defined out of line, one file per path (included
// at the end); each is declared `inline`, as an in-class definition is.

/// Everything one reactor owns; touched only on that reactor's thread.
template <transport Transport>
class endpoint<Transport>::shard {
 public:
  shard(endpoint& ep, unsigned index, log_sink log)
      : ep_(ep),
        index_(index),
        log_(std::move(log)),
        limits_(protocol::limits_for(ep.opts_.max_frame_bytes, ep.opts_.max_transfer_bytes)),
        pool_(pool_config(ep.opts_, ep.shards_)),
        tracing_(observe_enabled && !ep.opts_.trace_file.empty()),
        trace_(tracing_ ? std::max<std::size_t>(1, ep.opts_.trace_events / ep.shards_) : 0) {
    identity_.self = ep.self_;
    identity_.token = ep.opts_.cluster_token;
    if (reverse_allowed()) identity_.features = protocol::feature_reverse;
    // One per process, not per shard: a peer keys chunked transfers by it, and
    // their lanes may have been handshaken by different reactors.
    identity_.incarnation = ep.incarnation_;
  }

  shard(const shard&) = delete;
  shard& operator=(const shard&) = delete;
  template <class, class>
  friend class detail::rdma_direct;  // RDMA direct placement
  friend class endpoint::held_ref;   // releases its bytes
  ~shard() {
    closing_ = true;
    while (recv_ops_ != nullptr) recv_ops_->unlink();
    while (send_ops_ != nullptr) send_ops_->unlink();
    slots_.clear();
    // A charge still held (by a read's handler that never ran, say) may
    // outlive this shard: it then releases nothing.
    for (held_bytes* p = std::exchange(charges_, nullptr); p != nullptr; p = std::exchange(p->next, nullptr)) {
      p->owner = nullptr;
      p->prev = nullptr;
    }
  }

  /// On its reactor; `here` = where to listen (reactor 0's shard only).
  std::error_code start(const fusewire::net_address* here) {
    reactor_ = reactor_type::current();
    if (here != nullptr) {
      std::error_code ec;
      listener_ = ep_.transport_.listen(*reactor_, here->host, here->port, ec);
      if (ec) return ec;
      accept();
    }
    if (ep_.opts_.keepalive.count() != 0) arm_keepalive();
    if (index_ == 0) {
      // Reactor 0 runs the stall checks of every reactor and logs one block:
      // with FUSEWIRE_STALL_MS = 0 it still answers snapshot requests (SIGUSR1).
      seen_requests_ = detail::report_requests().load(std::memory_order_relaxed);  // only requests from now on
      arm_stall();
    }
    return {};
  }

  void shutdown() {
    if (closing_) return;
    closing_ = true;
    if (reactor_ == nullptr) return;  // never started (another reactor failed to)
    listener_.close();
    if (keepalive_timer_) reactor_->cancel(keepalive_timer_);
    if (sweep_timer_) reactor_->cancel(sweep_timer_);
    if (stall_timer_) reactor_->cancel(stall_timer_);
    if (stats_timer_) {
      reactor_->cancel(stats_timer_);
      stats_timer_ = {};
      dump_stats();  // the last counters, with everything this process did
    }
    starved_.clear();
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
    for (auto& [raw, h] : handshaking_) reactor_->cancel(h.deadline);
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
    op->link(send_ops_);
    if constexpr (observe_enabled) {
      op->started = tracing_ ? clock::now() : util::coarse_now();
      if (peer_cells* c = ep_.cells(op->peer_index)) bump(c->sends_started);
    }
    out_peer& p = out_peer_of(op->peer);
    if (timeout > clock::duration::zero()) {
      op->timer = reactor_->run_after(timeout, [this, op](std::error_code ec) {
        if (!ec) on_send_deadline(op);
      });
    }
    if (p.refused) return complete(*op, p.refused);
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
    if (fresh) {
      it->second.task = task_id::parse(peer);
      it->second.index = ep_.index_of(it->second.task);
    }
    last_out_ = &*it;
    return it->second;
  }

  void post_recv(std::shared_ptr<recv_op> op, clock::duration timeout) {
    if (closing_) return complete(*op, make_error_code(errc::cancelled), tensor_buffer());
    op->link(recv_ops_);
    if constexpr (observe_enabled) {
      op->started = tracing_ ? clock::now() : util::coarse_now();
      if (peer_cells* c = ep_.cells(op->peer_index)) bump(c->recvs_started);
    }
    slot& s = slot_for(op->peer, op->key, op->slot_hash);
    if (!s.arrived.empty()) {
      arrival a = std::move(s.arrived.front());  // its charge goes with it (held_ref)
      s.arrived.pop_front();
      if (a.pending) {
        // A chunked tensor still arriving: this recv gets it when its last chunk is in.
        arm_recv_deadline(op, timeout);
        a.pending->op = op;
        // One waiting for memory goes on now, into op's destination or whatever the budget.
        if (a.pending->starved) schedule_resume();
        op->xfer = std::move(a.pending);
        return;
      }
      a.held.reset();  // the receive's from now on
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
    // Its tensor may be the frame a lane waits with for memory: that one goes on for it.
    if (parked_ != 0) schedule_resume();
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
    if (op.list_head != nullptr) {  // started on this reactor: counted
      if (peer_cells* c = ep_.cells(op.peer_index)) {
        if (ec) {
          bump(c->send_errors);
        } else {
          bump(c->sends);
          bump(c->bytes_sent, op.bytes);
        }
      }
      if (tracing_) trace_.add({op.started, clock::now(), op.key, op.peer, {}, op.bytes, 's', !ec});
      op.unlink();
    }
    op.owned.reset();
    send_handler h = std::move(op.h);
    if (initiating_ != 0) {
      return reactor_->post([this, h = std::move(h), ec]() mutable { reactor_->invoke(h, ec); });
    }
    reactor_->invoke(h, ec);
  }

  /// Completes a receive whose destination took the tensor (a split one's
  /// head and tail both): `head` is the destination (moved out of op.dst or
  /// shared from it), handed to the handler.
  void complete_filled(recv_op& op, tensor_buffer head) { complete(op, {}, std::move(head), op.tail.size()); }

  /// Completes a receive with `b` (empty on error); `tail_filled` bytes more
  /// went to a split destination's tail (complete_filled).
  void complete(recv_op& op, std::error_code ec, tensor_buffer b, std::size_t tail_filled = 0) {
    if (op.done) return;
    op.done = true;
    if (op.timer) reactor_->cancel(op.timer);
    if (op.list_head != nullptr) {  // started on this reactor: counted
      const std::size_t got = b.size() + tail_filled;
      if (peer_cells* c = ep_.cells(op.peer_index)) {
        if (ec) {
          bump(c->recv_errors);
        } else {
          bump(c->recvs);
          bump(c->bytes_received, got);
        }
      }
      if (tracing_) trace_.add({op.started, clock::now(), op.key, op.peer, {}, got, 'r', !ec});
    }
    op.bound.reset();
    op.xfer.reset();
    op.unlink();
    op.dst.reset();
    op.tail = {};
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

  /// log(), at most a few lines of kind `kind` per interval (see util::log_limiter):
  /// for what a peer can make happen as often as it likes.
  void log_limited(std::string_view kind, const std::string& line) {
    std::string suffix;
    if (log_limit_.allow(kind, suffix)) log(line + suffix);
  }

  void log(const std::string& line) { write_log(log_, "fusewire rendezvous " + ep_.self_.to_string() + ": " + line); }

  // Only a peer that proved it holds the cluster token may carry our frames
  // back on its own connection: without a token, anyone who claims a task's
  // name could otherwise receive what is meant for that task.
  bool reverse_allowed() const noexcept {
    return ep_.tuning_.reverse_lanes && !rdma_transport<Transport> && !ep_.opts_.cluster_token.empty();
  }

  // connecting, retrying, reverse and striping lanes (rendezvous/detail/connect.hpp)
  void connect(out_peer& p);
  void retry(out_peer& p, std::error_code ec);
  void fail_waiting(out_peer& p, std::error_code ec);
  void watch_lane(out_peer& p, std::shared_ptr<channel_type> ch, std::uint64_t incarnation);
  bool adopt(out_peer& p, const std::string& name);
  void drop_outbound(out_peer& p, const std::shared_ptr<channel_type>& ch);
  void connect_lanes(out_peer& p);

  // send path (rendezvous/detail/send_path.hpp)
  void enqueue(out_peer& p, std::shared_ptr<send_op> op);
  void flush(out_peer& p);
  void write(out_peer& p, std::shared_ptr<send_op> op);
  void write_chunked(out_peer& p, std::shared_ptr<send_op> op);
  void on_send_deadline(const std::shared_ptr<send_op>& op);

  // accepting and handing off connections (rendezvous/detail/accept.hpp)
  void accept();
  void admit(const std::shared_ptr<channel_type>& ch, protocol::peer_identity peer, protocol::pending_ack ack);
  void hand_off(const std::shared_ptr<channel_type>& ch, unsigned owner, protocol::peer_identity peer,
                protocol::pending_ack ack)
    requires handoff_transport<Transport>;
  void take_accepted(detail::owned_fd socket, protocol::peer_identity peer, protocol::pending_ack ack)
    requires handoff_transport<Transport>;
  void accept_failed(std::error_code ec);
  void log_new_incarnation(channel_type* self, const std::string& peer, std::uint64_t incarnation);
  bool admit_handshake(const std::shared_ptr<channel_type>& ch);
  void end_handshake(channel_type* ch);
  static std::string remote(channel_type& ch);
  static std::string source_of(const std::string& remote);

  // receive path (rendezvous/detail/receive_path.hpp)
  void read_next(const std::shared_ptr<channel_type>& ch);
  void on_frame(const std::shared_ptr<channel_type>& ch, std::error_code ec, protocol::frame_head head);
  void dispatch(const std::shared_ptr<channel_type>& ch, inbound& in, protocol::frame_head& head);
  void on_tensor(const std::shared_ptr<channel_type>& ch, inbound& in, const std::string& peer,
                 protocol::frame_head& head);
  void on_fused(const std::shared_ptr<channel_type>& ch, inbound& in, const std::string& peer,
                protocol::frame_head& head);
  void deliver_fused(const std::shared_ptr<channel_type>& ch, const std::string& peer, recv_account& account,
                     std::uint64_t incarnation, const protocol::frame_head& head, const tensor_buffer& buf);
  void on_chunk(const std::shared_ptr<channel_type>& ch, const inbound& in, const wire::chunk_meta& c,
                const wire::frame_header& h);
  void read_parked_chunks(const std::shared_ptr<incoming>& x);
  void read_chunk(const std::shared_ptr<channel_type>& ch, const std::shared_ptr<incoming>& x, std::uint64_t offset,
                  std::uint64_t len);
  void chunk_read(const std::shared_ptr<channel_type>& ch, const std::shared_ptr<incoming>& x, std::error_code e);
  void bind_transfer(const std::shared_ptr<incoming>& x);
  void finish_transfer(const std::shared_ptr<incoming>& x);
  void drop_arrival(const std::shared_ptr<incoming>& x);
  void fail_transfers(const std::string& peer, std::uint64_t incarnation, std::error_code ec);
  arrival* deliver(std::string_view peer, std::string_view key, tensor_buffer b);
  arrival* deliver(std::string_view peer, std::string_view key, tensor_buffer b, std::uint64_t h);
  void deliver_late(const std::shared_ptr<channel_type>& ch, std::string_view peer, std::string_view key,
                    tensor_buffer b);
  void hand_over(recv_op& op, tensor_buffer b);
  void on_recv_deadline(const std::shared_ptr<recv_op>& op);
  void inbound_failed(const std::shared_ptr<channel_type>& ch, std::error_code ec, std::string why = {});

  // receive budget and what is dropped (rendezvous/detail/recv_budget.hpp)
  recv_account& account_of(std::string_view peer);
  static std::size_t arrival_cost(std::string_view key) noexcept;
  bool room(const recv_account& a, std::size_t n);
  void starved_on_total(std::size_t seen);
  held_ref charge(recv_account& a, std::size_t n, bool forced, std::uint64_t incarnation);
  void charge_more(held_ref& held, std::size_t n);
  void release(held_bytes& p) noexcept;
  void hold(arrival* a, recv_account& account, std::uint64_t incarnation, std::string_view key, held_ref held);
  void note_arrival(const held_ref& held) noexcept;
  bool awaited(std::string_view peer, const protocol::frame_head& head);
  void park(inbound& in, protocol::frame_head& head);
  void starve(const std::shared_ptr<incoming>& x);
  void mark_parked(inbound& in);
  void unpark(channel_type* ch);
  void note_pause(const recv_account& a);
  void schedule_resume();
  void resume_parked();
  void wake_starved_shards();
  void note_incarnation(recv_account& a, std::uint64_t incarnation);
  void arm_sweep();
  void sweep();
  void drop_idle(const std::vector<std::shared_ptr<incoming>>& idle, clock::time_point now);
  void drop_aged(clock::time_point now);

  // stall reports (rendezvous/detail/observe.hpp)
  /// One reactor's answer to a stall check: whether an operation reached its
  /// next report age, and the operations old enough to be in the block.
  struct stall_part {
    bool due = false;
    std::vector<pending_operation> ops;
  };
  void arm_stall();
  void stall_tick();
  stall_part stall_check(bool asked);
  void stall_collect(std::uint64_t round, unsigned from, stall_part part);
  void stall_log(const std::vector<unsigned>& silent);
  std::string connection_state(const std::string& peer, std::string& last_error);

 public:
  /// The operations of this shard not completed yet, with what each waits for. `min_age` filters.
  void snapshot(clock::time_point now, std::vector<pending_operation>& out, clock::duration min_age = {});
  /// This reactor's share of the receive pool; any thread.
  shard_stats pool_stats() const noexcept { return pool_.stats(0); }
  /// options.trace_file: this reactor's spans (read once the reactors stopped).
  const detail::trace_buffer& trace() const noexcept { return trace_; }
  /// Writes `line` to the endpoint's log (any thread once the reactors stopped).
  void log_line(const std::string& line) { log(line); }
  /// options.stats_file (reactor 0's shard): dumps the counters every stats_interval.
  void arm_stats_dump();
  void dump_stats();

 private:
  // keepalive (rendezvous/detail/keepalive.hpp)
  void arm_keepalive();
  void keepalive_tick();
  void judge_silence();

  // This shard's share of options.pool_size (one pool per reactor, nothing shared).
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
  /// Receive budget per peer (never dropped: peers are the cluster's tasks);
  /// before everything that holds a charge, so it outlives them.
  std::map<std::string, recv_account, std::less<>> accounts_;
  unsigned parked_ = 0;            ///< lanes parked for memory, over all accounts
  std::size_t held_here_ = 0;      ///< bytes this shard holds (its share of ep_.held_)
  held_bytes* charges_ = nullptr;  ///< every live charge of this shard (a list through held_bytes)
  bool resume_posted_ = false;
  bool resuming_ = false;  ///< resume_parked() runs: a frame parked again is no new pause
  /// Set when a charge failed on the process total: another shard's release wakes this one.
  std::atomic<bool> starved_by_total_{false};
  timer_id sweep_timer_;
  clock::time_point next_age_check_ = clock::time_point::max();  ///< when an unmatched arrival may first be too old
  std::map<channel_type*, inbound> in_;
  /// Empty slots stay (a steady step reuses them) until the table doubles: then they are swept.
  detail::slot_table<slot> slots_;
  recv_op* recv_ops_ = nullptr;  ///< started receives not completed yet (intrusive list; no allocation)
  send_op* send_ops_ = nullptr;  ///< started sends not completed yet (the same, for stall reports)
  timer_id stall_timer_;         ///< options.stall_report: the periodic check
  timer_id stats_timer_;         ///< options.stats_file: the next counter dump
  unsigned seen_requests_ = 0;   ///< report requests (SIGUSR1) already answered
  /// Reactor 0: the stall check under way (every reactor answers into it).
  struct stall_round {
    std::uint64_t number = 0;
    bool open = false;
    bool asked = false;  ///< a snapshot request: every operation, whatever its age
    bool due = false;
    clock::time_point since{};
    std::vector<bool> answered;
    std::vector<pending_operation> ops;
  } stall_;
  bool tracing_ = false;        ///< options.trace_file is set
  detail::trace_buffer trace_;  ///< this reactor's spans
  std::set<std::string> down_;  ///< peers whose connections all broke
  std::map<transfer_key, std::shared_ptr<incoming>> transfers_;
  std::vector<std::shared_ptr<incoming>> starved_;         ///< transfers whose buffer waits for the budget
  std::map<channel_type*, clock::time_point> unanswered_;  ///< outbound lanes with a ping in flight, since when
  timer_id keepalive_timer_;
  clock::time_point keepalive_due_{};  ///< when the armed keepalive tick should run
  /// An accepted connection still in its handshake: its source address and deadline.
  struct handshaking {
    std::string source;
    timer_id deadline;
  };
  std::map<channel_type*, handshaking> handshaking_;
  std::map<std::string, std::size_t, std::less<>> handshaking_by_source_;
  clock::duration accept_backoff_{};  ///< after an accept error (EMFILE...): wait before the next accept
  util::log_limiter log_limit_;

 public:
  /// RDMA direct placement (nothing for other transports).
  [[no_unique_address]] typename detail::direct_state_for<Transport, recv_op>::type direct_;
};

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire

// The member functions, by path.
#include <fusewire/rendezvous/detail/connect.hpp>
#include <fusewire/rendezvous/detail/send_path.hpp>
#include <fusewire/rendezvous/detail/accept.hpp>
#include <fusewire/rendezvous/detail/receive_path.hpp>
#include <fusewire/rendezvous/detail/recv_budget.hpp>
#include <fusewire/rendezvous/detail/keepalive.hpp>
#include <fusewire/rendezvous/detail/observe.hpp>
