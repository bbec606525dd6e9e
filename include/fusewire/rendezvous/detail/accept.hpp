#pragma once
/// A shard's accept path: the handshake, and the hand-off of a connection to
/// the reactor that owns its peer.

#include <fusewire/rendezvous/detail/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

template <transport Transport>
inline void endpoint<Transport>::shard::accept() {
  listener_.async_accept([this](std::error_code ec, connection_type c) {
    if (closing_) return c.close();
    if (ec) return accept_failed(ec);
    accept_backoff_ = clock::duration::zero();
    accept();
    // Until it authenticates, a peer gets small frames only: a few KiB at most.
    auto ch = std::make_shared<channel_type>(std::move(c), protocol::handshake_limits());
    if (!admit_handshake(ch)) return;
    in_.emplace(ch.get(), inbound{ch, {}});
    protocol::handshake_accept_deferred(
        ch, identity_, ep_.spec_,
        [this, ch](std::error_code e, protocol::peer_identity peer, std::string why, protocol::pending_ack ack) {
          if (closing_) return;
          end_handshake(ch.get());
          if (e) {
            // cancelled: closed here (its deadline passed), and said so then.
            if (e != make_error_code(errc::cancelled)) {
              log_limited("refused", "refused connection from " + remote(*ch) + ": " + e.message() +
                                         (why.empty() ? std::string() : " (" + util::printable(why, 256) + ")"));
            }
            ch->close();
            in_.erase(ch.get());
            return;
          }
          ch->set_limits(limits_);
          const unsigned owner = ep_.shard_of(peer.task);
          if (owner == index_) return admit(ch, std::move(peer), std::move(ack));
          if constexpr (handoff_transport<Transport>) hand_off(ch, owner, std::move(peer), std::move(ack));
        });
  });
}

// Out of descriptors or memory (EMFILE, ENFILE, ENOMEM, ENOBUFS), accepting at
// once fails at once again: the listener waits, doubling from 10 ms to 1 s,
// and says so a few times per interval, not once per failure. A connection
// that died in the accept queue is no reason to wait.
template <transport Transport>
inline void endpoint<Transport>::shard::accept_failed(std::error_code ec) {
  if (ec == make_error_code(errc::cancelled)) return;
  if (ec == make_error_code(errc::connection_reset) || ec == std::errc::interrupted ||
      ec == std::errc::resource_unavailable_try_again) {
    return accept();
  }
  using std::chrono::milliseconds;
  accept_backoff_ = accept_backoff_ == clock::duration::zero()
                        ? clock::duration(milliseconds(10))
                        : std::min<clock::duration>(accept_backoff_ * 2, milliseconds(1000));
  log_limited("accept", "accept failed: " + ec.message() + "; accepting again in " +
                            std::to_string(std::chrono::duration_cast<milliseconds>(accept_backoff_).count()) + " ms");
  reactor_->run_after(accept_backoff_, [this](std::error_code e) {
    if (e || closing_) return;
    accept();
  });
}

// A connection that has not authenticated is bounded three ways: how many
// there are (in all and per source address), how long each may take, and
// what it may send (protocol::handshake_limits). Past a bound it is closed.
template <transport Transport>
inline bool endpoint<Transport>::shard::admit_handshake(const std::shared_ptr<channel_type>& ch) {
  std::string source = source_of(remote(*ch));
  const options& o = ep_.opts_;
  const auto per_source = handshaking_by_source_.find(source);
  const std::size_t from_source = per_source == handshaking_by_source_.end() ? 0 : per_source->second;
  if (handshaking_.size() >= o.max_pending_handshakes || from_source >= o.max_pending_per_source) {
    const bool total = handshaking_.size() >= o.max_pending_handshakes;
    log_limited("handshake-cap", "closed a connection from " + source + ": " +
                                     std::to_string(total ? handshaking_.size() : from_source) +
                                     (total ? " connections are in their handshake (FUSEWIRE_MAX_PENDING_HANDSHAKES)"
                                            : " connections from that address are in their handshake "
                                              "(FUSEWIRE_MAX_PENDING_PER_SOURCE)"));
    ch->close();
    return false;
  }
  ++handshaking_by_source_[source];
  const timer_id deadline = reactor_->run_after(
      o.handshake_timeout, [this, raw = ch.get(), weak = std::weak_ptr<channel_type>(ch)](std::error_code e) {
        if (e || closing_) return;
        const auto it = handshaking_.find(raw);
        const std::shared_ptr<channel_type> c = weak.lock();
        if (it == handshaking_.end() || !c) return;
        log_limited("handshake-timeout", "closed the connection from " + it->second.source + ": no handshake within " +
                                             std::to_string(ep_.opts_.handshake_timeout.count()) +
                                             " ms (FUSEWIRE_HANDSHAKE_TIMEOUT_MS)");
        c->close();
      });
  handshaking_.emplace(ch.get(), handshaking{std::move(source), deadline});
  return true;
}

template <transport Transport>
inline void endpoint<Transport>::shard::end_handshake(channel_type* ch) {
  const auto it = handshaking_.find(ch);
  if (it == handshaking_.end()) return;
  reactor_->cancel(it->second.deadline);
  if (const auto s = handshaking_by_source_.find(it->second.source); s != handshaking_by_source_.end()) {
    if (--s->second == 0) handshaking_by_source_.erase(s);
  }
  handshaking_.erase(it);
}

// The peer is verified and waits for our hello_ack; once that is written,
// its frames are read here. It counts as connected already now, not from
// when the ack's write completes: it sends as soon as it has the ack, and a
// receive for it started before that completion ran must wait, not fail as
// if the peer were still down.
template <transport Transport>
inline void endpoint<Transport>::shard::admit(const std::shared_ptr<channel_type>& ch, protocol::peer_identity peer,
                                              protocol::pending_ack ack) {
  inbound& in = in_.try_emplace(ch.get(), inbound{ch, {}}).first->second;
  in.peer = peer.task.to_string();
  in.incarnation = peer.incarnation;
  in.account = &account_of(in.peer);
  in.last_frame = util::coarse_now();
  in.reverse = (peer.features & protocol::feature_reverse) != 0;
  down_.erase(in.peer);
  ep_.note_back(in.peer);
  // After it is in in_: receives waiting for this task keep waiting, for the
  // newcomer. What the previous process left (connections, tensors nobody
  // took, partial transfers) goes.
  log_new_incarnation(ch.get(), in.peer, in.incarnation);
  note_incarnation(*in.account, in.incarnation);
  protocol::write_ack(*ch, ack, [this, ch](std::error_code e) {
    if (closing_) return;
    // Lost before its first frame: its receives fail as on any lost connection.
    if (e) return inbound_failed(ch, e, "sending hello_ack");
    ep_.accepted_.fetch_add(1, std::memory_order_relaxed);
    read_next(ch);
  });
}

// A task is one process at a time: a connection from a new incarnation of a
// task whose older connections are still open means it restarted (or, without
// a token, that someone else claims its name). The old connections are closed
// (note_incarnation); this says so.
template <transport Transport>
inline void endpoint<Transport>::shard::log_new_incarnation(channel_type* self, const std::string& peer,
                                                            std::uint64_t incarnation) {
  std::size_t old = 0;
  std::uint64_t previous = 0;
  for (auto& [raw, in] : in_) {
    if (raw == self || in.peer != peer || in.incarnation == incarnation || !in.ch->is_open()) continue;
    previous = in.incarnation;
    ++old;
  }
  if (old == 0) return;
  log_limited("replace", peer + " connected as a new incarnation (" + std::to_string(incarnation) + ", was " +
                             std::to_string(previous) + "): its " + std::to_string(old) +
                             " older connection(s) are closed" +
                             (identity_.token.empty() ? " (no cluster token: the claim is not authenticated)" : ""));
}

// A connection accepted here whose peer another reactor owns: its socket
// moves there (the peer sends nothing until it has our hello_ack, which the
// owner sends), so every frame of that peer is read where its receives wait.
template <transport Transport>
inline void endpoint<Transport>::shard::hand_off(const std::shared_ptr<channel_type>& ch, unsigned owner,
                                                 protocol::peer_identity peer, protocol::pending_ack ack)
  requires handoff_transport<Transport>
{
  in_.erase(ch.get());
  ch->connection().async_release(
      [this, ch, owner, peer = std::move(peer), ack = std::move(ack)](std::error_code e, int fd) mutable {
        detail::owned_fd socket(fd);
        if (closing_ || e == make_error_code(errc::cancelled)) return;
        if (e == make_error_code(errc::invalid_argument)) {
          return log_limited("refused", "refused connection from " + peer.task.to_string() + " (" + remote(*ch) +
                                            "): it sent before the handshake ended");
        }
        if (e) {
          return log("lost the connection from " + peer.task.to_string() + " (" + remote(*ch) +
                     ") while moving it to reactor " + std::to_string(owner) + ": " + e.message());
        }
        shard* target = ep_.shard_list_[owner].get();
        // Refused (the endpoint is stopping): the task dies unrun and closes the socket.
        (void)ep_.group_->submit_to(
            owner, [target, socket = std::move(socket), peer = std::move(peer), ack = std::move(ack)]() mutable {
              target->take_accepted(std::move(socket), std::move(peer), std::move(ack));
            });
      });
}

template <transport Transport>
inline void endpoint<Transport>::shard::take_accepted(detail::owned_fd socket, protocol::peer_identity peer,
                                                      protocol::pending_ack ack)
  requires handoff_transport<Transport>
{
  if (closing_) return;
  std::error_code ec;
  connection_type c = ep_.transport_.adopt(*reactor_, socket.release(), ec);
  if (ec) return log("cannot take over the connection from " + peer.task.to_string() + ": " + ec.message());
  admit(std::make_shared<channel_type>(std::move(c), limits_), std::move(peer), std::move(ack));
}

/// "host:port" or "[v6]:port" less its port: what per-source limits count by.
template <transport Transport>
inline std::string endpoint<Transport>::shard::source_of(const std::string& remote) {
  const std::size_t colon = remote.rfind(':');
  if (colon == std::string::npos || colon == 0) return remote;
  return remote.substr(0, colon);
}

template <transport Transport>
inline std::string endpoint<Transport>::shard::remote(channel_type& ch) {
  try {
    return ch.remote_endpoint();
  } catch (...) {
    return "?";
  }
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
