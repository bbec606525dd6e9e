// One transport test suite, instantiated for every transport this build has.
// Server and client run on different reactors (threads) of one group.
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/concepts.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <doctest/doctest.h>

#include <array>
#include <random>
#include <tuple>

namespace fw = fusewire;
using namespace std::chrono_literals;

static_assert(fw::transport<fw::asio_tcp>);
static_assert(fw::handoff_transport<fw::asio_tcp>);
#if FUSEWIRE_HAS_URING
static_assert(fw::transport<fw::uring_tcp>);
static_assert(fw::handoff_transport<fw::uring_tcp>);
#endif

#include "support/tcp_transports.hpp"
#include "transport_suite.hpp"

using fusewire::test::tcp_transports;

// Every test case of the suite for each TCP transport, the hand-off ones too: both are handoff_transports.
TEST_CASE_TEMPLATE_APPLY(suite_connect_accept, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_echo, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_scatter_gather, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_buffers, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_back_to_back_writes, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_order, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_read, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_write, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_past_close, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_connections, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_close_cancels, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_peer_closes, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_connect_refused, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_listen_errors, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_off_thread, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_group_stop, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(suite_try_read, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_moves_on, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_read_ahead, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_pending_reads, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_second_release, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_reactor_stops, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_cut_write, tcp_transports);
TEST_CASE_TEMPLATE_APPLY(handoff_adopt, tcp_transports);

#if FUSEWIRE_HAS_URING
namespace {

struct zc_run {
  std::error_code ec;
  bool intact = false;
  bool notified_before_handler = true;  // the last write's handler ran after every notification
  fw::uring_tcp_stats stats;
  std::string features;
};

/// Two writes of `n` bytes from a fresh client connection to an echo server on
/// 127.0.0.1, read back into one destination; the client's stats at the end.
zc_run zero_copy_exchange(fw::zero_copy_policy policy, std::size_t n) {
  fw::uring_tcp::config cfg;
  cfg.zero_copy = policy;
  cfg.zc_threshold = 64 * 1024;
  harness<fw::uring_tcp> h(fw::reactor_mode::adaptive, fw::uring_tcp(cfg));
  const std::uint16_t port = h.serve_echo(0);
  const auto src = pattern_bytes(n, 77);
  std::vector<std::byte> dst(2 * n);
  std::promise<zc_run> done;
  h.group.submit_to(1, [&] {
    using conn_t = fw::uring_tcp_connection;
    h.transport.connect(harness<fw::uring_tcp>::here(), "127.0.0.1", port, [&](std::error_code ec, conn_t c) {
      REQUIRE_FALSE(ec);
      auto conn = std::make_shared<conn_t>(std::move(c));
      auto pending = std::make_shared<int>(3);
      auto ordered = std::make_shared<bool>(true);
      auto finish = [&, conn, pending, ordered](std::error_code e) {
        if (--*pending == 0 || e) {
          if (*pending < 0) return;
          *pending = -1;
          zc_run r;
          r.ec = e;
          r.notified_before_handler = *ordered;
          r.stats = conn->stats();
          r.features = fw::uring_reactor::current()->engine().features().to_string();
          done.set_value(std::move(r));
          conn->close();
        }
      };
      conn->async_read(fw::mutable_buffer(dst), [finish](std::error_code e, std::size_t) mutable { finish(e); });
      const fw::const_buffer one[] = {fw::const_buffer(src)};
      for (int i = 0; i < 2; ++i) {
        conn->async_write(one, [finish, conn, ordered, i](std::error_code e, std::size_t) mutable {
          // A handler runs only after every zero-copy notification of its write;
          // the last write's handler, after those of every send.
          const auto s = conn->stats();
          if (i == 1 && s.zc_notifications != s.zc_sends) *ordered = false;
          finish(e);
        });
      }
    });
  });
  auto f = done.get_future();
  zc_run r = get(f);
  r.intact = std::memcmp(src.data(), dst.data(), n) == 0 && std::memcmp(src.data(), dst.data() + n, n) == 0;
  MESSAGE("zc_sends=", r.stats.zc_sends, " zc_notifications=", r.stats.zc_notifications,
          " zc_copied=", r.stats.zc_copied, " plain sends=", r.stats.sends, " direct_recvs=", r.stats.direct_recvs,
          " copied_to_destination=", r.stats.bytes_copied_to_destination, " engine: ", r.features);
  return r;
}

/// What a test's reading side received, and its connection's stats then.
struct stream_result {
  std::vector<std::byte> data;
  fw::uring_tcp_stats stats;
};

/// Connects from reactor 1 to `port`, writes `src` in one async_write and
/// returns that write's result.
template <class Bytes>
std::error_code write_once(harness<fw::uring_tcp>& h, std::uint16_t port, const Bytes& src) {
  std::promise<std::error_code> wrote;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<fw::uring_tcp>::here(), "127.0.0.1", port,
                        [&](std::error_code ec, fw::uring_tcp_connection c) {
                          REQUIRE_FALSE(ec);
                          auto conn = std::make_shared<fw::uring_tcp_connection>(std::move(c));
                          const fw::const_buffer one[] = {fw::const_buffer(src)};
                          conn->async_write(one, [&, conn](std::error_code e, std::size_t) { wrote.set_value(e); });
                        });
  });
  auto w = wrote.get_future();
  return get(w);
}

}  // namespace

TEST_CASE("uring_tcp: zero_copy_policy::always sends large writes with SENDMSG_ZC, completing after the notification") {
  const zc_run r = zero_copy_exchange(fw::zero_copy_policy::always, 8u << 20);
  CHECK_FALSE(r.ec);
  CHECK(r.intact);
  CHECK(r.notified_before_handler);
  if (r.features.find("sendmsg_zc+") == std::string::npos) {
    MESSAGE("SKIPPED zero-copy checks: the kernel has no IORING_OP_SENDMSG_ZC");
    return;
  }
  // Forced: both writes go zero-copy, even though loopback copies (zc_copied) anyway.
  CHECK(r.stats.zc_sends >= 2);
  CHECK(r.stats.zc_notifications == r.stats.zc_sends);
  CHECK(r.stats.direct_recvs >= 1);
  CHECK(r.stats.bytes_sent == 16u << 20);
  CHECK(r.stats.bytes_received == 16u << 20);
}

TEST_CASE("uring_tcp: zero_copy_policy::automatic and ::never send plainly to a peer on this host") {
  for (const auto policy : {fw::zero_copy_policy::automatic, fw::zero_copy_policy::never}) {
    CAPTURE(static_cast<int>(policy));
    const zc_run r = zero_copy_exchange(policy, 8u << 20);
    CHECK_FALSE(r.ec);
    CHECK(r.intact);
    CHECK(r.stats.zc_sends == 0);
    CHECK(r.stats.zc_notifications == 0);
    CHECK(r.stats.sends >= 2);
    CHECK(r.stats.bytes_sent == 16u << 20);
  }
}

TEST_CASE("peer_is_local: loopback addresses and a connection to one's own address") {
  auto v4 = [](const char* ip) {
    fw::detail::socket_address a;
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    REQUIRE(::inet_pton(AF_INET, ip, &in->sin_addr) == 1);
    a.size = sizeof(sockaddr_in);
    return a;
  };
  auto v6 = [](const char* ip) {
    fw::detail::socket_address a;
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    REQUIRE(::inet_pton(AF_INET6, ip, &in6->sin6_addr) == 1);
    a.size = sizeof(sockaddr_in6);
    return a;
  };
  CHECK(fw::detail::is_loopback(v4("127.0.0.1")));
  CHECK(fw::detail::is_loopback(v4("127.200.3.4")));
  CHECK_FALSE(fw::detail::is_loopback(v4("10.0.0.1")));
  CHECK_FALSE(fw::detail::is_loopback(v4("128.0.0.1")));
  CHECK(fw::detail::is_loopback(v6("::1")));
  CHECK(fw::detail::is_loopback(v6("::ffff:127.0.0.9")));
  CHECK_FALSE(fw::detail::is_loopback(v6("::ffff:10.0.0.1")));
  CHECK_FALSE(fw::detail::is_loopback(v6("fe80::1")));
  CHECK(fw::detail::same_host_address(v4("10.1.2.3"), v4("10.1.2.3")));
  CHECK_FALSE(fw::detail::same_host_address(v4("10.1.2.3"), v4("10.1.2.4")));
  CHECK_FALSE(fw::detail::same_host_address(v4("127.0.0.1"), v6("::ffff:127.0.0.1")));
  CHECK(fw::detail::same_host_address(v6("fe80::1"), v6("fe80::1")));
  CHECK_FALSE(fw::detail::peer_is_local(-1));
}

TEST_CASE("uring_tcp works without provided buffers, multishot or zero copy (fallbacks)") {
  fw::uring_tcp::config cfg;
  cfg.multishot = false;
  cfg.zc_threshold = 0;
  harness<fw::uring_tcp> h(fw::reactor_mode::adaptive, fw::uring_tcp(cfg));
  const std::uint16_t port = h.serve_echo(0);
  for (std::size_t n : {std::size_t{1}, std::size_t{70000}, std::size_t{3u << 20}}) {
    const auto src = pattern_bytes(n, 5);
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
  const auto src = pattern_bytes(n, 21);
  std::promise<stream_result> got;
  const std::uint16_t port = h.serve(0, [&](fw::uring_tcp_connection c) {
    // Holds on to every buffer it receives, so the ring runs low.
    struct reader : std::enable_shared_from_this<reader> {
      fw::uring_tcp_connection conn;
      std::vector<fw::tensor_buffer> kept;
      std::size_t total = 0, want = 0;
      std::promise<stream_result>* done = nullptr;
      void next() {
        conn.async_read_some([self = this->shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
          REQUIRE_FALSE(ec);
          self->total += b.size();
          self->kept.push_back(std::move(b));
          if (self->total < self->want) return self->next();
          stream_result r;
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
  CHECK_FALSE(write_once(h, port, src));
  auto f = got.get_future();
  const stream_result r = get(f);
  REQUIRE(r.data.size() == n);
  CHECK(std::memcmp(r.data.data(), src.data(), n) == 0);
  MESSAGE("ring_buffers=", r.stats.ring_buffers, " fallback_recvs=", r.stats.fallback_recvs,
          " multishot_arms=", r.stats.multishot_arms);
  CHECK(r.stats.ring_buffers > 0);
}

TEST_CASE("uring_tcp: a stream of large frames lands in its destinations, not copied through ring buffers") {
  // Frames of a 16-byte head and a 256 KiB payload, read as a channel reads
  // them (exact head, exact payload). After a large read the next heads get
  // exact recvs too; a multishot recv re-armed for each head would drain the
  // next payload into ring buffers, to be copied again.
  harness<fw::uring_tcp> h;
  constexpr std::size_t frames = 16, head = 16, payload = 256 * 1024;
  const auto src = pattern_bytes(frames * (head + payload), 31);
  std::promise<stream_result> got;
  const std::uint16_t port = h.serve(0, [&](fw::uring_tcp_connection c) {
    struct reader : std::enable_shared_from_this<reader> {
      fw::uring_tcp_connection conn;
      std::vector<std::byte> data;
      std::size_t at = 0, step = 0;
      std::promise<stream_result>* done = nullptr;
      void next() {
        const std::size_t n = step % 2 == 0 ? head : payload;
        conn.async_read(fw::mutable_buffer(data.data() + at, n),
                        [self = this->shared_from_this(), n](std::error_code ec, std::size_t got) {
                          REQUIRE_FALSE(ec);
                          REQUIRE(got == n);
                          self->at += n;
                          if (++self->step < 2 * frames) return self->next();
                          self->done->set_value(stream_result{std::move(self->data), self->conn.stats()});
                          self->conn.close();
                        });
      }
    };
    auto r = std::make_shared<reader>();
    r->conn = std::move(c);
    r->data.resize(src.size());
    r->done = &got;
    r->next();
  });
  CHECK_FALSE(write_once(h, port, src));
  auto f = got.get_future();
  const stream_result r = get(f);
  REQUIRE(r.data.size() == src.size());
  CHECK(std::memcmp(r.data.data(), src.data(), src.size()) == 0);
  MESSAGE("copied_to_destination=", r.stats.bytes_copied_to_destination, " direct_recvs=", r.stats.direct_recvs,
          " multishot_arms=", r.stats.multishot_arms, " of ", src.size(), " bytes");
  // What the multishot that read the first head received ahead is copied
  // (the part of the stream sent before any read was posted); every later
  // payload is received straight into place.
  CHECK(r.stats.multishot_arms <= 2);
  CHECK(r.stats.direct_recvs >= frames);
  CHECK(r.stats.bytes_copied_to_destination <= src.size() / 2);
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
  const auto src = pattern_bytes(2000, 11);
  auto client = std::make_shared<fw::uring_tcp_connection>();  // touched on reactor 1 only
  std::vector<std::byte> never(1);
  h.group.submit_to(1, [&, client] {
    h.transport.connect(harness<fw::uring_tcp>::here(), "127.0.0.1", port,
                        [&, client](std::error_code ec, fw::uring_tcp_connection c) {
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

TEST_CASE("asio_tcp: exact reads of mixed sizes are byte-exact with read-ahead on, off and for everything") {
  // Sizes as a framed stream asks for them: header, meta, small and large payloads.
  const std::size_t sizes[] = {24, 40, 10, 24, 40, 5000, 1, 70000, 24, 3000, 4095, 4096, 24, 40, 0, 200000, 7};
  std::size_t total = 0;
  for (std::size_t n : sizes) total += n;
  for (std::size_t below : {std::size_t{0}, std::size_t{4096}, std::size_t{1} << 20}) {
    CAPTURE(below);
    fw::asio_tcp::config cfg;
    cfg.read_ahead_below = below;
    harness<fw::asio_tcp> h(fw::reactor_mode::block, fw::asio_tcp(cfg));
    const auto src = pattern_bytes(total, 11);
    using conn_t = fw::asio_tcp::connection_type;
    std::promise<std::vector<std::byte>> got;
    const std::uint16_t port = h.serve(0, [&](conn_t c) {
      struct reader : std::enable_shared_from_this<reader> {
        conn_t conn;
        std::vector<std::byte> out;
        std::vector<std::byte> buf;
        const std::size_t* sizes = nullptr;
        std::size_t count = 0, next_index = 0;
        std::promise<std::vector<std::byte>>* done = nullptr;
        void next() {
          if (next_index == count) {
            done->set_value(out);
            conn.close();
            return;
          }
          const std::size_t want = sizes[next_index++];
          buf.assign(want, std::byte{0});
          conn.async_read(fw::mutable_buffer(buf.data(), want),
                          [self = this->shared_from_this(), want](std::error_code ec, std::size_t n) {
                            REQUIRE_FALSE(ec);
                            REQUIRE(n == want);
                            self->out.insert(self->out.end(), self->buf.begin(), self->buf.end());
                            self->next();
                          });
        }
      };
      auto r = std::make_shared<reader>();
      r->conn = std::move(c);
      r->sizes = sizes;
      r->count = std::size(sizes);
      r->done = &got;
      r->next();
    });
    auto e = h.write_in_pieces(port, src, 997);  // boundaries unlike the reads'
    auto f = got.get_future();
    const auto out = get(f);
    REQUIRE(out.size() == src.size());
    CHECK(std::memcmp(out.data(), src.data(), src.size()) == 0);
    CHECK(get(e) == fw::errc::connection_closed);
  }
}

namespace {

int send_buffer_of(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  REQUIRE(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &len) == 0);
  return v;
}

/// SO_SNDBUF of both ends of a fresh loopback connection made with `t`:
/// {connector's, acceptor's}.
template <class T>
std::pair<int, int> loopback_send_buffers(T t) {
  harness<T> h(fw::reactor_mode::adaptive, std::move(t));
  std::promise<int> accepted;
  const std::uint16_t port =
      h.serve(0, [&](typename T::connection_type c) { accepted.set_value(send_buffer_of(c.native_handle())); });
  std::promise<int> connected;
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), "127.0.0.1", port, [&](std::error_code ec, typename T::connection_type c) {
      REQUIRE_FALSE(ec);
      connected.set_value(send_buffer_of(c.native_handle()));
    });
  });
  auto c = connected.get_future();
  auto a = accepted.get_future();
  const int client = get(c);
  return {client, get(a)};
}

/// SO_SNDBUF of a plain connected TCP socket to a loopback listener (the
/// kernel's autotuned start), made without any transport.
int plain_send_buffer() {
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(l >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(l, 1) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const int v = send_buffer_of(c);
  ::close(c);
  ::close(l);
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE(
    "a connection to a peer on this host gets config.local_send_buffer as SO_SNDBUF; 0 leaves autotuning", T,
    local_send_buffer) {
  // The kernel caps SO_SNDBUF at net.core.wmem_max and stores twice the value.
  long wmem_max = 0;
  {
    std::FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r");
    REQUIRE(f != nullptr);
    REQUIRE(std::fscanf(f, "%ld", &wmem_max) == 1);
    std::fclose(f);
  }
  const std::size_t asked = 96 * 1024;
  const int expected = 2 * static_cast<int>(std::min<long>(static_cast<long>(asked), wmem_max));
  typename T::config set;
  set.local_send_buffer = asked;
  const auto [client, server] = loopback_send_buffers(T(set));
  CHECK(client == expected);
  CHECK(server == expected);

  typename T::config autotuned;
  autotuned.local_send_buffer = 0;
  const auto [client0, server0] = loopback_send_buffers(T(autotuned));
  const int plain = plain_send_buffer();
  CHECK(client0 == plain);
  CHECK(client0 != expected);
  CHECK(server0 != expected);
  CHECK(typename T::config{}.local_send_buffer == 256 * 1024);  // the default, as documented
}
TEST_CASE_TEMPLATE_APPLY(local_send_buffer, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a bad config.local_send_buffer is refused, naming the field and the allowed range", T,
                          bad_local_send_buffer) {
  for (std::size_t bad : {std::size_t{1}, std::size_t{4095}, (std::size_t{1} << 30) + 1}) {
    CAPTURE(bad);
    typename T::config cfg;
    cfg.local_send_buffer = bad;
    try {
      T t(cfg);
      FAIL("accepted local_send_buffer = ", bad);
    } catch (const std::system_error& e) {
      CHECK(e.code() == fw::errc::invalid_argument);
      CHECK(std::string(e.what()).rfind(
                std::string(T::name()) + "::config.local_send_buffer = " + std::to_string(bad) + ": must be 0", 0) ==
            0);
    }
  }
  for (std::size_t good : {std::size_t{0}, std::size_t{4096}, std::size_t{1} << 30}) {
    typename T::config cfg;
    cfg.local_send_buffer = good;
    CHECK_NOTHROW(T{cfg});
  }
}
TEST_CASE_TEMPLATE_APPLY(bad_local_send_buffer, tcp_transports);

namespace {

template <class T>
using stats_of = decltype(std::declval<const typename T::connection_type&>().stats());

template <class T>
struct spin_side {
  bool intact = false;
  stats_of<T> stats;
};

#if FUSEWIRE_HAS_URING
std::string describe(const fw::uring_tcp_stats& s) {
  return "spin_reads=" + std::to_string(s.spin_reads) + " ring_buffers=" + std::to_string(s.ring_buffers) +
         " direct_recvs=" + std::to_string(s.direct_recvs) + " multishot_arms=" + std::to_string(s.multishot_arms) +
         " multishot_disarms=" + std::to_string(s.multishot_disarms);
}
#endif
std::string describe(const fw::asio_tcp_stats& s) {
  return "spin_reads=" + std::to_string(s.spin_reads) + " recvs=" + std::to_string(s.recvs) +
         " waits=" + std::to_string(s.waits) + " chunk_reads=" + std::to_string(s.chunk_reads) +
         " direct_reads=" + std::to_string(s.direct_reads) + " detaches=" + std::to_string(s.detaches);
}

/// Whether the transport's reactor can read with a plain recv while it spins
/// (uring_tcp needs DEFER_TASKRUN).
template <class T>
bool spin_capable(harness<T>& h) {
#if FUSEWIRE_HAS_URING
  if constexpr (std::is_same_v<T, fw::uring_tcp>) {
    return h.on(0, [] { return harness<T>::here().engine().features().defer_taskrun; });
  }
#endif
  (void)h;
  return true;
}

/// Frames (a 4-byte length, then that many bytes: mostly tiny, some of a few
/// KiB, some above copy_threshold, at first sent in two parts) from reactor 1
/// to reactor 0, each answered by a 1-byte ack: first one at a time, then in
/// bursts of 8. The server checks every payload; both sides' stats at the end.
template <class T>
std::pair<spin_side<T>, spin_side<T>> spin_exchange(fw::reactor_mode mode, bool& spins) {
  using conn_t = typename T::connection_type;
  using side = spin_side<T>;
  harness<T> h(mode);
  spins = spin_capable(h);
  constexpr std::size_t frames = 800;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::uint32_t> lens;
  std::mt19937 rng(99);
  for (std::size_t i = 0; i < frames; ++i) {
    const std::size_t n = i % 50 == 7 ? 20000 + rng() % 5000 : i % 10 == 3 ? 3000 + rng() % 3000 : rng() % 64;
    payloads.push_back(pattern_bytes(n, static_cast<unsigned>(i)));
    lens.push_back(static_cast<std::uint32_t>(n));
  }
  std::promise<side> server_done, client_done;

  struct receiver : std::enable_shared_from_this<receiver> {
    conn_t conn;
    const std::vector<std::vector<std::byte>>* want = nullptr;
    std::promise<side>* done = nullptr;
    std::size_t next = 0;
    std::uint32_t len = 0;
    std::vector<std::byte> got;
    bool intact = true;
    std::byte ack{1};
    void head() {
      conn.async_read(fw::mutable_buffer(reinterpret_cast<std::byte*>(&len), 4),
                      [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                        if (ec) return self->finish(false);
                        self->body();
                      });
    }
    void body() {
      got.assign(len, std::byte{0});
      if (len == 0) return check();
      conn.async_read(fw::mutable_buffer(got.data(), got.size()),
                      [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                        if (ec) return self->finish(false);
                        self->check();
                      });
    }
    void check() {
      intact = intact && got == (*want)[next];
      ++next;
      const bool last = next == want->size();
      const fw::const_buffer one[] = {fw::const_buffer(&ack, 1)};
      conn.async_write(one, [self = this->shared_from_this(), last](std::error_code, std::size_t) {
        if (last) self->conn.close();  // once the last ack is out
      });
      if (last) return finish(intact);
      head();
    }
    void finish(bool ok) {
      done->set_value({ok, conn.stats()});
      if (!ok) conn.close();
    }
  };
  const std::uint16_t port = h.serve(0, [&](conn_t c) {
    auto r = std::make_shared<receiver>();
    r->conn = std::move(c);
    r->want = &payloads;
    r->done = &server_done;
    r->head();
  });

  struct sender : std::enable_shared_from_this<sender> {
    conn_t conn;
    const std::vector<std::vector<std::byte>>* payloads = nullptr;
    const std::vector<std::uint32_t>* lens = nullptr;
    std::promise<side>* done = nullptr;
    std::size_t next = 0;
    std::array<std::byte, 8> acks{};
    void batch() {
      const std::size_t total = payloads->size();
      const std::size_t k = std::min<std::size_t>(next < total / 2 ? 1 : acks.size(), total - next);
      for (std::size_t j = next; j < next + k; ++j) {
        const std::span<const std::byte> payload((*payloads)[j]);
        // A large frame sent one at a time arrives in two parts, 300 us apart:
        // the receiver's read into its destination waits for the second one
        // while its reactor spins (and must not read it from under that read).
        const std::size_t first = k == 1 && payload.size() > 16384 ? payload.size() / 2 : payload.size();
        const fw::const_buffer sg[] = {fw::const_buffer(reinterpret_cast<const std::byte*>(&(*lens)[j]), 4),
                                       fw::const_buffer(payload.first(first))};
        conn.async_write(sg, [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
        if (first == payload.size()) continue;
        harness<T>::here().run_after(
            300us, [self = this->shared_from_this(), rest = payload.subspan(first)](std::error_code) {
              const fw::const_buffer tail[] = {fw::const_buffer(rest)};
              self->conn.async_write(tail, [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
            });
      }
      conn.async_read(fw::mutable_buffer(acks.data(), k),
                      [self = this->shared_from_this(), k](std::error_code ec, std::size_t) {
                        self->next += k;
                        if (ec || self->next == self->payloads->size()) {
                          self->done->set_value({!ec, self->conn.stats()});
                          self->conn.close();
                          return;
                        }
                        self->batch();
                      });
    }
  };
  h.group.submit_to(1, [&] {
    h.transport.connect(harness<T>::here(), "127.0.0.1", port, [&](std::error_code ec, conn_t c) {
      REQUIRE_FALSE(ec);
      auto s = std::make_shared<sender>();
      s->conn = std::move(c);
      s->payloads = &payloads;
      s->lens = &lens;
      s->done = &client_done;
      s->batch();
    });
  });
  auto fs = server_done.get_future();
  auto fc = client_done.get_future();
  const side server = get(fs);
  const side client = get(fc);
  return {server, client};
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a spinning reactor reads waiting connections with a plain recv, keeping the stream's order",
                          T, spin_plain_recv) {
  for (fw::reactor_mode mode : {fw::reactor_mode::poll, fw::reactor_mode::adaptive, fw::reactor_mode::block}) {
    CAPTURE(static_cast<int>(mode));
    bool spins = false;
    const auto [server, client] = spin_exchange<T>(mode, spins);
    CHECK(server.intact);
    CHECK(client.intact);
    MESSAGE("mode ", static_cast<int>(mode), ": server ", describe(server.stats), "; client ", describe(client.stats));
    if (mode == fw::reactor_mode::block || !spins) {
      CHECK(server.stats.spin_reads == 0);  // a reactor that sleeps never reads this way
      CHECK(client.stats.spin_reads == 0);
      if constexpr (requires { server.stats.chunk_reads; }) {
        // asio_tcp: Asio itself reads into the chunk (no wait to re-arm for each read).
        CHECK(server.stats.waits == 0);
        CHECK(server.stats.recvs == 0);
        CHECK(server.stats.chunk_reads > 0);
      }
    } else if (mode == fw::reactor_mode::poll) {
      CHECK(server.stats.spin_reads > 0);
      CHECK(client.stats.spin_reads > 0);
      if constexpr (requires { server.stats.multishot_arms; }) {
        // uring_tcp: a reactor that never sleeps reads its watched connection
        // with plain recvs alone; an armed multishot recv would be woken by
        // every message (in the sender's sendmsg).
        CHECK(server.stats.multishot_arms == 0);
        CHECK(client.stats.multishot_arms == 0);
      }
      if constexpr (requires { server.stats.detaches; }) {
        // asio_tcp: the hot socket leaves Asio's epoll set (whose wake-up would
        // run in the sender's sendmsg), and no wait for readability is made;
        // the large frames' direct reads bring it back to Asio each time.
        CHECK(server.stats.detaches > 1);
        CHECK(client.stats.detaches > 0);
        CHECK(server.stats.waits == 0);
        CHECK(server.stats.direct_reads > 0);
      }
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(spin_plain_recv, tcp_transports);

// uring_tcp arms no multishot recv for a connection a spinning reactor reads
// with plain recvs: when the reactor goes to sleep, it must arm one again, or
// bytes sent while it sleeps would never be reported.
TEST_CASE_TEMPLATE_DEFINE("a connection read by a spinning reactor's plain recvs still gets bytes sent while it sleeps",
                          T, spin_recv_sleeps) {
  using conn_t = typename T::connection_type;
  harness<T> h(fw::reactor_mode::adaptive);
  if (!spin_capable(h)) {
    MESSAGE("no spin reads on this kernel");
    return;
  }
  constexpr std::size_t rounds = 5;
  std::vector<std::promise<std::uint32_t>> got(rounds);
  struct reader : std::enable_shared_from_this<reader> {
    conn_t conn;
    std::uint32_t word = 0;
    std::vector<std::promise<std::uint32_t>>* got = nullptr;
    std::size_t next = 0;
    void read() {  // posted while the reactor spins: a watched connection
      conn.async_read(fw::mutable_buffer(reinterpret_cast<std::byte*>(&word), 4),
                      [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                        if (ec) return;
                        (*self->got)[self->next++].set_value(self->word);
                        if (self->next < self->got->size()) self->read();
                      });
    }
  };
  auto r = std::make_shared<reader>();
  r->got = &got;
  const std::uint16_t port = h.serve(0, [r](conn_t c) {
    r->conn = std::move(c);
    r->read();
  });
  auto client = h.connect_client(port);
  std::array<std::uint32_t, rounds> words{};
  for (std::size_t i = 0; i < rounds; ++i) {
    CAPTURE(i);
    std::this_thread::sleep_for(30ms);  // reactor 0 spins 100 us after posting its read, then sleeps
    words[i] = 0x51ee9000u + static_cast<std::uint32_t>(i);
    h.on(1, [client, w = &words[i]] {
      const fw::const_buffer one[] = {fw::const_buffer(reinterpret_cast<const std::byte*>(w), 4)};
      client->async_write(one, [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
      return 0;
    });
    auto f = got[i].get_future();
    REQUIRE_MESSAGE(f.wait_for(10s) == std::future_status::ready, "bytes sent to a sleeping reactor were not reported");
    CHECK(f.get() == words[i]);
  }
  // A connection's state belongs to its reactor: closed and released there.
  h.on(1, [client] {
    client->close();
    *client = conn_t();
    return 0;
  });
  h.on(0, [r] {
    r->conn.close();
    r->conn = conn_t();
    return 0;
  });
}
TEST_CASE_TEMPLATE_APPLY(spin_recv_sleeps, tcp_transports);

// More connections wait than a spinning reactor reads with plain recvs: the
// ones it evicts from its watch list must be reported by the engine again
// (uring_tcp arms their multishot recvs), or they would never get their bytes.
TEST_CASE_TEMPLATE_DEFINE("connections evicted from a spinning reactor's watch list still get their bytes", T,
                          spin_evicted) {
  using conn_t = typename T::connection_type;
  typename harness<T>::group_t::engine_config engine;
  engine.spin_readers = 2;
  harness<T> h(fw::reactor_mode::poll, suite_traits<T>::make(), engine);
  constexpr std::size_t n = 5;
  std::vector<std::promise<std::uint32_t>> got(n);
  struct reader : std::enable_shared_from_this<reader> {
    conn_t conn;
    std::uint32_t word = 0;
    std::promise<std::uint32_t>* got = nullptr;
  };
  std::vector<std::shared_ptr<reader>> readers;
  std::atomic<std::size_t> accepted{0};
  const std::uint16_t port = h.serve(0, [&](conn_t c) {
    auto r = std::make_shared<reader>();
    r->conn = std::move(c);
    r->got = &got[readers.size()];
    readers.push_back(r);
    r->conn.async_read(fw::mutable_buffer(reinterpret_cast<std::byte*>(&r->word), 4),
                       [r](std::error_code ec, std::size_t) {
                         if (!ec) r->got->set_value(r->word);
                       });
    ++accepted;
  });
  std::vector<std::shared_ptr<conn_t>> clients;
  for (std::size_t i = 0; i < n; ++i) {  // one at a time: reader i is the i-th accepted
    auto client = h.connect_client(port);
    for (int t = 0; t < 10000 && accepted.load() != i + 1; ++t) std::this_thread::sleep_for(1ms);
    REQUIRE(accepted.load() == i + 1);
    clients.push_back(client);
  }
  std::array<std::uint32_t, n> words{};
  for (std::size_t i = 0; i < n; ++i) words[i] = 0xe71c7000u + static_cast<std::uint32_t>(i);
  h.on(1, [&] {
    for (std::size_t i = 0; i < n; ++i) {
      const fw::const_buffer one[] = {fw::const_buffer(reinterpret_cast<const std::byte*>(&words[i]), 4)};
      clients[i]->async_write(one, [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
    }
    return 0;
  });
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    auto f = got[i].get_future();
    REQUIRE_MESSAGE(f.wait_for(10s) == std::future_status::ready, "an evicted connection's bytes were not reported");
    CHECK(f.get() == words[i]);
  }
  // A connection's state belongs to its reactor: closed and released there.
  h.on(1, [&] {
    for (auto& c : clients) {
      c->close();
      *c = conn_t();
    }
    return 0;
  });
  h.on(0, [&] {
    for (auto& r : readers) {
      r->conn.close();
      r->conn = conn_t();
    }
    return 0;
  });
}
TEST_CASE_TEMPLATE_APPLY(spin_evicted, tcp_transports);

// asio_tcp takes a hot socket out of Asio's epoll set while the spinning
// reactor reads it with plain recvs; a write that fills the socket then needs
// Asio's wait for writability, so the socket must go back to Asio first (and a
// close while it is out must close it). Both transports run it.
TEST_CASE_TEMPLATE_DEFINE("a write that fills the socket of a connection read by plain recvs completes", T,
                          spin_write_fills) {
  using conn_t = typename T::connection_type;
  harness<T> h(fw::reactor_mode::poll);
  const bool spins = spin_capable(h);
  constexpr std::size_t pings = 20;
  const std::vector<std::byte> big = pattern_bytes(std::size_t{24} << 20, 5);  // far above the socket buffers
  struct server_side : std::enable_shared_from_this<server_side> {
    conn_t conn;
    const std::vector<std::byte>* big = nullptr;
    std::uint32_t word = 0;
    std::size_t seen = 0;
    std::promise<std::error_code> written;
    stats_of<T> before_write{};
    void read() {  // small reads first, so the reactor reads the socket with plain recvs
      conn.async_read(fw::mutable_buffer(reinterpret_cast<std::byte*>(&word), 4), [self = this->shared_from_this()](
                                                                                      std::error_code ec, std::size_t) {
        if (ec) return self->written.set_value(ec);
        if (++self->seen < pings) return self->read();
        self->before_write = self->conn.stats();
        const fw::const_buffer one[] = {fw::const_buffer(self->big->data(), self->big->size())};
        self->conn.async_write(one, [self](std::error_code e, std::size_t n) {
          self->written.set_value(e                        ? e
                                  : n == self->big->size() ? std::error_code()
                                                           : fw::make_error_code(fw::errc::truncated_frame));
        });
      });
    }
  };
  auto srv = std::make_shared<server_side>();
  srv->big = &big;
  auto written = srv->written.get_future();
  const std::uint16_t port = h.serve(0, [srv](conn_t c) {
    srv->conn = std::move(c);
    srv->read();
  });
  auto client = h.connect_client(port);
  std::vector<std::byte> got(big.size());
  std::promise<std::error_code> read_all;
  auto fr = read_all.get_future();
  std::array<std::uint32_t, pings> words{};
  h.on(1, [&] {
    for (std::size_t i = 0; i < pings; ++i) {
      words[i] = static_cast<std::uint32_t>(i);
      const fw::const_buffer one[] = {fw::const_buffer(reinterpret_cast<const std::byte*>(&words[i]), 4)};
      client->async_write(one, [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
    }
    return 0;
  });
  // The server's write fills the socket before the client starts reading.
  std::this_thread::sleep_for(100ms);
  h.on(1, [&] {
    client->async_read(fw::mutable_buffer(got.data(), got.size()),
                       [&](std::error_code ec, std::size_t) { read_all.set_value(ec); });
    return 0;
  });
  REQUIRE_FALSE(get(written));
  REQUIRE_FALSE(get(fr));
  CHECK(got == big);
  if (spins) {
    if constexpr (requires { srv->before_write.detaches; }) CHECK(srv->before_write.detaches > 0);
  }
  // One more small message, read by a plain recv (asio_tcp: the socket leaves
  // Asio again), then the server's close must reach the client.
  std::promise<std::error_code> last;
  auto fl = last.get_future();
  h.on(0, [&] {
    srv->conn.async_read(fw::mutable_buffer(reinterpret_cast<std::byte*>(&srv->word), 4),
                         [&](std::error_code ec, std::size_t) { last.set_value(ec); });
    return 0;
  });
  std::this_thread::sleep_for(10ms);  // the read waits: the reactor reads the socket with plain recvs
  const std::uint32_t final_word = 0xc105ed00u;
  h.on(1, [&] {
    const fw::const_buffer one[] = {fw::const_buffer(reinterpret_cast<const std::byte*>(&final_word), 4)};
    client->async_write(one, [](std::error_code ec, std::size_t) { CHECK_FALSE(ec); });
    return 0;
  });
  REQUIRE_FALSE(get(fl));
  CHECK(srv->word == final_word);
  if (spins) {
    if constexpr (requires { srv->before_write.detaches; }) {
      const auto detaches = h.on(0, [srv] { return srv->conn.stats().detaches; });
      CHECK(detaches > srv->before_write.detaches);  // out of Asio's epoll set when closed
    }
  }
  h.on(0, [srv] {
    srv->conn.close();  // the handle stays: close() itself must close the socket
    return 0;
  });
  std::promise<std::error_code> eof;
  auto fe = eof.get_future();
  std::byte one_byte{};
  h.on(1, [&] {
    client->async_read(fw::mutable_buffer(&one_byte, 1), [&](std::error_code ec, std::size_t) { eof.set_value(ec); });
    return 0;
  });
  REQUIRE_MESSAGE(fe.wait_for(10s) == std::future_status::ready, "the server's close did not reach the client");
  CHECK(fe.get() == fw::make_error_code(fw::errc::connection_closed));
  h.on(1, [client] {
    client->close();
    *client = conn_t();
    return 0;
  });
  h.on(0, [srv] {
    srv->conn = conn_t();
    return 0;
  });
}
TEST_CASE_TEMPLATE_APPLY(spin_write_fills, tcp_transports);

// A connection a spinning reactor reads with plain recvs (asio_tcp: its socket
// out of Asio's epoll set) is released and adopted like any other.
TEST_CASE_TEMPLATE_DEFINE("a connection read by a spinning reactor's plain recvs is released and adopted as any other",
                          T, spin_handoff) {
  harness<T> h(fw::reactor_mode::poll);
  handoff_pair<T> p(h);
  const auto a = pattern_bytes(16, 21), b = pattern_bytes(40, 22), c = pattern_bytes(3000, 23);
  for (int i = 0; i < 5; ++i) {  // each read waits first, so the spinning reactor reads the socket
    auto ra = p.read_exact(0, p.server, a.size());
    std::this_thread::sleep_for(2ms);
    auto wa = p.write(1, p.client, {fw::const_buffer(a)});
    check_wrote(wa, a.size());
    check_read(ra, a);
  }
  if (spin_capable(h)) {
    if constexpr (requires { p.server->stats().detaches; }) {
      CHECK(h.on(0, [s = p.server] { return s->stats().detaches; }) > 0);
    }
  }
  using conn_t = typename T::connection_type;
  auto moved = std::make_shared<conn_t>();
  auto rf = p.release(0, p.server, 1, moved);
  const auto r = get(rf);
  handoff_pair<T>::check_moved(r);
  exchange_moved(p, moved, b, c);
}
TEST_CASE_TEMPLATE_APPLY(spin_handoff, tcp_transports);
