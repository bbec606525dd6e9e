// per_host<shm, asio_tcp>: the transport test suite over it twice, once with
// every connect going over shm (the suite's loopback host is this host) and
// once over TCP (a host test that finds no host near), and over
// per_host<uring_shm, uring_tcp>; then per_host against peers that run only
// one of its two transports, in both roles, and across the two reactors.
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/per_host.hpp>
#include <fusewire/transport/shm.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <doctest/doctest.h>

#include <mutex>
#include <string_view>
#include <tuple>
#include <vector>

#include "transport_suite.hpp"

namespace fw = fusewire;

namespace per_host_cases {

namespace {
using near_first = fw::per_host<fw::shm, fw::asio_tcp>;
/// Every host is another host: every connect goes over TCP.
struct far_only : near_first {
  far_only() : near_first(fw::shm{}, fw::asio_tcp{}, [](std::string_view) { return false; }) {}
};
#if FUSEWIRE_HAS_URING
using near_first_uring = fw::per_host<fw::uring_shm, fw::uring_tcp>;
#endif
}  // namespace

static_assert(fw::transport<near_first>);
static_assert(fw::transport<far_only>);
static_assert(!fw::handoff_transport<near_first>);
static_assert(fw::readahead_connection<near_first::connection_type>);
static_assert(near_first::name() == "shm+asio_tcp");

#if FUSEWIRE_HAS_URING
static_assert(fw::transport<near_first_uring>);
using per_host_transports = std::tuple<near_first, far_only, near_first_uring>;
#else
using per_host_transports = std::tuple<near_first, far_only>;
#endif

TEST_CASE_TEMPLATE_APPLY(suite_connect_accept, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_echo, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_scatter_gather, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_buffers, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_back_to_back_writes, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_order, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_read, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_write, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_past_close, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_connections, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_close_cancels, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_peer_closes, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_connect_refused, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_listen_errors, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_off_thread, per_host_transports);
TEST_CASE_TEMPLATE_APPLY(suite_group_stop, per_host_transports);

namespace {

/// Connects with `t` from reactor 1 of `h` to 127.0.0.1:port, sends `n` bytes
/// and waits for them to come back from an echo server. Returns the connect
/// or echo error, and whether the connection runs over the near transport
/// (for per_host connections; plain ones report `plain_near`).
template <class H, class T>
std::pair<std::error_code, bool> echo_with(H& h, T t, std::uint16_t port, bool plain_near = false) {
  using conn_t = typename T::connection_type;
  struct state {
    conn_t conn;
    std::vector<std::byte> out = fw::test::pattern_bytes(3000, 7);
    std::vector<std::byte> in = std::vector<std::byte>(3000);
    std::promise<std::pair<std::error_code, bool>> done;
  };
  // Only the reactor thread holds the state: it owns a connection handle,
  // which must die there.
  auto st = std::make_shared<state>();
  auto fut = st->done.get_future();
  h.group.submit_to(1, [t, port, st = std::move(st), plain_near]() mutable {
    auto& r = *std::remove_reference_t<H>::reactor_t::current();
    t.connect(r, "127.0.0.1", port, [st, plain_near](std::error_code ec, conn_t c) {
      if (ec) return st->done.set_value({ec, false});
      st->conn = std::move(c);
      bool is_near = plain_near;
      if constexpr (requires { st->conn.is_near(); }) is_near = st->conn.is_near();
      const fw::const_buffer one[] = {fw::const_buffer(st->out.data(), st->out.size())};
      st->conn.async_write(one, [](std::error_code, std::size_t) {});
      st->conn.async_read(fw::mutable_buffer(st->in.data(), st->in.size()),
                          [st, is_near](std::error_code e, std::size_t) {
                            if (!e && st->in != st->out) e = make_error_code(fw::errc::malformed_frame);
                            st->conn.close();
                            st->done.set_value({e, is_near});
                          });
    });
  });
  return get(fut);
}

}  // namespace

TEST_CASE("per_host serves peers of either kind, and reaches plain shm and asio_tcp listeners") {
  harness<near_first> h;
  CHECK(h.on(0, [&] { return h.transport.listen(harness<near_first>::here(), "127.0.0.1", 0).has_near(); }));
  std::mutex m;
  std::vector<bool> accepted_near;
  const std::uint16_t port = h.serve(0, [&](near_first::connection_type c) {
    {
      std::lock_guard lock(m);
      accepted_near.push_back(c.is_near());
    }
    harness<near_first>::echo(std::move(c));
  });

  // per_host peers: over shm on this host, over TCP when the host test says another host.
  CHECK(echo_with(h, near_first{}, port) == std::pair<std::error_code, bool>{{}, true});
  CHECK(echo_with(h, far_only{}, port) == std::pair<std::error_code, bool>{{}, false});
  // Peers that run one transport only reach it with that one.
  CHECK(echo_with(h, fw::asio_tcp{}, port) == std::pair<std::error_code, bool>{{}, false});
  CHECK(echo_with(h, fw::shm{}, port, true) == std::pair<std::error_code, bool>{{}, true});
  {
    std::lock_guard lock(m);
    CHECK(accepted_near == std::vector<bool>{true, false, false, true});
  }

  // The other way round: a per_host peer against a TCP-only listener on this
  // host finds no shm listener there and connects over TCP; against an
  // shm-only listener, over shm.
  harness<fw::asio_tcp> tcp;
  const std::uint16_t tcp_port = tcp.serve_echo(0);
  CHECK(echo_with(tcp, near_first{}, tcp_port) == std::pair<std::error_code, bool>{{}, false});
  harness<fw::shm> shm;
  const std::uint16_t shm_port = shm.serve_echo(0);
  CHECK(echo_with(shm, near_first{}, shm_port) == std::pair<std::error_code, bool>{{}, true});
}

#if FUSEWIRE_HAS_URING
TEST_CASE("per_host on io_uring's reactor serves shm peers on Asio's, and the other way round") {
  harness<near_first_uring> h;
  const std::uint16_t port = h.serve_echo(0);
  harness<fw::shm> asio_side;
  CHECK(echo_with(h, near_first_uring{}, port) == std::pair<std::error_code, bool>{{}, true});
  CHECK(echo_with(asio_side, fw::shm{}, port, true) == std::pair<std::error_code, bool>{{}, true});
  CHECK(echo_with(asio_side, near_first{}, port) == std::pair<std::error_code, bool>{{}, true});
  // A listener on Asio's reactor, reached from io_uring's over shm.
  const std::uint16_t asio_port = asio_side.serve_echo(0);
  CHECK(echo_with(h, near_first_uring{}, asio_port) == std::pair<std::error_code, bool>{{}, true});
  CHECK(echo_with(h, fw::uring_shm{}, asio_port, true) == std::pair<std::error_code, bool>{{}, true});
}
#endif

}  // namespace per_host_cases
