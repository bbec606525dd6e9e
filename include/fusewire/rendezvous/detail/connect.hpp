#pragma once
/// A shard's outbound connections: connect with retry and backoff, reverse lanes, striping lanes.

#include <fusewire/rendezvous/detail/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

template <transport Transport>
inline void endpoint<Transport>::shard::connect(out_peer& p) {
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
    // A peer that accepts but never answers (stopped, overloaded, not fusewire)
    // does not hold the connection: past the deadline it is closed and retried.
    const timer_id deadline = reactor_->run_after(
        ep_.opts_.handshake_timeout, [this, pp, weak = std::weak_ptr<channel_type>(ch)](std::error_code te) {
          if (te || closing_) return;
          if (auto c = weak.lock()) {
            log_limited("connect-timeout", "no handshake answer from " + pp->task.to_string() + " within " +
                                               std::to_string(ep_.opts_.handshake_timeout.count()) +
                                               " ms (FUSEWIRE_HANDSHAKE_TIMEOUT_MS); connecting again");
            c->close();
          }
        });
    protocol::handshake_connect(
        ch, identity_, pp->task, [this, pp, ch, deadline](std::error_code e, protocol::peer_identity who) {
          if (closing_) return ch->close();
          reactor_->cancel(deadline);
          if (e) {
            pp->last_error = e;
            ch->close();
            if (e == make_error_code(errc::auth_failed)) {
              // Permanent: the same token will be refused again, so no retry storm.
              log("handshake with " + pp->task.to_string() + " failed: " + e.message() +
                  "; every send to it fails from now on (check FUSEWIRE_CLUSTER_TOKEN on both tasks)");
              pp->connecting = false;
              pp->refused = e;
              return fail_waiting(*pp, e);
            }
            if (e == make_error_code(errc::handshake_failed)) {
              log_limited("handshake", "handshake with " + pp->task.to_string() + " failed: " + e.message());
              pp->connecting = false;
              return fail_waiting(*pp, e);
            }
            return retry(*pp, e);
          }
          pp->ch = ch;
          pp->ready = true;
          pp->connecting = false;
          pp->was_connected = true;
          pp->last_write = util::coarse_now();
          ep_.made_.fetch_add(1, std::memory_order_relaxed);
          if (peer_cells* c = ep_.cells(pp->index)) bump(c->connects);
          watch_lane(*pp, ch, who.incarnation);
          auto waiting = std::move(pp->waiting);
          for (auto& op : waiting) {
            if (!op->done) enqueue(*pp, op);
          }
        });
  });
}

template <transport Transport>
inline void endpoint<Transport>::shard::retry(out_peer& p, std::error_code ec) {
  const auto limit = ep_.opts_.connect_timeout;
  p.last_error = ec;
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

template <transport Transport>
inline void endpoint<Transport>::shard::fail_waiting(out_peer& p, std::error_code ec) {
  auto waiting = std::move(p.waiting);
  for (auto& op : waiting) complete(*op, ec);
}

// The peer answers our pings with pongs. When we offered it reverse lanes,
// any other frame means it sends on this connection too: from then on the
// connection is read like one it made (on_frame). An error, or any other
// frame without that offer, means it is gone.
template <transport Transport>
inline void endpoint<Transport>::shard::watch_lane(out_peer& p, std::shared_ptr<channel_type> ch,
                                                   std::uint64_t incarnation) {
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
      in.account = &account_of(in.peer);
      in.last_frame = util::coarse_now();
      in.out = pp;
      down_.erase(in.peer);
      ep_.note_back(in.peer);
      note_incarnation(*in.account, incarnation);
      return on_frame(ch, ec, std::move(head));
    }
    drop_outbound(*pp, ch);
  });
}

// Reverse lanes: a connection `name` made to us, on which it reads our
// frames, becomes our ordered lane to it (we keep it until it breaks).
template <transport Transport>
inline bool endpoint<Transport>::shard::adopt(out_peer& p, const std::string& name) {
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
template <transport Transport>
inline void endpoint<Transport>::shard::drop_outbound(out_peer& p, const std::shared_ptr<channel_type>& ch) {
  ch->close();
  unanswered_.erase(ch.get());
  const bool ours = p.ch == ch || std::find(p.extra.begin(), p.extra.end(), ch) != p.extra.end();
  if (!ours) return;
  if (p.ready) {
    if (peer_cells* c = ep_.cells(p.index)) bump(c->lost);
  }
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
template <transport Transport>
inline void endpoint<Transport>::shard::connect_lanes(out_peer& p) {
  p.extra_started = true;
  fusewire::net_address where;
  try {
    where = ep_.spec_.fast_path_endpoint(p.task);
  } catch (const std::system_error&) {
    return;
  }
  const std::uint64_t gen = p.generation;
  for (unsigned i = 1; i < ep_.tuning_.stripes; ++i) {
    ep_.transport_.connect(
        *reactor_, where.host, where.port, [this, pp = &p, gen](std::error_code ec, connection_type c) {
          if (closing_ || ec || pp->generation != gen || !pp->ready) return c.close();
          auto ch = std::make_shared<channel_type>(std::move(c), limits_);
          protocol::handshake_connect(ch, identity_, pp->task,
                                      [this, pp, ch, gen](std::error_code e, protocol::peer_identity who) {
                                        if (closing_ || e || pp->generation != gen || !pp->ready) return ch->close();
                                        pp->extra.push_back(ch);
                                        ep_.made_.fetch_add(1, std::memory_order_relaxed);
                                        watch_lane(*pp, ch, who.incarnation);
                                      });
        });
  }
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
