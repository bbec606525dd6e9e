#pragma once
/// The connection handshake: magic and version (checked by the frame decoder),
/// the peer's task identity, and an optional cluster token.
///
/// Without a token:  connector -> hello;  acceptor -> hello_ack.
/// With a token:     connector -> hello;  acceptor -> auth_challenge(nonce_a);
///                   connector -> auth_response(HMAC(token, "fwc1" nonce_a job index), nonce_c);
///                   acceptor  -> hello_ack(mac = HMAC(token, "fwa1" nonce_c job index)).
/// Each side proves it knows the token without sending it. A side with a token
/// refuses a peer that cannot prove it (errc::auth_failed); a side without a
/// token refuses a challenge (errc::auth_failed). The acceptor answers a refused
/// peer with an `error` frame naming the reason before the caller closes.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/protocol/frame_channel.hpp>
#include <fusewire/protocol/detail/hmac.hpp>
#include <fusewire/wire/meta.hpp>

namespace fusewire {
inline namespace v0 {
namespace protocol {

/// Feature bit in hello: the connector holds a cluster token.
inline constexpr std::uint64_t feature_token = 1;
/// Feature bit in hello: the connector reads frames the acceptor sends back on
/// this connection, so the acceptor may send its own tensors to the connector
/// on it (rendezvous endpoint_tuning::reverse_lanes). Echoed in hello_ack.
inline constexpr std::uint64_t feature_reverse = 2;

/// Who this process is, as the handshake presents it.
struct local_identity {
  task_id self;
  std::uint64_t incarnation = 0;  ///< random per process start
  std::string token;              ///< cluster token; empty = none
  std::uint64_t features = 0;     ///< feature bits offered besides feature_token (feature_reverse)
};

/// What one side of a handshake learned about the other.
struct peer_identity {
  task_id task;
  std::uint64_t incarnation = 0;
  std::uint64_t features = 0;  ///< feature bits it offered (hello) or echoed (hello_ack)
};

/// The acceptor's last handshake message, built but not sent
/// (handshake_accept_deferred): the caller sends it with write_ack(), possibly
/// over another channel on the same socket (after moving it to another reactor).
struct pending_ack {
  std::string job;            ///< meta.job views this when the ack is written
  wire::hello_ack_meta meta;  ///< everything else of the hello_ack
};

/// Writes `ack` on `ch`: `h(error_code)` once the bytes were handed to the kernel.
template <class Channel, class Handler>
void write_ack(Channel& ch, const pending_ack& ack, Handler h) {
  wire::hello_ack_meta m = ack.meta;
  m.job = ack.job;  // encoded before write() returns: the view need not outlive the call
  ch.write(m, {}, std::move(h));
}

namespace detail {

inline std::error_code handshake_mac(std::string_view token, const char* label, const wire::nonce_bytes& nonce,
                                     const task_id& who, wire::mac_bytes& out) {
  std::vector<std::byte> data(4 + nonce.size() + who.job.size() + 4);
  std::memcpy(data.data(), label, 4);
  std::memcpy(data.data() + 4, nonce.data(), nonce.size());
  if (!who.job.empty()) std::memcpy(data.data() + 4 + nonce.size(), who.job.data(), who.job.size());
  wire::store_le<std::uint32_t>(data.data() + 4 + nonce.size() + who.job.size(), who.index);
  return hmac_sha256(token, data, out);
}

inline std::error_code error_from_frame(const wire::error_meta& m) {
  return make_error_code(m.code == static_cast<std::int32_t>(errc::auth_failed) ? errc::auth_failed
                                                                                : errc::handshake_failed);
}

template <class Channel, class Handler>
class connector_handshake : public std::enable_shared_from_this<connector_handshake<Channel, Handler>> {
 public:
  connector_handshake(std::shared_ptr<Channel> ch, local_identity me, task_id expected, Handler h)
      : ch_(std::move(ch)), me_(std::move(me)), expected_(std::move(expected)), h_(std::move(h)) {}

  void start() {
    wire::hello_meta hello;
    hello.job = me_.self.job;
    hello.task_index = me_.self.index;
    hello.incarnation = me_.incarnation;
    hello.features = (me_.token.empty() ? 0 : feature_token) | (me_.features & ~feature_token);
    ch_->write(hello, {}, [self = this->shared_from_this()](std::error_code ec) {
      if (ec) return self->done(ec);
      self->read_next();
    });
  }

 private:
  void read_next() {
    ch_->read_head(
        [self = this->shared_from_this()](std::error_code ec, frame_head head) { self->on_head(ec, std::move(head)); });
  }

  void on_head(std::error_code ec, frame_head head) {
    if (ec) return done(ec);
    if (const auto* err = std::get_if<wire::error_meta>(&head.body)) return done(error_from_frame(*err));
    if (const auto* ch = std::get_if<wire::auth_challenge_meta>(&head.body)) {
      if (me_.token.empty() || answered_) return done(make_error_code(errc::auth_failed));
      answered_ = true;
      wire::auth_response_meta resp;
      if (auto e = handshake_mac(me_.token, "fwc1", ch->nonce, me_.self, resp.mac)) return done(e);
      if (auto e = random_bytes(my_nonce_)) return done(e);
      resp.nonce = my_nonce_;
      ch_->write(resp, {}, [self = this->shared_from_this()](std::error_code e) {
        if (e) return self->done(e);
        self->read_next();
      });
      return;
    }
    const auto* ack = std::get_if<wire::hello_ack_meta>(&head.body);
    if (ack == nullptr || ack->version != wire::version) return done(make_error_code(errc::handshake_failed));
    if (!me_.token.empty()) {
      wire::mac_bytes expected_mac{};
      if (!answered_) return done(make_error_code(errc::auth_failed));  // the acceptor has no token
      if (auto e = handshake_mac(me_.token, "fwa1", my_nonce_, expected_, expected_mac)) return done(e);
      if (!equal_macs(expected_mac, ack->mac)) return done(make_error_code(errc::auth_failed));
    }
    if (ack->job != expected_.job || ack->task_index != expected_.index) {
      return done(make_error_code(errc::handshake_failed));
    }
    done(std::error_code{}, peer_identity{expected_, ack->incarnation, ack->features});
  }

  // The handler takes (error_code) or (error_code, peer_identity): the acceptor's identity on success.
  void done(std::error_code ec, peer_identity who = {}) {
    if constexpr (std::invocable<Handler&, std::error_code, peer_identity>) {
      h_(ec, std::move(who));
    } else {
      (void)who;
      h_(ec);
    }
  }

  std::shared_ptr<Channel> ch_;
  local_identity me_;
  task_id expected_;
  Handler h_;
  wire::nonce_bytes my_nonce_{};
  bool answered_ = false;
};

template <class Channel, class Handler, bool DeferAck>
class acceptor_handshake : public std::enable_shared_from_this<acceptor_handshake<Channel, Handler, DeferAck>> {
 public:
  acceptor_handshake(std::shared_ptr<Channel> ch, local_identity me, const cluster_spec& spec, Handler h)
      : ch_(std::move(ch)), me_(std::move(me)), spec_(&spec), h_(std::move(h)) {}

  void start() {
    ch_->read_head([self = this->shared_from_this()](std::error_code ec, frame_head head) {
      self->on_hello(ec, std::move(head));
    });
  }

 private:
  void fail(std::error_code ec, std::string why) {
    // Tell the peer why (best effort), then report; the caller closes.
    auto text = std::make_shared<std::string>(std::move(why));
    wire::error_meta m;
    m.code = ec.category() == error_category() ? ec.value() : static_cast<int>(errc::handshake_failed);
    m.message = std::string_view(*text).substr(0, 1000);
    ch_->write(m, {},
               [self = this->shared_from_this(), text, ec](std::error_code) mutable { self->report(ec, *text); });
  }

  void on_hello(std::error_code ec, frame_head head) {
    if (ec) return report(ec, "while reading its hello");
    const auto* hello = std::get_if<wire::hello_meta>(&head.body);
    if (hello == nullptr) {
      return fail(make_error_code(errc::handshake_failed),
                  std::string("expected hello, got ") + std::string(wire::frame_type_name(head.header.type)));
    }
    if (hello->min_version > wire::version || hello->max_version < wire::version) {
      return fail(make_error_code(errc::handshake_failed), "no common wire version");
    }
    peer_.task = task_id{std::string(hello->job), hello->task_index};
    peer_.incarnation = hello->incarnation;
    peer_.features = hello->features;
    if (!spec_->contains(peer_.task)) {
      return fail(make_error_code(errc::handshake_failed), "task " + peer_.task.to_string() + " is not in the cluster");
    }
    if (me_.token.empty()) return send_ack(wire::nonce_bytes{});
    wire::auth_challenge_meta challenge;
    if (auto e = random_bytes(challenge.nonce)) return fail(e, "cannot make a nonce");
    nonce_ = challenge.nonce;
    ch_->write(challenge, {}, [self = this->shared_from_this()](std::error_code e) {
      if (e) return self->report(e, "sending challenge: " + e.message());
      self->ch_->read_head([self](std::error_code e2, frame_head h2) { self->on_response(e2, std::move(h2)); });
    });
  }

  void on_response(std::error_code ec, frame_head head) {
    if (ec) {
      const bool ended = ec == make_error_code(errc::connection_closed) || ec == make_error_code(errc::truncated_frame);
      return report(ended ? make_error_code(errc::auth_failed) : ec,
                    ended ? "peer " + peer_.task.to_string() + " closed instead of answering the token challenge"
                          : "reading auth_response: " + ec.message());
    }
    const auto* resp = std::get_if<wire::auth_response_meta>(&head.body);
    if (resp == nullptr) {
      return fail(make_error_code(errc::auth_failed), "peer " + peer_.task.to_string() +
                                                          " has no cluster token (sent " +
                                                          std::string(wire::frame_type_name(head.header.type)) + ")");
    }
    wire::mac_bytes expected{};
    if (auto e = handshake_mac(me_.token, "fwc1", nonce_, peer_.task, expected)) return fail(e, "mac");
    if (!equal_macs(expected, resp->mac)) {
      return fail(make_error_code(errc::auth_failed), "peer " + peer_.task.to_string() + " has a wrong cluster token");
    }
    send_ack(resp->nonce);
  }

  void send_ack(const wire::nonce_bytes& peer_nonce) {
    pending_ack ack;
    ack.job = me_.self.job;
    ack.meta.task_index = me_.self.index;
    ack.meta.incarnation = me_.incarnation;
    ack.meta.features = peer_.features & feature_reverse;
    if (!me_.token.empty()) {
      ack.meta.features |= feature_token;
      if (auto e = handshake_mac(me_.token, "fwa1", peer_nonce, me_.self, ack.meta.mac)) return fail(e, "mac");
    }
    if constexpr (DeferAck) {
      h_(std::error_code{}, std::move(peer_), std::string(), std::move(ack));
    } else {
      write_ack(*ch_, ack, [self = this->shared_from_this()](std::error_code e) {
        self->report(e, e ? "sending hello_ack: " + e.message() : std::string());
      });
    }
  }

  void report(std::error_code ec, std::string why) {
    if constexpr (DeferAck) {
      h_(ec, std::move(peer_), std::move(why), pending_ack{});
    } else {
      h_(ec, std::move(peer_), std::move(why));
    }
  }

  std::shared_ptr<Channel> ch_;
  local_identity me_;
  const cluster_spec* spec_;
  Handler h_;
  peer_identity peer_;
  wire::nonce_bytes nonce_{};
};

}  // namespace detail

/// Connector side: presents `me`, expects the acceptor to be task `expected`:
/// `h(error_code)` or `h(error_code, peer_identity)` once (the second form gets
/// the acceptor's incarnation and echoed feature bits on success). Errors:
/// errc::handshake_failed (wrong peer, version or an unexpected frame),
/// errc::auth_failed (token missing or wrong on either side), or a
/// transport/decoding error. On failure the caller closes `ch`.
template <class Channel, class Handler>
  requires(std::invocable<Handler&, std::error_code> || std::invocable<Handler&, std::error_code, peer_identity>) &&
          std::move_constructible<Handler>
void handshake_connect(std::shared_ptr<Channel> ch, local_identity me, task_id expected, Handler h) {
  std::make_shared<detail::connector_handshake<Channel, Handler>>(std::move(ch), std::move(me), std::move(expected),
                                                                  std::move(h))
      ->start();
}

/// Acceptor side: checks that the connector is a task of `spec` (which must
/// outlive the handshake) and, if `me.token` is set, that it knows the token:
/// `h(error_code, peer_identity, std::string why)` once; `why` says, for logs,
/// why a peer was refused. On failure the caller closes `ch`.
template <class Channel, class Handler>
  requires std::invocable<Handler&, std::error_code, peer_identity, std::string> && std::move_constructible<Handler>
void handshake_accept(std::shared_ptr<Channel> ch, local_identity me, const cluster_spec& spec, Handler h) {
  std::make_shared<detail::acceptor_handshake<Channel, Handler, false>>(std::move(ch), std::move(me), spec,
                                                                        std::move(h))
      ->start();
}

/// As handshake_accept, but stops before its last message: on success
/// `h(error_code{}, peer_identity, "", pending_ack)` runs with the hello_ack
/// still to be sent (write_ack); on failure `h(ec, peer_identity, why, {})`.
/// The connector sends nothing more until it has that ack, so at that moment
/// the socket holds no unread byte of the peer's: a caller may move the
/// connection to another reactor (transport async_release/adopt) and send the
/// ack from there. A peer that sends anyway broke the protocol.
template <class Channel, class Handler>
  requires std::invocable<Handler&, std::error_code, peer_identity, std::string, pending_ack> &&
           std::move_constructible<Handler>
void handshake_accept_deferred(std::shared_ptr<Channel> ch, local_identity me, const cluster_spec& spec, Handler h) {
  std::make_shared<detail::acceptor_handshake<Channel, Handler, true>>(std::move(ch), std::move(me), spec, std::move(h))
      ->start();
}

}  // namespace protocol
}  // namespace v0
}  // namespace fusewire
