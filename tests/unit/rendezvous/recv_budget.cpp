// rendezvous::endpoint's receive limits: the memory held for tensors no
// receive took yet (options.recv_peer_budget, recv_budget) stops the reading of
// a peer that fills it and resumes it as receives drain it; announcements above
// max_transfer_bytes are refused; idle partial transfers (transfer_idle), a
// restarted peer's leftovers and old unmatched tensors (unmatched_max_age) are
// dropped and counted.
#include <fusewire/wire/codec.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "raw_peer.hpp"
#include "support/eventually.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace recv_budget_cases {

using namespace fusewire::test;

namespace {

/// `ep`'s counters of the peer named `peer` (all zero if it has none).
template <class Endpoint>
rv::peer_counters counters_of(const Endpoint& ep, std::string_view peer) {
  for (const rv::peer_counters& c : ep.counters()) {
    if (c.peer == peer) return c;
  }
  return {};
}

constexpr std::size_t peer_budget = std::size_t{1} << 20;

fw::options budget_options() {
  fw::options o = block_options();
  o.recv_peer_budget = peer_budget;
  o.recv_budget = 2 * peer_budget;
  return o;
}

/// The most an endpoint held for unreceived tensors while it watched.
template <class T>
class held_watch {
 public:
  explicit held_watch(rv::endpoint<T>& ep)
      : thread_([this, &ep] {
          while (!stop_.load()) {
            const std::uint64_t h = ep.stats().recv_held_bytes;
            if (h > most_.load()) most_.store(h);
            std::this_thread::sleep_for(100us);
          }
        }) {}
  held_watch(const held_watch&) = delete;
  held_watch& operator=(const held_watch&) = delete;
  ~held_watch() {
    stop_.store(true);
    thread_.join();
  }
  std::uint64_t most() const { return most_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> most_{0};
  std::thread thread_;
};

/// Sends started without waiting; wait() until all completed (each must succeed).
struct send_tally {
  std::atomic<int> left{0};
  std::atomic<int> errors{0};
  template <class T>
  void send(rv::endpoint<T>& from, const fw::task_id& to, std::string key, fw::tensor_buffer b) {
    left.fetch_add(1);
    from.send(to, std::move(key), std::move(b), [this](std::error_code ec) {
      if (ec) errors.fetch_add(1);
      left.fetch_sub(1);
    });
  }
  bool wait() {
    return eventually([this] { return left.load() == 0; }) && errors.load() == 0;
  }
};

std::string key_of(int i) { return "t" + std::to_string(i); }

/// A chunk frame of a `count`-chunk transfer of `total` bytes, its payload pattern(total / count, seed).
std::vector<std::byte> chunk_frame(std::string_view key, std::uint64_t id, std::uint64_t total, std::uint32_t index,
                                   std::uint32_t count, std::size_t payload) {
  fw::wire::chunk_meta c;
  c.transfer_id = id;
  c.total_len = total;
  c.offset = index * (total / count);
  c.index = index;
  c.count = count;
  c.key = key;
  c.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(total)});
  auto bytes = pattern(payload, 40 + index);
  return frame_bytes(c, bytes.bytes());
}

std::vector<std::byte> hello_with(const fw::task_id& t, std::uint64_t incarnation) {
  fw::wire::hello_meta h;
  h.job = t.job;
  h.task_index = t.index;
  h.incarnation = incarnation;
  return frame_bytes(h);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a peer filling its receive budget is paused, then resumed as receives drain it", T,
                          recv_budget_1) {
  struct shape {
    const char* name;
    std::size_t tensor;  ///< bytes per tensor
    int count;           ///< tensors sent, about 3 x the budget in all
    std::size_t frame;   ///< the largest frame (or chunked tensor) the peer sends
    std::size_t acc_size;
  };
  for (const shape sh : {shape{"plain 64 KiB tensors", 64u << 10, 48, 64u << 10, 8192},
                         shape{"fused 2 KiB tensors", 2u << 10, 1500, 64u << 10, 64u << 10},
                         shape{"chunked 256 KiB tensors", 256u << 10, 12, 256u << 10, 8192}}) {
    CAPTURE(sh.name);
    auto spec = loopback_cluster(1, 1);
    fw::options o = budget_options();
    o.acc_size = sh.acc_size;
    o.chunk_size = 64u << 10;  // 256 KiB tensors leave as 4 chunks
    log_capture log;
    rv::endpoint<T> ps(ps0, spec, {.options = o, .log = log.sink()});
    rv::endpoint<T> worker(w0, spec, {.options = o});
    held_watch<T> watch(ps);

    send_tally sends;
    for (int i = 0; i < sh.count; ++i) sends.send(worker, ps0, key_of(i), pattern(sh.tensor, i));
    REQUIRE(eventually([&] { return ps.stats().recv_pauses >= 1; }));
    CHECK(log.saw("stopped reading from worker:0"));
    CHECK(counters_of(ps, "worker:0").recv_pauses == ps.stats().recv_pauses);
    std::this_thread::sleep_for(50ms);  // anything read past the budget would show now
    const std::uint64_t held = ps.stats().recv_held_bytes;
    CHECK(held > peer_budget / 2);
    CHECK(held <= peer_budget + sh.frame);

    std::vector<bool> taken(static_cast<std::size_t>(sh.count), false);
    if (sh.tensor == (64u << 10)) {
      // The frame the connection is parked on is the one after the held
      // tensors: a receive posted for it gets it although the budget is full.
      const int blocked = static_cast<int>(held / sh.tensor);
      auto r = ps.recv_sync(w0, key_of(blocked), 30s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, sh.tensor, static_cast<std::uint32_t>(blocked)));
      taken[static_cast<std::size_t>(blocked)] = true;
      CHECK(ps.stats().recv_held_bytes <= peer_budget + sh.frame);
    }
    for (int i = 0; i < sh.count; ++i) {
      if (taken[static_cast<std::size_t>(i)]) continue;
      auto r = ps.recv_sync(w0, key_of(i), 30s);
      REQUIRE_FALSE(r.ec);
      REQUIRE(matches(r.buffer, sh.tensor, static_cast<std::uint32_t>(i)));
    }
    CHECK(sends.wait());
    CHECK(eventually([&] { return ps.stats().recv_held_bytes == 0; }));
    CHECK(watch.most() <= peer_budget + sh.frame);
  }
}
TEST_CASE_TEMPLATE_APPLY(recv_budget_1, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("the process budget is shared by the reactors", T, recv_budget_2) {
  auto spec = loopback_cluster(1, 2);
  fw::options o = block_options();
  o.recv_peer_budget = peer_budget;
  o.recv_budget = peer_budget;  // two peers, one budget between them
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = {.reactors = 2}, .log = log.sink()});
  rv::endpoint<T> a(w0, spec, {.options = o});
  rv::endpoint<T> b(w1, spec, {.options = o});
  held_watch<T> watch(ps);
  constexpr std::size_t n = 64u << 10;
  constexpr int count = 24;
  send_tally sends;
  for (int i = 0; i < count; ++i) {
    sends.send(a, ps0, key_of(i), pattern(n, i));
    sends.send(b, ps0, key_of(i), pattern(n, 100 + i));
  }
  REQUIRE(eventually([&] { return ps.stats().recv_pauses >= 2; }));
  std::this_thread::sleep_for(50ms);
  CHECK(ps.stats().recv_held_bytes <= peer_budget + n);
  // One peer drained first: its receives go on whatever the other holds.
  for (int i = 0; i < count; ++i) {
    auto r = ps.recv_sync(w0, key_of(i), 30s);
    REQUIRE_FALSE(r.ec);
    REQUIRE(matches(r.buffer, n, static_cast<std::uint32_t>(i)));
  }
  for (int i = 0; i < count; ++i) {
    auto r = ps.recv_sync(w1, key_of(i), 30s);
    REQUIRE_FALSE(r.ec);
    REQUIRE(matches(r.buffer, n, static_cast<std::uint32_t>(100 + i)));
  }
  CHECK(sends.wait());
  CHECK(eventually([&] { return ps.stats().recv_held_bytes == 0; }));
  CHECK(watch.most() <= peer_budget + n);
}
TEST_CASE_TEMPLATE_APPLY(recv_budget_2, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a transfer announced above max_transfer_bytes is refused before any allocation", T,
                          recv_budget_3) {
  auto spec = loopback_cluster(1, 2);
  fw::options o = budget_options();
  o.max_frame_bytes = 4u << 20;
  o.max_transfer_bytes = 8u << 20;
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .log = log.sink()});
  rv::endpoint<T> worker(w1, spec, {.options = o});

  raw_client c(spec.fast_path_endpoint(ps0).port);
  c.send(hello_with(w0, 7));
  // Chunk 0 of a 16 GiB transfer; its payload never comes.
  const auto frame = chunk_frame("huge", 1, std::uint64_t{16} << 30, 0, 4096, 1024);
  c.send(std::span(frame).first(frame.size() - 1024));
  CHECK(c.closed_by_peer());
  CHECK(log.saw("FUSEWIRE_MAX_TRANSFER_BYTES = 8388608"));
  CHECK(ps.stats().frames_too_large == 1);
  CHECK(counters_of(ps, "worker:0").frames_too_large == 1);
  CHECK(counters_of(ps, "worker:1").frames_too_large == 0);
  CHECK(ps.stats().recv_held_bytes == 0);

  // Our own sends above the limit fail here, before the peer has to refuse them.
  CHECK(worker.send_sync(ps0, "big", fw::tensor_buffer::allocate((8u << 20) + 1), 30s) ==
        fw::make_error_code(fw::errc::frame_too_large));
  REQUIRE_FALSE(worker.send_sync(ps0, "ok", pattern(1000, 5), 30s));
  auto r = ps.recv_sync(w1, "ok", 30s);
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, 1000, 5));
}
TEST_CASE_TEMPLATE_APPLY(recv_budget_3, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a partial transfer with no chunk for transfer_idle is dropped", T, recv_budget_4) {
  auto spec = loopback_cluster(1, 1);
  fw::options o = budget_options();
  o.transfer_idle = 200ms;
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .log = log.sink()});
  constexpr std::uint64_t total = 128u << 10;
  const std::string key = "idle\x01key";

  std::optional<std::future<std::error_code>> waiting;
  SUBCASE("with no receive posted") {}
  SUBCASE("with a receive waiting for it") {
    auto p = std::make_shared<std::promise<std::error_code>>();
    waiting = p->get_future();
    ps.recv(
        w0, key, [p](std::error_code ec, fw::tensor_buffer) { p->set_value(ec); }, 60s);
  }
  raw_client c(spec.fast_path_endpoint(ps0).port);
  c.send(hello_with(w0, 9));
  c.send(chunk_frame(key, 5, total, 0, 2, total / 2));  // chunk 1 never comes
  REQUIRE(eventually([&] { return ps.stats().transfers_dropped_idle == 1; }));
  CHECK(log.saw("partial transfer of key 'idle\\x01key'"));
  CHECK(log.saw("FUSEWIRE_TRANSFER_IDLE_MS"));
  CHECK(c.closed_by_peer());
  CHECK(eventually([&] { return ps.stats().recv_held_bytes == 0; }));
  if (waiting) {
    REQUIRE(waiting->wait_for(30s) == std::future_status::ready);
    CHECK(waiting->get() == fw::make_error_code(fw::errc::timed_out));
  }
}
TEST_CASE_TEMPLATE_APPLY(recv_budget_4, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a peer that restarts loses what its previous process left unreceived", T, recv_budget_5) {
  auto spec = loopback_cluster(1, 1);
  fw::options o = budget_options();
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .log = log.sink()});

  SUBCASE("tensors no receive took") {
    {
      rv::endpoint<T> first(w0, spec, {.options = o});
      for (int i = 0; i < 4; ++i) REQUIRE_FALSE(first.send_sync(ps0, key_of(i), pattern(1000, i), 30s));
      REQUIRE(eventually([&] { return ps.stats().recv_held_bytes >= 4000; }));
    }
    rv::endpoint<T> second(w0, spec, {.options = o});
    REQUIRE_FALSE(second.send_sync(ps0, "hello", pattern(10, 1), 30s));
    auto r = ps.recv_sync(w0, "hello", 30s);
    REQUIRE_FALSE(r.ec);
    CHECK(ps.stats().arrivals_dropped_restart == 4);
    CHECK(eventually([&] { return ps.stats().recv_held_bytes == 0; }));
    CHECK(log.saw("worker:0 restarted: dropped 4 tensors"));
    CHECK(ps.recv_sync(w0, key_of(0), 300ms).ec == fw::make_error_code(fw::errc::timed_out));
  }
  SUBCASE("a partial transfer") {
    raw_client first(spec.fast_path_endpoint(ps0).port);
    first.send(hello_with(w0, 1));
    first.send(chunk_frame("half", 3, 128u << 10, 0, 2, 64u << 10));
    REQUIRE(eventually([&] { return ps.stats().recv_held_bytes >= (128u << 10); }));
    raw_client second(spec.fast_path_endpoint(ps0).port);
    second.send(hello_with(w0, 2));
    CHECK(first.closed_by_peer());
    CHECK(eventually([&] { return ps.stats().transfers_dropped_restart == 1; }));
    CHECK(eventually([&] { return ps.stats().recv_held_bytes == 0; }));
  }
}
TEST_CASE_TEMPLATE_APPLY(recv_budget_5, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a tensor no receive took within unmatched_max_age is dropped", T, recv_budget_6) {
  auto spec = loopback_cluster(1, 1);
  fw::options o = budget_options();
  o.unmatched_max_age = 200ms;
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .log = log.sink()});
  rv::endpoint<T> worker(w0, spec, {.options = o});

  REQUIRE_FALSE(worker.send_sync(ps0, "old", pattern(1000, 1), 30s));
  REQUIRE(eventually([&] { return ps.stats().arrivals_dropped_age == 1; }));
  CHECK(counters_of(ps, "worker:0").dropped == 1);
  CHECK(eventually([&] { return ps.stats().recv_held_bytes == 0; }));
  CHECK(log.saw("FUSEWIRE_UNMATCHED_MAX_AGE_MS"));
  CHECK(ps.recv_sync(w0, "old", 300ms).ec == fw::make_error_code(fw::errc::timed_out));

  // One received in time is not touched.
  REQUIRE_FALSE(worker.send_sync(ps0, "new", pattern(1000, 2), 30s));
  auto r = ps.recv_sync(w0, "new", 30s);
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, 1000, 2));
  CHECK(ps.stats().arrivals_dropped_age == 1);
}
TEST_CASE_TEMPLATE_APPLY(recv_budget_6, tcp_transports);

}  // namespace recv_budget_cases
