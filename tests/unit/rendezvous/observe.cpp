// What an endpoint says about itself: stall reports, pending(), the SIGUSR1
// snapshot, per-peer counters and the counter dumps (docs/observability.md).

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace observe_cases {

using namespace fusewire::test;
using T = fw::asio_tcp;

namespace {

/// Collects log lines from the reactor thread.
struct log_capture {
  std::mutex m;
  std::vector<std::string> lines;
  rv::log_sink sink() {
    return [this](std::string_view s) {
      std::lock_guard lock(m);
      lines.emplace_back(s);
    };
  }
  /// The lines holding every one of `needles`.
  std::vector<std::string> matching(std::initializer_list<std::string_view> needles) {
    std::lock_guard lock(m);
    std::vector<std::string> out;
    for (auto& l : lines) {
      bool all = true;
      for (auto n : needles) all = all && l.find(n) != std::string::npos;
      if (all) out.push_back(l);
    }
    return out;
  }
  /// Waits up to `limit` for a line holding every one of `needles`; returns it ("" if none came).
  std::string wait_for(std::initializer_list<std::string_view> needles, std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto got = matching(needles);
      if (!got.empty()) return got.front();
      if (std::chrono::steady_clock::now() >= until) return {};
      std::this_thread::sleep_for(5ms);
    }
  }
};

fw::options stall_options(std::chrono::milliseconds stall) {
  fw::options o = block_options();
  o.stall_report = stall;
  return o;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("a recv whose sender never sends is reported with its key, then again at doubling ages") {
  auto spec = loopback_cluster(1, 1);
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = stall_options(200ms)});
  rv::endpoint<T> worker(w0, spec, {.options = stall_options(200ms), .log = log.sink()});
  REQUIRE_FALSE(worker.send_sync(ps0, "hello", pattern(10, 1), 30s));  // connected both ways
  REQUIRE_FALSE(ps.recv_sync(w0, "hello", 30s).ec);
  REQUIRE_FALSE(ps.send_sync(w0, "hi", pattern(10, 2), 30s));
  REQUIRE_FALSE(worker.recv_sync(ps0, "hi", 30s).ec);

  std::promise<std::error_code> done;
  auto f = done.get_future();
  const auto posted = std::chrono::steady_clock::now();
  worker.recv(ps0, "grad/never.sent", fw::tensor_buffer::allocate(4096),
              [&done](std::error_code ec, fw::tensor_buffer) { done.set_value(ec); });
  // Threshold 200 ms, checked every 50 ms: named within 250 ms plus scheduling slack.
  const std::string line = log.wait_for({"stall report", "recv from ps:0 key \"grad/never.sent\""}, 5000ms);
  const auto seen = std::chrono::steady_clock::now() - posted;
  REQUIRE_MESSAGE(!line.empty(), "no stall report");
  MESSAGE(line);
  CHECK(seen >= 190ms);  // not before the threshold (the coarse clock may lag a tick)
  CHECK(line.find("4096 B") != std::string::npos);
  CHECK(line.find("waiting for the tensor") != std::string::npos);
  CHECK(line.find("connection connected") != std::string::npos);
  CHECK(line.find("missing: ps:0 has not sent it") != std::string::npos);

  // pending() says the same on demand.
  auto pending = worker.pending();
  REQUIRE(pending.size() == 1);
  CHECK_FALSE(pending[0].is_send);
  CHECK(pending[0].peer == "ps:0");
  CHECK(pending[0].key == "grad/never.sent");
  CHECK(pending[0].bytes == 4096);
  CHECK(pending[0].age >= 150ms);
  CHECK(worker.pending_report().find("grad/never.sent") != std::string::npos);
  CHECK(ps.pending().empty());

  // Again at 400 ms and 800 ms of age: at least one more report within a second, not one per check.
  std::this_thread::sleep_for(1000ms);
  const auto reports = log.matching({"stall report", "grad/never.sent"}).size();
  CHECK(reports >= 2);
  CHECK(reports <= 4);

  // Once it completes, it is neither pending nor reported.
  REQUIRE_FALSE(ps.send_sync(w0, "grad/never.sent", pattern(4096, 3), 30s));
  CHECK_FALSE(wait(f));
  CHECK(worker.pending().empty());
}

TEST_CASE("a send to a task that is not there is reported as waiting for a connection, with the error") {
  auto spec = loopback_cluster(1, 2);  // worker:1 never starts
  log_capture log;
  rv::endpoint<T> worker(w0, spec, {.options = stall_options(200ms), .log = log.sink()});
  std::promise<std::error_code> done;
  auto f = done.get_future();
  worker.send(w1, "activations", pattern(100, 1), [&done](std::error_code ec) { done.set_value(ec); });
  const std::string line = log.wait_for({"stall report", "send to worker:1 key \"activations\""}, 5000ms);
  REQUIRE_MESSAGE(!line.empty(), "no stall report");
  MESSAGE(line);
  CHECK(line.find("100 B") != std::string::npos);
  CHECK(line.find("waiting for a connection") != std::string::npos);
  CHECK(line.find("connection connecting") != std::string::npos);
  CHECK(line.find("last error: ") != std::string::npos);
  CHECK(line.find("missing: a connection to worker:1") != std::string::npos);
  worker.close();
  CHECK(wait(f) == fw::make_error_code(fw::errc::cancelled));
}

TEST_CASE("idle keys are left out of stall reports; SIGUSR1 logs a snapshot of everything") {
  auto spec = loopback_cluster(1, 1);
  log_capture log;
  rv::endpoint<T> ps(ps0, spec,
                     {.options = stall_options(100ms), .tuning = {.idle_keys = {"requests"}}, .log = log.sink()});
  ps.recv(w0, "requests", [](std::error_code, fw::tensor_buffer) {});
  std::this_thread::sleep_for(400ms);
  CHECK(log.matching({"stall report"}).empty());
  REQUIRE(std::raise(SIGUSR1) == 0);
  const std::string line = log.wait_for({"snapshot (SIGUSR1)", "recv from worker:0 key \"requests\""}, 5000ms);
  CHECK_MESSAGE(!line.empty(), "no snapshot");
  MESSAGE(line);
  fw::rendezvous::request_report();  // the same, for an application that handles SIGUSR1 itself
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (log.matching({"snapshot (SIGUSR1)"}).size() < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  CHECK(log.matching({"snapshot (SIGUSR1)"}).size() == 2);
}

TEST_CASE("per-peer counters match a scripted exchange exactly; the dump files carry them") {
  auto spec = loopback_cluster(1, 1);
  const auto dir = std::filesystem::temp_directory_path() / ("fusewire_observe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  fw::options wo = block_options();
  wo.stats_file = (dir / "worker.jsonl").string();
  wo.stats_interval = 100ms;
  fw::options po = block_options();
  po.stats_file = (dir / "{task}.prom").string();
  po.stats_format = "prometheus";
  po.stats_interval = 100ms;
  {
    rv::endpoint<T> ps(ps0, spec, {.options = po});
    rv::endpoint<T> worker(w0, spec, {.options = wo});
    // Worker to PS: 10 B, 100 B, 1000 B and 1 MiB, one at a time (each its own frame).
    const std::size_t sizes[] = {10, 100, 1000, std::size_t{1} << 20};
    std::uint64_t sent = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      REQUIRE_FALSE(worker.send_sync(ps0, "up" + std::to_string(i), pattern(sizes[i], 1), 30s));
      REQUIRE_FALSE(ps.recv_sync(w0, "up" + std::to_string(i), 30s).ec);
      sent += sizes[i];
    }
    // PS to worker: two replies of 7 B; one receive that times out.
    for (int i = 0; i < 2; ++i) {
      REQUIRE_FALSE(ps.send_sync(w0, "down" + std::to_string(i), pattern(7, 2), 30s));
      REQUIRE_FALSE(worker.recv_sync(ps0, "down" + std::to_string(i), 30s).ec);
    }
    CHECK(worker.recv_sync(ps0, "nothing", 50ms).ec == fw::make_error_code(fw::errc::timed_out));

    auto wc = worker.counters();
    REQUIRE(wc.size() == 1);
    const rv::peer_counters& w = wc[0];
    CHECK(w.peer == "ps:0");
    CHECK(w.sends == 4);
    CHECK(w.bytes_sent == sent);
    CHECK(w.send_errors == 0);
    CHECK(w.recvs == 2);
    CHECK(w.bytes_received == 14);
    CHECK(w.recv_errors == 1);
    CHECK(w.tensor_frames_sent == 4);
    CHECK(w.fused_frames_sent == 0);
    CHECK(w.chunk_frames_sent == 0);
    CHECK(w.connects == 1);
    CHECK(w.connections_lost == 0);
    CHECK(w.pending_sends == 0);
    CHECK(w.pending_recvs == 0);
    auto pc = ps.counters();
    REQUIRE(pc.size() == 1);
    const rv::peer_counters& p = pc[0];
    CHECK(p.peer == "worker:0");
    CHECK(p.recvs == 4);
    CHECK(p.bytes_received == sent);
    CHECK(p.sends == 2);
    CHECK(p.bytes_sent == 14);
    CHECK(p.tensor_frames_sent == 2);
    CHECK(p.connects == 1);
    // A receive still waiting counts as pending.
    ps.recv(w0, "later", [](std::error_code, fw::tensor_buffer) {});
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (ps.counters()[0].pending_recvs != 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    CHECK(ps.counters()[0].pending_recvs == 1);
  }  // closed: each writes its last dump
  const std::string json = read_file(dir / "worker.jsonl");
  const std::string last = json.substr(json.rfind('\n', json.size() - 2) + 1);
  MESSAGE(last);
  CHECK(last.find("\"task\":\"worker:0\"") != std::string::npos);
  CHECK(last.find("{\"peer\":\"ps:0\",\"sends\":4,\"bytes_sent\":1049686,\"send_errors\":0,\"recvs\":2,"
                  "\"bytes_received\":14,\"recv_errors\":1,") != std::string::npos);
  const std::string prom = read_file(dir / "ps-0.prom");
  CHECK(prom.find("fusewire_peer_bytes_received{task=\"ps:0\",peer=\"worker:0\"} 1049686\n") != std::string::npos);
  CHECK(prom.find("fusewire_peer_recvs{task=\"ps:0\",peer=\"worker:0\"} 4\n") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "ps-0.prom.tmp"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("several reactors: one stall report block for the endpoint; SIGUSR1 answered with stall reports off") {
  auto spec = loopback_cluster(1, 4);
  log_capture log;
  {
    // Stall reports off: a snapshot request is still answered.
    rv::endpoint<T> quiet(ps0, spec, {.options = stall_options(0ms), .tuning = {.reactors = 2}, .log = log.sink()});
    quiet.recv(w0, "q0", [](std::error_code, fw::tensor_buffer) {});
    quiet.recv(w1, "q1", [](std::error_code, fw::tensor_buffer) {});
    fw::rendezvous::request_report();
    const std::string snap = log.wait_for({"snapshot (SIGUSR1)", "2 reactors"}, 5000ms);
    REQUIRE_MESSAGE(!snap.empty(), "no snapshot with FUSEWIRE_STALL_MS = 0");
    MESSAGE(snap);
    CHECK(snap.find("key \"q0\"") != std::string::npos);
    CHECK(snap.find("key \"q1\"") != std::string::npos);
    CHECK(log.matching({"stall report"}).empty());
  }

  // Stall reports on, four peers over two reactors: each report is one block naming all four.
  log_capture log2;
  const fw::task_id w2{"worker", 2}, w3{"worker", 3};
  rv::endpoint<T> ps(ps0, spec, {.options = stall_options(150ms), .tuning = {.reactors = 2}, .log = log2.sink()});
  for (const fw::task_id& w : {w0, w1, w2, w3}) {
    ps.recv(w, "from " + w.to_string(), [](std::error_code, fw::tensor_buffer) {});
  }
  const std::string block = log2.wait_for({"stall report", "4 operations", "2 reactors"}, 5000ms);
  REQUIRE_MESSAGE(!block.empty(), "no stall report");
  MESSAGE(block);
  for (const char* w : {"worker:0", "worker:1", "worker:2", "worker:3"}) {
    CHECK(block.find("recv from " + std::string(w) + " key \"from " + w + "\"") != std::string::npos);
  }
  // One block per check for the whole endpoint, never one per reactor. (An
  // earlier block may hold fewer operations: those past the threshold then,
  // on a slow host where the four receives started milliseconds apart.)
  for (const std::string& l : log2.matching({"stall report"})) {
    CHECK(l.find(", 2 reactors: ") != std::string::npos);
    CHECK(l.find("reactor 0") == std::string::npos);
    CHECK(l.find("reactor 1") == std::string::npos);
  }
}

TEST_CASE("reactor usage, pool use and per-peer drops are counted and dumped") {
  auto spec = loopback_cluster(1, 2);  // two peers: room for two reactors
  const auto dir = std::filesystem::temp_directory_path() / ("fusewire_usage_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  fw::options po = block_options();
  po.unmatched_max_age = 100ms;
  po.stats_file = (dir / "ps.jsonl").string();
  po.stats_interval = 100ms;
  {
    rv::endpoint<T> ps(ps0, spec, {.options = po, .tuning = {.reactors = 2}});
    rv::endpoint<T> worker(w0, spec, {.options = block_options()});
    // A small tensor nobody receives is held in a pool block, then dropped for age.
    REQUIRE_FALSE(worker.send_sync(ps0, "unwanted", pattern(100, 1), 30s));
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (ps.counters()[0].dropped == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    CHECK(ps.counters()[0].dropped == 1);
    CHECK(ps.stats().arrivals_dropped_age == 1);
    // Real work for the reactors, then some idle time.
    for (int i = 0; i < 20; ++i) {
      REQUIRE_FALSE(worker.send_sync(ps0, "k" + std::to_string(i), pattern(1000, i), 30s));
      REQUIRE_FALSE(ps.recv_sync(w0, "k" + std::to_string(i), 30s).ec);
    }
    std::this_thread::sleep_for(200ms);
    const std::vector<rv::reactor_usage> r = ps.reactor_usages();
    REQUIRE(r.size() == 2);
    std::uint64_t busy = 0, idle = 0, sleep = 0;
    for (unsigned i = 0; i < 2; ++i) {
      CHECK(r[i].reactor == i);
      CHECK(r[i].ticks > 0);
      CHECK(r[i].pool_blocks > 0);
      CHECK(r[i].pool_blocks_in_use == 0);  // nothing held any more
      CHECK(r[i].sleep_ns <= r[i].idle_ns);
      busy += r[i].busy_ns;
      idle += r[i].idle_ns;
      sleep += r[i].sleep_ns;
    }
    MESSAGE("busy " << busy / 1000000 << " ms, idle " << idle / 1000000 << " ms, asleep " << sleep / 1000000 << " ms");
    // Block mode, mostly waiting: most of the reactors' time is idle, asleep.
    CHECK(idle > 0);
    CHECK(sleep > 0);
  }
  const std::string json = read_file(dir / "ps.jsonl");
  const std::string last = json.substr(json.rfind('\n', json.size() - 2) + 1);
  MESSAGE(last);
  CHECK(last.find(",\"dropped\":1,") != std::string::npos);
  CHECK(last.find("\"reactors\":[{\"reactor\":0,\"busy_ns\":") != std::string::npos);
  CHECK(last.find("{\"reactor\":1,") != std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace observe_cases
