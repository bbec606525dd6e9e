// The transport test suite, written once: included by every instantiation
// (tests/unit/transport/transport_suite.cpp for the TCP transports,
// tests/rdma/verbs_suite.cpp for verbs). Before including it, define
//   TRANSPORTS            the comma-separated transport types to instantiate for;
// and optionally
//   SUITE_HOST            an expression giving the address to listen on and connect to
//                         (default "127.0.0.1");
//   SUITE_MAKE(T)         an expression making a transport T (default T{});
//   SUITE_LARGEST_ECHO    the largest echo size in bytes (default 64 MiB).
// Server and client run on different reactors (threads) of one group.
#pragma once

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#ifndef TRANSPORTS
#error "define TRANSPORTS before including transport_suite.hpp"
#endif
#ifndef SUITE_HOST
#define SUITE_HOST std::string("127.0.0.1")
#endif
#ifndef SUITE_MAKE
#define SUITE_MAKE(T) T{}
#endif
#ifndef SUITE_LARGEST_ECHO
#define SUITE_LARGEST_ECHO (std::size_t{64} << 20)
#endif

namespace fw = fusewire;
using namespace std::chrono_literals;

namespace {

template <class T>
T get(std::future<T>& f) {
  REQUIRE_MESSAGE(f.wait_for(120s) == std::future_status::ready, "timed out waiting for a reactor");
  return f.get();
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

/// Two reactors (server on 0, client on 1) and a transport.
template <class T>
struct harness {
  using reactor_t = typename T::reactor_type;
  using group_t = fw::basic_reactor_group<typename reactor_t::engine_type>;
  using conn_t = typename T::connection_type;
  using listener_t = typename T::listener_type;

  static fw::reactor_config config(fw::reactor_mode mode) {
    fw::reactor_config cfg;
    cfg.mode = mode;
    cfg.count = 2;
    cfg.idle_poll = 100us;
    return cfg;
  }

  explicit harness(fw::reactor_mode mode = fw::reactor_mode::adaptive, T t = SUITE_MAKE(T),
                   typename group_t::engine_config engine = {})
      : transport(std::move(t)), group(config(mode), engine) {}
  ~harness() { group.stop(); }

  template <class F>
  auto on(unsigned core, F&& f) {
    auto fut = group.submit(core, std::forward<F>(f));
    return get(fut);
  }

  static reactor_t& here() { return *reactor_t::current(); }

  /// Listens on SUITE_HOST (any port) on `core`; `on_accept(conn)` runs for each connection.
  std::uint16_t serve(unsigned core, std::function<void(conn_t)> on_accept) {
    return on(core, [this, on_accept = std::move(on_accept)]() mutable {
      struct server : std::enable_shared_from_this<server> {
        listener_t listener;
        std::function<void(conn_t)> on_accept;
        void loop() {
          listener.async_accept([self = this->shared_from_this()](std::error_code ec, conn_t c) {
            if (ec) return;
            self->on_accept(std::move(c));
            self->loop();
          });
        }
      };
      auto srv = std::make_shared<server>();
      srv->listener = transport.listen(here(), SUITE_HOST, 0);
      srv->on_accept = std::move(on_accept);
      srv->loop();
      return srv->listener.port();
    });
  }

  /// An echo server: every buffer read_some delivers is written back.
  std::uint16_t serve_echo(unsigned core) {
    return serve(core, [](conn_t c) {
      struct session : std::enable_shared_from_this<session> {
        conn_t conn;
        void read() {
          conn.async_read_some([self = this->shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
            if (ec) {
              self->conn.close();
              return;
            }
            auto held = std::make_shared<fw::tensor_buffer>(std::move(b));
            const fw::const_buffer one[] = {held->bytes()};
            self->conn.async_write(one, [held](std::error_code, std::size_t) {});
            self->read();
          });
        }
      };
      auto s = std::make_shared<session>();
      s->conn = std::move(c);
      s->read();
    });
  }

  /// Connects from reactor 1 to `port` and writes `src` in writes of `piece`
  /// bytes (so the reader sees boundaries unlike its reads'), then keeps the
  /// connection until the server closes it: that read's error, as a future.
  std::future<std::error_code> write_in_pieces(std::uint16_t port, const std::vector<std::byte>& src,
                                               std::size_t piece) {
    auto eof = std::make_shared<std::promise<std::error_code>>();
    auto done = eof->get_future();
    group.submit_to(1, [this, port, &src, piece, eof] {
      transport.connect(here(), SUITE_HOST, port, [&src, piece, eof](std::error_code ec, conn_t c) {
        REQUIRE_FALSE(ec);
        auto conn = std::make_shared<conn_t>(std::move(c));
        for (std::size_t off = 0; off < src.size(); off += piece) {
          const fw::const_buffer one[] = {fw::const_buffer(src.data() + off, std::min(piece, src.size() - off))};
          conn->async_write(one, [conn](std::error_code e, std::size_t) { CHECK_FALSE(e); });
        }
        auto sink = std::make_shared<std::byte>();
        conn->async_read(fw::mutable_buffer(sink.get(), 1),
                         [conn, sink, eof](std::error_code e, std::size_t) { eof->set_value(e); });
      });
    });
    return done;
  }

  T transport;
  group_t group;
};

struct echo_result {
  std::error_code connect_ec, write_ec, read_ec;
  std::size_t written = 0, read = 0;
  std::string peer;
};

/// Connects from `core`, writes `sg` while reading sg's total size back into `dst`.
template <class T>
echo_result client_echo(harness<T>& h, unsigned core, std::uint16_t port, std::vector<fw::const_buffer> sg,
                        fw::mutable_buffer dst) {
  using conn_t = typename T::connection_type;
  struct state {
    conn_t conn;
    echo_result r;
    int pending = 2;
    std::promise<echo_result> done;
    void step() {
      if (--pending == 0) {
        conn.close();
        done.set_value(r);
      }
    }
  };
  // Only reactor threads may hold the state (it owns a connection handle).
  auto st = std::make_shared<state>();
  auto fut = st->done.get_future();
  h.group.submit_to(core, [&h, st = std::move(st), port, sg = std::move(sg), dst]() mutable {
    h.transport.connect(harness<T>::here(), SUITE_HOST, port,
                        [st, sg = std::move(sg), dst](std::error_code ec, conn_t c) mutable {
                          if (ec) {
                            st->r.connect_ec = ec;
                            st->done.set_value(st->r);
                            return;
                          }
                          st->conn = std::move(c);
                          st->r.peer = st->conn.remote_endpoint();
                          st->conn.async_read(dst, [st](std::error_code e, std::size_t n) {
                            st->r.read_ec = e;
                            st->r.read = n;
                            st->step();
                          });
                          st->conn.async_write(sg, [st](std::error_code e, std::size_t n) {
                            st->r.write_ec = e;
                            st->r.written = n;
                            st->step();
                          });
                        });
  });
  return get(fut);
}

/// Connects from reactor 1 to `port`, writes `sg` and returns the write's
/// (error, bytes); the write handler holds the connection until then.
template <class T>
std::pair<std::error_code, std::size_t> connect_and_write(harness<T>& h, std::uint16_t port,
                                                          std::span<const fw::const_buffer> sg) {
  std::promise<std::pair<std::error_code, std::size_t>> wrote;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&](std::error_code ec, typename T::connection_type c) {
      REQUIRE_FALSE(ec);
      auto conn = std::make_shared<typename T::connection_type>(std::move(c));
      conn->async_write(sg, [&, conn](std::error_code e, std::size_t n) { wrote.set_value({e, n}); });
    });
  });
  auto f = wrote.get_future();
  return get(f);
}

/// A port nobody listens on (bound, then closed).
std::uint16_t closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE_TEMPLATE("connect and accept on loopback", T, TRANSPORTS) {
  harness<T> h;
  std::promise<std::string> accepted_peer;
  const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
    CHECK(c.is_open());
    accepted_peer.set_value(c.remote_endpoint());
  });
  CHECK(port != 0);
  std::promise<std::pair<std::string, bool>> connected;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&](std::error_code ec, typename T::connection_type c) {
      CHECK_FALSE(ec);
      connected.set_value({c.remote_endpoint(), c.is_open()});
    });
  });
  auto r = connected.get_future();
  auto client = get(r);
  CHECK(client.first == SUITE_HOST + ":" + std::to_string(port));
  CHECK(client.second);
  auto f = accepted_peer.get_future();
  CHECK(get(f).rfind(SUITE_HOST + ":", 0) == 0);
}

TEST_CASE_TEMPLATE("echo 1 B .. 64 MiB byte for byte" * doctest::timeout(600), T, TRANSPORTS) {
  for (fw::reactor_mode mode : {fw::reactor_mode::adaptive, fw::reactor_mode::block, fw::reactor_mode::poll}) {
    CAPTURE(static_cast<int>(mode));
    harness<T> h(mode);
    const std::uint16_t port = h.serve_echo(0);
    std::vector<std::size_t> sizes = {1, 10, 100, 1000, 4096, 65536, 100000, 1u << 20};
    if (mode == fw::reactor_mode::adaptive) {
      for (std::size_t big : {std::size_t{16} << 20, std::size_t{64} << 20}) {
        if (big <= SUITE_LARGEST_ECHO) sizes.push_back(big);
      }
    }
    for (std::size_t n : sizes) {
      CAPTURE(n);
      const auto src = pattern(n, static_cast<unsigned>(n));
      std::vector<std::byte> dst(n);
      const auto r = client_echo(h, 1, port, {fw::const_buffer(src)}, fw::mutable_buffer(dst));
      REQUIRE_FALSE(r.connect_ec);
      CHECK_FALSE(r.write_ec);
      CHECK_FALSE(r.read_ec);
      CHECK(r.written == n);
      CHECK(r.read == n);
      CHECK(r.peer == SUITE_HOST + ":" + std::to_string(port));
      REQUIRE(std::memcmp(src.data(), dst.data(), n) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("a scatter-gather write of 10 buffers arrives in order; exact reads fill the destination", T,
                   TRANSPORTS) {
  harness<T> h;
  std::vector<std::size_t> sizes = {1, 7, 32, 100, 4096, 1, 70000, 3, 300000, 15};
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  std::vector<std::vector<std::byte>> pieces;
  std::vector<fw::const_buffer> sg;
  for (std::size_t i = 0; i < sizes.size(); ++i) pieces.push_back(pattern(sizes[i], static_cast<unsigned>(i + 1)));
  for (auto& p : pieces) sg.emplace_back(p);
  std::vector<std::byte> expected;
  for (auto& p : pieces) expected.insert(expected.end(), p.begin(), p.end());

  // The server reads a 32-byte "header" and then the rest straight into its destination.
  std::vector<std::byte> header(32), body(total - 32);
  std::promise<std::pair<std::error_code, std::error_code>> got;
  const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
    auto conn = std::make_shared<typename T::connection_type>(std::move(c));
    conn->async_read(fw::mutable_buffer(header), [&, conn](std::error_code e1, std::size_t n1) {
      CHECK(n1 == 32);
      conn->async_read(fw::mutable_buffer(body), [&, conn, e1](std::error_code e2, std::size_t n2) {
        CHECK(n2 == body.size());
        got.set_value({e1, e2});
        conn->close();
      });
    });
  });
  const auto w = connect_and_write(h, port, sg);
  CHECK_FALSE(w.first);
  CHECK(w.second == total);
  auto fg = got.get_future();
  const auto g = get(fg);
  CHECK_FALSE(g.first);
  CHECK_FALSE(g.second);
  CHECK(std::memcmp(header.data(), expected.data(), 32) == 0);
  CHECK(std::memcmp(body.data(), expected.data() + 32, body.size()) == 0);
}

TEST_CASE_TEMPLATE("a write of more buffers than one sendmsg takes, to a reader that starts late, arrives whole and in order",
                   T, TRANSPORTS) {
  // 3,000 buffers (IOV_MAX is 1,024) of 1 B .. 2 KiB, 3 MB in all: more than
  // the socket buffers hold before the reader starts, so the writer also waits
  // for room mid-list.
  harness<T> h;
  std::vector<std::vector<std::byte>> pieces;
  std::vector<fw::const_buffer> sg;
  std::vector<std::byte> expected;
  for (unsigned i = 0; i < 3000; ++i) {
    pieces.push_back(pattern(1 + (i * 2654435761u) % 2048, i));
    expected.insert(expected.end(), pieces.back().begin(), pieces.back().end());
  }
  for (auto& p : pieces) sg.emplace_back(p);
  std::vector<std::byte> body(expected.size());
  std::promise<std::error_code> got;
  const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
    auto conn = std::make_shared<typename T::connection_type>(std::move(c));
    harness<T>::here().run_after(100ms, [&, conn](std::error_code) {
      conn->async_read(fw::mutable_buffer(body), [&, conn](std::error_code e, std::size_t n) {
        CHECK(n == body.size());
        got.set_value(e);
        conn->close();
      });
    });
  });
  const auto w = connect_and_write(h, port, sg);
  CHECK_FALSE(w.first);
  CHECK(w.second == expected.size());
  auto fg = got.get_future();
  CHECK_FALSE(get(fg));
  CHECK(std::memcmp(body.data(), expected.data(), body.size()) == 0);
}

TEST_CASE_TEMPLATE("reads are served in call order across read_some and exact reads", T, TRANSPORTS) {
  harness<T> h;
  const auto src = pattern(200000, 9);
  std::promise<std::vector<std::byte>> got;
  const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
    struct reader : std::enable_shared_from_this<reader> {
      typename T::connection_type conn;
      std::vector<std::byte> out;
      std::vector<std::byte> exact = std::vector<std::byte>(50000);
      std::promise<std::vector<std::byte>>* done;
      int step = 0;
      void next() {
        // Alternate: some, exact(50000), some, exact(50000), ... until 200000 bytes.
        if (out.size() >= 200000) {
          done->set_value(out);
          conn.close();
          return;
        }
        if (step++ % 2 == 0) {
          conn.async_read_some([self = this->shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
            REQUIRE_FALSE(ec);
            REQUIRE(b.size() > 0);
            const std::size_t keep = std::min(b.size(), 200000 - self->out.size());
            REQUIRE(keep == b.size());
            self->out.insert(self->out.end(), b.data(), b.data() + b.size());
            self->next();
          });
        } else {
          const std::size_t want = std::min<std::size_t>(50000, 200000 - out.size());
          conn.async_read(fw::mutable_buffer(exact.data(), want),
                          [self = this->shared_from_this(), want](std::error_code ec, std::size_t n) {
                            REQUIRE_FALSE(ec);
                            REQUIRE(n == want);
                            self->out.insert(self->out.end(), self->exact.data(), self->exact.data() + n);
                            self->next();
                          });
        }
      }
    };
    auto r = std::make_shared<reader>();
    r->conn = std::move(c);
    r->done = &got;
    r->next();
  });
  auto e = h.write_in_pieces(port, src, 7919);  // many small writes: arbitrary boundaries
  auto f = got.get_future();
  const auto out = get(f);
  REQUIRE(out.size() == src.size());
  CHECK(std::memcmp(out.data(), src.data(), src.size()) == 0);
  CHECK(get(e) == fw::errc::connection_closed);
}

TEST_CASE_TEMPLATE("many concurrent connections on both reactors" * doctest::timeout(300), T, TRANSPORTS) {
  harness<T> h;
  const std::uint16_t port0 = h.serve_echo(0);
  const std::uint16_t port1 = h.serve_echo(1);
  constexpr int n = 100;
  std::vector<std::vector<std::byte>> src, dst;
  for (int i = 0; i < n; ++i) {
    src.push_back(pattern(1000 + static_cast<std::size_t>(i) * 37, static_cast<unsigned>(i)));
    dst.emplace_back(src.back().size());
  }
  struct tally {
    std::atomic<int> ok{0}, done{0};
    std::promise<void> all;
  } t;
  for (int i = 0; i < n; ++i) {
    const unsigned core = static_cast<unsigned>(i % 2);
    const std::uint16_t port = (i % 3 == 0) ? port0 : port1;
    h.group.submit_to(core, [&, i, port] {
      using conn_t = typename T::connection_type;
      h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&, i](std::error_code ec, conn_t c) {
        REQUIRE_FALSE(ec);
        auto conn = std::make_shared<conn_t>(std::move(c));
        const fw::const_buffer one[] = {fw::const_buffer(src[static_cast<std::size_t>(i)])};
        conn->async_write(one, [conn](std::error_code e, std::size_t) { CHECK_FALSE(e); });
        conn->async_read(fw::mutable_buffer(dst[static_cast<std::size_t>(i)]),
                         [&, conn](std::error_code e, std::size_t) {
                           if (!e) t.ok.fetch_add(1);
                           conn->close();
                           if (t.done.fetch_add(1) + 1 == n) t.all.set_value();
                         });
      });
    });
  }
  auto f = t.all.get_future();
  get(f);
  CHECK(t.ok.load() == n);
  for (int i = 0; i < n; ++i) REQUIRE(src[static_cast<std::size_t>(i)] == dst[static_cast<std::size_t>(i)]);
}

TEST_CASE_TEMPLATE("close completes every pending operation exactly once with errc::cancelled", T, TRANSPORTS) {
  harness<T> h;
  // A server that accepts and then neither reads nor writes (holds the connection).
  auto held = std::make_shared<std::vector<typename T::connection_type>>();  // lives on reactor 0 only
  const std::uint16_t port =
      h.serve(0, [held = std::move(held)](typename T::connection_type c) { held->push_back(std::move(c)); });

  struct calls {
    int read = 0, read_some = 0, write = 0, queued_write = 0, after = 0, after_some = 0;
    std::error_code read_ec, read_some_ec, write_ec, queued_ec, after_ec, after_some_ec;
    std::size_t written = 0;
    bool returned = false, inline_call = false;
    std::string reads_order, writes_order;  // handler order per direction
  };
  auto c = std::make_shared<calls>();
  std::vector<std::byte> big(64u << 20), dst(100);
  std::promise<void> closed;
  h.group.submit_to(1, [&, c] {
    using conn_t = typename T::connection_type;
    h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&, c](std::error_code ec, conn_t conn_in) {
      REQUIRE_FALSE(ec);
      auto conn = std::make_shared<conn_t>(std::move(conn_in));
      conn->async_read(fw::mutable_buffer(dst), [c](std::error_code e, std::size_t) {
        ++c->read;
        c->read_ec = e;
        c->reads_order += "1";
      });
      conn->async_read_some([c](std::error_code e, fw::tensor_buffer b) {
        ++c->read_some;
        c->read_some_ec = e;
        c->reads_order += "2";
        CHECK(b.empty());
      });
      const fw::const_buffer one[] = {fw::const_buffer(big)};
      conn->async_write(one, [c](std::error_code e, std::size_t n) {
        ++c->write;
        c->write_ec = e;
        c->written = n;
        c->writes_order += "1";
      });
      conn->async_write(one, [c](std::error_code e, std::size_t) {
        ++c->queued_write;
        c->queued_ec = e;
        c->writes_order += "2";
      });
      // Let the big write fill the socket buffers, then close.
      harness<T>::here().run_after(50ms, [&, c, conn](std::error_code) {
        conn->close();
        CHECK_FALSE(conn->is_open());
        conn->close();  // idempotent
        conn->async_read_some([c](std::error_code e, fw::tensor_buffer) {
          ++c->after_some;
          c->after_some_ec = e;
          c->reads_order += "3";
          if (!c->returned) c->inline_call = true;
        });
        conn->async_write(std::span<const fw::const_buffer>(), [c](std::error_code e, std::size_t) {
          ++c->after;
          c->after_ec = e;
          c->writes_order += "3";
        });
        c->returned = true;
        harness<T>::here().run_after(50ms, [&](std::error_code) { closed.set_value(); });
      });
    });
  });
  auto f = closed.get_future();
  get(f);
  auto r = h.on(1, [c] { return *c; });
  CHECK(r.read == 1);
  CHECK(r.read_some == 1);
  CHECK(r.write == 1);
  CHECK(r.queued_write == 1);
  CHECK(r.after == 1);
  CHECK(r.after_some == 1);
  CHECK_FALSE(r.inline_call);
  CHECK(r.read_ec == fw::errc::cancelled);
  CHECK(r.read_some_ec == fw::errc::cancelled);
  CHECK(r.write_ec == fw::errc::cancelled);
  CHECK(r.written < big.size());
  CHECK(r.queued_ec == fw::errc::cancelled);
  CHECK(r.after_ec == fw::errc::connection_closed);
  CHECK(r.after_some_ec == fw::errc::connection_closed);
  CHECK(r.reads_order == "123");
  CHECK(r.writes_order == "123");
}

TEST_CASE_TEMPLATE("the peer closing mid-read fails the read with errc::connection_closed", T, TRANSPORTS) {
  harness<T> h;
  const auto ten = pattern(10, 3);
  std::promise<std::error_code> sent;  // `ten` must outlive the server's write
  const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
    auto conn = std::make_shared<typename T::connection_type>(std::move(c));
    const fw::const_buffer one[] = {fw::const_buffer(ten)};
    conn->async_write(one, [&, conn](std::error_code e, std::size_t) {
      conn->close();
      sent.set_value(e);
    });
  });
  struct result {
    std::error_code exact_ec, some_ec, write_ec;
    std::size_t exact_n = 0;
  };
  std::promise<result> done;
  std::vector<std::byte> dst(100);
  h.group.submit_to(1, [&] {
    using conn_t = typename T::connection_type;
    h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&](std::error_code ec, conn_t c) {
      REQUIRE_FALSE(ec);
      auto conn = std::make_shared<conn_t>(std::move(c));
      auto r = std::make_shared<result>();
      conn->async_read(fw::mutable_buffer(dst), [r](std::error_code e, std::size_t n) {
        r->exact_ec = e;
        r->exact_n = n;
      });
      conn->async_read_some([&, r, conn](std::error_code e, fw::tensor_buffer) {
        r->some_ec = e;
        done.set_value(*r);
      });
    });
  });
  auto f = done.get_future();
  const result r = get(f);
  CHECK(r.exact_ec == fw::errc::connection_closed);
  CHECK(r.exact_n == 10);
  CHECK(std::memcmp(dst.data(), ten.data(), 10) == 0);
  CHECK(r.some_ec == fw::errc::connection_closed);
  auto s = sent.get_future();
  CHECK_FALSE(get(s));
}

TEST_CASE_TEMPLATE("connecting to a closed port fails with errc::connection_refused", T, TRANSPORTS) {
  harness<T> h;
  const std::uint16_t port = closed_port();
  std::promise<std::pair<std::error_code, bool>> done;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&](std::error_code ec, typename T::connection_type c) {
      done.set_value({ec, c.is_open()});
    });
  });
  auto f = done.get_future();
  const auto r = get(f);
  CHECK(r.first == fw::errc::connection_refused);
  CHECK(r.first.message() == "connection refused");
  CHECK_FALSE(r.second);

  std::promise<std::error_code> bad;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), "no such host.invalid", 1,
                        [&](std::error_code ec, typename T::connection_type) { bad.set_value(ec); });
  });
  auto g = bad.get_future();
  CHECK(get(g) == fw::errc::invalid_argument);
}

TEST_CASE_TEMPLATE("listen errors name the address; closing a listener cancels its accepts", T, TRANSPORTS) {
  harness<T> h;
  const std::uint16_t port = h.serve(0, [](typename T::connection_type) {});
  const std::string what = h.on(0, [&] {
    try {
      (void)h.transport.listen(harness<T>::here(), SUITE_HOST, port);
    } catch (const std::system_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  CHECK(what == std::string(T::name()) + "::listen(" + SUITE_HOST + ":" + std::to_string(port) + "): Address already in use");
  const auto ec = h.on(0, [&] {
    std::error_code e;
    auto l = h.transport.listen(harness<T>::here(), SUITE_HOST, port, e);
    CHECK_FALSE(l.is_open());
    return e;
  });
  CHECK(ec == std::errc::address_in_use);

  std::promise<std::error_code> cancelled;
  h.group.submit_to(0, [&] {
    auto l = std::make_shared<typename T::listener_type>(h.transport.listen(harness<T>::here(), SUITE_HOST, 0));
    l->async_accept([&, l](std::error_code e, typename T::connection_type c) {
      CHECK_FALSE(c.is_open());
      cancelled.set_value(e);
    });
    l->close();
  });
  auto f = cancelled.get_future();
  CHECK(get(f) == fw::errc::cancelled);
}

TEST_CASE_TEMPLATE("calls off the owning reactor's thread are refused with a clear error", T, TRANSPORTS) {
  harness<T> h;
  const std::string prefix = std::string(T::name());
  try {
    (void)h.transport.listen(h.group.at(0), SUITE_HOST, 0);
    FAIL("listen from the test thread was accepted");
  } catch (const std::system_error& e) {
    CHECK(e.code() == fw::errc::invalid_argument);
    CHECK(std::string(e.what()) == prefix + "::listen called off the thread of reactor 0 that owns it: invalid argument");
  }
  // A listener made on reactor 0, used from reactor 1.
  auto l = std::make_shared<typename T::listener_type>();
  h.on(0, [&, l] { *l = h.transport.listen(harness<T>::here(), SUITE_HOST, 0); });
  const std::string what = h.on(1, [l] {
    try {
      l->async_accept([](std::error_code, typename T::connection_type) {});
    } catch (const std::system_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  });
  CHECK(what.find("::async_accept called off the thread of reactor 0 that owns it") != std::string::npos);
  h.on(0, [l] { typename T::listener_type dies_here = std::move(*l); });  // handles die on their reactor
}

TEST_CASE_TEMPLATE("stopping the group completes pending operations with errc::cancelled" * doctest::timeout(120), T,
                   TRANSPORTS) {
  std::atomic<int> server_read{0}, client_read{0}, accept_calls{0};
  std::atomic<bool> all_cancelled{true};
  {
    harness<T> h(fw::reactor_mode::block);
    const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
      accept_calls.fetch_add(1);
      auto conn = std::make_shared<typename T::connection_type>(std::move(c));
      conn->async_read_some([&, conn](std::error_code e, fw::tensor_buffer) {
        server_read.fetch_add(1);
        if (e != fw::errc::cancelled && e != fw::errc::connection_closed) all_cancelled = false;
      });
    });
    std::promise<void> connected;
    h.group.submit_to(1, [&] {
      h.transport.connect(harness<T>::here(), SUITE_HOST, port, [&](std::error_code ec, typename T::connection_type c) {
        REQUIRE_FALSE(ec);
        auto conn = std::make_shared<typename T::connection_type>(std::move(c));
        auto dst = std::make_shared<std::vector<std::byte>>(10);
        conn->async_read(fw::mutable_buffer(*dst), [&, conn, dst](std::error_code e, std::size_t) {
          client_read.fetch_add(1);
          // The server's reactor may stop (and close its end) first.
          if (e != fw::errc::cancelled && e != fw::errc::connection_closed) all_cancelled = false;
        });
        connected.set_value();
      });
    });
    auto f = connected.get_future();
    get(f);
    // The passive side may finish its handshake after the active one (RDMA CM: on the RTU).
    for (int i = 0; i < 6000 && accept_calls.load() == 0; ++i) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(20ms);
    h.group.stop();
  }
  CHECK(accept_calls.load() == 1);
  CHECK(server_read.load() == 1);
  CHECK(client_read.load() == 1);
  CHECK(all_cancelled.load());
}

