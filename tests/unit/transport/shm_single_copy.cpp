// shm's pieces: parts of a write that the peer copies straight out of the
// writer's memory (single copy, at least single_copy_min long) or out of the
// writer's shared pool. Stream order with the ring's bytes, either side
// switching single copy off, a pool that is off or full, a writer closing
// before its piece was read, and a peer announcing pieces, or sending a
// pool, it should not.
#include <fcntl.h>
#include <sys/mman.h>

#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/shm.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shm_harness.hpp"

namespace shm_single_copy_cases {

namespace fw = fusewire;
namespace seg = fusewire::detail::shm;
using namespace std::chrono_literals;
using fusewire::test::shm::raw_peer;
using fusewire::test::shm::reported_group;

namespace {

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  return v;
}

/// A connected pair: `server` lives on reactor 0, `client` on reactor 1.
struct connected {
  fw::shm_listener listener;
  std::unique_ptr<fw::shm_connection> server, client;

  void open(reported_group& g, const fw::shm& server_side, const fw::shm& client_side) {
    std::promise<void> accepted, made;
    const std::uint16_t port = g.on(0, [&] {
      listener = server_side.listen(*fw::asio_reactor::current(), "single-copy", 0);
      listener.async_accept([&](std::error_code ec, fw::shm_connection c) {
        REQUIRE_FALSE(ec);
        server = std::make_unique<fw::shm_connection>(std::move(c));
        accepted.set_value();
      });
      return listener.port();
    });
    g.on(1, [&] {
      client_side.connect(*fw::asio_reactor::current(), "single-copy", port,
                          [&](std::error_code ec, fw::shm_connection c) {
                            REQUIRE_FALSE(ec);
                            client = std::make_unique<fw::shm_connection>(std::move(c));
                            made.set_value();
                          });
      return 0;
    });
    REQUIRE(accepted.get_future().wait_for(10s) == std::future_status::ready);
    REQUIRE(made.get_future().wait_for(10s) == std::future_status::ready);
  }
  /// One byte each way: a side probes its peer on its first read, so after
  /// this each has learnt whether it reads the other's pieces.
  void warm_up(reported_group& g) {
    static const std::byte one[1] = {std::byte{1}};
    const fw::const_buffer sg[] = {fw::const_buffer(one, 1)};
    for (unsigned reader : {0u, 1u}) {
      fw::shm_connection* r = reader == 0 ? server.get() : client.get();
      fw::shm_connection* w = reader == 0 ? client.get() : server.get();
      std::byte got[1];
      std::promise<std::error_code> done;
      g.on(reader, [&] {
        r->async_read(fw::mutable_buffer(got, 1), [&](std::error_code ec, std::size_t) { done.set_value(ec); });
        return 0;
      });
      g.on(1 - reader, [&] {
        w->async_write(sg, [](std::error_code, std::size_t) {});
        return 0;
      });
      auto f = done.get_future();
      REQUIRE(f.wait_for(10s) == std::future_status::ready);
      REQUIRE_FALSE(f.get());
    }
  }
  void close(reported_group& g) {
    g.on(1, [&] {
      client.reset();
      return 0;
    });
    g.on(0, [&] {
      server.reset();
      listener.close();
      return 0;
    });
  }
};

/// Reads `n` bytes with async_read_some, one delivery at a time, on `conn`'s reactor.
struct some_reader {
  fw::shm_connection* conn = nullptr;
  std::vector<std::byte> got;
  std::size_t want = 0;
  std::promise<std::error_code> done;
  void next() {
    if (got.size() >= want) return done.set_value({});
    conn->async_read_some([this](std::error_code ec, fw::tensor_buffer b) {
      if (ec) return done.set_value(ec);
      got.insert(got.end(), b.data(), b.data() + b.size());
      next();
    });
  }
};

/// Reads into `dst` with async_read in pieces of `step` bytes (the last shorter).
struct exact_reader {
  fw::shm_connection* conn = nullptr;
  std::vector<std::byte>* dst = nullptr;
  std::size_t at = 0, step = 0;
  std::promise<std::error_code> done;
  void next() {
    if (at == dst->size()) return done.set_value({});
    const std::size_t n = std::min(step, dst->size() - at);
    conn->async_read(fw::mutable_buffer(dst->data() + at, n), [this, n](std::error_code ec, std::size_t got) {
      if (ec || got != n) return done.set_value(ec ? ec : make_error_code(fw::errc::connection_reset));
      at += n;
      next();
    });
  }
};

/// The hand-made connecting side, with the probe the accepting side reads
/// published (this process is the peer it sees), so that it reads pieces.
struct piece_peer : raw_peer {
  std::uint64_t probe = 0x1234abcd5678ef01ull;

  bool open(std::uint16_t port, const char* host) {
    if (!connect(port, host)) return false;
    make_segment(4096);
    map.header()->side[0].probe_value.store(probe);
    map.header()->side[0].probe_addr.store(reinterpret_cast<std::uintptr_t>(&probe));
    return send_hello({seg::segment_magic, seg::segment_version, 0, 4096},
                      {memfd.get(), client_bell.get(), server_bell.get()});
  }
  /// Announces a piece of `size` bytes at `addr`, at ring position `at`.
  void announce(std::uint64_t at, const void* addr, std::uint64_t size) {
    seg::remote_queue& q = map.header()->remote[0];
    const std::uint64_t n = q.head.load();
    q.slot[n % seg::remote_slots] = {at, reinterpret_cast<std::uintptr_t>(addr), size, seg::piece_kind::process};
    q.head.store(n + 1);
    ring_server();
  }
};

/// `n` bytes read from `conn` (on reactor `r` of `g`) by async_read in steps of `step`.
std::vector<std::byte> read_exactly(reported_group& g, unsigned r, fw::shm_connection& conn, std::size_t n,
                                    std::size_t step) {
  std::vector<std::byte> back(n);
  exact_reader er;
  er.conn = &conn;
  er.dst = &back;
  er.step = step;
  g.on(r, [&] {
    er.next();
    return 0;
  });
  auto ef = er.done.get_future();
  REQUIRE(ef.wait_for(30s) == std::future_status::ready);
  CHECK_FALSE(ef.get());
  return back;
}

/// Client -> server: `sg` written twice and read by async_read_some; server ->
/// client: `big` written once and read by async_read in odd steps. Checks
/// every byte and that the writes completed in order; returns the client's
/// and the server's stats.
std::pair<fw::shm_stats, fw::shm_stats> exchange(reported_group& g, connected& p, std::span<const fw::const_buffer> sg,
                                                 fw::const_buffer big) {
  std::vector<std::byte> expect;
  for (const auto& piece : sg) expect.insert(expect.end(), piece.data(), piece.data() + piece.size());
  const std::size_t one_write = expect.size();
  expect.insert(expect.end(), expect.begin(), expect.end());
  std::vector<int> order;
  std::promise<void> written;
  g.on(1, [&] {
    for (int i = 0; i < 2; ++i) {
      p.client->async_write(sg, [&, i](std::error_code ec, std::size_t n) {
        CHECK_FALSE(ec);
        CHECK(n == one_write);
        order.push_back(i);
        if (order.size() == 2) written.set_value();
      });
    }
    return 0;
  });
  some_reader sr;
  sr.conn = p.server.get();
  sr.want = expect.size();
  g.on(0, [&] {
    sr.next();
    return 0;
  });
  auto sf = sr.done.get_future();
  REQUIRE(sf.wait_for(30s) == std::future_status::ready);
  CHECK_FALSE(sf.get());
  REQUIRE(written.get_future().wait_for(30s) == std::future_status::ready);
  CHECK(order == std::vector<int>{0, 1});
  CHECK(sr.got == expect);

  const fw::const_buffer one[] = {big};
  std::promise<std::error_code> sent;
  g.on(0, [&] {
    p.server->async_write(one, [&](std::error_code ec, std::size_t) { sent.set_value(ec); });
    return 0;
  });
  const std::vector<std::byte> back = read_exactly(g, 1, *p.client, big.size(), 333331);
  CHECK_FALSE(sent.get_future().get());
  CHECK(std::equal(back.begin(), back.end(), big.begin(), big.end()));
  return {g.on(1, [&] { return p.client->stats(); }), g.on(0, [&] { return p.server->stats(); })};
}

/// A listener on reactor 0 of `g` that accepted one hand-made connecting
/// side, `peer`, which publishes this process as the one to read pieces of.
struct raw_accepted {
  fw::shm_listener listener;
  std::unique_ptr<fw::shm_connection> conn;
  piece_peer peer;

  raw_accepted(reported_group& g, const fw::shm& transport, const char* host) {
    std::promise<void> accepted;
    const std::uint16_t port = g.on(0, [&] {
      listener = transport.listen(*fw::asio_reactor::current(), host, 0);
      listener.async_accept([&](std::error_code ec, fw::shm_connection c) {
        REQUIRE_FALSE(ec);
        conn = std::make_unique<fw::shm_connection>(std::move(c));
        accepted.set_value();
      });
      return listener.port();
    });
    REQUIRE(peer.open(port, host));
    REQUIRE(accepted.get_future().wait_for(10s) == std::future_status::ready);
  }
  void close(reported_group& g) {
    g.on(0, [&] {
      conn.reset();
      listener.close();
      return 0;
    });
  }
};

}  // namespace

TEST_CASE("shm single copy: large pieces are copied once, in stream order with the ring's bytes") {
  const std::size_t big_a = 200 * 1024, big_b = (std::size_t{1} << 20) + 3;  // the second longer than the ring
  const auto small_a = pattern(10, 1), small_b = pattern(100, 2), small_c = pattern(5, 3);
  const auto a = pattern(big_a, 4), b = pattern(big_b, 5), c = pattern(3 * 1024 * 1024, 6);
  for (const bool server_on : {true, false}) {
    for (const bool client_on : {true, false}) {
      for (fw::reactor_mode mode : {fw::reactor_mode::block, fw::reactor_mode::poll}) {
        CAPTURE(server_on);
        CAPTURE(client_on);
        CAPTURE(static_cast<int>(mode));
        fw::shm::config on_cfg, off_cfg;
        on_cfg.single_copy_min = 64 * 1024;
        reported_group g(mode, 2);
        connected p;
        p.open(g, fw::shm(server_on ? on_cfg : off_cfg), fw::shm(client_on ? on_cfg : off_cfg));
        p.warm_up(g);

        const fw::const_buffer sg[] = {
            fw::const_buffer(small_a.data(), small_a.size()), fw::const_buffer(a.data(), a.size()),
            fw::const_buffer(small_b.data(), small_b.size()), fw::const_buffer(b.data(), b.size()),
            fw::const_buffer(small_c.data(), small_c.size())};
        const std::size_t one_write = small_a.size() + a.size() + small_b.size() + b.size() + small_c.size();
        const auto [cs, ss] = exchange(g, p, sg, fw::const_buffer(c.data(), c.size()));
        const bool both = server_on && client_on;
        CHECK(cs.bytes_sent == 2 * one_write + 1);  // and warm_up's byte
        CHECK(ss.bytes_received == 2 * one_write + 1);
        CHECK(cs.single_copy_sent == (both ? 2 * (big_a + big_b) : 0));
        CHECK(ss.single_copy_received == cs.single_copy_sent);
        CHECK(ss.single_copy_sent == (both ? c.size() : 0));
        CHECK(cs.single_copy_received == ss.single_copy_sent);
        p.close(g);
      }
    }
  }
}

TEST_CASE("shm single copy: try_read takes the ring's bytes, never an announced piece") {
  fw::shm::config on_cfg;
  on_cfg.single_copy_min = 64 * 1024;
  reported_group g(fw::reactor_mode::block, 2);
  connected p;
  p.open(g, fw::shm(on_cfg), fw::shm(on_cfg));
  p.warm_up(g);
  const auto small = pattern(10, 7), big = pattern(100 * 1024, 8);
  const fw::const_buffer sg[] = {fw::const_buffer(small.data(), small.size()),
                                 fw::const_buffer(big.data(), big.size())};
  std::promise<std::error_code> sent;
  g.on(1, [&] {
    p.client->async_write(sg, [&](std::error_code ec, std::size_t) { sent.set_value(ec); });
    return 0;
  });
  struct outcome {
    bool rest = false, piece = true;
    std::error_code ec;
  };
  std::vector<std::byte> got(small.size() + big.size());
  std::promise<outcome> done;
  g.on(0, [&] {
    p.server->async_read(fw::mutable_buffer(got.data(), 5), [&](std::error_code ec, std::size_t) {
      outcome o;
      o.rest = !ec && p.server->try_read(fw::mutable_buffer(got.data() + 5, 5));
      std::byte b{};
      o.piece = p.server->try_read(fw::mutable_buffer(&b, 1));  // the next byte is the piece's
      p.server->async_read(fw::mutable_buffer(got.data() + 10, big.size()),
                           [&, o](std::error_code e, std::size_t) mutable {
                             o.ec = e;
                             done.set_value(o);
                           });
    });
    return 0;
  });
  auto f = done.get_future();
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  const outcome o = f.get();
  CHECK(o.rest);
  CHECK_FALSE(o.piece);
  CHECK_FALSE(o.ec);
  auto sf = sent.get_future();
  REQUIRE(sf.wait_for(30s) == std::future_status::ready);  // the piece was read whole: acknowledged
  CHECK_FALSE(sf.get());
  std::vector<std::byte> expect(small);
  expect.insert(expect.end(), big.begin(), big.end());
  CHECK(got == expect);
  CHECK(g.on(0, [&] { return p.server->stats().single_copy_received; }) == big.size());
  p.close(g);
}

TEST_CASE("shm single copy: a writer that closes before its piece was read fails the read, not with its bytes") {
  reported_group g(fw::reactor_mode::block, 2);
  connected p;
  fw::shm::config cfg;
  cfg.single_copy_min = 64 * 1024;
  p.open(g, fw::shm(cfg), fw::shm(cfg));
  p.warm_up(g);

  const auto big = pattern(512 * 1024, 10);
  const fw::const_buffer sg[] = {fw::const_buffer(big.data(), big.size())};
  std::promise<std::error_code> wrote;
  g.on(1, [&] {
    p.client->async_write(sg, [&](std::error_code ec, std::size_t) { wrote.set_value(ec); });
    return 0;
  });
  std::this_thread::sleep_for(20ms);  // announced, and nobody reads it
  g.on(1, [&] {
    p.client->close();
    return 0;
  });
  auto wf = wrote.get_future();
  REQUIRE(wf.wait_for(10s) == std::future_status::ready);
  CHECK(wf.get() == fw::errc::cancelled);
  std::vector<std::byte> dst(big.size());
  std::promise<std::pair<std::error_code, std::size_t>> read2;
  g.on(0, [&] {
    p.server->async_read(fw::mutable_buffer(dst.data(), dst.size()), [&](std::error_code ec, std::size_t n) {
      read2.set_value({ec, n});
    });
    return 0;
  });
  auto rf = read2.get_future();
  REQUIRE(rf.wait_for(10s) == std::future_status::ready);
  const auto [ec, n] = rf.get();
  CHECK(ec == fw::errc::connection_reset);
  CHECK(n == 0);
  CHECK(g.on(0, [&] { return p.server->stats().single_copy_received; }) == 0);
  p.close(g);
}

TEST_CASE("shm single copy: pieces a peer should not announce fail the connection with errc::malformed_frame") {
  struct hostile {
    const char* name;
    bool reader_on;
    const char* report;
  };
  for (const hostile& h : {hostile{"bad address", true, "bytes of the peer's piece at 0x10 failed: Bad address"},
                           hostile{"before the read index", true,
                                   "announced a piece of 100 bytes at ring position 0 "
                                   "(read index 16)"},
                           hostile{"to a side that reads none", false, "but this side reads no pieces"}}) {
    CAPTURE(h.name);
    reported_group g(fw::reactor_mode::block, 2);
    fw::shm::config cfg;
    if (h.reader_on) cfg.single_copy_min = 64 * 1024;
    raw_accepted r(g, fw::shm(cfg), "single-copy-raw");
    piece_peer& peer = r.peer;
    std::unique_ptr<fw::shm_connection>& conn = r.conn;

    // An honest piece first (when the side reads pieces): it arrives, and is acknowledged.
    const auto data = pattern(100, 11);
    std::vector<std::byte> got(100);
    std::uint64_t after_ring = 0;  ///< where the stream stands after the ring's bytes
    if (h.reader_on) {
      // Four bytes through the ring, then the piece: the reader probes the peer on its first read.
      std::promise<std::error_code> first;
      g.on(0, [&] {
        conn->async_read(fw::mutable_buffer(got.data(), 4),
                         [&](std::error_code ec, std::size_t) { first.set_value(ec); });
        return 0;
      });
      after_ring = peer.publish_record(0, std::span(data).first(4));
      peer.ring_server();
      CHECK_FALSE(first.get_future().get());
      CHECK(peer.map.header()->side[1].reads_peer.load() == static_cast<std::uint32_t>(seg::single_copy::works));
      std::promise<std::error_code> second;
      g.on(0, [&] {
        conn->async_read(fw::mutable_buffer(got.data(), 100),
                         [&](std::error_code ec, std::size_t) { second.set_value(ec); });
        return 0;
      });
      peer.announce(after_ring, data.data(), 100);
      auto sf = second.get_future();
      REQUIRE(sf.wait_for(10s) == std::future_status::ready);
      CHECK_FALSE(sf.get());
      CHECK(got == data);
      CHECK(peer.map.header()->remote[0].tail.load() == 1);
    }

    std::promise<std::pair<std::error_code, std::size_t>> done;
    g.on(0, [&] {
      conn->async_read(fw::mutable_buffer(got.data(), 100), [&](std::error_code ec, std::size_t n) {
        done.set_value({ec, n});
      });
      return 0;
    });
    const std::string which = h.name;
    if (which == "bad address") {
      peer.announce(after_ring, reinterpret_cast<const void*>(std::uintptr_t{0x10}), 100);
    } else {
      peer.announce(0, data.data(), 100);
    }
    auto df = done.get_future();
    REQUIRE(df.wait_for(10s) == std::future_status::ready);
    const auto [ec, n] = df.get();
    CHECK(ec == fw::errc::malformed_frame);
    CHECK(n == 0);
    CHECK(g.wait_report(h.report));
    r.close(g);
  }
}

TEST_CASE("shm shared pool: pieces in the pool are copied once by the peer, in stream order with the ring's bytes") {
  const std::size_t big_a = 200 * 1024, big_b = (std::size_t{1} << 20) + 3, big_c = 3 * 1024 * 1024;
  const auto small_a = pattern(10, 1), small_b = pattern(100, 2), small_c = pattern(5, 3), small_pool = pattern(999, 7);
  for (const bool single_copy : {false, true}) {
    for (fw::reactor_mode mode : {fw::reactor_mode::block, fw::reactor_mode::poll}) {
      CAPTURE(single_copy);
      CAPTURE(static_cast<int>(mode));
      fw::shm::config cfg;
      cfg.single_copy_min = single_copy ? 64 * 1024 : 0;
      const fw::shm server_side(cfg), client_side(cfg);
      // The pool's buffers, and one of ordinary memory (through the ring, or by single copy).
      fw::tensor_buffer a = client_side.allocate_shared(big_a), tiny = client_side.allocate_shared(small_pool.size());
      fw::tensor_buffer c = server_side.allocate_shared(big_c);
      const auto a_bytes = pattern(big_a, 4), b = pattern(big_b, 5), c_bytes = pattern(big_c, 6);
      std::memcpy(a.data(), a_bytes.data(), big_a);
      std::memcpy(tiny.data(), small_pool.data(), small_pool.size());
      std::memcpy(c.data(), c_bytes.data(), big_c);
      reported_group g(mode, 2);
      connected p;
      p.open(g, server_side, client_side);
      p.warm_up(g);

      const fw::const_buffer sg[] = {fw::const_buffer(small_a.data(), small_a.size()),
                                     fw::const_buffer(a.bytes()),
                                     fw::const_buffer(small_b.data(), small_b.size()),
                                     fw::const_buffer(b.data(), b.size()),
                                     fw::const_buffer(tiny.bytes()),
                                     fw::const_buffer(small_c.data(), small_c.size())};
      std::size_t one_write = 0;
      for (const fw::const_buffer& piece : sg) one_write += piece.size();
      const auto [cs, ss] = exchange(g, p, sg, c.bytes());  // server -> client: one piece of the server's pool
      CHECK(cs.bytes_sent == 2 * one_write + 1);            // and warm_up's byte
      CHECK(ss.bytes_received == 2 * one_write + 1);
      CHECK(cs.pool_sent == 2 * big_a);  // the tiny pool buffer is below pool_piece_min: the ring takes it
      CHECK(ss.pool_received == cs.pool_sent);
      CHECK(cs.single_copy_sent == (single_copy ? 2 * big_b : 0));
      CHECK(ss.single_copy_received == cs.single_copy_sent);
      CHECK(ss.pool_sent == big_c);
      CHECK(cs.pool_received == big_c);
      CHECK(ss.single_copy_sent == 0);
      p.close(g);
    }
  }
}

namespace {
/// Writes `sg` from the client and reads it on the server in one read;
/// checks that the write succeeded and returns what was read.
std::vector<std::byte> client_to_server(reported_group& g, connected& p, std::span<const fw::const_buffer> sg) {
  std::size_t n = 0;
  for (const fw::const_buffer& b : sg) n += b.size();
  std::promise<std::error_code> sent;
  g.on(1, [&] {
    p.client->async_write(sg, [&](std::error_code ec, std::size_t) { sent.set_value(ec); });
    return 0;
  });
  std::vector<std::byte> back = read_exactly(g, 0, *p.server, n, n);
  auto sf = sent.get_future();
  REQUIRE(sf.wait_for(10s) == std::future_status::ready);
  CHECK_FALSE(sf.get());
  return back;
}
}  // namespace

TEST_CASE("shm shared pool: the reader of a long pool transfer wakes the sleeping writer once, at its end") {
  // A 64 KiB ring: the reader takes the 16 MiB piece in 256 steps, and a
  // writer woken at each would find nothing to do (its write completes when
  // the whole piece was copied).
  fw::shm::config cfg;
  cfg.ring_size = 64 * 1024;
  const fw::shm side(cfg);
  const std::size_t n = std::size_t{16} << 20;
  fw::tensor_buffer big = side.allocate_shared(n);
  const auto data = pattern(n, 11);
  std::memcpy(big.data(), data.data(), n);
  reported_group g(fw::reactor_mode::block, 2);
  connected p;
  p.open(g, side, side);
  p.warm_up(g);
  const std::uint64_t woken_before = g.on(0, [&] { return p.server->stats().wakeups_sent; });
  const fw::const_buffer sg[] = {fw::const_buffer(big.bytes())};
  CHECK(client_to_server(g, p, sg) == data);
  const fw::shm_stats ss = g.on(0, [&] { return p.server->stats(); });
  CHECK(ss.pool_received == n);
  CHECK(ss.wakeups_sent - woken_before <= 1);
  p.close(g);
}

TEST_CASE("shm shared pool: without a pool, or when it is full, allocate_shared gives ordinary memory") {
  fw::shm::config off, small;
  off.pool_size = 0;
  small.pool_size = std::size_t{1} << 20;
  const fw::shm no_pool(off), small_pool(small);
  const std::size_t n = 600 * 1024;
  fw::tensor_buffer in_pool = small_pool.allocate_shared(n);
  fw::tensor_buffer over = small_pool.allocate_shared(n);  // the pool has no second block this large
  fw::tensor_buffer plain = no_pool.allocate_shared(n);
  for (fw::tensor_buffer* t : {&in_pool, &over, &plain}) {
    REQUIRE(t->size() == n);
    std::memset(t->data(), 0x5a, n);
  }
  const auto data = pattern(n, 9);
  std::memcpy(over.data(), data.data(), n);
  reported_group g(fw::reactor_mode::block, 2);
  connected p;
  p.open(g, no_pool, small_pool);
  p.warm_up(g);
  const fw::const_buffer sg[] = {fw::const_buffer(in_pool.bytes()), fw::const_buffer(over.bytes())};
  const std::vector<std::byte> back = client_to_server(g, p, sg);
  CHECK(std::all_of(back.begin(), back.begin() + n, [](std::byte x) { return x == std::byte{0x5a}; }));
  CHECK(std::equal(back.begin() + n, back.end(), data.begin()));
  const fw::shm_stats cs = g.on(1, [&] { return p.client->stats(); });
  CHECK(cs.pool_sent == n);  // the first buffer only
  p.close(g);
  // A pool buffer may outlive its transport and its connections.
  in_pool.data()[0] = std::byte{1};
}

namespace {
/// A sealed memfd of `size` bytes mapped writable, as a pool a raw peer sends.
struct raw_pool {
  seg::unique_fd fd;
  std::byte* base = nullptr;
  std::size_t size = 0;
  explicit raw_pool(std::size_t n, int seals = F_SEAL_SHRINK | F_SEAL_GROW) : size(n) {
    fd = seg::unique_fd(::memfd_create("test-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(fd);
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(n)) == 0);
    if (seals != 0) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0);
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<std::byte*>(p);
  }
  ~raw_pool() { ::munmap(base, size); }
  seg::pool_hello hello() const { return {seg::pool_magic, seg::segment_version, 0, size}; }
};

void announce_pool(piece_peer& peer, std::uint64_t at, std::uint64_t offset, std::uint64_t size) {
  seg::remote_queue& q = peer.map.header()->remote[0];
  const std::uint64_t n = q.head.load();
  q.slot[n % seg::remote_slots] = {at, offset, size, seg::piece_kind::pool};
  q.head.store(n + 1);
  peer.ring_server();
}
}  // namespace

TEST_CASE("shm shared pool: a peer's bad pool or pool piece fails the connection with errc::malformed_frame") {
  const std::size_t pool_bytes = std::size_t{1} << 20;
  for (const char* name :
       {"no pool sent", "outside the pool", "unsealed pool", "pool sent twice", "junk message", "too small a pool"}) {
    CAPTURE(name);
    const std::string which = name;
    reported_group g(fw::reactor_mode::block, 1);
    raw_accepted r(g, fw::shm(), "pool-raw");  // no single copy: pool pieces need none
    piece_peer& peer = r.peer;
    std::unique_ptr<fw::shm_connection>& conn = r.conn;
    raw_pool pool(which == "too small a pool" ? 64 * 1024 : pool_bytes,
                  which == "unsealed pool" ? 0 : F_SEAL_SHRINK | F_SEAL_GROW);
    const auto data = pattern(100 * 1024, 12);
    if (pool.size >= 4096 + data.size()) std::memcpy(pool.base + 4096, data.data(), data.size());
    std::vector<std::byte> got(data.size());
    const auto read = [&](std::promise<std::pair<std::error_code, std::size_t>>& done) {
      g.on(0, [&] {
        conn->async_read(fw::mutable_buffer(got.data(), got.size()), [&](std::error_code ec, std::size_t n) {
          done.set_value({ec, n});
        });
        return 0;
      });
    };
    std::string report;
    if (which == "no pool sent") {
      report = "announced a piece of 102400 bytes at ring position 0 (read index 0), but sent no pool";
    } else if (which == "junk message") {
      const std::uint64_t junk = 42;
      REQUIRE(peer.send_message(junk, {}));
      report = "a message of 8 bytes and 0 descriptors on the control socket that is not its pool";
    } else {
      REQUIRE(peer.send_message(pool.hello(), {pool.fd.get()}));
      if (which == "unsealed pool") report = "pool is not a memfd sealed against shrinking and growing";
      if (which == "too small a pool") report = "the peer's pool of 65536 bytes is not within";
      if (which == "pool sent twice" || which == "outside the pool") {
        // An honest piece of the pool first: it arrives, and is acknowledged.
        std::promise<std::pair<std::error_code, std::size_t>> first;
        read(first);
        announce_pool(peer, 0, 4096, data.size());
        auto ff = first.get_future();
        REQUIRE(ff.wait_for(10s) == std::future_status::ready);
        CHECK_FALSE(ff.get().first);
        CHECK(got == data);
        CHECK(peer.map.header()->remote[0].tail.load() == 1);
        if (which == "pool sent twice") {
          REQUIRE(peer.send_message(pool.hello(), {pool.fd.get()}));
          report = "the peer sent its pool a second time";
        } else {
          report = "at offset 1048000 of its pool of 1048576 bytes";
        }
      }
    }
    std::promise<std::pair<std::error_code, std::size_t>> done;
    read(done);
    if (which == "outside the pool") announce_pool(peer, 0, 1048000, data.size());
    if (which == "no pool sent") announce_pool(peer, 0, 4096, data.size());
    auto df = done.get_future();
    REQUIRE(df.wait_for(10s) == std::future_status::ready);
    const auto [ec, n] = df.get();
    CHECK(ec == fw::errc::malformed_frame);
    CHECK(n == 0);
    CHECK(g.wait_report(report));
    r.close(g);
  }
}

}  // namespace shm_single_copy_cases
