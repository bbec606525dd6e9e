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
    if (ec) {
      if (ec == make_error_code(errc::cancelled)) return;
      log("accept failed: " + ec.message());
      return accept();
    }
    accept();
    auto ch = std::make_shared<channel_type>(std::move(c), limits_);
    in_.emplace(ch.get(), inbound{ch, {}});
    protocol::handshake_accept_deferred(
        ch, identity_, ep_.spec_,
        [this, ch](std::error_code e, protocol::peer_identity peer, std::string why, protocol::pending_ack ack) {
          if (closing_) return;
          if (e) {
            log("refused connection from " + remote(*ch) + ": " + e.message() +
                (why.empty() ? std::string() : " (" + why + ")"));
            ch->close();
            in_.erase(ch.get());
            return;
          }
          const unsigned owner = ep_.shard_of(peer.task);
          if (owner == index_) return admit(ch, std::move(peer), std::move(ack));
          if constexpr (handoff_transport<Transport>) hand_off(ch, owner, std::move(peer), std::move(ack));
        });
  });
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
  in.last_frame = util::coarse_now();
  in.reverse = (peer.features & protocol::feature_reverse) != 0;
  down_.erase(in.peer);
  protocol::write_ack(*ch, ack, [this, ch](std::error_code e) {
    if (closing_) return;
    // Lost before its first frame: its receives fail as on any lost connection.
    if (e) return inbound_failed(ch, e, "sending hello_ack");
    ep_.accepted_.fetch_add(1, std::memory_order_relaxed);
    read_next(ch);
  });
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
          return log("refused connection from " + peer.task.to_string() + " (" + remote(*ch) +
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
