// The transport test suite, written once: included by every instantiation
// (tests/unit/transport/transport_suite.cpp for the TCP transports,
// tests/unit/transport/verbs/verbs_suite.cpp for verbs). Each test case is
// defined here with TEST_CASE_TEMPLATE_DEFINE under an id; an instantiation
// applies every id to a std::tuple of its transports after including this file:
//   using transports = std::tuple<fw::asio_tcp, fw::uring_tcp>;
//   TEST_CASE_TEMPLATE_APPLY(suite_connect_accept, transports);
// the suite_* ids to every transport, the handoff_* ids (release/adopt) to
// those that are handoff_transports. A test case added here is run only where
// its id is applied, so add it to every instantiation. A transport made or
// reached otherwise than suite_traits' defaults specialises suite_traits.
// Server and client run on different reactors (threads) of one group.
#pragma once

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "support/patterns.hpp"
#include "support/ports.hpp"

namespace fw = fusewire;
using namespace std::chrono_literals;

namespace {

using fusewire::test::free_port;
using fusewire::test::pattern_bytes;

/// How the suite makes and reaches a transport T. An instantiation whose
/// transport needs other values specialises suite_traits for it, deriving
/// from suite_defaults<T> to keep the rest.
template <class T>
struct suite_defaults {
  /// The address to listen on and connect to.
  static std::string host() { return "127.0.0.1"; }
  /// A transport for a harness that is given none.
  static T make() { return T{}; }
  /// The largest message the echo test sends, in bytes.
  static constexpr std::size_t largest_echo = std::size_t{64} << 20;
};

template <class T>
struct suite_traits : suite_defaults<T> {};

template <class T>
T get(std::future<T>& f) {
  REQUIRE_MESSAGE(f.wait_for(120s) == std::future_status::ready, "timed out waiting for a reactor");
  return f.get();
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

  explicit harness(fw::reactor_mode mode = fw::reactor_mode::adaptive, T t = suite_traits<T>::make(),
                   typename group_t::engine_config engine = {})
      : transport(std::move(t)), group(config(mode), engine) {}
  ~harness() { group.stop(); }

  template <class F>
  auto on(unsigned core, F&& f) {
    auto fut = group.submit(core, std::forward<F>(f));
    return get(fut);
  }

  static reactor_t& here() { return *reactor_t::current(); }

  /// Listens on suite_traits<T>::host() (any port) on `core`; `on_accept(conn)` runs for each connection.
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
      srv->listener = transport.listen(here(), suite_traits<T>::host(), 0);
      srv->on_accept = std::move(on_accept);
      srv->loop();
      return srv->listener.port();
    });
  }

  /// Connects from reactor 1 to `port` and waits for it. The connection is
  /// touched on reactor 1 only: use it, close it and reset it there.
  std::shared_ptr<conn_t> connect_client(std::uint16_t port) {
    auto client = std::make_shared<conn_t>();
    auto connected = std::make_shared<std::promise<std::error_code>>();
    auto fc = connected->get_future();
    group.submit_to(1, [this, port, client, connected] {
      transport.connect(here(), suite_traits<T>::host(), port, [client, connected](std::error_code ec, conn_t c) {
        *client = std::move(c);
        connected->set_value(ec);
      });
    });
    REQUIRE_FALSE(get(fc));
    return client;
  }

  /// Writes back every buffer read_some delivers on `c`, until it fails.
  static void echo(conn_t c) {
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
  }

  /// An echo server (echo() on each connection).
  std::uint16_t serve_echo(unsigned core) {
    return serve(core, [](conn_t c) { echo(std::move(c)); });
  }

  /// Connects from reactor 1 to `port` and writes `src` in writes of `piece`
  /// bytes (so the reader sees boundaries unlike its reads'), then keeps the
  /// connection until the server closes it: that read's error, as a future.
  std::future<std::error_code> write_in_pieces(std::uint16_t port, const std::vector<std::byte>& src,
                                               std::size_t piece) {
    auto eof = std::make_shared<std::promise<std::error_code>>();
    auto done = eof->get_future();
    group.submit_to(1, [this, port, &src, piece, eof] {
      transport.connect(here(), suite_traits<T>::host(), port, [&src, piece, eof](std::error_code ec, conn_t c) {
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
    h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port,
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
    h.transport.connect(
        harness<T>::here(), suite_traits<T>::host(), port, [&](std::error_code ec, typename T::connection_type c) {
          REQUIRE_FALSE(ec);
          auto conn = std::make_shared<typename T::connection_type>(std::move(c));
          conn->async_write(sg, [&, conn](std::error_code e, std::size_t n) { wrote.set_value({e, n}); });
        });
  });
  auto f = wrote.get_future();
  return get(f);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("connect and accept on loopback", T, suite_connect_accept) {
  harness<T> h;
  std::promise<std::string> accepted_peer;
  const std::uint16_t port = h.serve(0, [&](typename T::connection_type c) {
    CHECK(c.is_open());
    accepted_peer.set_value(c.remote_endpoint());
  });
  CHECK(port != 0);
  std::promise<std::pair<std::string, bool>> connected;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port,
                        [&](std::error_code ec, typename T::connection_type c) {
                          CHECK_FALSE(ec);
                          connected.set_value({c.remote_endpoint(), c.is_open()});
                        });
  });
  auto r = connected.get_future();
  auto client = get(r);
  CHECK(client.first == suite_traits<T>::host() + ":" + std::to_string(port));
  CHECK(client.second);
  auto f = accepted_peer.get_future();
  CHECK(get(f).rfind(suite_traits<T>::host() + ":", 0) == 0);
}

TEST_CASE_TEMPLATE_DEFINE("echo 1 B .. 64 MiB byte for byte" * doctest::timeout(600), T, suite_echo) {
  for (fw::reactor_mode mode : {fw::reactor_mode::adaptive, fw::reactor_mode::block, fw::reactor_mode::poll}) {
    CAPTURE(static_cast<int>(mode));
    harness<T> h(mode);
    const std::uint16_t port = h.serve_echo(0);
    std::vector<std::size_t> sizes = {1, 10, 100, 1000, 4096, 65536, 100000, 1u << 20};
    if (mode == fw::reactor_mode::adaptive) {
      for (std::size_t big : {std::size_t{16} << 20, std::size_t{64} << 20}) {
        if (big <= suite_traits<T>::largest_echo) sizes.push_back(big);
      }
    }
    for (std::size_t n : sizes) {
      CAPTURE(n);
      const auto src = pattern_bytes(n, static_cast<unsigned>(n));
      std::vector<std::byte> dst(n);
      const auto r = client_echo(h, 1, port, {fw::const_buffer(src)}, fw::mutable_buffer(dst));
      REQUIRE_FALSE(r.connect_ec);
      CHECK_FALSE(r.write_ec);
      CHECK_FALSE(r.read_ec);
      CHECK(r.written == n);
      CHECK(r.read == n);
      CHECK(r.peer == suite_traits<T>::host() + ":" + std::to_string(port));
      REQUIRE(std::memcmp(src.data(), dst.data(), n) == 0);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("a scatter-gather write of 10 buffers arrives in order; exact reads fill the destination", T,
                          suite_scatter_gather) {
  harness<T> h;
  std::vector<std::size_t> sizes = {1, 7, 32, 100, 4096, 1, 70000, 3, 300000, 15};
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  std::vector<std::vector<std::byte>> pieces;
  std::vector<fw::const_buffer> sg;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    pieces.push_back(pattern_bytes(sizes[i], static_cast<unsigned>(i + 1)));
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

TEST_CASE_TEMPLATE_DEFINE(
    "a write of more buffers than one sendmsg takes, to a reader that starts late, arrives whole and in order", T,
    suite_many_buffers) {
  // 3,000 buffers (IOV_MAX is 1,024) of 1 B .. 2 KiB, 3 MB in all: more than
  // the socket buffers hold before the reader starts, so the writer also waits
  // for room mid-list.
  harness<T> h;
  std::vector<std::vector<std::byte>> pieces;
  std::vector<fw::const_buffer> sg;
  std::vector<std::byte> expected;
  for (unsigned i = 0; i < 3000; ++i) {
    pieces.push_back(pattern_bytes(1 + (i * 2654435761u) % 2048, i));
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

// Writes started one after another in one reactor task (the fused frames of
// one batch) reach the kernel at once: none waits for the completion of the
// one before it to run, so the peer works on the first while the writer makes
// the next. Completions still run in call order, after the task (never
// inline, also not an earlier write's from a later call), and the bytes
// arrive in order. The second round mixes in a write above uring_tcp's
// speculative_send (it goes through the ring).
TEST_CASE_TEMPLATE_DEFINE(
    "writes started back to back in one task reach the kernel at once and complete in order, after it", T,
    suite_back_to_back_writes) {
  using conn_t = typename T::connection_type;
  harness<T> h;
  auto server = std::make_shared<conn_t>();
  std::promise<void> accepted;
  auto fa = accepted.get_future();
  const std::uint16_t port = h.serve(0, [server, &accepted](conn_t c) {
    *server = std::move(c);
    accepted.set_value();
  });
  auto client = h.connect_client(port);
  get(fa);
  struct record {
    std::vector<std::size_t> order;
    std::vector<std::error_code> errors;
    bool in_task = true;
    bool inline_completion = false;
    std::promise<void> done;
  };
  unsigned seed = 21;
  for (const std::vector<std::size_t>& sizes :
       {std::vector<std::size_t>{1500, 1500, 1500, 1500, 1500}, std::vector<std::size_t>{1500, 40000, 1500, 1500}}) {
    CAPTURE(sizes.size());
    const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    const auto src = pattern_bytes(total, ++seed);
    std::vector<std::byte> got(total);
    std::promise<std::error_code> read_done;
    auto fr = read_done.get_future();
    h.on(0, [&, server] {
      server->async_read(fw::mutable_buffer(got), [&](std::error_code ec, std::size_t) { read_done.set_value(ec); });
      return 0;
    });
    auto rec = std::make_shared<record>();
    auto fd = rec->done.get_future();
    const auto [sent_before, sent_in_task] = h.on(1, [&, rec] {
      const std::uint64_t before = client->stats().bytes_sent;
      std::size_t at = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const fw::const_buffer one[] = {fw::const_buffer(src.data() + at, sizes[i])};
        at += sizes[i];
        client->async_write(one, [rec, i, n_asked = sizes[i], count = sizes.size()](std::error_code ec, std::size_t n) {
          if (rec->in_task) rec->inline_completion = true;
          rec->order.push_back(i);
          rec->errors.push_back(ec             ? ec
                                : n == n_asked ? std::error_code()
                                               : fw::make_error_code(fw::errc::truncated_frame));
          if (rec->order.size() == count) rec->done.set_value();
        });
      }
      rec->in_task = false;
      return std::pair<std::uint64_t, std::uint64_t>(before, client->stats().bytes_sent);
    });
    // TCP: every small write's sendmsg ran in the task (RDMA transports post as their credits allow).
    if constexpr (!fw::rdma_transport<T>) {
      if (sizes[1] == 1500) CHECK(sent_in_task - sent_before == total);
    }
    get(fd);
    CHECK_FALSE(rec->inline_completion);
    std::vector<std::size_t> in_order(sizes.size());
    std::iota(in_order.begin(), in_order.end(), std::size_t{0});
    CHECK(rec->order == in_order);
    CHECK(rec->errors == std::vector<std::error_code>(sizes.size()));
    REQUIRE_FALSE(get(fr));
    CHECK(got == src);
  }
  h.on(1, [client] {
    client->close();
    *client = conn_t();
    return 0;
  });
  h.on(0, [server] {
    server->close();
    *server = conn_t();
    return 0;
  });
}

TEST_CASE_TEMPLATE_DEFINE("reads are served in call order across read_some and exact reads", T, suite_read_order) {
  harness<T> h;
  const auto src = pattern_bytes(200000, 9);
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

TEST_CASE_TEMPLATE_DEFINE("an empty exact read completes without waiting for bytes and takes none", T,
                          suite_empty_read) {
  harness<T> h(fw::reactor_mode::block);  // a read that waited for bytes would sleep: none come
  using conn_t = typename T::connection_type;
  struct outcome {
    std::error_code empty_ec = fw::make_error_code(fw::errc::timed_out), ec;
    std::size_t empty_n = 99, n = 0;
    std::vector<std::byte> got = std::vector<std::byte>(3);
  };
  std::promise<void> empty_done;
  std::promise<outcome> done;
  auto server_conn = std::make_shared<conn_t>();
  const std::uint16_t port = h.serve(0, [&](conn_t c) {
    *server_conn = std::move(c);
    auto o = std::make_shared<outcome>();
    server_conn->async_read(fw::mutable_buffer(), [&, o](std::error_code ec, std::size_t n) {
      o->empty_ec = ec;
      o->empty_n = n;
      empty_done.set_value();
    });
    server_conn->async_read(fw::mutable_buffer(o->got.data(), o->got.size()),
                            [&, o](std::error_code ec, std::size_t n) {
                              o->ec = ec;
                              o->n = n;
                              server_conn->close();
                              done.set_value(*o);
                            });
  });
  auto client = h.connect_client(port);
  auto ef = empty_done.get_future();
  REQUIRE_MESSAGE(ef.wait_for(60s) == std::future_status::ready, "the empty read waited for bytes");
  // Only now the bytes: they all go to the read behind the empty one.
  const auto src = pattern_bytes(3, 31);
  h.on(1, [&] {
    const fw::const_buffer one[] = {fw::const_buffer(src.data(), src.size())};
    client->async_write(one, [client](std::error_code, std::size_t) {});
    return 0;
  });
  auto f = done.get_future();
  const outcome o = get(f);
  CHECK_FALSE(o.empty_ec);
  CHECK(o.empty_n == 0);
  CHECK_FALSE(o.ec);
  CHECK(o.n == 3);
  CHECK(o.got == src);
  h.on(1, [&] {
    client->close();
    *client = conn_t();
    return 0;
  });
  h.on(0, [&] {
    *server_conn = conn_t();
    return 0;
  });
}

TEST_CASE_TEMPLATE_DEFINE("empty writes and empty buffers in a write complete and send nothing", T, suite_empty_write) {
  harness<T> h;
  using conn_t = typename T::connection_type;
  using write_result = std::pair<std::error_code, std::size_t>;
  struct outcome {
    std::error_code ec, end;
    std::size_t n = 0;
    std::vector<std::byte> got = std::vector<std::byte>(3);
  };
  std::promise<outcome> done;
  auto server_conn = std::make_shared<conn_t>();
  const std::uint16_t port = h.serve(0, [&](conn_t c) {
    *server_conn = std::move(c);
    auto o = std::make_shared<outcome>();
    server_conn->async_read(fw::mutable_buffer(o->got.data(), o->got.size()),
                            [&, o](std::error_code ec, std::size_t n) {
                              o->ec = ec;
                              o->n = n;
                              // Nothing else was sent: the next read sees the close.
                              server_conn->async_read_some([&, o](std::error_code e, fw::tensor_buffer) {
                                o->end = e;
                                done.set_value(*o);
                              });
                            });
  });
  auto client = h.connect_client(port);
  const auto src = pattern_bytes(3, 41);
  std::promise<std::vector<write_result>> wrote;
  h.on(1, [&] {
    auto results = std::make_shared<std::vector<write_result>>();
    const auto record = [&, results, client](std::error_code ec, std::size_t n) {
      results->emplace_back(ec, n);
      if (results->size() == 3) {
        client->close();
        wrote.set_value(*results);
      }
    };
    client->async_write(std::span<const fw::const_buffer>{}, record);
    const fw::const_buffer with_empty[] = {fw::const_buffer(), fw::const_buffer(src.data(), src.size()),
                                           fw::const_buffer(src.data(), 0)};
    client->async_write(with_empty, record);
    client->async_write(std::span<const fw::const_buffer>{}, record);
    return 0;
  });
  auto wf = wrote.get_future();
  const std::vector<write_result> writes = get(wf);
  REQUIRE(writes.size() == 3);
  CHECK(writes[0] == write_result{{}, 0});
  CHECK(writes[1] == write_result{{}, 3});
  CHECK(writes[2] == write_result{{}, 0});
  auto f = done.get_future();
  const outcome o = get(f);
  CHECK_FALSE(o.ec);
  CHECK(o.n == 3);
  CHECK(o.got == src);
  CHECK(o.end == fw::errc::connection_closed);
  h.on(0, [&] {
    server_conn->close();
    *server_conn = conn_t();
    return 0;
  });
  h.on(1, [&] {
    *client = conn_t();
    return 0;
  });
}

TEST_CASE_TEMPLATE_DEFINE(
    "a read that wants more than arrived before the peer closed gets those bytes, then "
    "errc::connection_closed",
    T, suite_read_past_close) {
  harness<T> h;
  using conn_t = typename T::connection_type;
  auto server_conn = std::make_shared<conn_t>();
  std::promise<void> accepted;
  const std::uint16_t port = h.serve(0, [&](conn_t c) {
    *server_conn = std::move(c);
    accepted.set_value();
  });
  auto client = h.connect_client(port);
  auto af = accepted.get_future();
  REQUIRE(af.wait_for(60s) == std::future_status::ready);
  const auto src = pattern_bytes(10, 37);
  std::promise<std::error_code> wrote;
  h.on(1, [&] {
    const fw::const_buffer one[] = {fw::const_buffer(src.data(), src.size())};
    client->async_write(one, [&, client](std::error_code ec, std::size_t) {
      client->close();
      wrote.set_value(ec);
    });
    return 0;
  });
  auto wf = wrote.get_future();
  REQUIRE_FALSE(get(wf));
  // Whether the bytes and the close are in when the read comes (the case
  // this is for) or not yet, the outcome is the same.
  std::this_thread::sleep_for(200ms);
  std::promise<std::pair<std::error_code, std::size_t>> read;
  std::vector<std::byte> got(100);
  h.on(0, [&] {
    server_conn->async_read(fw::mutable_buffer(got.data(), got.size()), [&](std::error_code ec, std::size_t n) {
      read.set_value({ec, n});
    });
    return 0;
  });
  auto rf = read.get_future();
  REQUIRE_MESSAGE(rf.wait_for(60s) == std::future_status::ready, "the read waited for bytes that cannot come");
  const auto [ec, n] = rf.get();
  CHECK(ec == fw::errc::connection_closed);
  REQUIRE(n == src.size());
  CHECK(std::equal(src.begin(), src.end(), got.begin()));
  h.on(0, [&] {
    server_conn->close();
    *server_conn = conn_t();
    return 0;
  });
  h.on(1, [&] {
    *client = conn_t();
    return 0;
  });
}

TEST_CASE_TEMPLATE_DEFINE("many concurrent connections on both reactors" * doctest::timeout(300), T,
                          suite_many_connections) {
  harness<T> h;
  const std::uint16_t port0 = h.serve_echo(0);
  const std::uint16_t port1 = h.serve_echo(1);
  constexpr int n = 100;
  std::vector<std::vector<std::byte>> src, dst;
  for (int i = 0; i < n; ++i) {
    src.push_back(pattern_bytes(1000 + static_cast<std::size_t>(i) * 37, static_cast<unsigned>(i)));
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
      h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port, [&, i](std::error_code ec, conn_t c) {
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

TEST_CASE_TEMPLATE_DEFINE("close completes every pending operation exactly once with errc::cancelled", T,
                          suite_close_cancels) {
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
    h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port, [&, c](std::error_code ec, conn_t conn_in) {
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

TEST_CASE_TEMPLATE_DEFINE("the peer closing mid-read fails the read with errc::connection_closed", T,
                          suite_peer_closes) {
  harness<T> h;
  const auto ten = pattern_bytes(10, 3);
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
    h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port, [&](std::error_code ec, conn_t c) {
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

TEST_CASE_TEMPLATE_DEFINE("connecting to a closed port fails with errc::connection_refused", T, suite_connect_refused) {
  harness<T> h;
  const std::uint16_t port = free_port();
  std::promise<std::pair<std::error_code, bool>> done;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port,
                        [&](std::error_code ec, typename T::connection_type c) {
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

TEST_CASE_TEMPLATE_DEFINE("listen errors name the address; closing a listener cancels its accepts", T,
                          suite_listen_errors) {
  harness<T> h;
  const std::uint16_t port = h.serve(0, [](typename T::connection_type) {});
  const std::string what = h.on(0, [&] {
    try {
      (void)h.transport.listen(harness<T>::here(), suite_traits<T>::host(), port);
    } catch (const std::system_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  CHECK(what == std::string(T::name()) + "::listen(" + suite_traits<T>::host() + ":" + std::to_string(port) +
                    "): Address already in use");
  const auto ec = h.on(0, [&] {
    std::error_code e;
    auto l = h.transport.listen(harness<T>::here(), suite_traits<T>::host(), port, e);
    CHECK_FALSE(l.is_open());
    return e;
  });
  CHECK(ec == std::errc::address_in_use);

  std::promise<std::error_code> cancelled;
  h.group.submit_to(0, [&] {
    auto l =
        std::make_shared<typename T::listener_type>(h.transport.listen(harness<T>::here(), suite_traits<T>::host(), 0));
    l->async_accept([&, l](std::error_code e, typename T::connection_type c) {
      CHECK_FALSE(c.is_open());
      cancelled.set_value(e);
    });
    l->close();
  });
  auto f = cancelled.get_future();
  CHECK(get(f) == fw::errc::cancelled);
}

TEST_CASE_TEMPLATE_DEFINE("calls off the owning reactor's thread are refused with a clear error", T, suite_off_thread) {
  harness<T> h;
  const std::string prefix = std::string(T::name());
  try {
    (void)h.transport.listen(h.group.at(0), suite_traits<T>::host(), 0);
    FAIL("listen from the test thread was accepted");
  } catch (const std::system_error& e) {
    CHECK(e.code() == fw::errc::invalid_argument);
    CHECK(std::string(e.what()) ==
          prefix + "::listen called off the thread of reactor 0 that owns it: invalid argument");
  }
  // A listener made on reactor 0, used from reactor 1.
  auto l = std::make_shared<typename T::listener_type>();
  h.on(0, [&, l] { *l = h.transport.listen(harness<T>::here(), suite_traits<T>::host(), 0); });
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

TEST_CASE_TEMPLATE_DEFINE("try_read takes bytes that already arrived, all or nothing, in stream order", T,
                          suite_try_read) {
  static_assert(fw::readahead_connection<typename T::connection_type>);
  harness<T> h(fw::reactor_mode::block);
  using conn_t = typename T::connection_type;
  const auto src = pattern_bytes(100, 23);  // one write: all there once the first 10 bytes are
  struct outcome {
    bool too_many = true, empty = false, some = false, rest_read = false, drained = true, closed = true;
    std::size_t ahead = 0;  ///< bytes a try_read took behind a queued read
    std::vector<std::byte> got = std::vector<std::byte>(100);
  };
  std::promise<outcome> done;
  const std::uint16_t port = h.serve(0, [&](conn_t c) {
    auto conn = std::make_shared<conn_t>(std::move(c));
    auto o = std::make_shared<outcome>();
    conn->async_read(fw::mutable_buffer(o->got.data(), 10), [&, conn, o](std::error_code ec, std::size_t) {
      REQUIRE_FALSE(ec);
      o->too_many = conn->try_read(fw::mutable_buffer(o->got.data() + 10, 91));  // 90 are there
      o->empty = conn->try_read(fw::mutable_buffer());
      conn->async_read(fw::mutable_buffer(o->got.data() + 10, 5), [&, conn, o](std::error_code e5, std::size_t) {
        REQUIRE_FALSE(e5);
        o->some = conn->try_read(fw::mutable_buffer(o->got.data() + 15 + o->ahead, 15 - o->ahead));
        conn->async_read(fw::mutable_buffer(o->got.data() + 30, 70), [&, conn, o](std::error_code e, std::size_t n) {
          o->rest_read = !e && n == 70;
          std::byte extra{};
          o->drained = conn->try_read(fw::mutable_buffer(&extra, 1));
          conn->close();
          o->closed = conn->try_read(fw::mutable_buffer());
          done.set_value(*o);
        });
      });
      // Bytes 10-14 belong to the read just queued, whether it holds them
      // already (shm fills it at once) or not yet (TCP: then this is refused);
      // a byte taken now can only be byte 15.
      if (conn->try_read(fw::mutable_buffer(o->got.data() + 15, 1))) o->ahead = 1;
    });
  });
  auto eof = h.write_in_pieces(port, src, src.size());
  auto f = done.get_future();
  const outcome o = get(f);
  CHECK_FALSE(o.too_many);
  CHECK(o.empty);
  CHECK(o.some);
  CHECK(o.rest_read);
  CHECK_FALSE(o.drained);
  CHECK_FALSE(o.closed);
  CHECK(o.got == src);  // nothing lost, taken twice or out of order by the calls
  CHECK(get(eof) == fw::errc::connection_closed);
}

TEST_CASE_TEMPLATE_DEFINE("stopping the group completes pending operations with errc::cancelled" *
                              doctest::timeout(120),
                          T, suite_group_stop) {
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
      h.transport.connect(harness<T>::here(), suite_traits<T>::host(), port,
                          [&](std::error_code ec, typename T::connection_type c) {
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

namespace {

/// A connection accepted on reactor 0 (`server`) and its peer connected from
/// reactor 1 (`client`), for the hand-off tests. Operations run on the reactor
/// that owns the connection and report through futures; the handles die on
/// their reactors when the pair does.
template <class T>
struct handoff_pair {
  using conn_t = typename T::connection_type;
  using conn_ptr = std::shared_ptr<conn_t>;
  using read_result = std::pair<std::error_code, std::vector<std::byte>>;
  using write_result = std::pair<std::error_code, std::size_t>;

  struct released {
    std::error_code ec;
    int fd = -1;
    bool inline_call = false;  // the handler ran inside async_release
    std::error_code adopt_ec;
    bool adopted_open = false;
    std::string adopted_peer;
  };

  /// A release that succeeded and an adopt that took the socket.
  static void check_moved(const released& r) {
    CHECK_FALSE(r.ec);
    CHECK(r.fd >= 0);
    CHECK_FALSE(r.adopt_ec);
    CHECK(r.adopted_open);
  }

  explicit handoff_pair(harness<T>& harness_) : h(harness_) {
    auto accepted = std::make_shared<std::promise<void>>();
    auto af = accepted->get_future();
    const std::uint16_t port = h.serve(0, [s = server, accepted](conn_t c) mutable {
      if (!accepted) return;  // one connection
      *s = std::move(c);
      accepted->set_value();
      accepted.reset();
    });
    auto connected = std::make_shared<std::promise<std::error_code>>();
    auto cf = connected->get_future();
    h.group.submit_to(1, [hp = &h, c = client, connected, port] {
      hp->transport.connect(harness<T>::here(), suite_traits<T>::host(), port,
                            [c, connected](std::error_code ec, conn_t conn) {
                              *c = std::move(conn);
                              connected->set_value(ec);
                            });
    });
    owned = {{0, server}, {1, client}};
    REQUIRE_FALSE(get(cf));
    get(af);
  }

  ~handoff_pair() {
    // Handles die on their reactors (or, should one not answer, after the group stopped).
    bool answered = true;
    for (auto& [core, c] : owned) {
      auto f = h.group.submit(core, [c = c] { *c = conn_t(); });
      answered = answered && f.wait_for(60s) == std::future_status::ready;
    }
    if (!answered) h.group.stop();
  }

  handoff_pair(const handoff_pair&) = delete;
  handoff_pair& operator=(const handoff_pair&) = delete;

  /// One scatter-gather write of `sg` on `c`, owned by reactor `core`.
  std::future<write_result> write(unsigned core, conn_ptr c, std::vector<fw::const_buffer> sg) {
    auto done = std::make_shared<std::promise<write_result>>();
    auto f = done->get_future();
    h.group.submit_to(core, [c, sg = std::move(sg), done] {
      c->async_write(sg, [done](std::error_code ec, std::size_t n) { done->set_value({ec, n}); });
    });
    return f;
  }

  /// An exact read of `n` bytes; the bytes it filled.
  std::future<read_result> read_exact(unsigned core, conn_ptr c, std::size_t n) {
    auto done = std::make_shared<std::promise<read_result>>();
    auto f = done->get_future();
    h.group.submit_to(core, [c, n, done] {
      auto dst = std::make_shared<std::vector<std::byte>>(n);
      c->async_read(fw::mutable_buffer(*dst), [dst, done](std::error_code ec, std::size_t got) {
        dst->resize(got);
        done->set_value({ec, std::move(*dst)});
      });
    });
    return f;
  }

  /// async_read_some until `n` bytes arrived, or an error; what arrived.
  std::future<read_result> read_some(unsigned core, conn_ptr c, std::size_t n) {
    struct reader : std::enable_shared_from_this<reader> {
      conn_ptr conn;
      std::size_t want = 0;
      std::vector<std::byte> out;
      std::promise<read_result> done;
      void next() {
        conn->async_read_some([self = this->shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
          if (!ec) self->out.insert(self->out.end(), b.data(), b.data() + b.size());
          if (ec || self->out.size() >= self->want) {
            self->done.set_value({ec, std::move(self->out)});
          } else {
            self->next();
          }
        });
      }
    };
    auto r = std::make_shared<reader>();
    r->conn = std::move(c);
    r->want = n;
    auto f = r->done.get_future();
    h.group.submit_to(core, [r] { r->next(); });
    return f;
  }

  /// Waits (bounded) until the socket of `c` (on reactor `core`) holds at least
  /// `n` bytes no one has received yet.
  void wait_unread(unsigned core, conn_ptr c, int n) {
    const auto unread = [&] {
      return h.on(core, [c] {
        int bytes = 0;
        return ::ioctl(c->native_handle(), FIONREAD, &bytes) == 0 ? bytes : -1;
      });
    };
    for (int i = 0; i < 6000 && unread() < n; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(unread() >= n);
  }

  /// `c.async_release(...)` on reactor `core`, then `after(c)` in the same
  /// task. The release's handler runs `first()`, then, if it got a socket,
  /// carries the fd to reactor `to` (submit_to, as a rendezvous endpoint
  /// would) and adopts it into `*into` (an fd with nowhere to go is closed).
  std::future<released> release(unsigned core, conn_ptr c, unsigned to, conn_ptr into,
                                std::function<void(conn_t&)> after = {}, std::function<void()> first = {}) {
    auto done = std::make_shared<std::promise<released>>();
    auto f = done->get_future();
    if (into) owned.push_back({to, into});
    h.group.submit_to(core, [hp = &h, c, to, into, done, after = std::move(after), first = std::move(first)] {
      auto returned = std::make_shared<bool>(false);
      c->async_release([hp, c, to, into, done, returned, first](std::error_code ec, int fd) {
        if (first) first();
        released r;
        r.ec = ec;
        r.fd = fd;
        r.inline_call = !*returned;
        if (fd < 0 || !into) {
          if (fd >= 0) ::close(fd);
          done->set_value(r);
          return;
        }
        hp->group.submit_to(to, [hp, r, into, done]() mutable {
          *into = hp->transport.adopt(harness<T>::here(), r.fd, r.adopt_ec);
          r.adopted_open = into->is_open();
          r.adopted_peer = into->remote_endpoint();
          done->set_value(r);
        });
      });
      *returned = true;
      if (after) after(*c);
    });
    return f;
  }

  harness<T>& h;
  conn_ptr server = std::make_shared<conn_t>();      // reactor 0
  conn_ptr client = std::make_shared<conn_t>();      // reactor 1
  std::vector<std::pair<unsigned, conn_ptr>> owned;  // (reactor, connection): dropped there
};

// An instantiation without handoff transports leaves the plain helpers below unused.
[[maybe_unused]] void check_wrote(std::future<std::pair<std::error_code, std::size_t>>& f, std::size_t n) {
  const auto [ec, wrote] = get(f);
  CHECK_FALSE(ec);
  CHECK(wrote == n);
}

[[maybe_unused]] void check_read(std::future<std::pair<std::error_code, std::vector<std::byte>>>& f,
                                 const std::vector<std::byte>& expected) {
  const auto [ec, got] = get(f);
  CHECK_FALSE(ec);
  REQUIRE(got.size() == expected.size());
  CHECK(std::memcmp(got.data(), expected.data(), got.size()) == 0);
}

/// After a move to reactor 1: `there` from the client arrives at `moved`,
/// whole, and `back` from `moved` at the client.
template <class T>
void exchange_moved(handoff_pair<T>& p, typename handoff_pair<T>::conn_ptr moved, const std::vector<std::byte>& there,
                    const std::vector<std::byte>& back) {
  auto w = p.write(1, p.client, {fw::const_buffer(there)});
  auto rt = p.read_exact(1, moved, there.size());
  auto wb = p.write(1, moved, {fw::const_buffer(back)});
  auto rb = p.read_exact(1, p.client, back.size());
  check_wrote(w, there.size());
  check_read(rt, there);
  check_wrote(wb, back.size());
  check_read(rb, back);
}

[[maybe_unused]] std::vector<std::byte> concat(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  std::vector<std::byte> out(a);
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE(
    "a connection released on one reactor and adopted on another goes on where it stopped, "
    "byte for byte" *
        doctest::timeout(300),
    T, handoff_moves_on) {
  harness<T> h;
  handoff_pair<T> p(h);
  // Before the move, on reactor 0: writes each way (one scatter-gather), reads of both kinds.
  const auto a1 = pattern_bytes(1000, 1), a2 = pattern_bytes(300, 2), a3 = pattern_bytes(70000, 3);
  const auto b1 = pattern_bytes(500, 4), b2 = pattern_bytes(20, 5), b3 = pattern_bytes(100000, 6);
  auto wa1 = p.write(1, p.client, {fw::const_buffer(a1)});
  auto wa23 = p.write(1, p.client, {fw::const_buffer(a2), fw::const_buffer(a3)});
  auto ra1 = p.read_exact(0, p.server, a1.size());
  auto ra23 = p.read_some(0, p.server, a2.size() + a3.size());
  auto wb1 = p.write(0, p.server, {fw::const_buffer(b1)});
  auto wb2 = p.write(0, p.server, {fw::const_buffer(b2)});
  auto wb3 = p.write(0, p.server, {fw::const_buffer(b3)});
  auto rb1 = p.read_exact(1, p.client, b1.size());
  auto rb23 = p.read_some(1, p.client, b2.size() + b3.size());
  check_wrote(wa1, a1.size());
  check_wrote(wa23, a2.size() + a3.size());
  check_read(ra1, a1);
  check_read(ra23, concat(a2, a3));
  check_wrote(wb1, b1.size());
  check_wrote(wb2, b2.size());
  check_wrote(wb3, b3.size());
  check_read(rb1, b1);
  check_read(rb23, concat(b2, b3));

  // At this message boundary the server side moves to reactor 1.
  using conn_t = typename T::connection_type;
  const std::string peer = h.on(0, [s = p.server] { return s->remote_endpoint(); });
  auto moved = std::make_shared<conn_t>();
  auto rf = p.release(0, p.server, 1, moved);
  const auto r = get(rf);
  handoff_pair<T>::check_moved(r);
  CHECK_FALSE(r.inline_call);
  CHECK(r.adopted_peer == peer);
  // What stays behind on reactor 0 is closed.
  CHECK_FALSE(h.on(0, [s = p.server] { return s->is_open(); }));
  auto late = p.read_exact(0, p.server, 1);
  CHECK(get(late).first == fw::errc::connection_closed);

  // After the move, on reactor 1: writes each way, a multi-megabyte one in each
  // direction (the large-read paths), exact reads and read_some.
  const auto c1 = pattern_bytes(100, 7), c2 = pattern_bytes(std::size_t{4} << 20, 8), c3 = pattern_bytes(777, 9);
  const auto d1 = pattern_bytes(std::size_t{3} << 20, 10), d2 = pattern_bytes(50, 11);
  auto wc1 = p.write(1, p.client, {fw::const_buffer(c1)});
  auto wc2 = p.write(1, p.client, {fw::const_buffer(c2)});
  auto wc3 = p.write(1, p.client, {fw::const_buffer(c3)});
  auto rc1 = p.read_exact(1, moved, c1.size());
  auto rc2 = p.read_exact(1, moved, c2.size());
  auto rc3 = p.read_some(1, moved, c3.size());
  auto wd1 = p.write(1, moved, {fw::const_buffer(d1)});
  auto wd2 = p.write(1, moved, {fw::const_buffer(d2)});
  auto rd1 = p.read_exact(1, p.client, d1.size());
  auto rd2 = p.read_some(1, p.client, d2.size());
  check_wrote(wc1, c1.size());
  check_wrote(wc2, c2.size());
  check_wrote(wc3, c3.size());
  check_read(rc1, c1);
  check_read(rc2, c2);
  check_read(rc3, c3);
  check_wrote(wd1, d1.size());
  check_wrote(wd2, d2.size());
  check_read(rd1, d1);
  check_read(rd2, d2);
}

TEST_CASE_TEMPLATE_DEFINE(
    "a release with bytes read ahead but not consumed closes the socket and fails with "
    "errc::invalid_argument",
    T, handoff_read_ahead) {
  harness<T> h;
  handoff_pair<T> p(h);
  const auto hundred = pattern_bytes(100, 12);
  auto w = p.write(1, p.client, {fw::const_buffer(hundred)});
  check_wrote(w, hundred.size());
  // With all 100 bytes waiting, the receive behind a 1-byte read takes them all
  // (asio_tcp reads ahead into its chunk, uring_tcp's multishot recv into a ring buffer).
  p.wait_unread(0, p.server, 100);
  auto one = p.read_exact(0, p.server, 1);
  check_read(one, std::vector<std::byte>(hundred.begin(), hundred.begin() + 1));
  auto rf = p.release(0, p.server, 1, std::make_shared<typename T::connection_type>());
  const auto r = get(rf);
  CHECK(r.ec == fw::errc::invalid_argument);
  CHECK(r.fd == -1);
  CHECK_FALSE(r.inline_call);
  CHECK_FALSE(h.on(0, [s = p.server] { return s->is_open(); }));
  // The socket was closed: the peer reads the end of the stream (or a reset).
  auto eof = p.read_exact(1, p.client, 1);
  const auto ec = get(eof).first;
  CHECK((ec == fw::errc::connection_closed || ec == fw::errc::connection_reset));
}

TEST_CASE_TEMPLATE_DEFINE(
    "a release completes pending reads with errc::cancelled first, then hands out a socket "
    "that reads on",
    T, handoff_pending_reads) {
  // A small pending read (asio_tcp: into the chunk; uring_tcp: the multishot
  // recv) and a large one (a receive straight into the destination).
  for (std::size_t pending : {std::size_t{10}, std::size_t{1} << 20}) {
    CAPTURE(pending);
    harness<T> h;
    handoff_pair<T> p(h);
    struct outcome {
      std::string order;
      std::error_code read_ec, some_ec;
      std::size_t read_n = 99;
      bool some_empty = false;
    };
    auto o = std::make_shared<outcome>();  // reactor 0's
    auto dst = std::make_shared<std::vector<std::byte>>(pending);
    h.on(0, [s = p.server, o, dst] {
      s->async_read(fw::mutable_buffer(*dst), [o, dst](std::error_code ec, std::size_t n) {
        o->order += "r";
        o->read_ec = ec;
        o->read_n = n;
      });
      s->async_read_some([o](std::error_code ec, fw::tensor_buffer b) {
        o->order += "s";
        o->some_ec = ec;
        o->some_empty = b.empty();
      });
    });
    auto moved = std::make_shared<typename T::connection_type>();
    auto rf = p.release(0, p.server, 1, moved, {}, [o] { o->order += "R"; });
    const auto r = get(rf);
    handoff_pair<T>::check_moved(r);
    const outcome got = h.on(0, [o] { return *o; });
    CHECK(got.order == "rsR");
    CHECK(got.read_ec == fw::errc::cancelled);
    CHECK(got.read_n == 0);
    CHECK(got.some_ec == fw::errc::cancelled);
    CHECK(got.some_empty);

    // What the peer sends now arrives at the adopted connection, whole; and back.
    exchange_moved(p, moved, pattern_bytes(5000, 13), pattern_bytes(10, 14));
  }
}

TEST_CASE_TEMPLATE_DEFINE(
    "a second release, or one on a closed connection, fails with errc::connection_closed; close() "
    "during a release cancels it and closes the socket",
    T, handoff_second_release) {
  using conn_t = typename T::connection_type;
  using released = typename handoff_pair<T>::released;
  harness<T> h;
  handoff_pair<T> p(h);

  // Two releases at once: the second fails (posted), the first hands out the
  // socket (adopted back on reactor 0).
  struct second_call {
    released r;
    bool returned = false;
  };
  auto second = std::make_shared<second_call>();  // reactor 0's
  auto second_done = std::make_shared<std::promise<void>>();
  auto sf = second_done->get_future();
  auto again = std::make_shared<conn_t>();
  auto rf = p.release(0, p.server, 0, again, [second, second_done](conn_t& c) {
    c.async_release([second, second_done](std::error_code ec, int fd) {
      second->r.ec = ec;
      second->r.fd = fd;
      second->r.inline_call = !second->returned;
      second_done->set_value();
    });
    second->returned = true;
  });
  const auto first = get(rf);
  get(sf);
  CHECK_FALSE(first.ec);
  CHECK(first.fd >= 0);
  CHECK(first.adopted_open);
  const auto s = h.on(0, [second] { return second->r; });
  CHECK(s.ec == fw::errc::connection_closed);
  CHECK(s.fd == -1);
  CHECK_FALSE(s.inline_call);
  // And one after the release: the connection is closed.
  auto third = p.release(0, p.server, 0, nullptr);
  const auto t = get(third);
  CHECK(t.ec == fw::errc::connection_closed);
  CHECK(t.fd == -1);
  CHECK_FALSE(t.inline_call);

  // close() right after async_release: cancelled, and the socket is closed
  // (the adopted peer reads the end of the stream).
  auto cf = p.release(1, p.client, 1, std::make_shared<conn_t>(), [](conn_t& c) {
    c.close();
    CHECK_FALSE(c.is_open());
  });
  const auto c = get(cf);
  CHECK(c.ec == fw::errc::cancelled);
  CHECK(c.fd == -1);
  CHECK_FALSE(c.inline_call);
  auto eof = p.read_exact(0, again, 1);
  CHECK(get(eof).first == fw::errc::connection_closed);
  // A release of a closed (not released) connection.
  auto closed = p.release(1, p.client, 1, nullptr);
  const auto cl = get(closed);
  CHECK(cl.ec == fw::errc::connection_closed);
  CHECK(cl.fd == -1);
  CHECK_FALSE(cl.inline_call);
}

TEST_CASE_TEMPLATE_DEFINE("the reactor stopping during a release cancels it and closes the socket", T,
                          handoff_reactor_stops) {
  harness<T> h;
  handoff_pair<T> p(h);
  const int fd = h.on(0, [s = p.server] { return s->native_handle(); });
  REQUIRE(fd >= 0);
  auto done = std::make_shared<std::promise<std::pair<std::error_code, int>>>();
  auto f = done->get_future();
  // Called from a posted task, the release's completion is posted to the next
  // tick, and the stop (which closes every connection) begins before that tick.
  h.on(0, [&h, s = p.server, done] {
    harness<T>::here().post([&h, s, done] {
      h.group.stop();
      s->async_release([s, done](std::error_code ec, int released_fd) { done->set_value({ec, released_fd}); });
    });
  });
  const auto r = get(f);
  CHECK(r.first == fw::errc::cancelled);
  CHECK(r.second == -1);
  h.group.stop();  // joins: nothing opens a descriptor from here on
  errno = 0;
  CHECK(::fcntl(fd, F_GETFD) == -1);
  CHECK(errno == EBADF);
}

TEST_CASE_TEMPLATE_DEFINE("a release that cuts a write in half closes the socket and fails with errc::invalid_argument",
                          T, handoff_cut_write) {
  harness<T> h;
  handoff_pair<T> p(h);
  // More than the socket buffers hold, to a peer that does not read: the write
  // stays under way once its first bytes arrived.
  const std::vector<std::byte> big(std::size_t{64} << 20);
  auto w = p.write(0, p.server, {fw::const_buffer(big)});
  p.wait_unread(1, p.client, 1);
  auto rf = p.release(0, p.server, 1, std::make_shared<typename T::connection_type>());
  const auto [wec, wrote] = get(w);
  CHECK(wec == fw::errc::cancelled);
  CHECK(wrote > 0);
  CHECK(wrote < big.size());
  const auto r = get(rf);
  CHECK(r.ec == fw::errc::invalid_argument);
  CHECK(r.fd == -1);
}

TEST_CASE_TEMPLATE_DEFINE(
    "adopt takes only a connected TCP socket, closes anything else, and runs only on its "
    "reactor's thread",
    T, handoff_adopt) {
  harness<T> h;
  struct attempt {
    std::error_code ec;
    bool open = true;
    bool closed = false;
  };
  // Nothing else opens a descriptor meanwhile (the reactors idle, the test thread waits).
  const auto is_closed = [](int fd) {
    errno = 0;
    return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF;
  };
  const auto tries = h.on(1, [&] {
    std::vector<attempt> out;
    const auto adopt = [&](int fd) {
      attempt a;
      auto c = h.transport.adopt(harness<T>::here(), fd, a.ec);
      a.open = c.is_open();
      a.closed = fd < 0 || is_closed(fd);
      out.push_back(a);
    };
    int unix_pair[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair) == 0) {
      adopt(unix_pair[0]);
      ::close(unix_pair[1]);
    }
    adopt(::socket(AF_INET, SOCK_STREAM, 0));  // TCP, not connected
    adopt(-1);
    return out;
  });
  REQUIRE(tries.size() == 3);
  for (const attempt& a : tries) {
    CHECK(a.ec == fw::errc::invalid_argument);
    CHECK_FALSE(a.open);
    CHECK(a.closed);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  try {
    std::error_code ec;
    (void)h.transport.adopt(h.group.at(0), fd, ec);
    FAIL("adopt from the test thread was accepted");
  } catch (const std::system_error& e) {
    CHECK(e.code() == fw::errc::invalid_argument);
    CHECK(std::string(e.what()) ==
          std::string(T::name()) + "::adopt called off the thread of reactor 0 that owns it: invalid argument");
  }
  CHECK(is_closed(fd));  // taken all the same
}
