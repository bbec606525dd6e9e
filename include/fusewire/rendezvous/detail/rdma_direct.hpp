#pragma once
/// Direct placement for rendezvous::endpoint over an rdma_transport: the
/// receiver of a large tensor advertises its destination (address + rkey), the
/// sender RDMA-writes the tensor straight into it and then sends a `placed`
/// frame on the same connection (which arrives only once the bytes are in
/// place); the receiver completes the recv with its destination, no copy.
///
/// Protocol (per sender connection and key; every advert names the number of
/// tensors the receiver had seen on that key, `seq`, in its request_id):
/// - The receiver advertises a recv when it is the only one waiting on its
///   (peer, key), nothing arrived for it, its destination is registered memory
///   larger than options.acc_size, and the peer's ordered connection is known
///   (it carried a tensor already: the first step goes the normal way). At most
///   one advert per (peer, key) is out at a time; it goes on that connection.
///   Nor while a tensor on that key is being read with no recv waiting for it
///   (its header counted, its payload not yet delivered): FIFO gives that one
///   to this recv, so an advert naming the next tensor would let the sender
///   write into a destination the user already got back, and the recv that
///   tensor was meant for would never complete.
/// - The sender counts its sends per key. Tensor number `seq` may use the
///   advert `seq` (it is the one FIFO matches to the advertised recv); an
///   advert that arrives after tensor `seq` left is stale and answered
///   `placed{written = 0}`, as is one the send cannot use (size differs, no
///   registered source or staging block): it then sends the normal frame.
/// - So when the receiver sees tensor `seq` arrive as a normal frame the
///   advert can no longer be written to: the recv proceeds as before. An
///   advertised recv that times out is taken out of the FIFO at once but
///   completes (errc::timed_out) only once its advert is answered, lost with
///   the connection, or overtaken: the NIC never writes into memory the user
///   got back. A tensor written into a timed-out recv's destination is copied
///   out and delivered to the next recv, as a late tensor would be.
/// - An advertised recv whose deadline passes withdraws its advert (a
///   recv_request with address 0); the sender answers `written = 0` if it had
///   not used it, and the recv then completes with errc::timed_out.
/// - Sources: registered memory (endpoint::allocate_registered, or any buffer
///   of a registered pool of the endpoint's device) is written as is; other
///   sources are copied into a registered staging block (one copy on the
///   sender instead of one on the receiver), or, when none is free or the
///   tensor is larger than a block, sent the normal way.
///
/// Reactor thread only, except stats().

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <variant>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/protocol/frame_channel.hpp>
#include <fusewire/util/timer_queue.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/wire/meta.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

/// Counters of the RDMA direct-placement path of one endpoint (see
/// rendezvous/detail/rdma_direct.hpp); read from any thread.
struct direct_stats {
  std::uint64_t adverts_sent = 0;      ///< recv_requests this endpoint sent as a receiver
  std::uint64_t adverts_received = 0;  ///< recv_requests it received as a sender
  std::uint64_t direct_writes = 0;     ///< tensors it RDMA-wrote into a peer's destination
  std::uint64_t staged_writes = 0;     ///< of those, from a staging copy of an unregistered source
  std::uint64_t declined = 0;          ///< adverts it answered "not written" (stale or unusable)
  std::uint64_t placed = 0;            ///< recvs it completed from a peer's direct write
};

namespace detail {

/// Transparent string hash for maps looked up by string_view.
struct direct_string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// Smallest power of two >= n (n <= 2^62).
inline std::size_t direct_pow2(std::size_t n) noexcept {
  std::size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

/// For transports without one-sided writes: nothing.
struct no_rdma_direct {};

template <class Transport, class RecvOp>
class rdma_direct;

/// rdma_direct<Transport, RecvOp> for an rdma_transport, else no_rdma_direct.
template <class Transport, class RecvOp>
struct direct_state_for {
  using type = no_rdma_direct;
};
template <rdma_transport Transport, class RecvOp>
struct direct_state_for<Transport, RecvOp> {
  using type = rdma_direct<Transport, RecvOp>;
};

/// The state of the direct path; `Shard` is the endpoint's reactor-side shard
/// (which befriends this class), `RecvOp` its receive operation.
template <class Transport, class RecvOp>
class rdma_direct {
  static_assert(rdma_transport<Transport>);

 public:
  /// Counters; any thread.
  direct_stats stats() const noexcept {
    return {adverts_sent_.load(std::memory_order_relaxed),  adverts_received_.load(std::memory_order_relaxed),
            direct_writes_.load(std::memory_order_relaxed), staged_writes_.load(std::memory_order_relaxed),
            declined_.load(std::memory_order_relaxed),      placed_.load(std::memory_order_relaxed)};
  }

  /// A buffer of `n` bytes registered with the reactor's device (its own
  /// registration, rounded up to a power of two of at least 4 KiB): for
  /// destinations and sources reused every step.
  template <class Shard>
  tensor_buffer allocate(Shard& shard, std::size_t n) {
    buffer_pool_config cfg;
    cfg.block_size = direct_pow2(std::max<std::size_t>(n, 4096));
    cfg.total_bytes = cfg.block_size;
    cfg.shards = 1;
    buffer_pool pool = shard.ep_.transport_.make_registered_pool(*shard.reactor_, std::move(cfg));
    return pool.allocate(n, 0);
  }

  // ---- receiving side ----------------------------------------------------------

  /// A recv about to wait alone on its (peer, key): advertise its destination if it qualifies.
  template <class Shard>
  void advertise(Shard& shard, RecvOp& op) {
    // A split destination (head and tail) is not one region: it takes the frame path.
    if (!op.has_dst || !op.tail.empty() || op.dst.size() <= shard.ep_.opts_.acc_size || op.dst.reg() == nullptr) {
      return;
    }
    auto pit = rx_.find(std::string_view(op.peer));
    if (pit == rx_.end() || !pit->second.ordered || !pit->second.ordered->is_open()) return;
    rx_peer& rx = pit->second;
    rx_key& k = key_state(rx.keys, op.key);
    if (k.op || k.unsettled != 0) return;
    remote_region region;
    try {
      region = Transport::describe(op.dst);
    } catch (const std::system_error&) {
      return;
    }
    k.op = op.self.lock();
    k.seq = k.seen;
    k.timed_out = false;
    wire::recv_request_meta m;
    m.key = op.key;
    m.capacity = op.dst.size();
    m.rdma_address = region.addr;
    m.rdma_rkey = region.rkey;
    adverts_sent_.fetch_add(1, std::memory_order_relaxed);
    rx.ordered->write(
        m, std::span<const const_buffer>{}, [](std::error_code) {}, k.seq);
  }

  /// A recv's deadline passed while it waits: true if its advert is out (the
  /// caller took it out of the FIFO). The advert is withdrawn (a recv_request
  /// with address 0); the recv completes once the sender answered.
  bool hold_timed_out(const std::shared_ptr<RecvOp>& op) {
    auto pit = rx_.find(std::string_view(op->peer));
    if (pit == rx_.end()) return false;
    auto kit = pit->second.keys.find(std::string_view(op->key));
    if (kit == pit->second.keys.end() || kit->second.op != op) return false;
    kit->second.timed_out = true;
    op->timed_out = true;
    wire::recv_request_meta m;
    m.key = op->key;
    pit->second.ordered->write(
        m, std::span<const const_buffer>{}, [](std::error_code) {}, kit->second.seq);
    return true;
  }

  /// Every frame that arrives on an inbound connection; true if it was a
  /// `placed` frame (handled here, the next read posted or the connection failed).
  template <class Shard, class Channel, class Inbound, class Head>
  bool on_inbound_frame(Shard& shard, const std::shared_ptr<Channel>& ch, const Inbound& in, const Head& head) {
    if (!rx_.empty()) settle(in.peer, ch);
    if (const auto* t = std::get_if<wire::tensor_meta>(&head.body)) {
      rx_peer& rx = ordered_for(shard, in.peer, ch);
      // With a recv waiting the tensor is that recv's (read into its destination or delivered to it).
      if (!has_waiting(shard, in.peer, t->key)) unsettle(rx, t->key);
      count(shard, rx, t->key);
    } else if (const auto* f = std::get_if<wire::fused_meta>(&head.body)) {
      rx_peer& rx = ordered_for(shard, in.peer, ch);
      for (const wire::fused_entry& e : *f) {
        unsettle(rx, e.key);
        count(shard, rx, e.key);
      }
    } else if (const auto* c = std::get_if<wire::chunk_meta>(&head.body)) {
      if (c->index == 0) count(shard, ordered_for(shard, in.peer, ch), c->key);
    } else if (const auto* p = std::get_if<wire::placed_meta>(&head.body)) {
      on_placed(shard, ch, in.peer, *p, head.header.request_id);
      return true;
    }
    return false;
  }

  /// A tensor from `peer` on `key` was read and delivered to its slot (a waiting
  /// recv or the arrived queue): a recv posted from now on may be advertised.
  void on_delivered(std::string_view peer, std::string_view key) {
    if (rx_.empty()) return;
    auto pit = rx_.find(peer);
    if (pit == rx_.end() || pit->second.unsettled == 0) return;
    auto kit = pit->second.keys.find(key);
    if (kit == pit->second.keys.end() || kit->second.unsettled == 0) return;
    --kit->second.unsettled;
    --pit->second.unsettled;
  }

  /// A peer's inbound connections broke: its adverts can no longer be written to.
  template <class Shard>
  void on_peer_lost(Shard& shard, std::string_view peer) {
    auto pit = rx_.find(peer);
    if (pit == rx_.end() || (pit->second.ordered && pit->second.ordered->is_open())) return;
    rx_peer rx = std::move(pit->second);
    rx_.erase(pit);
    for (auto& [key, k] : rx.keys) release(shard, k);
  }

  /// close(): forget everything (the connections are closed, the recvs cancelled).
  void clear() noexcept {
    rx_.clear();
    tx_.clear();
  }

  // ---- sending side ------------------------------------------------------------

  /// A recv_request arrived on `ch`, the ordered outbound connection of `p` (else ignored).
  template <class Shard, class OutPeer, class Channel, class Head>
  void on_advert(Shard& shard, OutPeer& p, const std::shared_ptr<Channel>& ch, const Head& head) {
    const auto* m = std::get_if<wire::recv_request_meta>(&head.body);
    if (m == nullptr || ch != p.ch) return;
    tx_key& k = key_state(tx_for(p).keys, m->key);
    const std::uint64_t seq = head.header.request_id;
    if (m->rdma_address == 0) {
      // Withdrawn: answer unless it was used or declined already.
      auto it = std::find_if(k.adverts.begin(), k.adverts.end(), [seq](const advert& a) { return a.seq == seq; });
      if (it == k.adverts.end()) return;
      k.adverts.erase(it);
      return decline(shard, p, m->key, seq);
    }
    adverts_received_.fetch_add(1, std::memory_order_relaxed);
    if (seq < k.sent) return decline(shard, p, m->key, seq);
    k.adverts.push_back(advert{seq, remote_region{m->rdma_address, m->rdma_rkey, m->capacity}});
  }

  /// Every send to `p`, in wire order: counts it, and if the peer advertised
  /// the recv it will match, writes it there. True if the op was taken.
  template <class Shard, class OutPeer, class SendOp>
  bool on_send(Shard& shard, OutPeer& p, const std::shared_ptr<SendOp>& op) {
    tx_key& k = key_state(tx_for(p).keys, op->key);
    const std::uint64_t seq = k.sent++;
    while (!k.adverts.empty() && k.adverts.front().seq < seq) {
      decline(shard, p, op->key, k.adverts.front().seq);
      k.adverts.pop_front();
    }
    if (k.adverts.empty() || k.adverts.front().seq != seq) return false;
    const advert a = k.adverts.front();
    k.adverts.pop_front();
    const std::size_t n = total_size(op->sg.view());
    tensor_buffer src;
    bool staged = false;
    if (n == a.region.size && n <= (std::size_t{1} << 30) && p.ready && p.ch) {
      if (op->sg.size() == 1 && op->owned.reg() != nullptr && op->owned.data() == op->sg[0].data() &&
          op->owned.size() == n) {
        src = op->owned.share();
      } else {
        staged = stage(shard, op->sg.view(), n, src);
      }
    }
    if (src.empty()) {
      decline(shard, p, op->key, seq);
      return false;
    }
    shard.flush(p);
    op->in_flight = true;
    direct_writes_.fetch_add(1, std::memory_order_relaxed);
    if (staged) staged_writes_.fetch_add(1, std::memory_order_relaxed);
    p.last_write = fusewire::util::coarse_now();
    auto ch = p.ch;
    auto write_error = std::make_shared<std::error_code>();
    ch->connection().async_write_remote(src, a.region,
                                        [write_error, keep = src.share()](std::error_code ec, std::size_t) {
                                          if (ec) *write_error = ec;
                                        });
    wire::placed_meta m;
    m.key = op->key;
    m.size = n;
    m.written = 1;
    ch->write(
        m, std::span<const const_buffer>{},
        [&shard, pp = &p, op, ch, write_error, keep = std::move(src)](std::error_code ec) {
          if (!ec) ec = *write_error;
          if (op->timed_out) return shard.complete(*op, make_error_code(errc::timed_out));
          if (ec) {
            shard.drop_outbound(*pp, ch);
            return shard.complete(*op, make_error_code(shard.closing_ ? errc::cancelled : errc::connection_reset));
          }
          shard.complete(*op, {});
        },
        seq);
    return true;
  }

 private:
  struct rx_key {
    std::uint64_t seen = 0;       ///< tensors on this key that arrived on the ordered connection
    std::uint32_t unsettled = 0;  ///< of those, being read with no recv waiting (not yet delivered)
    std::uint64_t seq = 0;        ///< the advert's seq, while `op` is set
    std::shared_ptr<RecvOp> op;   ///< the advertised recv, until the advert is answered or lost
    bool timed_out = false;       ///< `op`'s deadline passed: it is out of the FIFO, held for the answer
  };
  struct rx_peer {
    std::shared_ptr<protocol::frame_channel<typename Transport::connection_type>> ordered;
    std::unordered_map<std::string, rx_key, direct_string_hash, std::equal_to<>> keys;
    std::uint32_t unsettled = 0;  ///< sum of the keys' `unsettled`
  };
  struct advert {
    std::uint64_t seq = 0;
    remote_region region;
  };
  struct tx_key {
    std::uint64_t sent = 0;
    std::deque<advert> adverts;
  };
  struct tx_peer {
    std::uint64_t generation = 0;
    std::unordered_map<std::string, tx_key, direct_string_hash, std::equal_to<>> keys;
  };

  template <class State>
  static State& key_state(std::unordered_map<std::string, State, direct_string_hash, std::equal_to<>>& m,
                          std::string_view key) {
    auto it = m.find(key);
    if (it != m.end()) return it->second;
    return m.emplace(std::string(key), State{}).first->second;
  }

  // The connection that carries the peer's tensor frames; a new one (the peer
  // reconnected) starts the counts afresh: adverts on the old one are dead.
  template <class Shard, class Channel>
  rx_peer& ordered_for(Shard& shard, std::string_view peer, const std::shared_ptr<Channel>& ch) {
    auto pit = rx_.find(peer);
    if (pit == rx_.end()) pit = rx_.emplace(std::string(peer), rx_peer{}).first;
    rx_peer& rx = pit->second;
    if (rx.ordered != ch) {
      auto keys = std::move(rx.keys);
      rx.keys.clear();
      rx.unsettled = 0;
      rx.ordered = ch;
      for (auto& [key, k] : keys) release(shard, k);
    }
    return rx;
  }

  // A live recv waits on (peer, key).
  template <class Shard>
  static bool has_waiting(Shard& shard, std::string_view peer, std::string_view key) {
    auto* s = shard.find_slot(peer, key);
    if (s == nullptr) return false;
    for (const auto& op : s->waiting) {
      if (!op->done) return true;
    }
    return false;
  }

  template <class State>
  static void unsettle(State& rx, std::string_view key) {
    ++key_state(rx.keys, key).unsettled;
    ++rx.unsettled;
  }

  // A frame header arrived on `ch`: every payload before it on that connection
  // was read and delivered (a backstop; on_delivered settles them one by one).
  template <class Channel>
  void settle(std::string_view peer, const std::shared_ptr<Channel>& ch) {
    auto pit = rx_.find(peer);
    if (pit == rx_.end() || pit->second.unsettled == 0 || pit->second.ordered != ch) return;
    for (auto& [key, k] : pit->second.keys) k.unsettled = 0;
    pit->second.unsettled = 0;
  }

  // Tensor number `seen` on `key` arrived as a frame of its own: an advert for
  // it can no longer be written to.
  template <class Shard>
  void count(Shard& shard, rx_peer& rx, std::string_view key) {
    rx_key& k = key_state(rx.keys, key);
    if (k.op && k.seq == k.seen) release(shard, k);
    ++k.seen;
  }

  // The advert of `k` will never be written to: a held (timed-out) recv completes.
  template <class Shard>
  void release(Shard& shard, rx_key& k) {
    std::shared_ptr<RecvOp> op = std::move(k.op);
    k.op.reset();
    if (op && k.timed_out && !op->done) shard.complete(*op, make_error_code(errc::timed_out), tensor_buffer());
    k.timed_out = false;
  }

  template <class Shard, class Channel>
  void on_placed(Shard& shard, const std::shared_ptr<Channel>& ch, const std::string& peer, const wire::placed_meta& m,
                 std::uint64_t seq) {
    rx_peer& rx = ordered_for(shard, peer, ch);
    rx_key& k = key_state(rx.keys, m.key);
    if (!k.op || k.seq != seq) {
      if (m.written == 0) return shard.read_next(ch);  // declined after a tensor overtook it
      return shard.inbound_failed(ch, make_error_code(errc::malformed_frame), "placed frame for no advert");
    }
    std::shared_ptr<RecvOp> op = k.op;
    if (op->done) {
      k.op.reset();
      k.timed_out = false;
      if (m.written != 0) ++k.seen;
      return shard.read_next(ch);
    }
    if (m.written == 0) {
      release(shard, k);
      return shard.read_next(ch);
    }
    if (m.size != op->dst.size() || k.seen != seq) {
      release(shard, k);
      return shard.inbound_failed(ch, make_error_code(errc::malformed_frame), "placed frame does not match its advert");
    }
    ++k.seen;
    const bool held = k.timed_out;
    k.op.reset();
    k.timed_out = false;
    placed_.fetch_add(1, std::memory_order_relaxed);
    if (!held) {
      if (auto* s = shard.find_slot(op->peer, op->key)) s->waiting.erase(op);
      shard.complete_filled(*op, op->dst.share());
      return shard.read_next(ch);
    }
    // The recv timed out meanwhile: its tensor goes to the next recv, as a late one would.
    tensor_buffer copy;
    try {
      copy = protocol::payload_buffer(&shard.pool_, 0, op->dst.size());
    } catch (const std::bad_alloc&) {
      shard.complete(*op, make_error_code(errc::timed_out), tensor_buffer());
      return shard.inbound_failed(ch, make_error_code(errc::out_of_memory), "no memory for a late tensor");
    }
    if (copy.size() != 0) std::memcpy(copy.data(), op->dst.data(), copy.size());
    shard.complete(*op, make_error_code(errc::timed_out), tensor_buffer());
    shard.deliver_late(ch, peer, m.key, std::move(copy));  // held within the receive budget like any arrival
    shard.read_next(ch);
  }

  // Per outbound peer (the endpoint's out_peer entries never move); its
  // connections were remade (generation bumped): counts and adverts start afresh.
  template <class OutPeer>
  tx_peer& tx_for(OutPeer& p) {
    tx_peer& tx = tx_[static_cast<const void*>(&p)];
    if (tx.generation != p.generation) {
      tx.keys.clear();
      tx.generation = p.generation;
    }
    return tx;
  }

  template <class Shard, class OutPeer>
  void decline(Shard& shard, OutPeer& p, std::string_view key, std::uint64_t seq) {
    (void)shard;
    if (!p.ch) return;
    declined_.fetch_add(1, std::memory_order_relaxed);
    wire::placed_meta m;
    m.key = key;
    p.ch->write(
        m, std::span<const const_buffer>{}, [](std::error_code) {}, seq);
  }

  // One copy of an unregistered source into a registered staging block.
  template <class Shard>
  bool stage(Shard& shard, std::span<const const_buffer> sg, std::size_t n, tensor_buffer& out) {
    if (staging_failed_) return false;
    if (!staging_) {
      buffer_pool_config cfg;
      cfg.block_size = direct_pow2(std::clamp<std::size_t>(shard.ep_.opts_.chunk_size, 64 << 10, 16 << 20));
      cfg.total_bytes = 4 * cfg.block_size;
      cfg.shards = 1;
      try {
        staging_ = std::make_unique<buffer_pool>(shard.ep_.transport_.make_registered_pool(*shard.reactor_, cfg));
      } catch (const std::system_error& e) {
        staging_failed_ = true;
        shard.log(std::string("rdma staging pool unavailable, unregistered sources go the normal way: ") + e.what());
        return false;
      }
    }
    if (n > staging_->block_size() || staging_->allocate(n, 0, out)) return false;
    std::size_t at = 0;
    for (const_buffer b : sg) {
      if (!b.empty()) std::memcpy(out.data() + at, b.data(), b.size());
      at += b.size();
    }
    return true;
  }

  std::unordered_map<std::string, rx_peer, direct_string_hash, std::equal_to<>> rx_;
  std::unordered_map<const void*, tx_peer> tx_;
  std::unique_ptr<buffer_pool> staging_;
  bool staging_failed_ = false;
  std::atomic<std::uint64_t> adverts_sent_{0}, adverts_received_{0}, direct_writes_{0}, staged_writes_{0}, declined_{0},
      placed_{0};
};

}  // namespace detail
}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
