// rendezvous::endpoint over both transports: two endpoints in one process.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace endpoint_cases {

using namespace fusewire::test;

namespace {

fw::options test_options() { return block_options(); }

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
  bool contains(std::string_view needle) {
    std::lock_guard lock(m);
    for (auto& l : lines) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
};

/// `worker` (task w0) connects and says hello, `ps` waits for another tensor
/// from it, and `worker` dies: returns that receive's error.
template <class Endpoint>
std::error_code lose_worker(Endpoint& ps, std::unique_ptr<Endpoint>& worker) {
  REQUIRE_FALSE(worker->send_sync(ps0, "hello", pattern(1, 1), 30s));
  REQUIRE_FALSE(ps.recv_sync(w0, "hello", 30s).ec);
  std::promise<std::error_code> p;
  auto f = p.get_future();
  ps.recv(
      w0, "never", [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); }, 30s);
  worker.reset();
  return wait(f);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("send then recv, recv then send, every size, byte for byte", T, send_recv_every_size) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1024}, std::size_t{65536}, std::size_t{1} << 20,
                        std::size_t{5} << 20}) {
    CAPTURE(n);
    // send first, then recv (early arrival)
    REQUIRE_FALSE(worker.send_sync(ps0, "a" + std::to_string(n), pattern(n, 1), 30s));
    auto r = ps.recv_sync(w0, "a" + std::to_string(n), 30s);
    REQUIRE_FALSE(r.ec);
    CHECK(matches(r.buffer, n, 1));
    // recv first with a posted destination (zero copy), then send
    auto dst = fw::tensor_buffer::allocate(n);
    std::byte* where = dst.data();
    std::promise<rv::recv_result> got;
    auto fut = got.get_future();
    ps.recv(
        w0, "b" + std::to_string(n), std::move(dst),
        [&got](std::error_code ec, fw::tensor_buffer b) {
          got.set_value({ec, std::move(b)});
        },
        30s);
    std::this_thread::sleep_for(5ms);
    REQUIRE_FALSE(worker.send_sync(ps0, "b" + std::to_string(n), pattern(n, 2), 30s));
    auto r2 = wait(fut);
    REQUIRE_FALSE(r2.ec);
    CHECK(matches(r2.buffer, n, 2));
    CHECK(r2.buffer.data() == where);
  }
}
TEST_CASE_TEMPLATE_APPLY(send_recv_every_size, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("per-key FIFO and scatter-gather payloads", T, per_key_fifo_scatter_gather) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  auto a = pattern(100, 7);
  auto b = pattern(3000, 8);
  const fw::const_buffer sg[] = {a.bytes(), b.bytes()};
  REQUIRE_FALSE(worker.send_sync(ps0, "sg", sg, 30s));
  auto r = ps.recv_sync(w0, "sg", 30s);
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.buffer.size() == 3100);
  CHECK(std::memcmp(r.buffer.data(), a.data(), 100) == 0);
  CHECK(std::memcmp(r.buffer.data() + 100, b.data(), 3000) == 0);

  std::vector<std::future<std::error_code>> sends;
  for (std::uint32_t i = 0; i < 20; ++i) {
    auto p = std::make_shared<std::promise<std::error_code>>();
    sends.push_back(p->get_future());
    worker.send(
        ps0, "same", pattern(10 + i, i), [p](std::error_code ec) { p->set_value(ec); }, 30s);
  }
  for (std::uint32_t i = 0; i < 20; ++i) {
    auto got = ps.recv_sync(w0, "same", 30s);
    REQUIRE_FALSE(got.ec);
    CHECK(matches(got.buffer, 10 + i, i));
  }
  for (auto& f : sends) CHECK_FALSE(wait(f));
}
TEST_CASE_TEMPLATE_APPLY(per_key_fifo_scatter_gather, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("deadlines, size mismatch, bad arguments, close", T, deadlines_mismatch_close) {
  auto spec = loopback_cluster(1, 2);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});

  auto r = ps.recv_sync(w0, "never", 50ms);
  CHECK(r.ec == fw::make_error_code(fw::errc::timed_out));

  REQUIRE_FALSE(worker.send_sync(ps0, "k", pattern(10, 1), 30s));
  r = ps.recv_sync(w0, "k", fw::tensor_buffer::allocate(11), 30s);
  CHECK(r.ec == fw::make_error_code(fw::errc::size_mismatch));

  CHECK(worker.send_sync({"chief", 0}, "k", pattern(1, 1), 1s) == fw::make_error_code(fw::errc::invalid_argument));
  CHECK(ps.recv_sync({"worker", 9}, "k", 1s).ec == fw::make_error_code(fw::errc::invalid_argument));

  // worker:1 never started: its sends fail once connect_timeout passed, or at their deadline.
  auto e = worker.send_sync(w1, "k", pattern(1, 1), 200ms);
  CHECK((e == fw::make_error_code(fw::errc::timed_out) || e == fw::make_error_code(fw::errc::connection_refused)));

  // close() completes pending operations exactly once with cancelled.
  std::atomic<int> calls{0};
  std::promise<std::error_code> p;
  auto f = p.get_future();
  ps.recv(w1, "pending", [&](std::error_code ec, fw::tensor_buffer) {
    ++calls;
    p.set_value(ec);
  });
  ps.close();
  CHECK(wait(f) == fw::make_error_code(fw::errc::cancelled));
  CHECK(ps.recv_sync(w0, "after", 1s).ec == fw::make_error_code(fw::errc::cancelled));
  CHECK(calls.load() == 1);
}
TEST_CASE_TEMPLATE_APPLY(deadlines_mismatch_close, tcp_transports);

namespace {

struct fire_and_forget {
  struct promise_type {
    fire_and_forget get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

template <class T>
fire_and_forget exchange(rv::endpoint<T>& worker, rv::endpoint<T>& ps, std::promise<bool>& done) {
  std::error_code ec = co_await worker.async_send(ps0, "co", pattern(4096, 3), 30s);
  if (ec) {
    done.set_value(false);
    co_return;
  }
  rv::recv_result r = co_await ps.async_recv(w0, "co", 30s);
  done.set_value(!r.ec && matches(r.buffer, 4096, 3));
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("coroutine awaitables", T, coroutine_awaitables) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  std::promise<bool> done;
  auto f = done.get_future();
  exchange(worker, ps, done);
  CHECK(wait(f));
}
TEST_CASE_TEMPLATE_APPLY(coroutine_awaitables, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a peer that dies fails the receives waiting for it", T, dead_peer_fails_receives) {
  auto spec = loopback_cluster(1, 2);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  auto worker = std::make_unique<rv::endpoint<T>>(w0, spec, rv::endpoint_config<T>{.options = test_options()});
  rv::endpoint<T> other(w1, spec, {.options = test_options()});
  CHECK(lose_worker(ps, worker) == fw::make_error_code(fw::errc::connection_reset));
  // The survivor keeps serving the other worker.
  REQUIRE_FALSE(other.send_sync(ps0, "still", pattern(777, 5), 30s));
  auto r = ps.recv_sync(w1, "still", 30s);
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, 777, 5));
}
TEST_CASE_TEMPLATE_APPLY(dead_peer_fails_receives, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("fusion on and off: many small sends, per-key FIFO, mixed with large ones", T,
                          fusion_on_and_off) {
  for (bool coalesce : {true, false}) {
    CAPTURE(coalesce);
    auto spec = loopback_cluster(1, 1);
    auto o = test_options();
    o.coalesce = coalesce;
    o.acc_size = 8192;
    rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
    rv::endpoint<T> worker(w0, spec, {.options = o});
    // Warm up the connection so the burst below lands in one reactor tick.
    REQUIRE_FALSE(worker.send_sync(ps0, "warm", pattern(1, 1), 30s));
    REQUIRE_FALSE(ps.recv_sync(w0, "warm", 30s).ec);

    constexpr std::uint32_t n = 300;
    std::atomic<std::uint32_t> sent{0}, failed{0};
    std::promise<void> all_sent;
    auto on_sent = [&](std::error_code ec) {
      if (ec) ++failed;
      if (++sent == n) all_sent.set_value();
    };
    for (std::uint32_t i = 0; i < n; ++i) {
      // Every 50th send is large (not fused); keys repeat so FIFO per key is checked.
      const std::size_t size = i % 50 == 49 ? 100000 : 1 + (i % 7) * 9;
      worker.send(ps0, "k" + std::to_string(i % 3), pattern(size, i), on_sent, 30s);
    }
    auto f = all_sent.get_future();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    CHECK(failed.load() == 0);
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::size_t size = i % 50 == 49 ? 100000 : 1 + (i % 7) * 9;
      // A posted destination for some, the endpoint's buffer for the others.
      auto r = i % 2 == 0 ? ps.recv_sync(w0, "k" + std::to_string(i % 3), fw::tensor_buffer::allocate(size), 30s)
                          : ps.recv_sync(w0, "k" + std::to_string(i % 3), 30s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, size, i));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(fusion_on_and_off, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("sends made in one reactor tick leave as one fused frame (switchable)", T,
                          one_tick_one_fused_frame) {
  for (bool coalesce : {true, false}) {
    CAPTURE(coalesce);
    auto spec = loopback_cluster(1, 1);
    auto o = test_options();
    o.coalesce = coalesce;
    rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
    rv::endpoint<T> worker(w0, spec, {.options = o});
    REQUIRE_FALSE(worker.send_sync(ps0, "warm", pattern(1, 1), 30s));
    REQUIRE_FALSE(ps.recv_sync(w0, "warm", 30s).ec);
    const auto before = worker.stats();
    // Issued from a handler on the reactor thread: they reach the reactor together, in its next tick.
    std::promise<void> issued;
    worker.send(ps0, "first", pattern(64, 100), [&](std::error_code) {
      for (std::uint32_t i = 0; i < 8; ++i)
        worker.send(ps0, "small" + std::to_string(i), pattern(64, i), [](std::error_code) {});
      issued.set_value();
    });
    auto f = issued.get_future();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    for (std::uint32_t i = 0; i < 8; ++i) {
      auto r = ps.recv_sync(w0, "small" + std::to_string(i), 30s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, 64, i));
    }
    REQUIRE_FALSE(ps.recv_sync(w0, "first", 30s).ec);
    const auto after = worker.stats();
    if (coalesce) {
      CHECK(after.fused_frames_sent > before.fused_frames_sent);
      CHECK(after.tensors_fused - before.tensors_fused >= 2);
    } else {
      CHECK(after.fused_frames_sent == 0);
      CHECK(after.tensor_frames_sent - before.tensor_frames_sent == 9);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(one_tick_one_fused_frame, tcp_transports);

namespace {

/// How deep the calling thread is inside a test handler: a handler that runs
/// inline from an operation started by another handler would see depth 1.
thread_local int handler_depth = 0;

struct handler_scope {
  std::atomic<int>& nested;
  explicit handler_scope(std::atomic<int>& n) : nested(n) {
    if (handler_depth++ != 0) nested.fetch_add(1);
  }
  ~handler_scope() { --handler_depth; }
  handler_scope(const handler_scope&) = delete;
  handler_scope& operator=(const handler_scope&) = delete;
};

/// Receives `left` tensors on `key` from `peer`, each receive started by the
/// previous one's handler (on the reactor thread); then `done(errors, seeds)`.
template <class Endpoint>
struct recv_chain {
  Endpoint& ep;
  fw::task_id peer;
  std::string key;
  int left;
  std::atomic<int>& nested;
  std::vector<std::uint32_t> seeds;
  std::vector<std::error_code> errors;
  std::promise<void> done;

  void next() {
    ep.recv(
        peer, key,
        [this](std::error_code ec, fw::tensor_buffer b) {
          handler_scope scope(nested);
          errors.push_back(ec);
          if (!ec && !b.empty()) seeds.push_back(static_cast<std::uint32_t>(b.data()[0]));
          if (--left == 0) return done.set_value();
          next();
        },
        30s);
  }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("operations started from a handler start at once, never complete inline, keep FIFO", T,
                          operations_from_handler) {
  auto spec = loopback_cluster(1, 1);
  // Declared before the endpoints: a send started from a handler may complete
  // on the worker's reactor after the PS received it, up to the endpoints'
  // destruction (then with errc::cancelled, counted in `failed`).
  std::atomic<int> nested{0};
  std::atomic<int> failed{0};
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  auto worker = std::make_unique<rv::endpoint<T>>(w0, spec, rv::endpoint_config<T>{.options = test_options()});

  SUBCASE("receives whose tensors already arrived complete from the reactor, not inside the previous handler") {
    constexpr int n = 40;
    for (int i = 0; i < n; ++i) {
      worker->send(ps0, "early", fw::tensor_buffer::copy_of(std::vector<std::byte>{static_cast<std::byte>(i)}),
                   [](std::error_code) {});
    }
    REQUIRE_FALSE(worker->send_sync(ps0, "last", pattern(3, 1), 30s));
    // "last" left after every "early" on the same connection: once it is in, they are too.
    REQUIRE_FALSE(ps.recv_sync(w0, "last", 30s).ec);
    recv_chain<rv::endpoint<T>> chain{ps, w0, "early", n, nested, {}, {}, {}};
    auto f = chain.done.get_future();
    chain.next();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    CHECK(nested.load() == 0);
    REQUIRE(chain.seeds.size() == static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) CHECK(chain.seeds[static_cast<std::size_t>(i)] == static_cast<std::uint32_t>(i));
  }

  SUBCASE("a handler that retries a receive from a dead peer does not recurse") {
    REQUIRE(lose_worker(ps, worker) == fw::make_error_code(fw::errc::connection_reset));
    // The peer is known down: each retry fails at once, from a posted task.
    recv_chain<rv::endpoint<T>> chain{ps, w0, "never", 2000, nested, {}, {}, {}};
    auto f = chain.done.get_future();
    chain.next();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    CHECK(nested.load() == 0);
    REQUIRE(chain.errors.size() == 2000u);
    for (auto ec : chain.errors) CHECK(ec == fw::make_error_code(fw::errc::connection_reset));
  }

  SUBCASE("sends a handler starts directly and through batches leave in call order") {
    constexpr std::uint32_t n = 60;
    std::promise<void> started;
    auto s = started.get_future();
    worker->recv(
        ps0, "go",
        [&](std::error_code ec, fw::tensor_buffer) {
          handler_scope scope(nested);
          if (ec) failed.fetch_add(1);
          auto on_sent = [&failed, &nested](std::error_code e) {
            handler_scope inner(nested);
            if (e) failed.fetch_add(1);
          };
          typename rv::endpoint<T>::op_batch b(*worker);
          for (std::uint32_t i = 0; i < n; ++i) {
            if (i % 3 == 0) {
              b.submit();
              worker->send(ps0, "order", pattern(5 + i, i), on_sent);
            } else {
              b.send(ps0, "order", pattern(5 + i, i), on_sent);
            }
          }
          b.submit();
          started.set_value();
        },
        30s);
    REQUIRE_FALSE(ps.send_sync(w0, "go", pattern(1, 9), 30s));
    REQUIRE(s.wait_for(60s) == std::future_status::ready);
    for (std::uint32_t i = 0; i < n; ++i) {
      auto r = ps.recv_sync(w0, "order", 30s);
      REQUIRE_FALSE(r.ec);
      CHECK(matches(r.buffer, 5 + i, i));
    }
    CHECK(failed.load() == 0);
    CHECK(nested.load() == 0);
  }
}
TEST_CASE_TEMPLATE_APPLY(operations_from_handler, tcp_transports);

}  // namespace endpoint_cases
