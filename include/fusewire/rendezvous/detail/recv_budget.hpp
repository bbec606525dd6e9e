#pragma once
/// A shard's receive budget: what tensors no receive took yet and the
/// endpoint's own transfer buffers may hold (options.recv_budget,
/// recv_peer_budget), and the connections left unread while it is full.

#include <fusewire/rendezvous/detail/shard.hpp>
#include <fusewire/util/text.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

template <transport Transport>
inline auto endpoint<Transport>::shard::account_of(std::string_view peer) -> recv_account& {
  auto it = accounts_.find(peer);
  if (it == accounts_.end()) {
    it = accounts_.emplace(std::string(peer), recv_account{}).first;
    it->second.peer = it->first;
  }
  return it->second;
}

// What one stored tensor costs besides its bytes (its slot, key and records):
// a peer that sends empty tensors on ever new keys is bounded too.
template <transport Transport>
inline std::size_t endpoint<Transport>::shard::arrival_cost(std::string_view key) noexcept {
  return 256 + key.size();
}

// Whether `n` more bytes fit `a`'s share and the process total. Where nothing
// is held, anything fits: a lone tensor above the budget still arrives.
template <transport Transport>
inline bool endpoint<Transport>::shard::room(const recv_account& a, std::size_t n) {
  const options& o = ep_.opts_;
  if (a.held != 0 && a.held + n > o.recv_peer_budget) return false;
  const std::size_t total = ep_.held_.load(std::memory_order_relaxed);
  if (total == 0 || total + n <= o.recv_budget) return true;
  starved_on_total(total);
  return false;
}

// The process total is full (at `seen`): a release on another reactor wakes
// this one; one that came before the flag could be seen shows here instead
// (both sides seq_cst).
template <transport Transport>
inline void endpoint<Transport>::shard::starved_on_total(std::size_t seen) {
  starved_by_total_.store(true);
  if (ep_.held_.load() < seen) schedule_resume();
}

// `n` bytes for `a`'s peer, or nothing when they do not fit (unless `forced`:
// bytes already read, or a receive waits for them).
template <transport Transport>
inline auto endpoint<Transport>::shard::charge(recv_account& a, std::size_t n, bool forced, std::uint64_t incarnation)
    -> held_ref {
  const options& o = ep_.opts_;
  if (!forced && a.held != 0 && a.held + n > o.recv_peer_budget) return held_ref();
  if (!forced) {
    // The total is shared with the other reactors: room is claimed, not just seen.
    std::size_t total = ep_.held_.load(std::memory_order_relaxed);
    do {
      if (total != 0 && total + n > o.recv_budget) {
        starved_on_total(total);
        return held_ref();
      }
    } while (!ep_.held_.compare_exchange_weak(total, total + n, std::memory_order_relaxed));
  } else if (n != 0) {
    ep_.held_.fetch_add(n, std::memory_order_relaxed);
  }
  auto* p = new held_bytes;
  p->owner = this;
  p->account = &a;
  p->bytes = n;
  p->since = util::coarse_now();
  p->incarnation = incarnation;
  p->next = charges_;
  if (charges_ != nullptr) charges_->prev = p;
  charges_ = p;
  a.held += n;
  held_here_ += n;
  return held_ref(p);
}

// Adds `n` bytes to what `held` charges, whatever the budget.
template <transport Transport>
inline void endpoint<Transport>::shard::charge_more(held_ref& held, std::size_t n) {
  held->bytes += n;
  held->account->held += n;
  held_here_ += n;
  if (n != 0) ep_.held_.fetch_add(n, std::memory_order_relaxed);
}

template <transport Transport>
inline void endpoint<Transport>::shard::release(held_bytes& p) noexcept {
  if (p.prev != nullptr) {
    p.prev->next = p.next;
  } else {
    charges_ = p.next;
  }
  if (p.next != nullptr) p.next->prev = p.prev;
  const std::size_t n = p.bytes;
  p.account->held -= n;
  held_here_ -= n;
  ep_.held_.fetch_sub(n);  // seq_cst: before the flags are read (see charge)
  if (closing_) return;
  try {
    if (parked_ != 0) schedule_resume();
    wake_starved_shards();
  } catch (...) {
    // No memory to post a task: the next release tries again.
  }
}

// A tensor delivered to no receive is held: charged to its peer (`held`:
// what was claimed for it before its payload was read, if anything).
template <transport Transport>
inline void endpoint<Transport>::shard::hold(arrival* a, recv_account& account, std::uint64_t incarnation,
                                             std::string_view key, held_ref held) {
  if (a == nullptr) return;  // a receive took it: `held` goes
  if (!held) held = charge(account, a->buf.size() + arrival_cost(key), true, incarnation);
  a->held = std::move(held);
}

// A receive waits for one of a fused frame's tensors.
template <transport Transport>
inline bool endpoint<Transport>::shard::awaited(std::string_view peer, const protocol::frame_head& head) {
  for (const wire::fused_entry& entry : std::get<wire::fused_meta>(head.body)) {
    if (slot* s = find_slot(peer, entry.key)) {
      for (const std::shared_ptr<recv_op>& op : s->waiting) {
        if (!op->done) return true;
      }
    }
  }
  return false;
}

// The frame whose head was just read does not fit: its payload stays in the
// socket (TCP backpressure; on RDMA its credits are not returned) until memory
// is released or a receive for it is posted (resume_parked()).
template <transport Transport>
inline void endpoint<Transport>::shard::park(inbound& in, protocol::frame_head& head) {
  in.parked_head = std::move(head);
  in.head_parked = true;
  mark_parked(in);
}

// A transfer's buffer does not fit: the chunks parked on it wait in their lanes.
template <transport Transport>
inline void endpoint<Transport>::shard::starve(const std::shared_ptr<incoming>& x) {
  if (!x->starved) {
    x->starved = true;
    starved_.push_back(x);
  }
  for (const auto& pc : x->parked) {
    const auto it = in_.find(static_cast<channel_type*>(pc.lane.get()));
    if (it != in_.end()) mark_parked(it->second);
  }
}

template <transport Transport>
inline void endpoint<Transport>::shard::mark_parked(inbound& in) {
  if (in.parked) return;
  in.parked = true;
  ++in.account->parked;
  ++parked_;
  if (!resuming_) note_pause(*in.account);
}

template <transport Transport>
inline void endpoint<Transport>::shard::unpark(channel_type* ch) {
  const auto it = in_.find(ch);
  if (it == in_.end() || !it->second.parked) return;
  inbound& in = it->second;
  in.parked = false;
  in.head_parked = false;
  in.parked_head = protocol::frame_head{};
  --in.account->parked;
  --parked_;
}

template <transport Transport>
inline void endpoint<Transport>::shard::note_pause(const recv_account& a) {
  ep_.recv_pauses_.fetch_add(1, std::memory_order_relaxed);
  const options& o = ep_.opts_;
  log_limited("recv-budget", "stopped reading from " + a.peer + " until its tensors are received: it holds " +
                                 std::to_string(a.held) +
                                 " bytes (FUSEWIRE_RECV_PEER_BUDGET_BYTES = " + std::to_string(o.recv_peer_budget) +
                                 "), the process " + std::to_string(ep_.held_.load(std::memory_order_relaxed)) +
                                 " (FUSEWIRE_RECV_BUDGET_BYTES = " + std::to_string(o.recv_budget) + ")");
}

template <transport Transport>
inline void endpoint<Transport>::shard::schedule_resume() {
  if (resume_posted_ || closing_ || reactor_ == nullptr) return;
  resume_posted_ = true;
  reactor_->post([this] {
    resume_posted_ = false;
    if (!closing_) resume_parked();
  });
}

// Memory was released or a receive was posted: the parked transfers and
// frames try again (each parks again if it still does not fit and no receive
// waits for it).
template <transport Transport>
inline void endpoint<Transport>::shard::resume_parked() {
  struct flag {
    bool& b;
    explicit flag(bool& v) : b(v) { b = true; }
    ~flag() { b = false; }
  } guard(resuming_);
  for (std::shared_ptr<incoming>& x : std::exchange(starved_, {})) {
    x->starved = false;
    read_parked_chunks(x);
  }
  if (parked_ == 0) return;
  std::vector<std::shared_ptr<channel_type>> lanes;
  for (auto& [raw, in] : in_) {
    if (in.head_parked) lanes.push_back(in.ch);
  }
  for (const std::shared_ptr<channel_type>& ch : lanes) {
    const auto it = in_.find(ch.get());
    if (it == in_.end() || !it->second.head_parked || closing_) continue;
    protocol::frame_head head = std::move(it->second.parked_head);
    unpark(ch.get());
    dispatch(ch, it->second, head);
  }
}

// Memory came back: the reactors whose charge failed on the process total try again.
template <transport Transport>
inline void endpoint<Transport>::shard::wake_starved_shards() {
  for (const std::unique_ptr<shard>& other : ep_.shard_list_) {
    shard* s = other.get();
    if (!s->starved_by_total_.load() || !s->starved_by_total_.exchange(false)) continue;
    if (s == this) {
      schedule_resume();
    } else if (ep_.group_->submit_to(s->index_, [s] { s->schedule_resume(); })) {
      s->starved_by_total_.store(true);  // refused (stopping, or its inbox is full): the next release tries
    }
  }
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
