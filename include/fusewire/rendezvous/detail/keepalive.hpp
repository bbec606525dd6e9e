#pragma once
/// A shard's keepalive: pings on idle lanes, and dropping peers that went silent.

#include <fusewire/rendezvous/detail/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

// Keepalive (options.keepalive = k): every k, an idle outbound lane gets a
// ping; a lane whose ping is unanswered after 2k is dropped (its sends fail),
// and an inbound connection with no frame for 3k is closed (its receives
// fail); see keepalive_tick for when silence is judged.
template <transport Transport>
inline void endpoint<Transport>::shard::arm_keepalive() {
  keepalive_due_ = clock::now() + ep_.opts_.keepalive;
  keepalive_timer_ = reactor_->run_at(keepalive_due_, [this](std::error_code ec) {
    keepalive_timer_ = {};
    if (ec || closing_) return;
    keepalive_tick();
    arm_keepalive();
  });
}

template <transport Transport>
inline void endpoint<Transport>::shard::keepalive_tick() {
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

template <transport Transport>
inline void endpoint<Transport>::shard::judge_silence() {
  const auto k = ep_.opts_.keepalive;
  const auto now = util::coarse_now();
  // A peer we stopped reading (receive budget) is not silent: its frames,
  // pongs among them, wait in the socket for us.
  const auto paused = [&](const std::string& peer) {
    if (parked_ == 0) return false;
    const auto a = accounts_.find(peer);
    return a != accounts_.end() && a->second.parked != 0;
  };
  for (auto& [name, p] : out_) {
    if (!p.ready || !p.ch) continue;
    std::vector<std::shared_ptr<channel_type>> lanes{p.ch};
    lanes.insert(lanes.end(), p.extra.begin(), p.extra.end());
    const bool unread = paused(name);
    for (auto& lane : lanes) {
      auto u = unanswered_.find(lane.get());
      if (u == unanswered_.end()) continue;
      if (unread) u->second = now;
      if (now - u->second < 2 * k) continue;
      const std::string silent =
          "did not answer keepalive pings for " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - u->second).count()) + " ms";
      log("peer " + name + " " + silent + "; dropping its connections");
      ep_.note_lost(name, silent);
      drop_outbound(p, lane);  // the peer's lanes live and die together
      break;
    }
  }
  std::vector<std::shared_ptr<channel_type>> silent;
  for (auto& [raw, in] : in_) {
    if (in.account != nullptr && in.account->parked != 0) in.last_frame = now;
    if (!in.peer.empty() && now - in.last_frame >= 3 * k) silent.push_back(in.ch);
  }
  for (auto& ch : silent) {
    inbound_failed(ch, make_error_code(errc::timed_out),
                   "no frame for " + std::to_string(3 * k.count()) + " ms (keepalive)");
  }
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
