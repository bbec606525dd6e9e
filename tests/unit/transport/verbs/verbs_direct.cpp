// RDMA direct placement through rendezvous::endpoint<verbs> (two endpoints in
// one process, on the RDMA device): a recv posted into registered memory is
// advertised, and the sender RDMA-writes the tensor straight into it.
// Skips (exit 77) without a device; runs in the QEMU guest's 'rdma' suite.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/verbs.hpp>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/eventually.hpp"
#include "support/patterns.hpp"
#include "support/ports.hpp"
#include "support/verbs_setup.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;
using fusewire::test::eventually;

namespace {

using ep_t = rv::endpoint<fw::verbs>;

const fw::task_id ps0{"ps", 0};
const fw::task_id w0{"worker", 0};

/// `poll`: busy-polling reactors. FUSEWIRE_TEST_REACTOR_MODE=poll|block overrides.
fw::options direct_options(bool poll) {
  fw::options o;
  o.mode = poll ? fw::reactor_mode::poll : fw::reactor_mode::block;
  if (const char* m = std::getenv("FUSEWIRE_TEST_REACTOR_MODE"); m != nullptr && *m != '\0') {
    o.mode = std::string(m) == "poll" ? fw::reactor_mode::poll : fw::reactor_mode::block;
  }
  o.pool_size = 8u << 20;
  o.chunk_size = 1u << 20;  // 3 MiB tensors are chunked on the normal path
  o.connect_timeout = 30000ms;
  o.insecure = true;  // the RDMA address is the test guest's private network
  return o;
}

fw::cluster_spec rdma_cluster() {
  const std::string a = fw::test::rdma_host();
  return fw::cluster_spec::from_string("ps=" + a + ":" + std::to_string(fw::test::free_port()) + ";worker=" + a + ":" +
                                       std::to_string(fw::test::free_port()));
}

fw::tensor_buffer registered_pattern(ep_t& ep, std::size_t n, std::uint32_t seed) {
  fw::tensor_buffer b = ep.allocate_registered(n);
  fw::tensor_buffer p = fw::test::pattern(n, seed);
  std::memcpy(b.data(), p.data(), n);
  return b;
}

void fill(fw::tensor_buffer& b, unsigned char v) { std::memset(b.data(), v, b.size()); }

bool all_bytes(const fw::tensor_buffer& b, unsigned char v) {
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (static_cast<unsigned char>(b.data()[i]) != v) return false;
  }
  return true;
}

/// A PS (receiver) and a worker (sender) on the RDMA device; one warm-up tensor
/// makes the worker's connection the PS's known ordered connection.
struct pair {
  fw::cluster_spec spec = rdma_cluster();
  ep_t ps, w;

  explicit pair(bool poll = false)
      : ps(ps0, spec, {.options = direct_options(poll), .transport = fw::test::small_verbs()}),
        w(w0, spec, {.options = direct_options(poll), .transport = fw::test::small_verbs()}) {
    REQUIRE(!w.send_sync(ps0, "warm", fw::test::pattern(16, 1), 60s));
    rv::recv_result r = ps.recv_sync(w0, "warm", 60s);
    REQUIRE(!r.ec);
  }

  /// Posts a recv into `dst`; the future gets its result.
  std::future<rv::recv_result> post(const std::string& key, fw::tensor_buffer dst,
                                    rv::clock::duration timeout = rv::no_deadline) {
    auto done = std::make_shared<std::promise<rv::recv_result>>();
    auto f = done->get_future();
    ps.recv(
        w0, key, std::move(dst),
        [done](std::error_code ec, fw::tensor_buffer b) {
          done->set_value(rv::recv_result{ec, std::move(b)});
        },
        timeout);
    return f;
  }

  bool advert_arrived(std::uint64_t count) {
    return eventually([&] { return w.rdma_stats().adverts_received >= count; });
  }

  /// One direct round: a recv posted into `dst`, the worker's advert count reaching
  /// `adverts`, then `src` (fw::test::pattern(n, seed)) sent; the tensor must land in
  /// `dst` itself, byte-exact.
  void direct_round(const std::string& key, const fw::tensor_buffer& dst, fw::tensor_buffer src, std::uint32_t seed,
                    std::uint64_t adverts) {
    auto f = post(key, dst.share());
    REQUIRE(advert_arrived(adverts));
    CHECK(!w.send_sync(ps0, key, std::move(src), 60s));
    rv::recv_result r = f.get();
    REQUIRE(!r.ec);
    CHECK(r.buffer.data() == dst.data());  // no copy: the recv hands back its destination
    CHECK(fw::test::matches(r.buffer, dst.size(), seed));
  }
};

}  // namespace

TEST_CASE("a recv posted first gets the tensor RDMA-written into its destination, byte-exact") {
  pair p;
  const std::size_t sizes[] = {8193, 65536, 1u << 20, (3u << 20) + 5};  // the last > chunk_size
  std::uint64_t n_done = 0;
  for (std::size_t n : sizes) {
    CAPTURE(n);
    const std::string key = "param/" + std::to_string(n);
    fw::tensor_buffer dst = p.ps.allocate_registered(n);
    fill(dst, 0xee);
    fw::tensor_buffer src = registered_pattern(p.w, n, static_cast<std::uint32_t>(n));
    const auto frames_before = p.w.stats();
    p.direct_round(key, dst, src.share(), static_cast<std::uint32_t>(n), n_done + 1);
    ++n_done;
    CHECK(p.w.rdma_stats().direct_writes == n_done);
    CHECK(p.ps.rdma_stats().placed == n_done);
    CHECK(p.ps.rdma_stats().adverts_sent == n_done);
    const auto frames_after = p.w.stats();
    CHECK(frames_after.tensor_frames_sent == frames_before.tensor_frames_sent);
    CHECK(frames_after.chunk_frames_sent == frames_before.chunk_frames_sent);
  }
  CHECK(p.w.rdma_stats().staged_writes == 0);
  CHECK(p.w.rdma_stats().declined == 0);
}

TEST_CASE(
    "an unregistered source is staged (one copy on the sender); one larger than a staging block goes the normal way") {
  pair p;
  // Staged: the staging blocks are chunk_size (1 MiB).
  for (std::size_t n : {std::size_t{65536}, std::size_t{1} << 20}) {
    CAPTURE(n);
    const std::string key = "grad/" + std::to_string(n);
    fw::tensor_buffer dst = p.ps.allocate_registered(n);
    p.direct_round(key, dst, fw::test::pattern(n, 9), 9, p.w.rdma_stats().adverts_received + 1);
  }
  CHECK(p.w.rdma_stats().direct_writes == 2);
  CHECK(p.w.rdma_stats().staged_writes == 2);
  // 3 MiB, unregistered: declined, then sent in chunk frames and copied into dst.
  const std::size_t n = 3u << 20;
  fw::tensor_buffer dst = p.ps.allocate_registered(n);
  const auto chunks_before = p.w.stats().chunk_frames_sent;
  auto f = p.post("big", dst.share());
  REQUIRE(p.advert_arrived(3));
  CHECK(!p.w.send_sync(ps0, "big", fw::test::pattern(n, 10), 60s));
  rv::recv_result r = f.get();
  REQUIRE(!r.ec);
  CHECK(fw::test::matches(r.buffer, n, 10));
  CHECK(p.w.rdma_stats().direct_writes == 2);
  CHECK(p.w.rdma_stats().declined == 1);
  CHECK(p.w.stats().chunk_frames_sent == chunks_before + 3);
}

TEST_CASE("steady steps on the same keys and buffers: every tensor placed directly, no stream frame") {
  pair p;
  const std::size_t small = 65536, large = 2u << 20;
  fw::tensor_buffer dst_a = p.ps.allocate_registered(small), dst_b = p.ps.allocate_registered(large);
  fw::tensor_buffer src_a = p.w.allocate_registered(small), src_b = p.w.allocate_registered(large);
  const auto frames_before = p.w.stats();
  const int steps = 40;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const auto seed = static_cast<std::uint32_t>(100 + step);
    std::memcpy(src_a.data(), fw::test::pattern(small, seed).data(), small);
    std::memcpy(src_b.data(), fw::test::pattern(large, seed + 1).data(), large);
    auto fa = p.post("w/a", dst_a.share());
    auto fb = p.post("w/b", dst_b.share());
    REQUIRE(p.advert_arrived(2u * static_cast<unsigned>(step) + 2));
    std::promise<std::error_code> sa, sb;
    p.w.send(ps0, "w/a", src_a.share(), [&sa](std::error_code ec) { sa.set_value(ec); });
    p.w.send(ps0, "w/b", src_b.share(), [&sb](std::error_code ec) { sb.set_value(ec); });
    CHECK(!sa.get_future().get());
    CHECK(!sb.get_future().get());
    rv::recv_result ra = fa.get(), rb = fb.get();
    REQUIRE(!ra.ec);
    REQUIRE(!rb.ec);
    CHECK(fw::test::matches(ra.buffer, small, seed));
    CHECK(fw::test::matches(rb.buffer, large, seed + 1));
  }
  const auto d = p.w.rdma_stats();
  CHECK(d.direct_writes == 2u * steps);
  CHECK(d.declined == 0);
  CHECK(p.ps.rdma_stats().adverts_sent == 2u * steps);  // one small frame per recv, none per send
  CHECK(p.ps.rdma_stats().placed == 2u * steps);
  const auto frames_after = p.w.stats();
  CHECK(frames_after.tensor_frames_sent == frames_before.tensor_frames_sent);
  CHECK(frames_after.chunk_frames_sent == frames_before.chunk_frames_sent);
}

TEST_CASE("a tensor that overtakes its advert goes the normal way and the advert is never written to") {
  pair p;
  const std::size_t n = 65536;
  struct round {
    fw::tensor_buffer dst;
    rv::recv_result r;
  };
  std::vector<round> rounds;
  const auto state = [&p] {
    const auto r = p.ps.rdma_stats(), s = p.w.rdma_stats();
    return "adverts " + std::to_string(r.adverts_sent) + "/" + std::to_string(s.adverts_received) + ", written " +
           std::to_string(s.direct_writes) + ", declined " + std::to_string(s.declined) + ", placed " +
           std::to_string(r.placed);
  };
  for (int i = 0; i < 30; ++i) {
    CAPTURE(i);
    round rd;
    rd.dst = p.ps.allocate_registered(n);
    fill(rd.dst, 0xee);
    const auto seed = static_cast<std::uint32_t>(500 + i);
    std::future<rv::recv_result> f;
    auto sent = std::make_shared<std::promise<std::error_code>>();
    auto sent_f = sent->get_future();
    // Both orders, started together: the advert and the tensor cross on the wire.
    if (i % 2 == 0) {
      f = p.post("race", rd.dst.share());
      p.w.send(ps0, "race", fw::test::pattern(n, seed), [sent](std::error_code ec) { sent->set_value(ec); });
    } else {
      p.w.send(ps0, "race", fw::test::pattern(n, seed), [sent](std::error_code ec) { sent->set_value(ec); });
      f = p.post("race", rd.dst.share());
    }
    // Bounded: a hang shows the direct path's counters instead of stalling the suite.
    const bool send_done = sent_f.wait_for(60s) == std::future_status::ready;
    const bool recv_done = f.wait_for(60s) == std::future_status::ready;
    CAPTURE(state());
    REQUIRE(send_done);
    REQUIRE(recv_done);
    CHECK(!sent_f.get());
    rd.r = f.get();
    REQUIRE(!rd.r.ec);
    CHECK(fw::test::matches(rd.r.buffer, n, seed));
    rounds.push_back(std::move(rd));
  }
  // Every advert is answered: written, declined as stale, or declined as unusable.
  const bool answered = eventually([&] {
    const auto d = p.w.rdma_stats();
    return d.direct_writes + d.declined == p.ps.rdma_stats().adverts_sent;
  });
  CAPTURE(state());
  CHECK(answered);
  // Every direct write completed its recv.
  CHECK(p.ps.rdma_stats().placed == p.w.rdma_stats().direct_writes);
  // No destination changed after its recv completed.
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    CAPTURE(i);
    CHECK(fw::test::matches(rounds[i].r.buffer, n, static_cast<std::uint32_t>(500 + i)));
  }
  std::printf("race: %s\n", state().c_str());
}

TEST_CASE("a recv posted after a tensor on its key went the normal way is advertised") {
  // The tensor arrives with no recv waiting: while it is read a recv on its key
  // is not advertised; once it is delivered, the next one is (no other frame needed).
  pair p;
  const std::size_t n = 65536;
  CHECK(!p.w.send_sync(ps0, "after", fw::test::pattern(n, 41), 60s));
  std::this_thread::sleep_for(200ms);  // let it arrive before any recv (the test holds either way)
  rv::recv_result first = p.ps.recv_sync(w0, "after", 60s);
  REQUIRE(!first.ec);
  CHECK(fw::test::matches(first.buffer, n, 41));
  CHECK(p.ps.rdma_stats().adverts_sent == 0);
  fw::tensor_buffer dst = p.ps.allocate_registered(n);
  fill(dst, 0xee);
  p.direct_round("after", dst, registered_pattern(p.w, n, 42), 42, 1);
  CHECK(p.ps.rdma_stats().placed == 1);
  CHECK(p.w.rdma_stats().direct_writes == 1);
}

TEST_CASE("a recv that times out with its advert out withdraws it; the tensor then goes to the next recv") {
  pair p;
  const std::size_t n = 65536;
  fw::tensor_buffer dst = p.ps.allocate_registered(n);
  fill(dst, 0xee);
  auto f = p.post("late", dst.share(), 100ms);
  REQUIRE(p.advert_arrived(1));
  rv::recv_result r = f.get();
  CHECK(r.ec == fw::make_error_code(fw::errc::timed_out));
  CHECK(r.buffer.empty());
  CHECK(p.w.rdma_stats().declined == 1);  // the withdrawal was answered
  CHECK(!p.w.send_sync(ps0, "late", fw::test::pattern(n, 33), 60s));
  rv::recv_result next = p.ps.recv_sync(w0, "late", 60s);
  REQUIRE(!next.ec);
  CHECK(fw::test::matches(next.buffer, n, 33));
  CHECK(next.buffer.data() != dst.data());
  CHECK(all_bytes(dst, 0xee));  // the timed-out destination was never written
  CHECK(p.w.rdma_stats().direct_writes == 0);
}

TEST_CASE("the sender going away fails a recv with its advert out; its destination is not written") {
  auto p = std::make_unique<pair>();
  const std::size_t n = 65536;
  fw::tensor_buffer dst = p->ps.allocate_registered(n);
  fill(dst, 0xee);
  auto f = p->post("orphan", dst.share());
  REQUIRE(p->advert_arrived(1));
  p->w.close();
  rv::recv_result r = f.get();
  CHECK(r.ec == fw::make_error_code(fw::errc::connection_reset));
  CHECK(all_bytes(dst, 0xee));
  CHECK(p->ps.recv_sync(w0, "orphan", 10s).ec == fw::make_error_code(fw::errc::connection_reset));
}

TEST_CASE("closing the receiver with an advert out cancels the recv") {
  pair p;
  fw::tensor_buffer dst = p.ps.allocate_registered(65536);
  auto f = p.post("closing", dst.share());
  REQUIRE(p.advert_arrived(1));
  p.ps.close();
  CHECK(f.get().ec == fw::make_error_code(fw::errc::cancelled));
}

int main(int argc, char** argv) {
  std::string why;
  if (!fusewire::verbs::available(why)) {
    std::printf("SKIP verbs_direct: no usable RDMA device here: %s\n", why.c_str());
    return 77;
  }
  ::signal(SIGPIPE, SIG_IGN);
  doctest::Context context(argc, argv);
  return context.run();
}
