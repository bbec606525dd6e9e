#pragma once
/// A shard's receive budget: what tensors no receive took yet and the
/// endpoint's own transfer buffers may hold (options.recv_budget,
/// recv_peer_budget), the connections left unread while it is full, and what
/// is dropped (idle partial transfers, a restarted peer's leftovers, arrivals
/// kept too long).

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
  arm_sweep();
  return held_ref(p);
}

// Adds `n` bytes to what `held` charges, whatever the budget.
template <transport Transport>
inline void endpoint<Transport>::shard::charge_more(held_ref& held, std::size_t n) {
  held->bytes += n;
  held->account->held += n;
  held_here_ += n;
  if (n != 0) ep_.held_.fetch_add(n, std::memory_order_relaxed);
  arm_sweep();
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
  note_arrival(held);
  a->held = std::move(held);
}

template <transport Transport>
inline void endpoint<Transport>::shard::note_arrival(const held_ref& held) noexcept {
  const auto age = ep_.opts_.unmatched_max_age;
  if (age.count() != 0) next_age_check_ = std::min(next_age_check_, held->since + age);
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
  ep_.count_peer_event(a.peer, &peer_cells::recv_pauses);
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

// A peer process we had not seen before on an inbound connection of task
// `a.peer`: the previous one is gone, and what it left (tensors no receive
// took, partial transfers, its connections) with it.
template <transport Transport>
inline void endpoint<Transport>::shard::note_incarnation(recv_account& a, std::uint64_t incarnation) {
  if (a.incarnation == incarnation) return;
  const std::uint64_t previous = a.incarnation;
  a.incarnation = incarnation;
  if (previous == 0) return;
  std::vector<std::shared_ptr<incoming>> transfers;
  for (auto& [k, x] : transfers_) {
    if (std::get<0>(k) == a.peer && std::get<1>(k) != incarnation && !x->failed) transfers.push_back(x);
  }
  std::uint64_t arrivals = 0;
  slots_.for_each([&](std::string_view peer, std::string_view, slot& s) {
    if (peer != a.peer || s.arrived.empty()) return;
    s.arrived.erase_if([&](const arrival& x) {
      const bool stale = !x.pending && x.held && x.held->incarnation != incarnation;
      arrivals += stale ? 1 : 0;
      return stale;
    });
  });
  for (const std::shared_ptr<incoming>& x : transfers) {
    x->failed = true;
    x->error = make_error_code(errc::connection_reset);
    finish_transfer(x);
  }
  ep_.arrivals_dropped_restart_.fetch_add(arrivals, std::memory_order_relaxed);
  ep_.transfers_dropped_restart_.fetch_add(transfers.size(), std::memory_order_relaxed);
  ep_.count_peer_event(a.peer, &peer_cells::dropped, arrivals + transfers.size());
  if (arrivals != 0 || !transfers.empty()) {
    log_limited("restart", a.peer + " restarted: dropped " + std::to_string(arrivals) +
                               " tensors no receive took and " + std::to_string(transfers.size()) +
                               " partial transfers of its previous process");
  }
  std::shared_ptr<channel_type> old;
  for (auto& [raw, in] : in_) {
    if (in.peer == a.peer && in.incarnation != incarnation) old = in.ch;
  }
  // Failing one fails all of that process's connections.
  if (old) inbound_failed(old, make_error_code(errc::connection_reset), "the peer restarted");
}

// One timer per shard, running only while something is held or a transfer is
// under way (not one per arrival).
template <transport Transport>
inline void endpoint<Transport>::shard::arm_sweep() {
  if (sweep_timer_ || closing_ || reactor_ == nullptr) return;
  const options& o = ep_.opts_;
  clock::duration shortest = clock::duration::max();
  if (o.transfer_idle.count() != 0) shortest = std::min<clock::duration>(shortest, o.transfer_idle);
  if (o.unmatched_max_age.count() != 0) shortest = std::min<clock::duration>(shortest, o.unmatched_max_age);
  if (shortest == clock::duration::max()) return;
  using std::chrono::milliseconds;
  const clock::duration period = std::clamp<clock::duration>(shortest / 4, milliseconds(10), milliseconds(1000));
  sweep_timer_ = reactor_->run_after(period, [this](std::error_code ec) {
    sweep_timer_ = {};
    if (ec || closing_) return;
    sweep();
    const options& opts = ep_.opts_;
    if ((opts.transfer_idle.count() != 0 && !transfers_.empty()) ||
        (opts.unmatched_max_age.count() != 0 && held_here_ != 0)) {
      arm_sweep();
    }
  });
}

template <transport Transport>
inline void endpoint<Transport>::shard::sweep() {
  const options& o = ep_.opts_;
  const auto now = util::coarse_now();
  if (o.transfer_idle.count() != 0 && !transfers_.empty()) {
    std::vector<std::shared_ptr<incoming>> idle;
    for (auto& [k, x] : transfers_) {
      if (x->failed) continue;
      // Unread because of us (the budget is full), not the peer.
      if (x->account->parked != 0) x->last_chunk = now;
      if (now - x->last_chunk >= o.transfer_idle) idle.push_back(x);
    }
    if (!idle.empty()) drop_idle(idle, now);
  }
  if (o.unmatched_max_age.count() != 0 && now >= next_age_check_) drop_aged(now);
}

// Partial transfers that got no chunk for options.transfer_idle: their
// receives fail with errc::timed_out, their memory goes, and so do their
// peers' connections (later chunks would have no transfer to go to).
template <transport Transport>
inline void endpoint<Transport>::shard::drop_idle(const std::vector<std::shared_ptr<incoming>>& idle,
                                                  clock::time_point now) {
  using std::chrono::milliseconds;
  std::vector<std::pair<std::shared_ptr<incoming>, std::string>> dropped;
  for (const std::shared_ptr<incoming>& x : idle) {
    x->failed = true;
    x->error = make_error_code(errc::timed_out);
    const auto quiet = std::chrono::duration_cast<milliseconds>(now - x->last_chunk).count();
    dropped.emplace_back(x, "dropped its partial transfer of key '" + util::printable(x->key) + "' (" +
                                std::to_string(x->count - x->chunks_left) + " of " + std::to_string(x->count) +
                                " chunks of " + std::to_string(x->total) + " bytes): no chunk for " +
                                std::to_string(quiet) + " ms (FUSEWIRE_TRANSFER_IDLE_MS)");
  }
  ep_.transfers_dropped_idle_.fetch_add(idle.size(), std::memory_order_relaxed);
  for (const std::shared_ptr<incoming>& x : idle) ep_.count_peer_event(std::get<0>(x->id), &peer_cells::dropped);
  for (auto& [x, why] : dropped) {
    std::shared_ptr<channel_type> lane;
    for (auto& [raw, in] : in_) {
      if (in.peer == std::get<0>(x->id) && in.incarnation == std::get<1>(x->id)) lane = in.ch;
    }
    if (lane) {
      inbound_failed(lane, make_error_code(errc::timed_out), why);
    } else {
      log_limited("transfer-idle", "peer " + std::get<0>(x->id) + ": " + why);
    }
    finish_transfer(x);
  }
}

// Tensors no receive took within options.unmatched_max_age.
template <transport Transport>
inline void endpoint<Transport>::shard::drop_aged(clock::time_point now) {
  const auto age = ep_.opts_.unmatched_max_age;
  clock::time_point next = clock::time_point::max();
  std::uint64_t dropped = 0;
  std::string first;
  slots_.for_each([&](std::string_view peer, std::string_view key, slot& s) {
    if (s.arrived.empty()) return;
    s.arrived.erase_if([&](const arrival& a) {
      if (a.pending || !a.held) return false;
      if (now - a.held->since < age) {
        next = std::min(next, a.held->since + age);
        return false;
      }
      if (dropped++ == 0) first = std::string(peer) + ", key '" + util::printable(key) + "'";
      ep_.count_peer_event(peer, &peer_cells::dropped);
      return true;
    });
  });
  next_age_check_ = next;
  if (dropped == 0) return;
  ep_.arrivals_dropped_age_.fetch_add(dropped, std::memory_order_relaxed);
  log_limited("unmatched-age", "dropped " + std::to_string(dropped) + " tensors no receive took within " +
                                   std::to_string(age.count()) +
                                   " ms (FUSEWIRE_UNMATCHED_MAX_AGE_MS); the first from " + first);
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
