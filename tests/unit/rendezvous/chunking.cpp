// rendezvous::endpoint: chunked and striped large tensors, per-key FIFO across
// chunked and plain frames, failures mid-transfer, fuse_delay and keepalive.
#include <fusewire/wire/codec.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "raw_peer.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace chunking_cases {

using namespace fusewire::test;

namespace {

fw::options test_options() { return block_options(2000ms); }

/// Chunk `index` (0 or 1) of a `total`-byte transfer of two chunks, with its whole payload
/// (pattern(total / 2, 3 + index)).
std::vector<std::byte> chunk_frame(std::string_view key, std::uint64_t total, std::uint32_t index) {
  fw::wire::chunk_meta c;
  c.transfer_id = 77;
  c.total_len = total;
  c.offset = index * (total / 2);
  c.index = index;
  c.count = 2;
  c.key = key;
  c.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(total)});
  auto payload = pattern(static_cast<std::size_t>(total / 2), 3 + index);
  return frame_bytes(c, payload.bytes());
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("64 MiB tensors, chunked over 1-3 lanes or whole, land byte for byte", T,
                          chunked_64mib_tensors) {
  constexpr std::size_t n = std::size_t{64} << 20;
  // Three scatter-gather pieces whose seams do not fall on chunk boundaries.
  const fw::tensor_buffer whole = pattern(n, 11);
  const std::size_t cut1 = (40u << 20) + 1, cut2 = cut1 + 3;
  const fw::const_buffer sg[] = {whole.bytes().subspan(0, cut1), whole.bytes().subspan(cut1, cut2 - cut1),
                                 whole.bytes().subspan(cut2)};
  struct config {
    bool chunking;
    unsigned stripes;
  };
  for (const config c : {config{true, 1}, config{true, 2}, config{true, 3}, config{false, 1}}) {
    CAPTURE(c.chunking);
    CAPTURE(c.stripes);
    auto spec = loopback_cluster(1, 1);
    fw::options o = test_options();
    o.chunking = c.chunking;
    rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = {.stripes = c.stripes}});
    rv::endpoint<T> worker(w0, spec, {.options = o, .tuning = {.stripes = c.stripes}});

    // recv first, into a destination: the chunks are read straight into it.
    auto dst = fw::tensor_buffer::allocate(n);
    std::promise<rv::recv_result> got;
    auto fut = got.get_future();
    ps.recv(
        w0, "big", dst.share(),
        [&](std::error_code ec, fw::tensor_buffer b) {
          got.set_value({ec, std::move(b)});
        },
        60s);
    REQUIRE_FALSE(worker.send_sync(ps0, "big", std::span<const fw::const_buffer>(sg), 60s));
    auto r = wait(fut);
    REQUIRE_FALSE(r.ec);
    CHECK(r.buffer.data() == dst.data());
    CHECK(std::memcmp(dst.data(), whole.data(), n) == 0);

    // send first: the tensor arrives before its recv and is handed over whole.
    REQUIRE_FALSE(worker.send_sync(ps0, "early", whole.share(), 60s));
    auto e = ps.recv_sync(w0, "early", 60s);
    REQUIRE_FALSE(e.ec);
    REQUIRE(e.buffer.size() == n);
    CHECK(std::memcmp(e.buffer.data(), whole.data(), n) == 0);

    CHECK(worker.stats().chunk_frames_sent == (c.chunking ? 32u : 0u));
    CHECK(worker.stats().tensor_frames_sent == (c.chunking ? 0u : 2u));
  }
}
TEST_CASE_TEMPLATE_APPLY(chunked_64mib_tensors, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a split destination takes a tensor of its size in two parts, any other as it came", T,
                          split_destinations) {
  // 1 MiB + 5 bytes, split where no chunk boundary falls (chunks of 64 KiB).
  constexpr std::size_t n = (std::size_t{1} << 20) + 5, head_bytes = 300001;
  const fw::tensor_buffer whole = pattern(n, 21);
  struct config {
    bool chunking;
    unsigned stripes;
  };
  for (const config c : {config{true, 1}, config{true, 2}, config{false, 1}}) {
    CAPTURE(c.chunking);
    CAPTURE(c.stripes);
    auto spec = loopback_cluster(1, 1);
    fw::options o = test_options();
    o.chunking = c.chunking;
    o.chunk_size = 64 * 1024;
    rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = {.stripes = c.stripes}});
    rv::endpoint<T> worker(w0, spec, {.options = o, .tuning = {.stripes = c.stripes}});
    std::vector<std::byte> tail(n - head_bytes);
    auto split_recv = [&](const std::string& key, fw::tensor_buffer head, fw::mutable_buffer t) {
      auto got = std::make_shared<std::promise<rv::recv_result>>();
      auto fut = got->get_future();
      ps.recv(
          w0, key, std::move(head), t,
          [got](std::error_code ec, fw::tensor_buffer b) {
            got->set_value({ec, std::move(b)});
          },
          60s);
      return wait(fut);
    };
    auto landed = [&](const rv::recv_result& r, const fw::tensor_buffer& head) {
      REQUIRE_FALSE(r.ec);
      CHECK(r.buffer.data() == head.data());
      CHECK(r.buffer.size() == head_bytes);
      CHECK(std::memcmp(head.data(), whole.data(), head_bytes) == 0);
      CHECK(std::memcmp(tail.data(), whole.data() + head_bytes, tail.size()) == 0);
      CHECK(ps.counters().front().bytes_received == n);  // the tail's bytes count too
    };

    SUBCASE("posted first: read straight into both parts") {
      auto head = fw::tensor_buffer::allocate(head_bytes);
      auto fut = std::async(std::launch::async, [&] { return split_recv("big", head.share(), tail); });
      std::this_thread::sleep_for(50ms);  // usually posted before the tensor comes; either order must land
      REQUIRE_FALSE(worker.send_sync(ps0, "big", whole.share(), 60s));
      landed(fut.get(), head);
    }
    SUBCASE("the tensor came first: copied into both parts") {
      REQUIRE_FALSE(worker.send_sync(ps0, "early", whole.share(), 60s));
      std::this_thread::sleep_for(50ms);
      auto head = fw::tensor_buffer::allocate(head_bytes);
      landed(split_recv("early", head.share(), tail), head);
    }
    SUBCASE("another size: handed over whole, neither part written") {
      std::fill(tail.begin(), tail.end(), std::byte{0xEE});
      auto head = fw::tensor_buffer::allocate(head_bytes + 1);
      std::memset(head.data(), 0xEE, head.size());
      auto fut = std::async(std::launch::async, [&] { return split_recv("other", head.share(), tail); });
      REQUIRE_FALSE(worker.send_sync(ps0, "other", whole.share(), 60s));
      const rv::recv_result r = fut.get();
      REQUIRE_FALSE(r.ec);
      CHECK(r.buffer.data() != head.data());
      REQUIRE(r.buffer.size() == n);
      CHECK(std::memcmp(r.buffer.data(), whole.data(), n) == 0);
      CHECK(std::all_of(tail.begin(), tail.end(), [](std::byte b) { return b == std::byte{0xEE}; }));
      CHECK(std::all_of(head.data(), head.data() + head.size(), [](std::byte b) { return b == std::byte{0xEE}; }));
      CHECK(ps.counters().front().bytes_received == n);
    }
    SUBCASE("an empty part is refused") {
      const rv::recv_result r = split_recv("none", fw::tensor_buffer::allocate(16), {});
      CHECK(r.ec == fw::make_error_code(fw::errc::invalid_argument));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(split_destinations, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("per-key FIFO holds across chunked, striped, fused and plain frames", T,
                          fifo_across_frame_kinds) {
  auto spec = loopback_cluster(1, 1);
  fw::options o = test_options();
  o.chunk_size = 64 * 1024;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = {.stripes = 3}});
  rv::endpoint<T> worker(w0, spec, {.options = o, .tuning = {.stripes = 3}});
  const std::vector<std::size_t> sizes = {200000, 10, 300001, 70000, 5, 1000000, 65536, 65537, 0, 131072};
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    // The first few recvs wait before their tensors arrive (half with a destination); the rest come after.
    std::vector<std::future<rv::recv_result>> early;
    std::vector<std::shared_ptr<std::promise<rv::recv_result>>> promises;
    for (std::size_t i = 0; i < 4; ++i) {
      auto p = std::make_shared<std::promise<rv::recv_result>>();
      early.push_back(p->get_future());
      auto h = [p](std::error_code ec, fw::tensor_buffer b) { p->set_value({ec, std::move(b)}); };
      if (i % 2 == 0) {
        ps.recv(w0, "k", fw::tensor_buffer::allocate(sizes[i]), h, 60s);
      } else {
        ps.recv(w0, "k", h, 60s);
      }
      promises.push_back(std::move(p));
    }
    std::vector<std::future<std::error_code>> sent;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto p = std::make_shared<std::promise<std::error_code>>();
      sent.push_back(p->get_future());
      worker.send(
          ps0, "k", pattern(sizes[i], static_cast<std::uint32_t>(i + 100 * round)),
          [p](std::error_code ec) { p->set_value(ec); }, 60s);
    }
    for (auto& f : sent) CHECK_FALSE(wait(f));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      rv::recv_result r = i < early.size() ? wait(early[i]) : ps.recv_sync(w0, "k", 60s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, sizes[i], static_cast<std::uint32_t>(i + 100 * round)));
    }
  }
  CHECK(worker.stats().chunk_frames_sent > 0);
  CHECK(worker.stats().fused_frames_sent + worker.stats().tensor_frames_sent > 0);
}
TEST_CASE_TEMPLATE_APPLY(fifo_across_frame_kinds, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a connection dying mid-chunked-transfer fails the receive, never hangs", T,
                          connection_dies_mid_transfer) {
  auto spec = loopback_cluster(1, 2);
  const std::uint16_t port = spec.fast_path_endpoint(ps0).port;
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = test_options(), .log = log.sink()});
  constexpr std::uint64_t total = 4u << 20;
  const auto frame = chunk_frame("big", total, 0);

  SUBCASE("stream ends inside a chunk; the recv posted a destination") {
    raw_client c(port);
    c.send(hello_from(w0));
    std::promise<std::error_code> p;
    auto f = p.get_future();
    ps.recv(
        w0, "big", fw::tensor_buffer::allocate(total), [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); },
        30s);
    c.send(std::span(frame).first(frame.size() / 2));
    c.shut_write();
    CHECK(wait(f) == fw::make_error_code(fw::errc::connection_reset));
    CHECK(log.saw("truncated frame"));
  }
  SUBCASE("one chunk arrived, the other never will; the recv comes later") {
    raw_client c(port);
    c.send(hello_from(w0));
    c.send(frame);
    std::this_thread::sleep_for(50ms);
    std::promise<std::error_code> p;
    auto f = p.get_future();
    ps.recv(
        w0, "big", [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); }, 30s);
    c.shut_write();
    CHECK(wait(f) == fw::make_error_code(fw::errc::connection_reset));
  }
  SUBCASE("a lane the peer closes in order ends alone: the transfer completes on its other lane") {
    // A peer that exits right after its last chunked send closes its lanes one by one; the
    // chunks still on the other lanes must not be lost (a lane that BREAKS takes the others down).
    raw_client a(port);
    raw_client b(port);
    a.send(hello_from(w0));
    b.send(hello_from(w0));
    std::promise<std::error_code> p;
    auto f = p.get_future();
    fw::tensor_buffer got;
    ps.recv(
        w0, "big",
        [&p, &got](std::error_code ec, fw::tensor_buffer t) {
          got = std::move(t);
          p.set_value(ec);
        },
        30s);
    a.send(frame);
    a.shut_write();
    CHECK(a.closed_by_peer());  // the endpoint saw a's end of stream and let go of it
    b.send(chunk_frame("big", total, 1));
    REQUIRE(wait(f) == std::error_code());
    REQUIRE(got.size() == total);
    CHECK(std::memcmp(got.data(), pattern(total / 2, 3).data(), total / 2) == 0);
    CHECK(std::memcmp(got.data() + total / 2, pattern(total / 2, 4).data(), total / 2) == 0);
    b.shut_write();
    CHECK(b.closed_by_peer());
  }
  SUBCASE("a chunk ahead of chunk 0 parks its lane until chunk 0 says where the tensor goes") {
    // Lane b carries chunk 1 and then a small tensor; chunk 0 comes later on
    // lane a. The receiver leaves chunk 1's payload in b's socket (no staging
    // buffer to copy from later), so nothing behind it on b is read either.
    raw_client a(port);
    raw_client b(port);
    a.send(hello_from(w0));
    b.send(hello_from(w0));
    fw::tensor_buffer dst = fw::tensor_buffer::allocate(total);
    const std::byte* const where = dst.data();
    std::promise<rv::recv_result> big, small;
    ps.recv(
        w0, "big", std::move(dst),
        [&big](std::error_code ec, fw::tensor_buffer t) {
          big.set_value({ec, std::move(t)});
        },
        30s);
    ps.recv(
        w0, "small",
        [&small](std::error_code ec, fw::tensor_buffer t) {
          small.set_value({ec, std::move(t)});
        },
        30s);
    fw::wire::tensor_meta t;
    t.key = "small";
    t.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {100});
    const std::uint64_t sizes[] = {100};
    t.segments = fw::wire::segment_list(std::span<const std::uint64_t>(sizes));
    b.send(chunk_frame("big", total, 1));
    b.send(frame_bytes(t, pattern(100, 9).bytes()));
    auto small_f = small.get_future();
    CHECK(small_f.wait_for(300ms) == std::future_status::timeout);  // b is parked behind chunk 1
    a.send(frame);
    auto big_f = big.get_future();
    const rv::recv_result got = wait(big_f);
    REQUIRE_FALSE(got.ec);
    REQUIRE(got.buffer.size() == total);
    CHECK(got.buffer.data() == where);  // landed in the posted destination
    CHECK(std::memcmp(got.buffer.data(), pattern(total / 2, 3).data(), total / 2) == 0);
    CHECK(std::memcmp(got.buffer.data() + total / 2, pattern(total / 2, 4).data(), total / 2) == 0);
    const rv::recv_result s = wait(small_f);
    CHECK_FALSE(s.ec);
    CHECK(matches(s.buffer, 100, 9));
  }
  SUBCASE("the deadline passes mid-transfer: timed_out, and that peer's connection is closed") {
    raw_client c(port);
    c.send(hello_from(w0));
    std::promise<std::error_code> p;
    auto f = p.get_future();
    ps.recv(
        w0, "big", fw::tensor_buffer::allocate(total), [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); },
        300ms);
    c.send(std::span(frame).first(frame.size() / 2));
    CHECK(wait(f) == fw::make_error_code(fw::errc::timed_out));
    CHECK(c.closed_by_peer());
  }
  SUBCASE("the receiver goes away while 64 MiB sends are on the wire") {
    fw::options o = test_options();
    rv::endpoint<T> worker(w1, spec, {.options = o});
    REQUIRE_FALSE(worker.send_sync(ps0, "hello", pattern(10, 1), 30s));
    const auto big = pattern(64u << 20, 5);
    std::vector<std::future<std::error_code>> sent;
    for (int i = 0; i < 3; ++i) {
      auto p = std::make_shared<std::promise<std::error_code>>();
      sent.push_back(p->get_future());
      worker.send(ps0, "big", big.share(), [p](std::error_code ec) { p->set_value(ec); });
    }
    ps.close();
    for (auto& f : sent) {
      const std::error_code ec = wait(f);
      CHECK((!ec || ec == fw::make_error_code(fw::errc::connection_reset) ||
             ec == fw::make_error_code(fw::errc::connection_refused)));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(connection_dies_mid_transfer, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("fuse_delay: a batch waits up to the delay for more sends, a large send flushes it", T,
                          fuse_delay_batches) {
  auto spec = loopback_cluster(1, 1);
  fw::options o = test_options();
  o.fuse_delay = std::chrono::microseconds(1000000);
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  rv::endpoint<T> worker(w0, spec, {.options = o});
  REQUIRE_FALSE(worker.send_sync(ps0, "warm", pattern(20000, 1), 30s));  // connected, not fused

  SUBCASE("sends in separate ticks leave as one fused frame") {
    std::vector<std::future<std::error_code>> sent;
    for (std::uint32_t i = 0; i < 3; ++i) {
      auto p = std::make_shared<std::promise<std::error_code>>();
      sent.push_back(p->get_future());
      worker.send(ps0, "s" + std::to_string(i), pattern(100, i), [p](std::error_code ec) { p->set_value(ec); });
      std::this_thread::sleep_for(5ms);
    }
    for (std::uint32_t i = 0; i < 3; ++i) {
      auto r = ps.recv_sync(w0, "s" + std::to_string(i), 30s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, 100, i));
    }
    for (auto& f : sent) CHECK_FALSE(wait(f));
    CHECK(worker.stats().fused_frames_sent == 1);
    CHECK(worker.stats().tensors_fused == 3);
  }
  SUBCASE("a send above acc_size flushes the waiting batch first (per-key FIFO)") {
    std::promise<std::error_code> p;
    auto f = p.get_future();
    worker.send(ps0, "k", pattern(10, 1), [&p](std::error_code ec) { p.set_value(ec); });
    REQUIRE_FALSE(worker.send_sync(ps0, "k", pattern(20000, 2), 30s));
    CHECK_FALSE(wait(f));
    auto a = ps.recv_sync(w0, "k", 30s);
    auto b = ps.recv_sync(w0, "k", 30s);
    CHECK(matches(a.buffer, 10, 1));
    CHECK(matches(b.buffer, 20000, 2));
    CHECK(worker.stats().fused_frames_sent == 0);
  }
}
TEST_CASE_TEMPLATE_APPLY(fuse_delay_batches, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("keepalive: idle peers ping and stay, a silent one is dropped", T,
                          keepalive_idle_and_silent) {
  auto spec = loopback_cluster(1, 2);
  const std::uint16_t port = spec.fast_path_endpoint(ps0).port;
  fw::options o = test_options();
  o.keepalive = 100ms;
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .log = log.sink()});
  rv::endpoint<T> worker(w1, spec, {.options = o});
  REQUIRE_FALSE(worker.send_sync(ps0, "a", pattern(10, 1), 30s));

  SUBCASE("an idle connection is kept alive by pings") {
    for (int i = 0; i < 4000 && worker.stats().keepalive_pings < 5; ++i) std::this_thread::sleep_for(5ms);
    CHECK(worker.stats().keepalive_pings >= 5);
    REQUIRE_FALSE(worker.send_sync(ps0, "b", pattern(10, 2), 30s));
    CHECK(matches(ps.recv_sync(w1, "a", 30s).buffer, 10, 1));
    CHECK(matches(ps.recv_sync(w1, "b", 30s).buffer, 10, 2));
    CHECK(worker.stats().tensor_frames_sent == 2);
  }
  SUBCASE("a peer that never pings is closed and its receives fail") {
    raw_client c(port);
    c.send(hello_from(w0));
    std::promise<std::error_code> p;
    auto f = p.get_future();
    ps.recv(
        w0, "x", [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); }, 30s);
    CHECK(wait(f) == fw::make_error_code(fw::errc::connection_reset));
    CHECK(log.saw("(keepalive)"));
    CHECK(c.closed_by_peer());
    // The receive's error is the same whatever broke the connection; the endpoint keeps the cause.
    CHECK(ps.why_lost(w0) == "deadline exceeded (no frame for 300 ms (keepalive))");
    CHECK(ps.why_lost(w1).empty());
  }
  SUBCASE("a reactor that stalls for several periods keeps a peer whose frames wait unread") {
    // The PS's handler blocks its reactor for 5 periods while the worker keeps
    // sending; when it resumes, the overdue keepalive check runs before those
    // frames are read and must not call the worker silent.
    std::promise<void> stalled;
    ps.recv(w1, "stall", [&stalled](std::error_code, fw::tensor_buffer) {
      std::this_thread::sleep_for(500ms);
      stalled.set_value();
    });
    auto stalled_f = stalled.get_future();
    REQUIRE_FALSE(worker.send_sync(ps0, "stall", pattern(10, 3), 30s));
    int sent = 0;
    while (stalled_f.wait_for(20ms) != std::future_status::ready) {
      REQUIRE_FALSE(worker.send_sync(ps0, "during" + std::to_string(sent), pattern(10, sent), 30s));
      ++sent;
    }
    CHECK(sent > 0);
    for (int i = 0; i < sent; ++i) {
      rv::recv_result r = ps.recv_sync(w1, "during" + std::to_string(i), 30s);
      CHECK_FALSE(r.ec);
      CHECK(matches(r.buffer, 10, i));
    }
    CHECK_FALSE(log.saw("(keepalive)"));
    CHECK(worker.stats().connections_made == 1);
  }
}
TEST_CASE_TEMPLATE_APPLY(keepalive_idle_and_silent, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a peer that restarts is reconnected to and new sends succeed", T,
                          restarted_peer_reconnected) {
  auto spec = loopback_cluster(1, 1);
  fw::options o = test_options();
  o.chunk_size = 1u << 20;
  rv::endpoint<T> worker(w0, spec, {.options = o});
  {
    rv::endpoint<T> ps(ps0, spec, {.options = o});
    REQUIRE_FALSE(worker.send_sync(ps0, "k", pattern(3u << 20, 1), 30s));
    CHECK(matches(ps.recv_sync(w0, "k", 30s).buffer, 3u << 20, 1));
  }
  // The peer is gone; its successor listens on the same address.
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  // A send racing the old connection's teardown may fail (connection_reset); a later one reconnects.
  std::error_code ec = fw::make_error_code(fw::errc::connection_reset);
  int attempts = 0;
  for (; attempts < 50 && ec; ++attempts) {
    ec = worker.send_sync(ps0, "small", pattern(100, 2), 30s);
    if (ec) {
      CHECK(ec == fw::make_error_code(fw::errc::connection_reset));
      std::this_thread::sleep_for(10ms);
    }
  }
  REQUIRE_FALSE(ec);
  CHECK(matches(ps.recv_sync(w0, "small", 30s).buffer, 100, 2));
  REQUIRE_FALSE(worker.send_sync(ps0, "k", pattern(3u << 20, 3), 30s));  // chunked, new lanes
  CHECK(matches(ps.recv_sync(w0, "k", 30s).buffer, 3u << 20, 3));
}
TEST_CASE_TEMPLATE_APPLY(restarted_peer_reconnected, tcp_transports);

}  // namespace chunking_cases
