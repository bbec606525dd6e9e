// rendezvous::endpoint with several reactors (endpoint_tuning::reactors): the
// peers are dealt over the reactors, an accepted connection moves to its
// peer's reactor after the handshake, and everything of one peer (handlers
// included) happens on that reactor's thread.

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "raw_peer.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace reactors_cases {

using namespace fusewire::test;

namespace {

constexpr unsigned workers = 4;

fw::task_id worker(unsigned i) { return {"worker", i}; }

/// The threads each peer's handlers ran on.
struct thread_log {
  std::mutex m;
  std::map<std::string, std::set<std::thread::id>> by_peer;
  void note(const fw::task_id& peer) {
    std::lock_guard lock(m);
    by_peer[peer.to_string()].insert(std::this_thread::get_id());
  }
  /// Every peer's handlers ran on one thread; returns how many threads there were in all.
  std::size_t threads() {
    std::lock_guard lock(m);
    std::set<std::thread::id> all;
    for (auto& [peer, ids] : by_peer) {
      CAPTURE(peer);
      CHECK(ids.size() == 1);
      all.insert(ids.begin(), ids.end());
    }
    return all.size();
  }
};

rv::endpoint_tuning with_reactors(unsigned n, bool reverse = true) {
  rv::endpoint_tuning t;
  t.reactors = n;
  t.reverse_lanes = reverse;
  return t;
}

/// Sizes that take every path: fused, plain, pool-sized, above the pool block, chunked (chunk_size 256 KiB).
const std::vector<std::size_t> sizes{1, 100, 5000, 70000, 700000, 3u << 20};

fw::options multi_options() {
  fw::options o = block_options();
  o.chunk_size = 256 << 10;
  return o;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("two reactors: peers spread over both, each peer's handlers on one thread, every size intact",
                          T, two_reactors_spread_peers) {
  for (const bool reverse : {true, false}) {
    CAPTURE(reverse);
    auto spec = loopback_cluster(1, workers);
    fw::options opts = multi_options();
    if (reverse) opts.cluster_token = "s3cret";  // handed-off connections authenticate like any other
    // Declared before the endpoints: a PS send may complete on its reactor
    // after the worker saw the echo, up to the endpoints' destruction.
    thread_log threads;
    std::atomic<int> ps_failures{0};
    rv::endpoint<T> ps(ps0, spec, {.options = opts, .tuning = with_reactors(2, reverse)});
    REQUIRE(ps.reactors() == 2);
    std::vector<std::unique_ptr<rv::endpoint<T>>> ws;
    for (unsigned i = 0; i < workers; ++i) {
      ws.push_back(std::make_unique<rv::endpoint<T>>(
          worker(i), spec, rv::endpoint_config<T>{.options = opts, .tuning = with_reactors(0, reverse)}));
    }
    // Each worker sends every size; the PS receives each (every other one into
    // a posted destination) and echoes it back; the worker checks the echo.
    std::vector<std::future<std::error_code>> echoes;
    for (unsigned i = 0; i < workers; ++i) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t n = sizes[k];
        const auto seed = static_cast<std::uint32_t>(i * 100 + k);
        const std::string key = "t" + std::to_string(k);
        auto on_recv = [&ps, &threads, &ps_failures, i, key, n, seed](std::error_code ec, fw::tensor_buffer b) {
          threads.note(worker(i));
          if (ec || !matches(b, n, seed)) return (void)++ps_failures;
          ps.send(worker(i), "echo/" + key, std::move(b), [&threads, &ps_failures, i](std::error_code e) {
            threads.note(worker(i));
            if (e) ++ps_failures;
          });
        };
        if (k % 2 == 0) {
          ps.recv(worker(i), key, fw::tensor_buffer::allocate(n), std::move(on_recv), 60s);
        } else {
          ps.recv(worker(i), key, std::move(on_recv), 60s);
        }
        ws[i]->send(
            ps0, key, pattern(n, seed), [](std::error_code) {}, 60s);
        auto echoed = std::make_shared<std::promise<std::error_code>>();
        echoes.push_back(echoed->get_future());
        ws[i]->recv(
            ps0, "echo/" + key,
            [echoed, n, seed](std::error_code ec, fw::tensor_buffer b) {
              if (!ec && !matches(b, n, seed)) ec = make_error_code(fw::errc::malformed_frame);
              echoed->set_value(ec);
            },
            60s);
      }
    }
    for (auto& f : echoes) CHECK_FALSE(wait(f));
    CHECK(ps_failures.load() == 0);
    CHECK(threads.threads() == 2);
    CHECK(ps.stats().connections_accepted >= workers);
  }
}
TEST_CASE_TEMPLATE_APPLY(two_reactors_spread_peers, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("two reactors: a handler starts operations for peers of the other reactor; batches span both",
                          T, two_reactors_cross_reactor_operations) {
  auto spec = loopback_cluster(1, workers);
  rv::endpoint<T> ps(ps0, spec, {.options = multi_options(), .tuning = with_reactors(2)});
  std::vector<std::unique_ptr<rv::endpoint<T>>> ws;
  for (unsigned i = 0; i < workers; ++i) {
    ws.push_back(
        std::make_unique<rv::endpoint<T>>(worker(i), spec, rv::endpoint_config<T>{.options = multi_options()}));
  }

  // A request from worker 0 makes the PS send to every worker from worker 0's handler.
  std::vector<std::future<rv::recv_result>> got;
  for (unsigned i = 0; i < workers; ++i) {
    auto p = std::make_shared<std::promise<rv::recv_result>>();
    got.push_back(p->get_future());
    ws[i]->recv(
        ps0, "fanout",
        [p](std::error_code ec, fw::tensor_buffer b) {
          p->set_value({ec, std::move(b)});
        },
        60s);
  }
  ps.recv(
      w0, "go",
      [&ps](std::error_code ec, fw::tensor_buffer) {
        if (ec) return;
        for (unsigned i = 0; i < workers; ++i) ps.send(worker(i), "fanout", pattern(64 + i, i), [](std::error_code) {});
      },
      60s);
  REQUIRE_FALSE(ws[0]->send_sync(ps0, "go", pattern(1, 1), 60s));
  for (unsigned i = 0; i < workers; ++i) {
    auto r = wait(got[i]);
    REQUIRE_FALSE(r.ec);
    CHECK(matches(r.buffer, 64 + i, i));
  }

  // One batch with interleaved operations for every worker: per-(peer, key) FIFO holds on each reactor.
  constexpr unsigned per_worker = 30;
  std::vector<std::future<std::error_code>> sends;
  {
    typename rv::endpoint<T>::op_batch b(ps);
    for (unsigned j = 0; j < per_worker; ++j) {
      for (unsigned i = 0; i < workers; ++i) {
        auto p = std::make_shared<std::promise<std::error_code>>();
        sends.push_back(p->get_future());
        b.send(worker(i), "fifo", pattern(10 + j, i * 1000 + j), [p](std::error_code ec) { p->set_value(ec); });
      }
    }
  }
  for (unsigned i = 0; i < workers; ++i) {
    for (unsigned j = 0; j < per_worker; ++j) {
      auto r = ws[i]->recv_sync(ps0, "fifo", 60s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, 10 + j, i * 1000 + j));
    }
  }
  for (auto& f : sends) CHECK_FALSE(wait(f));
}
TEST_CASE_TEMPLATE_APPLY(two_reactors_cross_reactor_operations, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("two reactors: a dead peer fails only its own receives; close() cancels every reactor's", T,
                          two_reactors_dead_peer) {
  auto spec = loopback_cluster(1, workers);
  auto ps = std::make_unique<rv::endpoint<T>>(
      ps0, spec, rv::endpoint_config<T>{.options = multi_options(), .tuning = with_reactors(2)});
  std::vector<std::unique_ptr<rv::endpoint<T>>> ws;
  for (unsigned i = 0; i < workers; ++i) {
    ws.push_back(
        std::make_unique<rv::endpoint<T>>(worker(i), spec, rv::endpoint_config<T>{.options = multi_options()}));
    REQUIRE_FALSE(ws[i]->send_sync(ps0, "hello", pattern(1, i), 60s));
    REQUIRE_FALSE(ps->recv_sync(worker(i), "hello", 60s).ec);
  }
  // Worker 0 (on one reactor) and worker 1 (on the other) die; their waiting receives fail.
  std::vector<std::future<std::error_code>> waits;
  for (unsigned i = 0; i < workers; ++i) {
    auto p = std::make_shared<std::promise<std::error_code>>();
    waits.push_back(p->get_future());
    ps->recv(
        worker(i), "later", [p](std::error_code ec, fw::tensor_buffer) { p->set_value(ec); }, 60s);
  }
  ws[0].reset();
  ws[1].reset();
  CHECK(wait(waits[0]) == fw::errc::connection_reset);
  CHECK(wait(waits[1]) == fw::errc::connection_reset);
  // The others still serve, on both reactors.
  for (unsigned i = 2; i < workers; ++i) {
    REQUIRE_FALSE(ws[i]->send_sync(ps0, "later", pattern(77, i), 60s));
    CHECK_FALSE(wait(waits[i]));
  }
  // Pending receives on both reactors end with cancelled, exactly once.
  std::atomic<int> calls{0};
  std::vector<std::future<std::error_code>> pending;
  for (unsigned i = 2; i < workers; ++i) {
    auto p = std::make_shared<std::promise<std::error_code>>();
    pending.push_back(p->get_future());
    ps->recv(worker(i), "never", [p, &calls](std::error_code ec, fw::tensor_buffer) {
      ++calls;
      p->set_value(ec);
    });
  }
  ps->close();
  for (auto& f : pending) CHECK(wait(f) == fw::errc::cancelled);
  ps.reset();
  CHECK(calls.load() == 2);
}
TEST_CASE_TEMPLATE_APPLY(two_reactors_dead_peer, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("reactor count: tuning, options.cores (NETWORK_*_CORE_NUMBER), capped by the peers", T,
                          reactor_count) {
  auto spec = loopback_cluster(1, 3);
  fw::options o = block_options();
  {
    rv::endpoint<T> ps(ps0, spec, {.options = o});
    CHECK(ps.reactors() == 1);  // the default: one
  }
  o.cores = 2;
  {
    rv::endpoint<T> ps(ps0, spec, {.options = o});
    CHECK(ps.reactors() == 2);
  }
  {
    rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = with_reactors(8)});
    CHECK(ps.reactors() == 3);  // three peers
  }
  {
    rv::endpoint<T> w(w0, spec, {.options = o});
    CHECK(w.reactors() == 2);
  }
  CHECK_THROWS_WITH_AS(rv::endpoint<T>(ps0, spec, rv::endpoint_config<T>{.options = o, .tuning = with_reactors(5000)}),
                       doctest::Contains("endpoint_tuning.reactors = 5000"), std::system_error);
}
TEST_CASE_TEMPLATE_APPLY(reactor_count, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE(
    "two reactors: a peer that sends before the handshake ended is refused; the others are served", T,
    two_reactors_early_sender_refused) {
  auto spec = loopback_cluster(1, workers);
  log_capture log;
  rv::endpoint<T> ps(ps0, spec, {.options = multi_options(), .tuning = with_reactors(2), .log = log.sink()});
  // worker 0 belongs to the reactor that did not accept: its connection would
  // move, but a frame it sent right behind its hello would be lost in the move.
  {
    raw_client raw(spec.fast_path_endpoint(ps0).port);
    auto hello = hello_from(w0);
    fw::wire::ping_meta ping;
    auto extra = frame_bytes(ping);
    hello.insert(hello.end(), extra.begin(), extra.end());
    raw.send(hello);
    CHECK(raw.closed_by_peer());
  }
  CHECK(log.saw("sent before the handshake ended"));
  rv::endpoint<T> w(w0, spec, {.options = multi_options()});
  REQUIRE_FALSE(w.send_sync(ps0, "after", pattern(5, 5), 60s));
  auto r = ps.recv_sync(w0, "after", 60s);
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, 5, 5));
}
TEST_CASE_TEMPLATE_APPLY(two_reactors_early_sender_refused, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("two reactors: a peer connecting while the endpoint starts is handed to a running reactor", T,
                          two_reactors_connect_during_start) {
  // A peer that keeps dialling gets in the moment reactor 0 listens; its
  // connection moves to worker 0's reactor, which must already be running.
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    auto spec = loopback_cluster(1, workers);
    const std::uint16_t port = spec.fast_path_endpoint(ps0).port;
    std::atomic<bool> answered{false};
    std::thread dialler([&] {
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      const auto hello = hello_from(w0);
      while (std::chrono::steady_clock::now() < deadline) {
        const int fd = dial_loopback(port);
        if (fd < 0) continue;
        if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size())) {
          pollfd p{fd, POLLIN, 0};
          std::byte ack[64];
          answered = ::poll(&p, 1, 20000) == 1 && ::recv(fd, ack, sizeof ack, 0) > 0;
        }
        ::close(fd);
        return;
      }
    });
    {
      log_capture log;  // the dialler's goodbye is logged; keep it out of the output
      rv::endpoint<T> ps(ps0, spec, {.options = multi_options(), .tuning = with_reactors(2), .log = log.sink()});
      dialler.join();
    }
    REQUIRE(answered);
  }
}
TEST_CASE_TEMPLATE_APPLY(two_reactors_connect_during_start, tcp_transports);

}  // namespace reactors_cases
