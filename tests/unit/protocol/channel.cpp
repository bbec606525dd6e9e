// protocol::frame_channel and the handshake over both transports, on two reactors of one group.
#include <fusewire/protocol/frame_channel.hpp>
#include <fusewire/protocol/handshake.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "support/patterns.hpp"
#include "support/tcp_transports.hpp"

namespace fw = fusewire;
namespace proto = fusewire::protocol;
using namespace std::chrono_literals;

namespace {

template <class T>
struct pair_harness {
  using reactor_t = typename T::reactor_type;
  using group_t = fw::basic_reactor_group<typename reactor_t::engine_type>;
  using conn_t = typename T::connection_type;
  using channel_t = proto::frame_channel<conn_t>;

  static fw::reactor_config config() {
    fw::reactor_config c;
    c.count = 2;
    c.mode = fw::reactor_mode::block;
    return c;
  }

  pair_harness() : group(config()) {
    // Server on reactor 0, client on reactor 1; both channels live on their reactor.
    auto port = group.submit(0, [this] {
      listener = transport.listen(*reactor_t::current(), "127.0.0.1", 0);
      listener.async_accept([this](std::error_code ec, conn_t c) {
        REQUIRE_FALSE(ec);
        server = std::make_shared<channel_t>(std::move(c), proto::limits_for(1 << 20));
        server_ready.set_value();
      });
      return listener.port();
    });
    const std::uint16_t p = get(port);
    group.submit_to(1, [this, p] {
      transport.connect(*reactor_t::current(), "127.0.0.1", p, [this](std::error_code ec, conn_t c) {
        REQUIRE_FALSE(ec);
        client = std::make_shared<channel_t>(std::move(c), proto::limits_for(1 << 20));
        client_ready.set_value();
      });
    });
    auto a = server_ready.get_future();
    auto b = client_ready.get_future();
    get(a);
    get(b);
  }

  ~pair_harness() {
    group
        .submit(0,
                [this] {
                  server.reset();
                  listener = {};
                })
        .get();
    group.submit(1, [this] { client.reset(); }).get();
    group.stop();
  }

  template <class F>
  static auto get(std::future<F>& f) {
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    return f.get();
  }
  template <class F>
  static auto get(std::future<F>&& f) {
    return get(f);
  }

  T transport;
  group_t group;
  typename T::listener_type listener;
  std::shared_ptr<channel_t> server, client;
  std::promise<void> server_ready, client_ready;
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a tensor frame: one scatter-gather write, payload read into the destination", T,
                          tensor_frame_scatter_gather) {
  pair_harness<T> h;
  const auto a = fw::test::pattern_bytes(1000, 1), b = fw::test::pattern_bytes(70000, 2),
             c = fw::test::pattern_bytes(5, 3);
  const std::size_t total = a.size() + b.size() + c.size();
  auto dst = fw::tensor_buffer::allocate(total);

  std::promise<std::error_code> wrote;
  h.group.submit_to(1, [&] {
    const fw::const_buffer sg[] = {a, b, c};
    fw::wire::tensor_meta m;
    m.key = "weights";
    m.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(total)});
    m.segments = fw::wire::segment_list(std::span<const fw::const_buffer>(sg));
    h.client->write(m, sg, [&wrote](std::error_code ec) { wrote.set_value(ec); });
  });
  struct got_t {
    std::error_code ec;
    std::string key;
    std::uint64_t len = 0;
  };
  std::promise<got_t> got;
  h.group.submit_to(0, [&] {
    h.server->read_head([&](std::error_code ec, proto::frame_head head) {
      if (ec) return got.set_value({ec, {}, 0});
      auto* t = std::get_if<fw::wire::tensor_meta>(&head.body);
      if (t == nullptr) return got.set_value({fw::make_error_code(fw::errc::malformed_frame), {}, 0});
      std::string key(t->key);
      const auto len = head.header.payload_len;
      h.server->read_payload(dst.bytes().first(len), [&got, key, len](std::error_code e) {
        got.set_value({e, key, len});
      });
    });
  });
  CHECK_FALSE(pair_harness<T>::get(wrote.get_future()));
  const got_t g = pair_harness<T>::get(got.get_future());
  REQUIRE_FALSE(g.ec);
  CHECK(g.key == "weights");
  CHECK(g.len == total);
  CHECK(std::memcmp(dst.data(), a.data(), a.size()) == 0);
  CHECK(std::memcmp(dst.data() + a.size(), b.data(), b.size()) == 0);
  CHECK(std::memcmp(dst.data() + a.size() + b.size(), c.data(), c.size()) == 0);
}
TEST_CASE_TEMPLATE_APPLY(tensor_frame_scatter_gather, fw::test::tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a meta that cannot be encoded fails the write, asynchronously", T,
                          unencodable_meta_fails_write) {
  pair_harness<T> h;
  std::promise<std::error_code> wrote;
  const std::string huge(70000, 'k');
  h.group.submit_to(1, [&] {
    fw::wire::recv_request_meta m;
    m.key = huge;
    auto inline_call = std::make_shared<bool>(true);
    h.client->write(m, {}, [&wrote, inline_call](std::error_code ec) {
      CHECK_FALSE(*inline_call);
      wrote.set_value(ec);
    });
    *inline_call = false;
  });
  CHECK(pair_harness<T>::get(wrote.get_future()) == fw::make_error_code(fw::errc::invalid_argument));
}
TEST_CASE_TEMPLATE_APPLY(unencodable_meta_fails_write, fw::test::tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a frame above the receiver's limit is refused before its meta is read", T,
                          frame_above_limit_refused) {
  pair_harness<T> h;
  std::vector<std::byte> big(2u << 20);
  std::promise<std::error_code> wrote, got;
  h.group.submit_to(1, [&] {
    const fw::const_buffer sg[] = {big};
    fw::wire::tensor_meta m;
    m.key = "big";
    m.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(big.size())});
    m.segments = fw::wire::segment_list(std::span<const fw::const_buffer>(sg));
    h.client->write(m, sg, [&wrote](std::error_code ec) { wrote.set_value(ec); });
  });
  h.group.submit_to(0, [&] {
    h.server->read_head([&](std::error_code ec, proto::frame_head) {
      got.set_value(ec);
      h.server->close();
    });
  });
  CHECK(pair_harness<T>::get(got.get_future()) == fw::make_error_code(fw::errc::frame_too_large));
  (void)pair_harness<T>::get(wrote.get_future());  // the write may succeed or break; it completes
}
TEST_CASE_TEMPLATE_APPLY(frame_above_limit_refused, fw::test::tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("handshake: identity checked, tokens proven", T, handshake_identity_tokens) {
  struct run_t {
    std::error_code connector, acceptor;
    std::string acceptor_saw;
  };
  auto run = [](std::string client_token, std::string server_token, fw::task_id expected) {
    pair_harness<T> h;
    std::promise<std::error_code> c, a;
    std::string seen;
    fw::cluster_spec spec = fw::cluster_spec::from_string("ps=127.0.0.1:1;worker=127.0.0.1:2");
    h.group.submit_to(0, [&] {
      proto::local_identity me{{"ps", 0}, 42, server_token};
      proto::handshake_accept(h.server, me, spec, [&](std::error_code ec, proto::peer_identity p, std::string) {
        seen = p.task.to_string();
        if (ec) h.server->close();
        a.set_value(ec);
      });
    });
    h.group.submit_to(1, [&] {
      proto::local_identity me{{"worker", 0}, 7, client_token};
      proto::handshake_connect(h.client, me, expected, [&](std::error_code ec) {
        if (ec) h.client->close();
        c.set_value(ec);
      });
    });
    run_t r;
    r.connector = pair_harness<T>::get(c.get_future());
    r.acceptor = pair_harness<T>::get(a.get_future());
    r.acceptor_saw = seen;
    return r;
  };
  const auto auth = fw::make_error_code(fw::errc::auth_failed);
  auto ok = run("", "", {"ps", 0});
  CHECK_FALSE(ok.connector);
  CHECK_FALSE(ok.acceptor);
  CHECK(ok.acceptor_saw == "worker:0");

  auto wrong_peer = run("", "", {"ps", 1});
  CHECK(wrong_peer.connector == fw::make_error_code(fw::errc::handshake_failed));

  if constexpr (proto::detail::has_crypto) {
    auto tok = run("t0ken", "t0ken", {"ps", 0});
    CHECK_FALSE(tok.connector);
    CHECK_FALSE(tok.acceptor);
    auto wrong = run("other", "t0ken", {"ps", 0});
    CHECK(wrong.connector == auth);
    CHECK(wrong.acceptor == auth);
    auto missing = run("", "t0ken", {"ps", 0});
    CHECK(missing.connector == auth);
    CHECK(missing.acceptor == auth);
    auto unasked = run("t0ken", "", {"ps", 0});
    CHECK(unasked.connector == auth);
  }
}
TEST_CASE_TEMPLATE_APPLY(handshake_identity_tokens, fw::test::tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("handshake: the connector's offered features reach the acceptor and are echoed back", T,
                          handshake_features_echoed) {
  for (const bool offer : {false, true}) {
    for (const char* token : {"", "t0ken"}) {
      if (*token != 0 && !proto::detail::has_crypto) continue;
      CAPTURE(offer);
      CAPTURE(token);
      pair_harness<T> h;
      std::promise<proto::peer_identity> c, a;
      fw::cluster_spec spec = fw::cluster_spec::from_string("ps=127.0.0.1:1;worker=127.0.0.1:2");
      h.group.submit_to(0, [&] {
        proto::local_identity me{{"ps", 0}, 42, token};
        proto::handshake_accept(h.server, me, spec, [&](std::error_code ec, proto::peer_identity p, std::string) {
          CHECK_FALSE(ec);
          a.set_value(p);
        });
      });
      h.group.submit_to(1, [&] {
        proto::local_identity me{{"worker", 0}, 7, token, offer ? proto::feature_reverse : 0};
        proto::handshake_connect(h.client, me, fw::task_id{"ps", 0}, [&](std::error_code ec, proto::peer_identity p) {
          CHECK_FALSE(ec);
          c.set_value(p);
        });
      });
      const proto::peer_identity acceptor_saw = pair_harness<T>::get(a.get_future());
      const proto::peer_identity connector_saw = pair_harness<T>::get(c.get_future());
      CHECK(acceptor_saw.task.to_string() == "worker:0");
      CHECK(acceptor_saw.incarnation == 7);
      CHECK(((acceptor_saw.features & proto::feature_reverse) != 0) == offer);
      CHECK(((acceptor_saw.features & proto::feature_token) != 0) == (*token != 0));
      CHECK(connector_saw.task.to_string() == "ps:0");
      CHECK(connector_saw.incarnation == 42);
      CHECK(((connector_saw.features & proto::feature_reverse) != 0) == offer);
      CHECK(((connector_saw.features & proto::feature_token) != 0) == (*token != 0));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(handshake_features_echoed, fw::test::tcp_transports);

TEST_CASE("reusable_buffer: hands its bytes out again once nobody holds them, else a fresh buffer") {
  fw::reusable_buffer r;
  fw::tensor_buffer first = r.take(40);
  REQUIRE(first.size() == 40);
  fw::tensor_buffer second = r.take(40);  // the first is still held: not the same bytes
  CHECK(second.data() != first.data());
  const std::byte* cached = first.data();
  first.reset();
  fw::tensor_buffer third = r.take(100);
  CHECK(third.data() == cached);
  CHECK(third.size() == 100);
  third.reset();
  fw::tensor_buffer big = r.take(r.capacity() + 1);
  CHECK(big.size() == r.capacity() + 1);
  CHECK(big.data() != cached);
  CHECK(r.take(0).empty());
}

TEST_CASE("reusable_buffer: scratch bytes only while nobody holds them; keep(n) hands over what was written") {
  fw::reusable_buffer r(64);
  fw::mutable_buffer s = r.scratch();
  REQUIRE(s.size() == 64);
  s[0] = std::byte{7};
  s[1] = std::byte{9};
  CHECK(r.scratch().data() == s.data());  // nothing kept: the same bytes again, no handle taken
  fw::tensor_buffer kept = r.keep(2);
  REQUIRE(kept.size() == 2);
  CHECK(kept.data() == s.data());
  CHECK(kept.data()[0] == std::byte{7});
  CHECK(kept.data()[1] == std::byte{9});
  CHECK(r.scratch().empty());  // held: a speculative read must not write into it
  CHECK(r.take(8).data() != s.data());
  kept.reset();
  CHECK(r.scratch().data() == s.data());
}
