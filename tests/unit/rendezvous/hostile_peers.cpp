// An endpoint facing garbage, truncated frames, impostors and wrong cluster tokens:
// it closes that one connection with a logged error and keeps serving the others.
#include <fusewire/wire/codec.hpp>

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "raw_peer.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace hostile_peers_cases {

using namespace fusewire::test;

namespace {

fw::options test_options(std::string token = {}) {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 4u << 20;
  o.connect_timeout = 2000ms;
  o.cluster_token = std::move(token);
  return o;
}

template <class T>
void still_serves(rv::endpoint<T>& ps, rv::endpoint<T>& worker, std::string key) {
  REQUIRE_FALSE(worker.send_sync(ps0, key, pattern(5000, 9), 30s));
  auto r = ps.recv_sync(w1, key, 30s);
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, 5000, 9));
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("garbage and truncated frames close that connection only", T, garbage_closes_one_connection) {
  auto spec = loopback_cluster(1, 2);
  const std::uint16_t port = spec.fast_path_endpoint(ps0).port;
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = test_options(), .log = log.sink()});
  rv::endpoint<T> worker(w1, spec, {.options = test_options()});
  still_serves(ps, worker, "before");

  SUBCASE("garbage instead of a hello") {
    raw_client c(port);
    c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n and then some more bytes to fill a header");
    CHECK(c.closed_by_peer());
    CHECK(log.saw("bad frame magic"));
  }
  SUBCASE("a header announcing a frame above the limits") {
    raw_client c(port);
    auto bytes = hello_from(w0);
    fw::wire::store_le<std::uint32_t>(bytes.data() + 16, 10u << 20);  // meta_len 10 MiB
    c.send(std::span(bytes).first(fw::wire::header_size));
    CHECK(c.closed_by_peer());
    CHECK(log.saw("refused connection"));
  }
  SUBCASE("a truncated hello") {
    raw_client c(port);
    auto bytes = hello_from(w0);
    c.send(std::span(bytes).first(bytes.size() - 3));
    c.shut_write();
    CHECK(c.closed_by_peer());
    CHECK(log.saw("refused connection"));
  }
  SUBCASE("a task that is not in the cluster") {
    raw_client c(port);
    c.send(hello_from({"chief", 0}));
    CHECK(c.closed_by_peer());
    CHECK(log.saw("task chief:0 is not in the cluster"));
  }
  SUBCASE("a truncated tensor after a good handshake") {
    raw_client c(port);
    c.send(hello_from(w0));
    fw::wire::tensor_meta t;
    t.key = "cut";
    t.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {1000});
    const std::uint64_t sizes[] = {1000};
    t.segments = fw::wire::segment_list(std::span<const std::uint64_t>(sizes));
    auto payload = pattern(1000, 1);
    auto bytes = frame_bytes(t, payload.bytes());
    c.send(std::span(bytes).first(bytes.size() - 10));
    // The recv posted for it fails with connection_reset once the stream ends mid-payload.
    std::promise<std::error_code> p;
    auto f = p.get_future();
    ps.recv(
        w0, "cut", [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); }, 30s);
    std::this_thread::sleep_for(20ms);
    c.shut_write();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    CHECK(f.get() == fw::make_error_code(fw::errc::connection_reset));
    CHECK(c.closed_by_peer());
    CHECK(log.saw("truncated frame"));
  }
  SUBCASE("garbage after a good handshake") {
    raw_client c(port);
    c.send(hello_from(w0));
    std::vector<std::byte> junk(64, std::byte{0x5a});
    c.send(junk);
    CHECK(c.closed_by_peer());
    CHECK(log.saw("closing connection from worker:0"));
  }
  still_serves(ps, worker, "after");
}
TEST_CASE_TEMPLATE_APPLY(garbage_closes_one_connection, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("cluster token: matching peers talk, others are refused and logged", T, cluster_token) {
  auto spec = loopback_cluster(1, 2);
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = test_options("s3cret"), .log = log.sink()});
  rv::endpoint<T> good(w1, spec, {.options = test_options("s3cret")});
  still_serves(ps, good, "ok");

  SUBCASE("peer without a token") {
    rv::endpoint<T> bad(w0, spec, {.options = test_options()});
    CHECK(bad.send_sync(ps0, "k", pattern(10, 1), 30s) == fw::make_error_code(fw::errc::auth_failed));
    CHECK(log.saw("refused connection"));
  }
  SUBCASE("peer with a wrong token") {
    rv::endpoint<T> bad(w0, spec, {.options = test_options("wrong")});
    CHECK(bad.send_sync(ps0, "k", pattern(10, 1), 30s) == fw::make_error_code(fw::errc::auth_failed));
    CHECK(log.saw("has a wrong cluster token"));
  }
  SUBCASE("acceptor without a token refuses a connector that has one") {
    rv::endpoint<T> plain(w0, spec, {.options = test_options()});
    CHECK(good.send_sync(w0, "k", pattern(10, 1), 30s) == fw::make_error_code(fw::errc::auth_failed));
  }
  still_serves(ps, good, "still");
}
TEST_CASE_TEMPLATE_APPLY(cluster_token, tcp_transports);

}  // namespace hostile_peers_cases
