// rendezvous::endpoint over both transports: two endpoints in one process.

#include <doctest/doctest.h>

#include <chrono>
#include <coroutine>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "test_util.hpp"

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


}  // namespace

TEST_CASE_TEMPLATE("send then recv, recv then send, every size, byte for byte", T, TRANSPORTS) {
  auto spec = rvtest::loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, test_options());
  rv::endpoint<T> worker(w0, spec, test_options());
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1024}, std::size_t{65536}, std::size_t{1} << 20,
                        std::size_t{5} << 20}) {
    CAPTURE(n);
    // send first, then recv (early arrival)
    REQUIRE_FALSE(worker.send_sync(ps0, "a" + std::to_string(n), rvtest::pattern(n, 1), 30s));
    auto r = ps.recv_sync(w0, "a" + std::to_string(n), 30s);
    REQUIRE_FALSE(r.ec);
    CHECK(rvtest::matches(r.buffer, n, 1));
    // recv first with a posted destination (zero copy), then send
    auto dst = fw::tensor_buffer::allocate(n);
    std::byte* where = dst.data();
    std::promise<rv::recv_result> got;
    auto fut = got.get_future();
    ps.recv(w0, "b" + std::to_string(n), std::move(dst),
            [&got](std::error_code ec, fw::tensor_buffer b) { got.set_value({ec, std::move(b)}); }, 30s);
    std::this_thread::sleep_for(5ms);
    REQUIRE_FALSE(worker.send_sync(ps0, "b" + std::to_string(n), rvtest::pattern(n, 2), 30s));
    auto r2 = wait(fut);
    REQUIRE_FALSE(r2.ec);
    CHECK(rvtest::matches(r2.buffer, n, 2));
    CHECK(r2.buffer.data() == where);
  }
}

TEST_CASE_TEMPLATE("per-key FIFO and scatter-gather payloads", T, TRANSPORTS) {
  auto spec = rvtest::loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, test_options());
  rv::endpoint<T> worker(w0, spec, test_options());
  auto a = rvtest::pattern(100, 7);
  auto b = rvtest::pattern(3000, 8);
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
    worker.send(ps0, "same", rvtest::pattern(10 + i, i), [p](std::error_code ec) { p->set_value(ec); }, 30s);
  }
  for (std::uint32_t i = 0; i < 20; ++i) {
    auto got = ps.recv_sync(w0, "same", 30s);
    REQUIRE_FALSE(got.ec);
    CHECK(rvtest::matches(got.buffer, 10 + i, i));
  }
  for (auto& f : sends) CHECK_FALSE(wait(f));
}

TEST_CASE_TEMPLATE("deadlines, size mismatch, bad arguments, close", T, TRANSPORTS) {
  auto spec = rvtest::loopback_cluster(1, 2);
  rv::endpoint<T> ps(ps0, spec, test_options());
  rv::endpoint<T> worker(w0, spec, test_options());

  auto r = ps.recv_sync(w0, "never", 50ms);
  CHECK(r.ec == fw::make_error_code(fw::errc::timed_out));

  REQUIRE_FALSE(worker.send_sync(ps0, "k", rvtest::pattern(10, 1), 30s));
  r = ps.recv_sync(w0, "k", fw::tensor_buffer::allocate(11), 30s);
  CHECK(r.ec == fw::make_error_code(fw::errc::size_mismatch));

  CHECK(worker.send_sync({"chief", 0}, "k", rvtest::pattern(1, 1), 1s) == fw::make_error_code(fw::errc::invalid_argument));
  CHECK(ps.recv_sync({"worker", 9}, "k", 1s).ec == fw::make_error_code(fw::errc::invalid_argument));

  // worker:1 never started: its sends fail once connect_timeout passed, or at their deadline.
  auto e = worker.send_sync(w1, "k", rvtest::pattern(1, 1), 200ms);
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
  std::error_code ec = co_await worker.async_send(ps0, "co", rvtest::pattern(4096, 3), 30s);
  if (ec) {
    done.set_value(false);
    co_return;
  }
  rv::recv_result r = co_await ps.async_recv(w0, "co", 30s);
  done.set_value(!r.ec && rvtest::matches(r.buffer, 4096, 3));
}

}  // namespace

TEST_CASE_TEMPLATE("coroutine awaitables", T, TRANSPORTS) {
  auto spec = rvtest::loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, test_options());
  rv::endpoint<T> worker(w0, spec, test_options());
  std::promise<bool> done;
  auto f = done.get_future();
  exchange(worker, ps, done);
  CHECK(wait(f));
}

TEST_CASE_TEMPLATE("a peer that dies fails the receives waiting for it", T, TRANSPORTS) {
  auto spec = rvtest::loopback_cluster(1, 2);
  rv::endpoint<T> ps(ps0, spec, test_options());
  auto worker = std::make_unique<rv::endpoint<T>>(w0, spec, test_options());
  rv::endpoint<T> other(w1, spec, test_options());
  REQUIRE_FALSE(worker->send_sync(ps0, "hello", rvtest::pattern(1, 1), 30s));
  REQUIRE_FALSE(ps.recv_sync(w0, "hello", 30s).ec);
  std::promise<std::error_code> p;
  auto f = p.get_future();
  ps.recv(w0, "never", [&p](std::error_code ec, fw::tensor_buffer) { p.set_value(ec); }, 30s);
  worker.reset();
  CHECK(wait(f) == fw::make_error_code(fw::errc::connection_reset));
  // The survivor keeps serving the other worker.
  REQUIRE_FALSE(other.send_sync(ps0, "still", rvtest::pattern(777, 5), 30s));
  auto r = ps.recv_sync(w1, "still", 30s);
  REQUIRE_FALSE(r.ec);
  CHECK(rvtest::matches(r.buffer, 777, 5));
}

TEST_CASE_TEMPLATE("fusion on and off: many small sends, per-key FIFO, mixed with large ones", T, TRANSPORTS) {
  for (bool coalesce : {true, false}) {
    CAPTURE(coalesce);
    auto spec = rvtest::loopback_cluster(1, 1);
    auto o = test_options();
    o.coalesce = coalesce;
    o.acc_size = 8192;
    rv::endpoint<T> ps(ps0, spec, test_options());
    rv::endpoint<T> worker(w0, spec, o);
    // Warm up the connection so the burst below lands in one reactor tick.
    REQUIRE_FALSE(worker.send_sync(ps0, "warm", rvtest::pattern(1, 1), 30s));
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
      worker.send(ps0, "k" + std::to_string(i % 3), rvtest::pattern(size, i), on_sent, 30s);
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
      CHECK(rvtest::matches(r.buffer, size, i));
    }
  }
}

TEST_CASE_TEMPLATE("sends made in one reactor tick leave as one fused frame (switchable)", T, TRANSPORTS) {
  for (bool coalesce : {true, false}) {
    CAPTURE(coalesce);
    auto spec = rvtest::loopback_cluster(1, 1);
    auto o = test_options();
    o.coalesce = coalesce;
    rv::endpoint<T> ps(ps0, spec, test_options());
    rv::endpoint<T> worker(w0, spec, o);
    REQUIRE_FALSE(worker.send_sync(ps0, "warm", rvtest::pattern(1, 1), 30s));
    REQUIRE_FALSE(ps.recv_sync(w0, "warm", 30s).ec);
    const auto before = worker.stats();
    // Issued from a handler on the reactor thread: they reach the reactor together, in its next tick.
    std::promise<void> issued;
    worker.send(ps0, "first", rvtest::pattern(64, 100), [&](std::error_code) {
      for (std::uint32_t i = 0; i < 8; ++i) worker.send(ps0, "small" + std::to_string(i), rvtest::pattern(64, i), [](std::error_code) {});
      issued.set_value();
    });
    auto f = issued.get_future();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    for (std::uint32_t i = 0; i < 8; ++i) {
      auto r = ps.recv_sync(w0, "small" + std::to_string(i), 30s);
      REQUIRE_FALSE(r.ec);
      CHECK(rvtest::matches(r.buffer, 64, i));
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
