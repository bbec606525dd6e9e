// Reverse lanes (endpoint_tuning::reverse_lanes): a task with no connection to
// a peer sends on the one that peer made to it, so a PS/worker pair shares one
// connection. Over both transports: who makes which connection (the endpoint
// counters), every payload kind on a shared connection, either side switching
// it off, a broken shared connection failing both directions, a restarted
// peer, keepalive on a shared connection, and both sides sending first.

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "support/eventually.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace reverse_lanes_cases {

using namespace fusewire::test;

namespace {

// Reverse lanes are for peers that proved they hold the cluster token.
fw::options test_options() {
  fw::options o = block_options();
  o.cluster_token = "reverse-lanes";
  return o;
}

rv::endpoint_tuning tuning(bool reverse) {
  rv::endpoint_tuning t;
  t.reverse_lanes = reverse;
  return t;
}

/// `from` sends pattern(n, seed) under `key`; `to` receives it and checks every byte.
template <class E>
void exchange(E& from, const fw::task_id& from_id, E& to, const fw::task_id& to_id, const std::string& key,
              std::size_t n, std::uint32_t seed) {
  CAPTURE(key);
  CAPTURE(n);
  REQUIRE_FALSE(from.send_sync(to_id, key, pattern(n, seed), 30s));
  auto r = to.recv_sync(from_id, key, 30s);
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, n, seed));
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a reply travels on the connection its peer made", T, reply_on_peers_connection) {
  auto spec = loopback_cluster(1, 1);
  auto o = test_options();
  o.chunk_size = 1u << 20;  // 3 MiB below leaves in chunks
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  rv::endpoint<T> worker(w0, spec, {.options = o});
  exchange(worker, w0, ps, ps0, "req", 10, 1);
  // The PS has no connection to the worker: its replies of every kind use the worker's.
  exchange(ps, ps0, worker, w0, "rep", 10, 2);
  exchange(ps, ps0, worker, w0, "rep", 100000, 3);
  std::vector<std::future<std::error_code>> sends;
  for (std::uint32_t i = 0; i < 50; ++i) {  // small sends in a row: fused frames
    auto p = std::make_shared<std::promise<std::error_code>>();
    sends.push_back(p->get_future());
    ps.send(
        w0, "many", pattern(8 + i, 100 + i), [p](std::error_code ec) { p->set_value(ec); }, 30s);
  }
  for (std::uint32_t i = 0; i < 50; ++i) {
    auto r = worker.recv_sync(ps0, "many", 30s);
    REQUIRE_FALSE(r.ec);
    CHECK(matches(r.buffer, 8 + i, 100 + i));
  }
  for (auto& f : sends) CHECK_FALSE(wait(f));
  {
    const auto s = ps.stats();
    const auto w = worker.stats();
    CHECK(s.connections_made == 0);
    CHECK(s.connections_reused == 1);
    CHECK(s.connections_accepted == 1);
    CHECK(w.connections_made == 1);
    CHECK(w.connections_accepted == 0);
    CHECK(w.connections_reused == 0);
    CHECK(s.fused_frames_sent > 0);
  }
  // A chunked reply: chunk 0 on the shared connection, the others on a striping lane the PS makes.
  exchange(ps, ps0, worker, w0, "big", (3u << 20) + 123, 4);
  CHECK(ps.stats().chunk_frames_sent >= 3);
  // The stripe (endpoint_tuning::stripes = 2) is made beside the transfer,
  // which may finish on the shared connection before the stripe is up.
  CHECK(eventually([&] { return ps.stats().connections_made == 1; }));
  CHECK(eventually([&] { return worker.stats().connections_accepted == 1; }));
  // The worker's own chunked sends are unchanged.
  exchange(worker, w0, ps, ps0, "up", (3u << 20) + 7, 5);
  exchange(worker, w0, ps, ps0, "req", 10, 6);
  exchange(ps, ps0, worker, w0, "rep", 10, 7);
  CHECK(ps.stats().connections_reused == 1);
}
TEST_CASE_TEMPLATE_APPLY(reply_on_peers_connection, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("reverse lanes switched off on either side: each direction has its own connection", T,
                          reverse_lanes_off) {
  for (bool ps_allows : {false, true}) {
    CAPTURE(ps_allows);
    auto spec = loopback_cluster(1, 1);
    rv::endpoint<T> ps(ps0, spec, {.options = test_options(), .tuning = tuning(ps_allows)});
    rv::endpoint<T> worker(w0, spec, {.options = test_options(), .tuning = tuning(!ps_allows)});
    exchange(worker, w0, ps, ps0, "req", 64, 1);
    exchange(ps, ps0, worker, w0, "rep", 64, 2);
    exchange(worker, w0, ps, ps0, "req", 64, 3);
    exchange(ps, ps0, worker, w0, "rep", 64, 4);
    CHECK(ps.stats().connections_reused == 0);
    CHECK(ps.stats().connections_made == 1);
    CHECK(worker.stats().connections_accepted == 1);
  }
}
TEST_CASE_TEMPLATE_APPLY(reverse_lanes_off, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("without a cluster token nobody sends on a connection its peer made", T, no_token) {
  // Anyone may claim a task's name when nothing is authenticated: what is
  // meant for that task goes to the address the cluster spec gives it.
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = block_options()});
  rv::endpoint<T> worker(w0, spec, {.options = block_options()});
  exchange(worker, w0, ps, ps0, "req", 64, 1);
  exchange(ps, ps0, worker, w0, "rep", 64, 2);
  CHECK(ps.stats().connections_reused == 0);
  CHECK(ps.stats().connections_made == 1);
  CHECK(worker.stats().connections_made == 1);
}
TEST_CASE_TEMPLATE_APPLY(no_token, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("the peer sent first: the other side answers on its connection, whichever it is", T,
                          peer_sent_first) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  exchange(ps, ps0, worker, w0, "down", 1000, 1);
  exchange(worker, w0, ps, ps0, "up", 1000, 2);
  exchange(ps, ps0, worker, w0, "down", 1000, 3);
  CHECK(ps.stats().connections_made == 1);
  CHECK(worker.stats().connections_made == 0);
  CHECK(worker.stats().connections_reused == 1);
}
TEST_CASE_TEMPLATE_APPLY(peer_sent_first, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("both sides send first at once: every tensor arrives, in order per key", T, both_send_first) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  constexpr std::uint32_t n = 200;
  std::vector<std::future<std::error_code>> sends;
  auto start = [&](auto& ep, const fw::task_id& to, std::uint32_t seed) {
    for (std::uint32_t i = 0; i < n; ++i) {
      auto p = std::make_shared<std::promise<std::error_code>>();
      sends.push_back(p->get_future());
      ep.send(
          to, "k", pattern(1 + i * 37, seed + i), [p](std::error_code ec) { p->set_value(ec); }, 30s);
    }
  };
  start(ps, w0, 1000);
  start(worker, ps0, 2000);
  for (std::uint32_t i = 0; i < n; ++i) {
    auto a = worker.recv_sync(ps0, "k", 30s);
    REQUIRE_FALSE(a.ec);
    CHECK(matches(a.buffer, 1 + i * 37, 1000 + i));
    auto b = ps.recv_sync(w0, "k", 30s);
    REQUIRE_FALSE(b.ec);
    CHECK(matches(b.buffer, 1 + i * 37, 2000 + i));
  }
  for (auto& f : sends) CHECK_FALSE(wait(f));
  // However the race went, each side sends on exactly one connection to the other.
  CHECK(ps.stats().connections_made + ps.stats().connections_reused == 1);
  CHECK(worker.stats().connections_made + worker.stats().connections_reused == 1);
}
TEST_CASE_TEMPLATE_APPLY(both_send_first, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a shared connection that breaks fails both directions; a restarted peer is served again", T,
                          shared_connection_breaks) {
  auto spec = loopback_cluster(1, 2);
  auto o = test_options();
  o.connect_timeout = 500ms;
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  auto worker = std::make_unique<rv::endpoint<T>>(w0, spec, rv::endpoint_config<T>{.options = o});
  rv::endpoint<T> other(w1, spec, {.options = o});
  exchange(*worker, w0, ps, ps0, "req", 10, 1);
  exchange(ps, ps0, *worker, w0, "rep", 10, 2);
  REQUIRE(ps.stats().connections_reused == 1);
  exchange(other, w1, ps, ps0, "req", 10, 3);
  exchange(ps, ps0, other, w1, "rep", 10, 4);
  // The PS waits for the worker; the worker goes away.
  std::promise<std::error_code> p;
  auto f = p.get_future();
  ps.recv(
      w0, "never", [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); }, 30s);
  worker.reset();
  CHECK(wait(f) == fw::make_error_code(fw::errc::connection_reset));
  // Its shared connection is gone: a send to it reconnects and is refused (nobody listens).
  CHECK(ps.send_sync(w0, "rep", pattern(10, 5), 30s) == fw::make_error_code(fw::errc::connection_refused));
  // The other worker's shared connection is untouched.
  exchange(other, w1, ps, ps0, "req", 10, 6);
  exchange(ps, ps0, other, w1, "rep", 10, 7);
  // The worker restarts (a new incarnation) and connects first: the PS answers on that connection.
  worker = std::make_unique<rv::endpoint<T>>(w0, spec, rv::endpoint_config<T>{.options = o});
  exchange(*worker, w0, ps, ps0, "req", 10, 8);
  exchange(ps, ps0, *worker, w0, "rep", 100, 9);
  CHECK(ps.stats().connections_reused == 3);  // w0, w1, then w0 again
  CHECK(worker->stats().connections_accepted == 0);
}
TEST_CASE_TEMPLATE_APPLY(shared_connection_breaks, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("keepalive on a shared connection: pings both ways, nothing dropped while idle", T,
                          keepalive_shared_connection) {
  auto spec = loopback_cluster(1, 1);
  auto o = test_options();
  o.keepalive = 100ms;  // silence for 300 ms closes: room for a slow (sanitized, loaded) run
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  rv::endpoint<T> worker(w0, spec, {.options = o});
  exchange(worker, w0, ps, ps0, "req", 10, 1);
  exchange(ps, ps0, worker, w0, "rep", 10, 2);
  // Idle for many keepalive periods: each side pings the shared connection and
  // the other answers; silence for 3 periods would close it.
  std::this_thread::sleep_for(1000ms);
  CHECK(ps.stats().keepalive_pings > 0);
  CHECK(worker.stats().keepalive_pings > 0);
  exchange(worker, w0, ps, ps0, "req", 10, 3);
  exchange(ps, ps0, worker, w0, "rep", 10, 4);
  CHECK(ps.stats().connections_reused == 1);
  CHECK(worker.stats().connections_made == 1);
  CHECK(ps.stats().connections_made == 0);
}
TEST_CASE_TEMPLATE_APPLY(keepalive_shared_connection, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a peer that restarts is served from its first frame on, every time", T,
                          restarted_peer_served) {
  // Once the PS knows the worker is gone, a receive from it fails at once. The
  // restarted worker sends as soon as the handshake is over: a receive started
  // right after that must wait for its frame, not fail as if it were still gone.
  auto spec = loopback_cluster(1, 1);
  auto o = test_options();
  o.connect_timeout = 5s;
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  for (std::uint32_t round = 0; round < 100; ++round) {
    CAPTURE(round);
    auto worker = std::make_unique<rv::endpoint<T>>(w0, spec, rv::endpoint_config<T>{.options = o});
    exchange(*worker, w0, ps, ps0, "req", 10, round);
    worker.reset();
    CHECK(ps.recv_sync(w0, "gone", 30s).ec == fw::make_error_code(fw::errc::connection_reset));
  }
}
TEST_CASE_TEMPLATE_APPLY(restarted_peer_served, tcp_transports);

}  // namespace reverse_lanes_cases
