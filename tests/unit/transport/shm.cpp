// The shm transport's own tests: a hostile peer (bad hellos, indices outside
// the ring), its limits, and what it leaves behind (descriptors, mappings,
// files); those that exercise the reactor's waits (the handshake's, the
// control socket's) run on each reactor this build has. The shared suite runs
// in shm_suite.cpp; peer death across processes in
// tests/multiprocess/transport/shm_mp.cpp.
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/shm.hpp>

#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <functional>
#include <thread>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shm_harness.hpp"
#include "support/process_resources.hpp"

namespace shm_cases {

namespace fw = fusewire;
namespace seg = fusewire::detail::shm;
using namespace std::chrono_literals;
using fusewire::test::count_fds;
using fusewire::test::count_segment_mappings;
using fusewire::test::dev_shm;
using fusewire::test::shm::basic_reported_group;
using fusewire::test::shm::raw_peer;
using fusewire::test::shm::reactor_shms;
using fusewire::test::shm::reported_group;

namespace {

/// The server side of a test: a listener on reactor 0 that keeps what it
/// accepts (the connections die there: clear `accepted` on the reactor).
template <class T = fw::shm>
struct basic_server {
  using connection_t = typename T::connection_type;
  T transport;
  typename T::listener_type listener;
  std::vector<std::shared_ptr<connection_t>> accepted;
  std::promise<connection_t*> next;

  void accept_one() {
    next = {};
    listener.async_accept([this](std::error_code ec, connection_t c) {
      if (ec) return;
      auto p = std::make_shared<connection_t>(std::move(c));
      accepted.push_back(p);
      next.set_value(p.get());
    });
  }

  /// Listens on 127.0.0.1 from g's reactor and accepts one connection;
  /// returns the port.
  template <class Group>
  std::uint16_t start(Group& g) {
    return g.on([&] {
      listener = transport.listen(*T::reactor_type::current(), "127.0.0.1", 0);
      accept_one();
      return listener.port();
    });
  }

  /// `p` connects to `port` and sends a good hello (a ring of 4 KiB): the
  /// connection this side accepted from it.
  connection_t* accept_raw(raw_peer& p, std::uint16_t port) {
    REQUIRE(p.connect(port));
    REQUIRE(p.send_good_hello(4096));
    auto f = next.get_future();
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    return f.get();
  }
};
using server = basic_server<>;

template <class T>
using reported_group_for = basic_reported_group<typename T::reactor_type::engine_type>;

}  // namespace

TEST_CASE("shm: hostile hellos are dropped with a report naming what was wrong; the listener goes on") {
  reported_group g;
  server s;
  const std::uint16_t port = s.start(g);

  struct bad_case {
    const char* report;
    std::function<bool(raw_peer&)> send;
  };
  const std::vector<bad_case> cases = {
      {"does not start with the shm magic",
       [](raw_peer& p) {
         p.make_segment(4096);
         return p.send_hello({0xdeadbeef, seg::segment_version, 0, 4096},
                             {p.memfd.get(), p.client_bell.get(), p.server_bell.get()});
       }},
      {"ring size 1099511627776 is not a power of two from 4096 to the limit",
       [](raw_peer& p) {
         p.make_segment(4096);
         return p.send_hello({seg::segment_magic, seg::segment_version, 0, std::uint64_t{1} << 40},
                             {p.memfd.get(), p.client_bell.get(), p.server_bell.get()});
       }},
      {"not a memfd sealed against shrinking",
       [](raw_peer& p) {
         p.make_segment(4096);
         seg::unique_fd unsealed(::memfd_create("fusewire-shm-test", MFD_CLOEXEC));
         REQUIRE(::ftruncate(unsealed.get(), seg::segment_size(4096)) == 0);
         return p.send_hello({seg::segment_magic, seg::segment_version, 0, 4096},
                             {unsealed.get(), p.client_bell.get(), p.server_bell.get()});
       }},
      {"segment's size is not",
       [](raw_peer& p) {
         p.make_segment(4096);
         return p.send_hello({seg::segment_magic, seg::segment_version, 0, 8192},
                             {p.memfd.get(), p.client_bell.get(), p.server_bell.get()});
       }},
      {"is not an eventfd",
       [](raw_peer& p) {
         p.make_segment(4096);
         return p.send_hello({seg::segment_magic, seg::segment_version, 0, 4096},
                             {p.memfd.get(), p.memfd.get(), p.server_bell.get()});
       }},
      {"descriptors", [](raw_peer& p) {
         p.make_segment(4096);
         return p.send_hello({seg::segment_magic, seg::segment_version, 0, 4096}, {p.memfd.get()});
       }}};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    raw_peer p;
    REQUIRE(p.connect(port));
    REQUIRE(cases[i].send(p));
    CHECK(g.wait_report(cases[i].report));
    // Dropped: the hostile side sees the hang-up.
    char b;
    CHECK(::recv(p.sock.get(), &b, 1, 0) == 0);
  }
  // A good connection is still accepted.
  std::promise<std::error_code> connected;
  auto client = std::make_shared<fw::shm_connection>();
  g.on([&] {
    s.transport.connect(*fw::asio_reactor::current(), "127.0.0.1", port,
                        [&, client](std::error_code ec, fw::shm_connection c) {
                          *client = std::move(c);
                          connected.set_value(ec);
                        });
    return 0;
  });
  CHECK_FALSE(connected.get_future().get());
  auto f = s.next.get_future();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  g.on([&] {
    client->close();
    s.listener.close();
    s.accepted.clear();
    *client = fw::shm_connection();
    return 0;
  });
}

TEST_CASE("shm: a peer writing a bad record header or read index fails the connection with errc::malformed_frame") {
  // A record longer than the ring, a header that carries another position
  // (one left from a lap before), and a read index beyond what was written.
  for (const int hostile : {0, 1, 2}) {
    CAPTURE(hostile);
    const bool bad_head = hostile != 2;
    for (fw::reactor_mode mode : {fw::reactor_mode::block, fw::reactor_mode::poll}) {
      CAPTURE(static_cast<int>(mode));
      reported_group g(mode);
      server s;
      raw_peer p;
      auto* conn = s.accept_raw(p, s.start(g));

      std::promise<std::pair<std::error_code, std::size_t>> done;
      std::vector<std::byte> buf(10000);
      g.on([&] {
        if (bad_head) {
          conn->async_read(fw::mutable_buffer(buf.data(), 100), [&](std::error_code ec, std::size_t n) {
            done.set_value({ec, n});
          });
        } else {
          const fw::const_buffer one[] = {fw::const_buffer(buf.data(), buf.size())};  // more than the ring
          conn->async_write(one, [&](std::error_code ec, std::size_t n) { done.set_value({ec, n}); });
        }
        return 0;
      });
      seg::segment_header* h = p.map.header();
      if (bad_head) {
        p.store_word(0, hostile == 0 ? seg::record_header(0, std::uint64_t{1} << 20) : seg::record_header(4096, 100));
      } else {
        std::this_thread::sleep_for(20ms);  // the write filled the ring and waits
        h->ring[1].tail.store(12345678);    // a read index beyond what was written
      }
      p.ring_server();
      auto df = done.get_future();
      REQUIRE(df.wait_for(10s) == std::future_status::ready);
      const auto [ec, n] = df.get();
      CHECK(ec == fw::errc::malformed_frame);
      if (bad_head) {
        CHECK(n == 0);  // nothing read from outside the ring
        CHECK(g.wait_report(std::string("record header at ring position 0 (0x") +
                            (hostile == 0 ? "100000" : "20000000064") +
                            ") does not carry that position and a length from 1 to 4072"));
      } else {
        CHECK(n == 4072);  // one record: the ring less its header, padding and the next header's word
        CHECK(g.wait_report("read index 12345678 is not within the ring of 4096 bytes"));
      }
      // Later operations fail the same way; the hostile side sees the hang-up.
      std::promise<std::error_code> later;
      g.on([&] {
        conn->async_read(fw::mutable_buffer(buf.data(), 1),
                         [&](std::error_code e, std::size_t) { later.set_value(e); });
        return 0;
      });
      CHECK(later.get_future().get() == fw::errc::malformed_frame);
      char b;
      CHECK(::recv(p.sock.get(), &b, 1, 0) == 0);
      g.on([&] {
        conn->close();
        s.listener.close();
        s.accepted.clear();
        return 0;
      });
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("shm: connections leave no descriptors, mappings or files behind", T, leaves_nothing) {
  using connection_t = typename T::connection_type;
  using reactor_t = typename T::reactor_type;
  const auto shm_before = dev_shm();
  const std::size_t fds_before = count_fds();
  {
    fw::reactor_config cfg;
    cfg.count = 2;
    fw::basic_reactor_group<typename reactor_t::engine_type> group(cfg);
    T transport;
    auto listener = std::make_shared<typename T::listener_type>();
    auto accepted = std::make_shared<std::vector<connection_t>>();
    auto fp = group.submit(0, [&] {
      *listener = transport.listen(*reactor_t::current(), "leak-check", 0);
      return listener->port();
    });
    const std::uint16_t port = fp.get();
    for (int i = 0; i < 5; ++i) {
      std::promise<void> echoed, took;
      group.submit_to(0, [&, listener, accepted] {
        listener->async_accept([accepted, &took](std::error_code ec, connection_t c) {
          if (!ec) accepted->push_back(std::move(c));
          took.set_value();
        });
      });
      group.submit_to(1, [&] {
        transport.connect(*reactor_t::current(), "leak-check", port, [&](std::error_code ec, connection_t c) {
          REQUIRE_FALSE(ec);
          auto conn = std::make_shared<connection_t>(std::move(c));
          static const std::byte word[4] = {};
          const fw::const_buffer one[] = {fw::const_buffer(word, 4)};
          conn->async_write(one, [&, conn](std::error_code e, std::size_t) {
            CHECK_FALSE(e);
            conn->close();
            echoed.set_value();
          });
        });
      });
      REQUIRE(echoed.get_future().wait_for(10s) == std::future_status::ready);
      // The accept may complete after the client's write: an accepted
      // connection pushed after the clear below would outlive its reactor.
      REQUIRE(took.get_future().wait_for(10s) == std::future_status::ready);
    }
    CHECK(count_segment_mappings() > 0);  // the accepted ones, still open
    auto fc = group.submit(0, [&, listener, accepted] {
      accepted->clear();
      listener->close();
      *listener = typename T::listener_type();
      return 0;
    });
    fc.get();
    group.stop();
  }
  CHECK(count_segment_mappings() == 0);
  CHECK(count_fds() == fds_before);
  CHECK(dev_shm() == shm_before);
}
TEST_CASE_TEMPLATE_APPLY(leaves_nothing, reactor_shms);

TEST_CASE("shm: config limits are checked and named") {
  const auto what = [](fw::shm::config cfg) {
    try {
      fw::shm t(cfg);
    } catch (const std::system_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  fw::shm::config c;
  c.ring_size = 5000;
  CHECK(what(c).find("shm::config.ring_size = 5000: must be a power of two") == 0);
  c = {};
  c.ring_size = std::size_t{128} << 20;  // above max_ring_size
  CHECK(what(c).find("shm::config.ring_size") == 0);
  c = {};
  c.max_ring_size = std::size_t{2} << 30;
  CHECK(what(c).find("shm::config.max_ring_size") == 0);
  c = {};
  c.read_some_max = 0;
  CHECK(what(c).find("shm::config.read_some_max") == 0);
  c = {};
  c.single_copy_min = 100;
  CHECK(what(c).find("shm::config.single_copy_min = 100: must be 0 (off) or at least 4096") == 0);
  c.single_copy_min = 0;
  CHECK(what(c) == "accepted");
  CHECK(what({}) == "accepted");
}

TEST_CASE_TEMPLATE_DEFINE(
    "shm: a connecting side that sends no hello is dropped after handshake_timeout; others are served", T,
    silent_peer_dropped) {
  reported_group_for<T> g;
  fw::shm_config cfg;
  cfg.handshake_timeout = 100ms;
  basic_server<T> s{T(cfg), {}, {}, {}};
  const std::uint16_t port = s.start(g);
  raw_peer silent;
  REQUIRE(silent.connect(port));
  CHECK(g.wait_report("sent no hello within 100 ms; dropped"));
  char b;
  CHECK(::recv(silent.sock.get(), &b, 1, 0) == 0);  // dropped: the hang-up
  raw_peer good;
  CHECK(s.accept_raw(good, port)->remote_endpoint() ==
        "127.0.0.1:" + std::to_string(port) + "#" + std::to_string(::getpid()));
  g.on([&] {
    s.listener.close();
    s.accepted.clear();
    return 0;
  });
}
TEST_CASE_TEMPLATE_APPLY(silent_peer_dropped, reactor_shms);

TEST_CASE_TEMPLATE_DEFINE("shm: a peer that dies without closing fails pending reads and writes with connection_reset",
                          T, peer_dies) {
  for (fw::reactor_mode mode : {fw::reactor_mode::block, fw::reactor_mode::poll}) {
    CAPTURE(static_cast<int>(mode));
    reported_group_for<T> g(mode);
    basic_server<T> s{T(), {}, {}, {}};
    raw_peer peer;
    auto* conn = s.accept_raw(peer, s.start(g));
    std::promise<std::error_code> read_done, write_done;
    static std::byte sink[16];
    static const std::vector<std::byte> big(64 * 1024);  // more than the 4 KiB ring: the write waits for room
    g.on([&] {
      conn->async_read(fw::mutable_buffer(sink, sizeof sink),
                       [&](std::error_code ec, std::size_t) { read_done.set_value(ec); });
      const fw::const_buffer one[] = {fw::const_buffer(big.data(), big.size())};
      conn->async_write(one, [&](std::error_code ec, std::size_t) { write_done.set_value(ec); });
      return 0;
    });
    // The peer's process dies: its socket hangs up, its close flag never rises.
    peer.sock.reset();
    auto rf = read_done.get_future();
    auto wf = write_done.get_future();
    REQUIRE(rf.wait_for(10s) == std::future_status::ready);
    REQUIRE(wf.wait_for(10s) == std::future_status::ready);
    CHECK(rf.get() == fw::make_error_code(fw::errc::connection_reset));
    CHECK(wf.get() == fw::make_error_code(fw::errc::connection_reset));
    g.on([&] {
      s.listener.close();
      s.accepted.clear();
      return 0;
    });
  }
}
TEST_CASE_TEMPLATE_APPLY(peer_dies, reactor_shms);

}  // namespace shm_cases
