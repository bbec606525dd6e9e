// libFuzzer target for the connection handshake (include/fusewire/protocol/handshake.hpp).
//
// An input is [mode u8][the peer's byte stream]. The stream is first cut into
// frames by the wire decoder under protocol::handshake_limits() (what an
// acceptor applies before the peer authenticated): each frame that decodes
// keeps the format's invariants and re-encodes to its own bytes.
//
// Then one side of the handshake runs over a fake in-memory connection (a
// model of fusewire::connection; its completions are posted and run by a loop
// here, never inline) whose peer sends the stream. Mode bits:
//   1  this side holds the cluster token
//   2  acceptor: handshake_accept_deferred (the ack sent afterwards with write_ack)
//   4  the peer knows the token: when this side writes a challenge (acceptor)
//      or an auth_response (connector), the peer's correct answer is put next
//      in the stream, computed from the nonce just written
//   8  the connection reads ahead (readahead_connection: try_read)
//  16  run the connector (else the acceptor)
//  32  connector: offer feature_reverse
// Checked: the handler runs exactly once; the handshake succeeds exactly when
// the stream's first frame (decoded independently) is what the protocol asks
// for and the token, if any, was proven; what this side wrote decodes under
// handshake_limits, in the protocol's order, with the identities, features and
// MACs the protocol prescribes; a refusal's error frame carries the reported
// code and reason. Leaks (a handshake kept alive by a cycle) are ASan findings.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/protocol/frame_channel.hpp>
#include <fusewire/protocol/handshake.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/wire/wire.hpp>

#include "fuzz_support.hpp"

namespace {

namespace wire = fusewire::wire;
namespace protocol = fusewire::protocol;
using fusewire::const_buffer;
using fusewire::errc;
using fusewire::make_error_code;
using fusewire::mutable_buffer;
using fusewire::task_id;
using bytes = std::vector<std::byte>;

constexpr std::uint8_t mode_token = 1, mode_deferred = 2, mode_helpful = 4, mode_readahead = 8, mode_connector = 16,
                       mode_reverse = 32;
constexpr std::string_view cluster_token = "fuzz-cluster-token";
const wire::nonce_bytes peer_nonce = [] {
  wire::nonce_bytes n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::byte>(0x5a ^ i);
  return n;
}();

// ---- a fake connection: the peer's bytes in memory, completions posted ---------

struct peer_stream {
  bytes incoming;  ///< what the peer sends
  std::size_t read_pos = 0;
  bytes outgoing;  ///< what this side wrote
  std::deque<fusewire::util::unique_function<void()>> posted;
  bool closed = false;
  std::function<void()> after_write;  ///< the peer's reaction to a write (mode_helpful)

  std::size_t left() const noexcept { return incoming.size() - read_pos; }
  void take(mutable_buffer dst) {
    if (dst.empty()) return;
    std::memcpy(dst.data(), incoming.data() + read_pos, dst.size());
    read_pos += dst.size();
  }
  /// Runs posted completions until none is left.
  void run() {
    for (int steps = 0; !posted.empty(); ++steps) {
      FUZZ_CHECK(steps < 1000);
      auto f = std::move(posted.front());
      posted.pop_front();
      f();
    }
  }
};

template <bool ReadAhead>
class fake_connection {
 public:
  using connection_concept = fusewire::connection_tag;

  fake_connection() = default;
  explicit fake_connection(std::shared_ptr<peer_stream> s) : s_(std::move(s)) {}

  template <fusewire::io_handler H>
  void async_write(std::span<const const_buffer> sg, H&& h) {
    if (!is_open()) return post(std::forward<H>(h), make_error_code(errc::connection_closed), std::size_t{0});
    std::size_t n = 0;
    for (const_buffer b : sg) {
      s_->outgoing.insert(s_->outgoing.end(), b.begin(), b.end());
      n += b.size();
    }
    post(std::forward<H>(h), std::error_code{}, n);
    if (n != 0 && s_->after_write) s_->after_write();
  }

  template <fusewire::io_handler H>
  void async_read(mutable_buffer dst, H&& h) {
    if (!is_open()) return post(std::forward<H>(h), make_error_code(errc::connection_closed), std::size_t{0});
    const std::size_t n = std::min(dst.size(), s_->left());
    s_->take(dst.first(n));
    post(std::forward<H>(h), n == dst.size() ? std::error_code{} : make_error_code(errc::connection_closed), n);
  }

  template <fusewire::read_some_handler H>
  void async_read_some(H&& h) {
    if (!is_open() || s_->left() == 0) {
      return post(std::forward<H>(h), make_error_code(errc::connection_closed), fusewire::tensor_buffer{});
    }
    fusewire::tensor_buffer b = fusewire::tensor_buffer::allocate(s_->left());
    s_->take(b.bytes());
    post(std::forward<H>(h), std::error_code{}, std::move(b));
  }

  bool try_read(mutable_buffer dst)
    requires ReadAhead
  {
    if (!is_open() || s_->left() < dst.size()) return false;
    s_->take(dst);
    return true;
  }

  void close() noexcept {
    if (s_) s_->closed = true;
  }
  bool is_open() const noexcept { return s_ && !s_->closed; }
  std::string remote_endpoint() const { return "fuzz-peer"; }

 private:
  template <class H, class... Args>
  void post(H&& h, Args... args) {
    s_->posted.push_back(
        [h = std::decay_t<H>(std::forward<H>(h)), ... args = std::move(args)]() mutable { h(std::move(args)...); });
  }

  std::shared_ptr<peer_stream> s_;
};

static_assert(fusewire::connection<fake_connection<false>>);
static_assert(!fusewire::readahead_connection<fake_connection<false>>);
static_assert(fusewire::readahead_connection<fake_connection<true>>);

// ---- frames --------------------------------------------------------------------

template <wire::frame_meta M>
bytes encode(const M& meta) {
  bytes out(wire::prefix_size(meta));
  std::error_code ec;
  FUZZ_CHECK(wire::encode_prefix(meta, wire::frame_header{}, out, ec) == out.size() && !ec);
  return out;
}

/// Frames of `in` that decode one after another under `lim`, and whether they
/// cover it exactly. Each frame re-encodes to its own bytes.
struct frame_list {
  std::vector<wire::decoded_frame> frames;
  bool whole = false;
};

frame_list cut_frames(const_buffer in, const wire::limits& lim) {
  frame_list out;
  std::size_t at = 0;
  while (at < in.size()) {
    wire::decoded_frame f;
    if (wire::decode_frame(in.subspan(at), lim, f)) return out;
    FUZZ_CHECK(f.header.payload_len == 0 && f.payload.empty());  // handshake_limits: no payload
    FUZZ_CHECK(f.header.meta_len <= lim.max_meta_bytes);
    bytes again(wire::prefix_size(f.body));
    std::error_code ec;
    FUZZ_CHECK(wire::encode_prefix(f.body, f.header, again, ec) == again.size() && !ec);
    FUZZ_CHECK(again.size() == f.size() && std::memcmp(again.data(), in.data() + at, again.size()) == 0);
    at += f.size();
    out.frames.push_back(f);
  }
  out.whole = true;
  return out;
}

template <class M>
const M* first_as(const frame_list& l) {
  return l.frames.empty() ? nullptr : std::get_if<M>(&l.frames.front().body);
}

wire::mac_bytes transcript_mac(const char* label, const wire::nonce_bytes& nonce, std::string_view job,
                               std::uint32_t index) {
  // The transcript as handshake.hpp documents it: label, nonce, job, index (u32 le).
  bytes data(4 + nonce.size() + job.size() + 4);
  std::memcpy(data.data(), label, 4);
  std::memcpy(data.data() + 4, nonce.data(), nonce.size());
  if (!job.empty()) std::memcpy(data.data() + 4 + nonce.size(), job.data(), job.size());
  wire::store_le<std::uint32_t>(data.data() + 4 + nonce.size() + job.size(), index);
  wire::mac_bytes mac{};
  FUZZ_CHECK(!protocol::detail::hmac_sha256(cluster_token, data, mac));
  return mac;
}

const fusewire::cluster_spec& spec() {
  static const fusewire::cluster_spec s =
      fusewire::cluster_spec::from_string("ps=127.0.0.1:1;worker=127.0.0.1:2,127.0.0.1:3");
  return s;
}

void check_refusal_frame(const frame_list& written, const std::error_code& ec, const std::string& why) {
  if (written.frames.empty()) return;
  const auto* err = std::get_if<wire::error_meta>(&written.frames.back().body);
  if (err == nullptr) return;
  FUZZ_CHECK(err->code ==
             (ec.category() == fusewire::error_category() ? ec.value() : static_cast<int>(errc::handshake_failed)));
  FUZZ_CHECK(err->message == std::string_view(why).substr(0, 1000));
}

// ---- the acceptor ----------------------------------------------------------------

struct accept_result {
  int calls = 0;
  std::error_code ec;
  protocol::peer_identity peer;
  std::string why;
  std::optional<protocol::pending_ack> ack;
};

template <bool ReadAhead, bool Deferred>
void run_acceptor(std::uint8_t mode, const_buffer stream, const frame_list& sent) {
  const bool token = (mode & mode_token) != 0;
  const bool helpful = (mode & mode_helpful) != 0 && protocol::detail::has_crypto;
  auto s = std::make_shared<peer_stream>();
  s->incoming.assign(stream.begin(), stream.end());
  using connection_t = fake_connection<ReadAhead>;
  auto ch = std::make_shared<protocol::frame_channel<connection_t>>(connection_t(s), protocol::handshake_limits());

  // What the acceptor should make of the stream, from an independent decode.
  const auto* hello = first_as<wire::hello_meta>(sent);
  const bool hello_ok = hello != nullptr && hello->min_version <= wire::version &&
                        hello->max_version >= wire::version &&
                        spec().contains(task_id{std::string(hello->job), hello->task_index});
  const bool expect_ok = hello_ok && (!token || helpful);

  // A peer that knows the token answers the challenge right away.
  bool answered = false;
  s->after_write = [&] {
    if (!helpful || answered || hello == nullptr) return;
    const frame_list w = cut_frames(s->outgoing, protocol::handshake_limits());
    if (w.frames.empty()) return;
    const auto* challenge = std::get_if<wire::auth_challenge_meta>(&w.frames.back().body);
    if (challenge == nullptr) return;
    answered = true;
    wire::auth_response_meta resp;
    resp.mac = transcript_mac("fwc1", challenge->nonce, hello->job, hello->task_index);
    resp.nonce = peer_nonce;
    const bytes frame = encode(resp);
    s->incoming.insert(s->incoming.begin() + static_cast<std::ptrdiff_t>(s->read_pos), frame.begin(), frame.end());
  };

  const protocol::local_identity me{{"ps", 0}, 0x5eed, token ? std::string(cluster_token) : std::string(), 0};
  accept_result r;
  if constexpr (Deferred) {
    protocol::handshake_accept_deferred(
        ch, me, spec(),
        [&r](std::error_code ec, protocol::peer_identity peer, std::string why, protocol::pending_ack ack) {
          ++r.calls;
          r.ec = ec;
          r.peer = std::move(peer);
          r.why = std::move(why);
          if (!ec) r.ack = std::move(ack);
        });
  } else {
    protocol::handshake_accept(ch, me, spec(), [&r](std::error_code ec, protocol::peer_identity peer, std::string why) {
      ++r.calls;
      r.ec = ec;
      r.peer = std::move(peer);
      r.why = std::move(why);
    });
  }
  s->run();
  FUZZ_CHECK(r.calls == 1);
  FUZZ_CHECK(!r.ec == expect_ok);

  if (r.ack) {
    int wrote = 0;
    protocol::write_ack(*ch, *r.ack, [&wrote](std::error_code e) {
      FUZZ_CHECK(!e);
      ++wrote;
    });
    s->run();
    FUZZ_CHECK(wrote == 1);
  }
  s->after_write = nullptr;
  const frame_list written = cut_frames(s->outgoing, protocol::handshake_limits());
  FUZZ_CHECK(written.whole);

  if (r.ec) {
    FUZZ_CHECK(r.ec.category() == fusewire::error_category());
    FUZZ_CHECK(!r.why.empty());
    FUZZ_CHECK(written.frames.size() <= 2);
    check_refusal_frame(written, r.ec, r.why);
    ch->close();
    return;
  }
  FUZZ_CHECK(r.why.empty());
  FUZZ_CHECK(r.peer.task.job == hello->job && r.peer.task.index == hello->task_index);
  FUZZ_CHECK(r.peer.incarnation == hello->incarnation && r.peer.features == hello->features);
  FUZZ_CHECK(written.frames.size() == (token ? 2u : 1u));
  if (token) FUZZ_CHECK(std::holds_alternative<wire::auth_challenge_meta>(written.frames.front().body));
  const auto* ack = std::get_if<wire::hello_ack_meta>(&written.frames.back().body);
  FUZZ_CHECK(ack != nullptr);
  FUZZ_CHECK(ack->version == wire::version && ack->job == "ps" && ack->task_index == 0 && ack->incarnation == 0x5eed);
  FUZZ_CHECK(ack->features == ((hello->features & protocol::feature_reverse) | (token ? protocol::feature_token : 0)));
  FUZZ_CHECK(ack->mac == (token ? transcript_mac("fwa1", peer_nonce, "ps", 0) : wire::mac_bytes{}));
}

// ---- the connector ---------------------------------------------------------------

template <bool ReadAhead>
void run_connector(std::uint8_t mode, const_buffer stream, const frame_list& sent) {
  const bool token = (mode & mode_token) != 0;
  const bool helpful = (mode & mode_helpful) != 0 && protocol::detail::has_crypto;
  const std::uint64_t offered = (mode & mode_reverse) != 0 ? protocol::feature_reverse : 0;
  auto s = std::make_shared<peer_stream>();
  s->incoming.assign(stream.begin(), stream.end());
  using connection_t = fake_connection<ReadAhead>;
  auto ch = std::make_shared<protocol::frame_channel<connection_t>>(connection_t(s), protocol::handshake_limits());
  const task_id expected{"ps", 0};

  const auto* first_ack = first_as<wire::hello_ack_meta>(sent);
  const auto* challenge = first_as<wire::auth_challenge_meta>(sent);
  const bool ack_ok = first_ack != nullptr && first_ack->version == wire::version && first_ack->job == "ps" &&
                      first_ack->task_index == 0;
  const bool expect_ok = token ? challenge != nullptr && helpful : ack_ok;

  // A peer that knows the token proves it with the connector's nonce.
  wire::hello_ack_meta helpful_ack;
  helpful_ack.job = "ps";
  helpful_ack.incarnation = 0xacce;
  helpful_ack.features = protocol::feature_token | offered;
  bool answered = false;
  s->after_write = [&] {
    if (!helpful || answered) return;
    const frame_list w = cut_frames(s->outgoing, protocol::handshake_limits());
    if (w.frames.empty()) return;
    const auto* resp = std::get_if<wire::auth_response_meta>(&w.frames.back().body);
    if (resp == nullptr) return;
    answered = true;
    helpful_ack.mac = transcript_mac("fwa1", resp->nonce, "ps", 0);
    const bytes frame = encode(helpful_ack);
    s->incoming.insert(s->incoming.begin() + static_cast<std::ptrdiff_t>(s->read_pos), frame.begin(), frame.end());
  };

  const protocol::local_identity me{{"worker", 1}, 0x77, token ? std::string(cluster_token) : std::string(), offered};
  int calls = 0;
  std::error_code result;
  protocol::peer_identity peer;
  protocol::handshake_connect(ch, me, expected, [&](std::error_code ec, protocol::peer_identity p) {
    ++calls;
    result = ec;
    peer = std::move(p);
  });
  s->run();
  FUZZ_CHECK(calls == 1);
  FUZZ_CHECK(!result == expect_ok);

  s->after_write = nullptr;
  const frame_list written = cut_frames(s->outgoing, protocol::handshake_limits());
  FUZZ_CHECK(written.whole && !written.frames.empty() && written.frames.size() <= 2);
  const auto* hello = std::get_if<wire::hello_meta>(&written.frames.front().body);
  FUZZ_CHECK(hello != nullptr);
  FUZZ_CHECK(hello->job == "worker" && hello->task_index == 1 && hello->incarnation == 0x77);
  FUZZ_CHECK(hello->min_version <= wire::version && hello->max_version >= wire::version);
  FUZZ_CHECK(hello->features == ((token ? protocol::feature_token : 0) | offered));
  if (written.frames.size() == 2) {
    // It answered a challenge, the stream's first frame, with the MAC the protocol prescribes.
    const auto* resp = std::get_if<wire::auth_response_meta>(&written.frames.back().body);
    FUZZ_CHECK(resp != nullptr && token && challenge != nullptr);
    FUZZ_CHECK(resp->mac == transcript_mac("fwc1", challenge->nonce, "worker", 1));
  }

  if (result) {
    FUZZ_CHECK(result.category() == fusewire::error_category());
    if (const auto* err = first_as<wire::error_meta>(sent)) {
      FUZZ_CHECK(result == make_error_code(err->code == static_cast<int>(errc::auth_failed) ? errc::auth_failed
                                                                                            : errc::handshake_failed));
    }
    if (challenge != nullptr && !token) FUZZ_CHECK(result == make_error_code(errc::auth_failed));
    ch->close();
    return;
  }
  FUZZ_CHECK(peer.task == expected);
  const wire::hello_ack_meta& ack = token ? helpful_ack : *first_ack;
  FUZZ_CHECK(peer.incarnation == ack.incarnation && peer.features == ack.features);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const const_buffer stream(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  const frame_list sent = cut_frames(stream, protocol::handshake_limits());
  const bool readahead = (mode & mode_readahead) != 0;
  if ((mode & mode_connector) != 0) {
    readahead ? run_connector<true>(mode, stream, sent) : run_connector<false>(mode, stream, sent);
  } else if ((mode & mode_deferred) != 0) {
    readahead ? run_acceptor<true, true>(mode, stream, sent) : run_acceptor<false, true>(mode, stream, sent);
  } else {
    readahead ? run_acceptor<true, false>(mode, stream, sent) : run_acceptor<false, false>(mode, stream, sent);
  }
  return 0;
}
