#pragma once
/// Which reactor owns a peer, and how an operation checked on the calling thread gets there.

#include <fusewire/rendezvous/endpoint.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

/// A peer's name and whether the cluster has it. A thread's calls mostly name
/// the peer of its previous call (a worker's PS, a PS's worker): the last
/// answer is kept per thread, keyed by this endpoint's serial number, and
/// handed out by reference (valid until this thread's next resolve()).
template <transport Transport>
inline auto endpoint<Transport>::resolve(const task_id& peer) const -> const peer_info& {
  struct last_answer {
    std::uint64_t endpoint = 0;
    std::uint32_t index = 0;
    std::string job;
    peer_info info;
  };
  thread_local last_answer last;
  if (last.endpoint == serial_ && last.index == peer.index && last.job == peer.job) return last.info;
  peer_info info{peer.to_string(), spec_.contains(peer), 0, 0};
  if (info.known) {
    info.shard = shard_of(peer);
    info.index = index_of(peer);
  }
  info.hash = detail::peer_hash_of(info.name);
  last.endpoint = 0;  // until the whole answer is stored
  last.index = peer.index;
  last.job = peer.job;
  last.info = std::move(info);
  last.endpoint = serial_;
  return last.info;
}

/// How many reactors to run (see endpoint_tuning::reactors).
template <transport Transport>
inline unsigned endpoint<Transport>::reactor_count() const noexcept {
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
template <transport Transport>
inline unsigned endpoint<Transport>::shard_of(const task_id& t) const {
  if (shards_ == 1) return 0;
  auto it = job_base_.find(t.job);
  const unsigned base = it != job_base_.end() ? it->second : 0;
  return (base + t.index) % shards_;
}

/// True on the reactor that owns shard `shard`.
template <transport Transport>
inline bool endpoint<Transport>::on_shard(unsigned shard) const noexcept {
  reactor_type* r = reactor_type::current();
  return r != nullptr && &r->group() == group_.get() && r->index() == shard;
}

template <transport Transport>
inline std::uint64_t endpoint<Transport>::next_serial() noexcept {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

template <transport Transport>
inline std::error_code endpoint<Transport>::check_send(const peer_info& peer, const std::string& key,
                                                       const send_op& op) const {
  if (!peer.known || key.size() > wire::limits{}.max_key_bytes) return make_error_code(errc::invalid_argument);
  if (op.sg.size() > wire::limits{}.max_segments) return make_error_code(errc::invalid_argument);
  const std::uint64_t n = total_size(op.sg.view());
  const bool chunked = opts_.chunking && n > opts_.chunk_size;
  // The peer refuses (and closes the connection on) a transfer above its
  // max_transfer_bytes; a cluster shares its options, so ours says it first.
  if (n > (chunked ? opts_.max_transfer_bytes : opts_.max_frame_bytes)) {
    return make_error_code(errc::frame_too_large);
  }
  return {};
}

template <transport Transport>
inline auto endpoint<Transport>::prepare_send(const peer_info& peer, std::string key, std::shared_ptr<send_op> op,
                                              send_handler h, clock::duration timeout) -> pending_op {
  op->peer = peer.name;
  op->peer_index = peer.index;
  op->h = std::move(h);
  pending_op p;
  p.error = check_send(peer, key, *op);
  op->bytes = total_size(op->sg.view());
  if (!p.error) op->key = std::move(key);
  p.send = std::move(op);
  p.timeout = timeout;
  p.shard = peer.shard;
  return p;
}

template <transport Transport>
inline auto endpoint<Transport>::prepare_recv(std::shared_ptr<recv_op> op, const peer_info& peer, std::string key,
                                              tensor_buffer dst, bool has_dst, recv_handler h, clock::duration timeout)
    -> pending_op {
  if constexpr (rdma_transport<Transport>) op->self = op;  // RDMA direct placement
  op->peer = peer.name;
  op->peer_index = peer.index;
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
template <transport Transport>
inline void endpoint<Transport>::run_pending(pending_op& p) {
  shard& c = *shard_list_[p.shard];
  if (p.send) {
    if (p.error) return c.complete(*p.send, p.error);
    return c.post_send(std::move(p.send), p.timeout);
  }
  if (p.error) return c.complete(*p.recv, p.error, tensor_buffer());
  c.post_recv(std::move(p.recv), p.timeout);
}

/// The endpoint is closed: the handler runs inline with errc::cancelled.
template <transport Transport>
inline void endpoint<Transport>::cancel_pending(pending_op& p) {
  if (p.send) return (void)p.send->h(make_error_code(errc::cancelled));
  p.recv->h(make_error_code(errc::cancelled), tensor_buffer());
}

template <transport Transport>
inline void endpoint<Transport>::start(pending_op p) {
  if (closed_.load()) return cancel_pending(p);
  if constexpr (!rdma_transport<Transport>) {  // RDMA direct placement keeps every start posted
    if (on_shard(p.shard)) return shard_list_[p.shard]->initiate([&] { run_pending(p); });
  }
  pending_op keep{p.send, p.recv, {}, {}, 0};
  const unsigned shard = p.shard;
  if (group_->submit_to(shard, [this, p = std::move(p)]() mutable { run_pending(p); })) cancel_pending(keep);
}

/// Hands `ops` to their peers' reactors: one task per reactor, each in the order added.
template <transport Transport>
inline void endpoint<Transport>::start_many(std::vector<pending_op> ops) {
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

template <transport Transport>
inline void endpoint<Transport>::start_on(unsigned shard, std::vector<pending_op> ops) {
  if constexpr (!rdma_transport<Transport>) {
    if (!closed_.load() && on_shard(shard)) {
      return shard_list_[shard]->initiate([&] {
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

template <transport Transport>
inline recv_result endpoint<Transport>::recv_sync_impl(const task_id& peer, std::string key, tensor_buffer dst,
                                                       bool has_dst, clock::duration timeout) {
  if (on_reactor()) return {make_error_code(errc::invalid_argument), {}};
  std::promise<recv_result> done;
  auto fut = done.get_future();
  start(prepare_recv(
      new_recv_op(), resolve(peer), std::move(key), std::move(dst), has_dst,
      [&done](std::error_code ec, tensor_buffer b) {
        done.set_value(recv_result{ec, std::move(b)});
      },
      timeout));
  return fut.get();
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
