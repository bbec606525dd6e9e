#pragma once
/// A shard's receive path: frame parsing, delivery to receives, chunk reassembly, receive deadlines.

#include <fusewire/rendezvous/detail/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

template <transport Transport>
inline void endpoint<Transport>::shard::read_next(const std::shared_ptr<channel_type>& ch) {
  // Init-captures: a copy-capture of a const& parameter would be a const
  // member, copied (an atomic increment) on every move of the continuation.
  ch->read_head([this, ch = ch](std::error_code ec, protocol::frame_head head) { on_frame(ch, ec, std::move(head)); });
}

template <transport Transport>
inline void endpoint<Transport>::shard::on_frame(const std::shared_ptr<channel_type>& ch, std::error_code ec,
                                                 protocol::frame_head head) {
  if (closing_) return;
  if (ec) {
    if (ec == make_error_code(errc::frame_too_large)) {
      ep_.frames_too_large_.fetch_add(1, std::memory_order_relaxed);
      if (const auto it = in_.find(ch.get()); it != in_.end()) {
        ep_.count_peer_event(it->second.peer, &peer_cells::frames_too_large);
      }
      return inbound_failed(
          ch, ec,
          "it announced a frame above FUSEWIRE_MAX_FRAME_BYTES = " + std::to_string(ep_.opts_.max_frame_bytes) +
              " or a transfer above FUSEWIRE_MAX_TRANSFER_BYTES = " + std::to_string(ep_.opts_.max_transfer_bytes) +
              "; nothing was allocated for it");
    }
    return inbound_failed(ch, ec);
  }
  auto it = in_.find(ch.get());
  if (it == in_.end()) return;
  it->second.last_frame = util::coarse_now();
  if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: count tensors, take placed frames
    if (direct_.on_inbound_frame(*this, ch, it->second, head)) return;
  }
  dispatch(ch, it->second, head);
}

// A frame's head, read (or parked for memory and taken up again): what it carries decides the rest.
template <transport Transport>
inline void endpoint<Transport>::shard::dispatch(const std::shared_ptr<channel_type>& ch, inbound& in,
                                                 protocol::frame_head& head) {
  const std::string peer = in.peer;
  if (std::holds_alternative<wire::tensor_meta>(head.body)) return on_tensor(ch, in, peer, head);
  if (std::holds_alternative<wire::fused_meta>(head.body)) return on_fused(ch, in, peer, head);
  if (const auto* c = std::get_if<wire::chunk_meta>(&head.body)) return on_chunk(ch, in, *c, head.header);
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
    case wire::frame_type::goodbye:
      return inbound_failed(ch, make_error_code(errc::connection_closed));
    default:
      return inbound_failed(
          ch, make_error_code(errc::not_supported),
          std::string("unexpected ") + std::string(wire::frame_type_name(head.header.type)) + " frame");
  }
}

template <transport Transport>
inline void endpoint<Transport>::shard::on_tensor(const std::shared_ptr<channel_type>& ch, inbound& in,
                                                  const std::string& peer, protocol::frame_head& head) {
  const wire::tensor_meta& t = std::get<wire::tensor_meta>(head.body);
  const std::size_t n = static_cast<std::size_t>(head.header.payload_len);
  bool wanted = false;  // a receive waits for it: nothing is held for long
  if (slot* s = find_slot(peer, t.key)) {
    auto& waiting = s->waiting;
    while (!waiting.empty() && waiting.front()->done) waiting.pop_front();
    wanted = !waiting.empty();
    if (!waiting.empty() && waiting.front()->has_dst && waiting.front()->dst_size() == n) {
      // Zero copy: the payload goes from the socket into the posted destination
      // (a split one's head, then its tail).
      std::shared_ptr<recv_op> op = std::move(waiting.front());
      waiting.pop_front();
      const mutable_buffer dst = op->dst.bytes();
      const mutable_buffer tail = op->tail;
      // The destination is handed over as is (moved, not shared: complete()
      // would drop the op's reference right away): on the way from the
      // frame's arrival to the handler, reference counts cost atomics.
      const bool head_read = ch->try_read_payload(dst);
      if (head_read && (tail.empty() || ch->try_read_payload(tail))) {  // it arrived with the head: done now
        complete_filled(*op, std::move(op->dst));
        if (!closing_) read_next(ch);
        return;
      }
      op->bound = ch;
      auto finish = [this, ch = ch, op](std::error_code e) {
        if (e || op->timed_out) {
          complete(*op,
                   make_error_code(op->timed_out ? errc::timed_out
                                   : closing_    ? errc::cancelled
                                                 : errc::connection_reset),
                   tensor_buffer());
          if (!closing_) inbound_failed(ch, e ? e : make_error_code(errc::timed_out));
          return;
        }
        complete_filled(*op, std::move(op->dst));
        if (!closing_) read_next(ch);
      };
      if (head_read || tail.empty()) {
        ch->read_payload(head_read ? tail : dst, std::move(finish));
      } else {
        ch->read_payload(dst, [ch = ch, tail, finish = std::move(finish)](std::error_code e) mutable {
          if (e) return finish(e);
          ch->read_payload(tail, std::move(finish));
        });
      }
      return;
    }
  }
  // An early arrival: it is held until its receive comes, within the budget.
  held_ref held;
  if (!wanted) {
    held = charge(*in.account, n + arrival_cost(t.key), false, in.incarnation);
    if (!held) return park(in, head);
  }
  tensor_buffer buf;
  try {
    buf = protocol::payload_buffer(&pool_, 0, n);
  } catch (const std::bad_alloc&) {
    return inbound_failed(ch, make_error_code(errc::out_of_memory), "no memory for " + std::to_string(n) + " bytes");
  }
  const mutable_buffer dst = buf.bytes();
  if (ch->try_read_payload(dst)) {
    hold(deliver(peer, t.key, std::move(buf)), *in.account, in.incarnation, t.key, std::move(held));
    if (!closing_) read_next(ch);
    return;
  }
  ch->read_payload(dst,
                   [this, ch = ch, peer = peer, key = std::string(t.key), buf = std::move(buf), account = in.account,
                    incarnation = in.incarnation, held = std::move(held)](std::error_code e) mutable {
                     if (closing_) return;
                     if (e) return inbound_failed(ch, e);
                     hold(deliver(peer, key, std::move(buf)), *account, incarnation, key, std::move(held));
                     read_next(ch);
                   });
}

// A fused frame: its payload is read into one buffer, and each entry is
// handed over as an alias of its bytes (no copy).
template <transport Transport>
inline void endpoint<Transport>::shard::on_fused(const std::shared_ptr<channel_type>& ch, inbound& in,
                                                 const std::string& peer, protocol::frame_head& head) {
  const std::size_t n = static_cast<std::size_t>(head.header.payload_len);
  // What it holds is charged once its tensors were delivered (a frame's
  // worth past the budget at most); here it only waits while the budget is
  // full, unless a receive waits for one of its tensors.
  if (!room(*in.account, n) && !awaited(peer, head)) return park(in, head);
  tensor_buffer buf;
  try {
    buf = protocol::payload_buffer(&pool_, 0, n);
  } catch (const std::bad_alloc&) {
    return inbound_failed(ch, make_error_code(errc::out_of_memory), "no memory for " + std::to_string(n) + " bytes");
  }
  const mutable_buffer dst = buf.bytes();
  if (ch->try_read_payload(dst)) return deliver_fused(ch, peer, *in.account, in.incarnation, head, buf);
  ch->read_payload(dst, [this, ch = ch, peer = peer, account = in.account, incarnation = in.incarnation,
                         head = std::move(head), buf = std::move(buf)](std::error_code e) mutable {
    if (closing_) return;
    if (e) return inbound_failed(ch, e);
    deliver_fused(ch, peer, *account, incarnation, head, buf);
  });
}

// The tensors no receive took share one charge: the whole payload (each
// keeps all of it alive), plus each one's bookkeeping.
template <transport Transport>
inline void endpoint<Transport>::shard::deliver_fused(const std::shared_ptr<channel_type>& ch, const std::string& peer,
                                                      recv_account& account, std::uint64_t incarnation,
                                                      const protocol::frame_head& head, const tensor_buffer& buf) {
  const std::uint64_t peer_hash = detail::peer_hash_of(peer);
  held_ref held;
  std::size_t bookkeeping = 0;
  for (const wire::fused_entry& entry : std::get<wire::fused_meta>(head.body)) {
    arrival* a = deliver(peer, entry.key,
                         buf.share(static_cast<std::size_t>(entry.offset), static_cast<std::size_t>(entry.size)),
                         detail::slot_hash_of(peer_hash, entry.key));
    if (a == nullptr) continue;
    if (!held) held = charge(account, buf.size(), true, incarnation);
    bookkeeping += arrival_cost(entry.key);
    a->held = held;
  }
  if (held) {
    charge_more(held, bookkeeping);
    note_arrival(held);
  }
  if (!closing_) read_next(ch);
}

// A chunk of a large tensor: its payload is read straight into the
// transfer's buffer (the posted destination when chunk 0 found a recv of the
// right size waiting, else one buffer for the whole tensor). A chunk whose
// head comes before chunk 0's parks its lane until chunk 0 has been matched.
template <transport Transport>
inline void endpoint<Transport>::shard::on_chunk(const std::shared_ptr<channel_type>& ch, const inbound& in,
                                                 const wire::chunk_meta& c, const wire::frame_header& h) {
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
    x->account = in.account;
    transfers_.emplace(std::move(k), x);
    arm_sweep();
  } else {
    x = it->second;
    if (x->key != c.key || x->total != c.total_len || x->count != c.count || x->failed) {
      return inbound_failed(ch, make_error_code(errc::malformed_frame), "chunk does not match its transfer");
    }
  }
  x->last_chunk = util::coarse_now();
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
  x->parked.push_back({ch, c.offset, h.payload_len});
  read_parked_chunks(x);
}

// Reads the chunks parked on `x` (this one, and those whose head came before
// chunk 0's) once its buffer is there: the receive's destination, else one of
// its own within the budget; until then their lanes stay unread.
template <transport Transport>
inline void endpoint<Transport>::shard::read_parked_chunks(const std::shared_ptr<incoming>& x) {
  if (x->failed) return;
  if (x->buf.empty() && x->total != 0) {
    if (x->op && x->op->has_dst && x->op->dst_size() == x->total) {
      x->buf = x->op->dst.share();
      x->tail = x->op->tail;
    } else {
      // A receive that waits for it (with no destination) takes it whatever the budget.
      held_ref held = charge(*x->account, static_cast<std::size_t>(x->total) + arrival_cost(x->key), x->op != nullptr,
                             std::get<1>(x->id));
      if (!held) return starve(x);
      try {
        x->buf = tensor_buffer::allocate(static_cast<std::size_t>(x->total));
      } catch (const std::bad_alloc&) {
        auto lane = std::static_pointer_cast<channel_type>(x->parked.front().lane);
        return inbound_failed(lane, make_error_code(errc::out_of_memory),
                              "no memory for " + std::to_string(x->total) + " bytes");
      }
      x->held = std::move(held);
    }
  }
  for (auto& pc : std::exchange(x->parked, {})) {
    auto lane = std::static_pointer_cast<channel_type>(pc.lane);
    unpark(lane.get());
    read_chunk(lane, x, pc.offset, pc.len);
  }
}

// Reads one chunk's payload into the transfer's buffer (the recv's
// destination when it has one of the right size; with a split one, the part
// of the chunk past its head goes to its tail), then the lane's next frame.
template <transport Transport>
inline void endpoint<Transport>::shard::read_chunk(const std::shared_ptr<channel_type>& ch,
                                                   const std::shared_ptr<incoming>& x, std::uint64_t offset,
                                                   std::uint64_t len) {
  if (x->failed || !ch->is_open()) return;
  const auto off = static_cast<std::size_t>(offset), n = static_cast<std::size_t>(len);
  const std::size_t head = x->buf.size();
  mutable_buffer first, second;
  if (off + n <= head) {
    first = x->buf.bytes().subspan(off, n);
  } else if (off >= head) {
    first = x->tail.subspan(off - head, n);
  } else {
    first = x->buf.bytes().subspan(off);
    second = x->tail.first(off + n - head);
  }
  ++x->reads;
  if (!second.empty()) {
    ch->read_payload(first, [this, ch = ch, x = x, second](std::error_code e) {
      if (e) return chunk_read(ch, x, e);
      ch->read_payload(second, [this, ch = ch, x = x](std::error_code e2) { chunk_read(ch, x, e2); });
    });
    return;
  }
  ch->read_payload(first, [this, ch = ch, x = x](std::error_code e) { chunk_read(ch, x, e); });
}

// A chunk's payload was read (or failed): the transfer's count, then the lane's next frame.
template <transport Transport>
inline void endpoint<Transport>::shard::chunk_read(const std::shared_ptr<channel_type>& ch,
                                                   const std::shared_ptr<incoming>& x, std::error_code e) {
  --x->reads;
  if (e && !x->failed) {
    x->failed = true;
    x->error = make_error_code(closing_ ? errc::cancelled : errc::connection_reset);
  }
  if (!e) {
    --x->chunks_left;
    x->last_chunk = util::coarse_now();
  }
  finish_transfer(x);
  if (closing_) return;
  if (e) return inbound_failed(ch, e);
  read_next(ch);
}

// Chunk 0 travels on the sender's ordered lane: matching it to a recv here
// keeps per-(peer, key) FIFO with the peer's other frames.
template <transport Transport>
inline void endpoint<Transport>::shard::bind_transfer(const std::shared_ptr<incoming>& x) {
  x->ordered = true;
  slot& s = slot_for(std::get<0>(x->id), x->key);
  while (!s.waiting.empty() && s.waiting.front()->done) s.waiting.pop_front();
  if (!s.waiting.empty()) {
    std::shared_ptr<recv_op> op = std::move(s.waiting.front());
    s.waiting.pop_front();
    if (x->buf.empty() && op->has_dst && op->dst_size() == x->total) {
      x->buf = op->dst.share();
      x->tail = op->tail;
    }
    op->xfer = x;
    x->op = std::move(op);
  } else {
    s.arrived.push_back(arrival{tensor_buffer(), x});
  }
}

// Completes a transfer once its last chunk is in (or it failed) and no chunk
// read still writes into its buffer.
template <transport Transport>
inline void endpoint<Transport>::shard::finish_transfer(const std::shared_ptr<incoming>& x) {
  if (x->reads != 0) return;
  if (!x->failed && (x->chunks_left != 0 || !x->ordered)) return;
  auto it = transfers_.find(x->id);
  if (it == transfers_.end() || it->second != x) return;  // already finished
  transfers_.erase(it);
  std::shared_ptr<recv_op> op = std::move(x->op);
  if (op) op->xfer.reset();
  held_ref held = std::move(x->held);
  if (x->failed) {
    x->buf.reset();
    held.reset();
    if (op) return complete(*op, op->timed_out ? make_error_code(errc::timed_out) : x->error, tensor_buffer());
    drop_arrival(x);
    return;
  }
  tensor_buffer buf = std::move(x->buf);
  if (op) {
    held.reset();
    if (op->has_dst && op->dst.size() == buf.size() && op->dst.data() == buf.data()) {
      return complete_filled(*op, op->dst.share());
    }
    return hand_over(*op, std::move(buf));
  }
  slot* s = find_slot(std::get<0>(x->id), x->key);
  if (s == nullptr) return;
  for (arrival& a : s->arrived) {
    if (a.pending == x) {
      a.pending.reset();
      a.buf = std::move(buf);
      // Unmatched from now on: its age counts from here (options.unmatched_max_age).
      if (!held) held = charge(*x->account, arrival_cost(x->key), true, std::get<1>(x->id));
      held->since = util::coarse_now();
      note_arrival(held);
      a.held = std::move(held);
      return;
    }
  }
}

template <transport Transport>
inline void endpoint<Transport>::shard::drop_arrival(const std::shared_ptr<incoming>& x) {
  slot* s = find_slot(std::get<0>(x->id), x->key);
  if (s == nullptr) return;
  s->arrived.erase_if([&](const arrival& a) { return a.pending == x; });
}

template <transport Transport>
inline void endpoint<Transport>::shard::fail_transfers(const std::string& peer, std::uint64_t incarnation,
                                                       std::error_code ec) {
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

/// Hands `b` to the first receive waiting on (peer, key) and returns nullptr,
/// or, with none, stores it and returns the arrival (valid until the next
/// change to that slot): the caller charges it (hold()).
template <transport Transport>
inline auto endpoint<Transport>::shard::deliver(std::string_view peer, std::string_view key, tensor_buffer b)
    -> arrival* {
  return deliver(peer, key, std::move(b), detail::slot_hash_of(peer, key));
}

/// deliver() with `h` = detail::slot_hash_of(peer, key).
template <transport Transport>
inline auto endpoint<Transport>::shard::deliver(std::string_view peer, std::string_view key, tensor_buffer b,
                                                std::uint64_t h) -> arrival* {
  if constexpr (rdma_transport<Transport>) direct_.on_delivered(peer, key);  // RDMA direct placement
  slot& s = slot_for(peer, key, h);
  while (!s.waiting.empty()) {
    std::shared_ptr<recv_op> op = std::move(s.waiting.front());
    s.waiting.pop_front();
    if (op->done) continue;
    hand_over(*op, std::move(b));
    return nullptr;
  }
  s.arrived.push_back(arrival{std::move(b), nullptr, held_ref()});
  return &*std::prev(s.arrived.end());
}

// A tensor written into a destination whose receive timed out meanwhile (RDMA
// direct placement), copied out: delivered and held like any arrival.
template <transport Transport>
inline void endpoint<Transport>::shard::deliver_late(const std::shared_ptr<channel_type>& ch, std::string_view peer,
                                                     std::string_view key, tensor_buffer b) {
  const auto it = in_.find(ch.get());
  recv_account& account = it != in_.end() && it->second.account != nullptr ? *it->second.account : account_of(peer);
  const std::uint64_t incarnation = it != in_.end() ? it->second.incarnation : account.incarnation;
  hold(deliver(peer, key, std::move(b)), account, incarnation, key, held_ref());
}

template <transport Transport>
inline void endpoint<Transport>::shard::hand_over(recv_op& op, tensor_buffer b) {
  if (!op.has_dst) return complete(op, {}, std::move(b));
  if (!op.tail.empty()) {
    // A split destination takes a tensor of its size; any other is handed over as it came.
    if (op.dst_size() != b.size()) return complete(op, {}, std::move(b));
    if (!op.dst.empty()) std::memcpy(op.dst.data(), b.data(), op.dst.size());
    std::memcpy(op.tail.data(), b.data() + op.dst.size(), op.tail.size());
  } else {
    if (op.dst.size() != b.size()) return complete(op, make_error_code(errc::size_mismatch), tensor_buffer());
    if (b.size() != 0) std::memcpy(op.dst.data(), b.data(), b.size());
  }
  complete_filled(op, op.dst.share());
}

template <transport Transport>
inline void endpoint<Transport>::shard::on_recv_deadline(const std::shared_ptr<recv_op>& op) {
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

template <transport Transport>
inline void endpoint<Transport>::shard::inbound_failed(const std::shared_ptr<channel_type>& ch, std::error_code ec,
                                                       std::string why) {
  auto it = in_.find(ch.get());
  if (it == in_.end()) return;
  const std::string peer = it->second.peer;
  const std::uint64_t incarnation = it->second.incarnation;
  out_peer* const out = it->second.out;
  recv_account* const it_account = it->second.account;
  unpark(ch.get());
  in_.erase(it);
  ch->close();
  // A lane we send on too (reverse lanes) takes our lanes to that peer down with it.
  if (out != nullptr) drop_outbound(*out, ch);
  const bool orderly = ec == make_error_code(errc::connection_closed);
  if (!orderly) {
    if (it_account != nullptr) it_account->last_error = ec;
    log_limited("closing", "closing connection from " + (peer.empty() ? std::string("?") : peer) + " (" + remote(*ch) +
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
        unpark(i->first);
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
  ep_.note_lost(peer, ec.message() + (why.empty() ? std::string() : " (" + why + ")"));
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

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
