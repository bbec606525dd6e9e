// One transport test suite, instantiated for every transport this build has.
// Server and client run on different reactors (threads) of one group.
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/concepts.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <doctest/doctest.h>

namespace fw = fusewire;
using namespace std::chrono_literals;

static_assert(fw::transport<fw::asio_tcp>);
#if FUSEWIRE_HAS_URING
static_assert(fw::transport<fw::uring_tcp>);
#define TRANSPORTS fw::asio_tcp, fw::uring_tcp
#else
#define TRANSPORTS fw::asio_tcp
#endif

#include "transport_suite.hpp"

#if FUSEWIRE_HAS_URING
TEST_CASE("uring_tcp: large writes go through SENDMSG_ZC and complete after the notification") {
  fw::uring_tcp::config cfg;
  cfg.zc_threshold = 64 * 1024;
  harness<fw::uring_tcp> h(fw::reactor_mode::adaptive, fw::uring_tcp(cfg));
  const std::uint16_t port = h.serve_echo(0);
  const std::string features = h.on(1, [] { return fw::uring_reactor::current()->engine().features().to_string(); });
  MESSAGE("engine: ", features);

  const std::size_t n = 8u << 20;
  const auto src = pattern(n, 77);
  std::vector<std::byte> dst(n);
  struct result {
    std::error_code ec;
    fw::uring_tcp_stats stats;
    std::string features;
  };
  std::promise<result> done;
  h.group.submit_to(1, [&] {
    using conn_t = fw::uring_tcp_connection;
    h.transport.connect(harness<fw::uring_tcp>::here(), "127.0.0.1", port, [&](std::error_code ec, conn_t c) {
      REQUIRE_FALSE(ec);
      auto conn = std::make_shared<conn_t>(std::move(c));
      auto pending = std::make_shared<int>(2);
      auto finish = [&, conn, pending](std::error_code e) {
        if (--*pending == 0 || e) {
          if (*pending < 0) return;
          *pending = -1;
          done.set_value({e, conn->stats(), fw::uring_reactor::current()->engine().features().to_string()});
          conn->close();
        }
      };
      conn->async_read(fw::mutable_buffer(dst), [finish](std::error_code e, std::size_t) mutable { finish(e); });
      const fw::const_buffer one[] = {fw::const_buffer(src)};
      conn->async_write(one, [finish, conn](std::error_code e, std::size_t) mutable {
        // The handler runs only after every zero-copy notification of this write.
        const auto s = conn->stats();
        CHECK(s.zc_notifications == s.zc_sends);
        finish(e);
      });
    });
  });
  auto f = done.get_future();
  const result r = get(f);
  CHECK_FALSE(r.ec);
  CHECK(std::memcmp(src.data(), dst.data(), n) == 0);
  MESSAGE("zc_sends=", r.stats.zc_sends, " zc_notifications=", r.stats.zc_notifications,
          " zc_copied=", r.stats.zc_copied, " plain sends=", r.stats.sends, " multishot_arms=",
          r.stats.multishot_arms, " ring_buffers=", r.stats.ring_buffers, " direct_recvs=", r.stats.direct_recvs,
          " copied_to_destination=", r.stats.bytes_copied_to_destination);
  MESSAGE("after: ", r.features);
  CHECK(r.stats.zc_sends >= 1);
  CHECK(r.stats.zc_notifications == r.stats.zc_sends);
  CHECK(r.stats.direct_recvs >= 1);
  CHECK(r.stats.bytes_sent == n);
  CHECK(r.stats.bytes_received == n);
}

TEST_CASE("uring_tcp works without provided buffers, multishot or zero copy (fallbacks)") {
  fw::uring_tcp::config cfg;
  cfg.multishot = false;
  cfg.zc_threshold = 0;
  harness<fw::uring_tcp> h(fw::reactor_mode::adaptive, fw::uring_tcp(cfg));
  const std::uint16_t port = h.serve_echo(0);
  for (std::size_t n : {std::size_t{1}, std::size_t{70000}, std::size_t{3u << 20}}) {
    const auto src = pattern(n, 5);
    std::vector<std::byte> dst(n);
    const auto r = client_echo(h, 1, port, {fw::const_buffer(src)}, fw::mutable_buffer(dst));
    CHECK_FALSE(r.read_ec);
    CHECK(src == dst);
  }
}

TEST_CASE("uring_tcp: a tiny provided-buffer ring held by a slow reader neither stalls nor corrupts the stream") {
  fw::uring_engine::config engine;
  engine.buffer_count = 8;
  engine.buffer_size = 4096;
  harness<fw::uring_tcp> h(fw::reactor_mode::adaptive, fw::uring_tcp(), engine);
  const std::size_t n = 1u << 20;
  const auto src = pattern(n, 21);
  struct result {
    std::vector<std::byte> data;
    fw::uring_tcp_stats stats;
  };
  std::promise<result> got;
  const std::uint16_t port = h.serve(0, [&](fw::uring_tcp_connection c) {
    // Holds on to every buffer it receives, so the ring runs low.
    struct reader : std::enable_shared_from_this<reader> {
      fw::uring_tcp_connection conn;
      std::vector<fw::tensor_buffer> kept;
      std::size_t total = 0, want = 0;
      std::promise<result>* done = nullptr;
      void next() {
        conn.async_read_some([self = this->shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
          REQUIRE_FALSE(ec);
          self->total += b.size();
          self->kept.push_back(std::move(b));
          if (self->total < self->want) return self->next();
          result r;
          for (auto& k : self->kept) r.data.insert(r.data.end(), k.data(), k.data() + k.size());
          r.stats = self->conn.stats();
          self->done->set_value(std::move(r));
          self->conn.close();
        });
      }
    };
    auto r = std::make_shared<reader>();
    r->conn = std::move(c);
    r->want = n;
    r->done = &got;
    r->next();
  });
  std::promise<std::error_code> wrote;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<fw::uring_tcp>::here(), "127.0.0.1", port, [&](std::error_code ec,
                                                                              fw::uring_tcp_connection c) {
      REQUIRE_FALSE(ec);
      auto conn = std::make_shared<fw::uring_tcp_connection>(std::move(c));
      const fw::const_buffer one[] = {fw::const_buffer(src)};
      conn->async_write(one, [&, conn](std::error_code e, std::size_t) { wrote.set_value(e); });
    });
  });
  auto w = wrote.get_future();
  CHECK_FALSE(get(w));
  auto f = got.get_future();
  const result r = get(f);
  REQUIRE(r.data.size() == n);
  CHECK(std::memcmp(r.data.data(), src.data(), n) == 0);
  MESSAGE("ring_buffers=", r.stats.ring_buffers, " fallback_recvs=", r.stats.fallback_recvs,
          " multishot_arms=", r.stats.multishot_arms);
  CHECK(r.stats.ring_buffers > 0);
}

TEST_CASE("uring_tcp: received buffers are handed over without a copy and may die on another thread") {
  harness<fw::uring_tcp> h;
  std::promise<fw::tensor_buffer> first, second;
  const std::uint16_t port = h.serve(0, [&](fw::uring_tcp_connection c) {
    auto conn = std::make_shared<fw::uring_tcp_connection>(std::move(c));
    conn->async_read_some([&, conn](std::error_code ec, fw::tensor_buffer b) {
      REQUIRE_FALSE(ec);
      CHECK(conn->stats().ring_buffers == 1);
      first.set_value(std::move(b));
      conn->async_read_some([&, conn](std::error_code ec2, fw::tensor_buffer b2) {
        REQUIRE_FALSE(ec2);
        second.set_value(std::move(b2));
      });
    });
  });
  const auto src = pattern(2000, 11);
  auto client = std::make_shared<fw::uring_tcp_connection>();  // touched on reactor 1 only
  std::vector<std::byte> never(1);
  h.group.submit_to(1, [&, client] {
    h.transport.connect(harness<fw::uring_tcp>::here(), "127.0.0.1", port, [&, client](std::error_code ec,
                                                                                      fw::uring_tcp_connection c) {
      REQUIRE_FALSE(ec);
      *client = std::move(c);
      const fw::const_buffer one[] = {fw::const_buffer(src.data(), 1000)};
      client->async_write(one, [](std::error_code, std::size_t) {});
      client->async_read(fw::mutable_buffer(never), [client](std::error_code, std::size_t) {});
    });
  });
  auto f1 = first.get_future();
  fw::tensor_buffer a = get(f1);
  REQUIRE(a.size() == 1000);
  CHECK(std::memcmp(a.data(), src.data(), 1000) == 0);
  h.group.submit_to(1, [&, client] {
    const fw::const_buffer one[] = {fw::const_buffer(src.data() + 1000, 1000)};
    client->async_write(one, [](std::error_code, std::size_t) {});
  });
  auto f2 = second.get_future();
  fw::tensor_buffer b = get(f2);
  REQUIRE(b.size() == 1000);
  CHECK(std::memcmp(b.data(), src.data() + 1000, 1000) == 0);
  a.reset();  // while the reactor runs: queued for it, put back on its next tick
  h.group.stop();
  client.reset();
  CHECK(std::memcmp(b.data(), src.data() + 1000, 1000) == 0);  // the ring's memory outlives the ring
  b.reset();
}
#endif
