// rendezvous::endpoint::op_batch (many operations, one hand-off to the reactor) and
// the endpoint's reused per-operation state, over both transports.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "endpoint_fixture.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace batch_cases {

using namespace fusewire::test;

namespace {

fw::options test_options(bool coalesce = true) {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 4u << 20;
  o.connect_timeout = 3000ms;
  o.coalesce = coalesce;
  return o;
}

/// Counts completions; `done` becomes ready after `n` of them.
struct countdown {
  explicit countdown(int n) : left(n) {}
  std::atomic<int> left;
  std::promise<void> all;
  void hit() {
    if (left.fetch_sub(1) == 1) all.set_value();
  }
  bool wait() {
    auto f = all.get_future();
    return f.wait_for(60s) == std::future_status::ready;
  }
};

/// What each recv got, by its index; filled on the reactor thread.
struct received {
  explicit received(std::size_t n) : ec(n), buf(n), calls(n) {}
  std::mutex m;
  std::vector<std::error_code> ec;
  std::vector<fw::tensor_buffer> buf;
  std::vector<int> calls;
  void set(std::size_t i, std::error_code e, fw::tensor_buffer b) {
    std::lock_guard lock(m);
    ec[i] = e;
    buf[i] = std::move(b);
    ++calls[i];
  }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("batch: per-key FIFO across batches and direct calls, both payload forms, both recv forms", T,
                          batch_per_key_fifo) {
  for (bool coalesce : {true, false}) {
    CAPTURE(coalesce);
    auto spec = loopback_cluster(1, 1);
    rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
    rv::endpoint<T> worker(w0, spec, {.options = test_options(coalesce)});
    constexpr std::uint32_t n = 60;
    // Receives first: one batch, in order; every third lands in a posted destination.
    received got(n);
    countdown recvs(n);
    {
      typename rv::endpoint<T>::op_batch b(ps);
      for (std::uint32_t i = 0; i < n; ++i) {
        auto h = [&, i](std::error_code ec, fw::tensor_buffer buf) {
          got.set(i, ec, std::move(buf));
          recvs.hit();
        };
        const std::size_t size = 1 + i * 5;
        if (i % 3 == 0) {
          b.recv(w0, "k" + std::to_string(i % 2), fw::tensor_buffer::allocate(size), h, 30s);
        } else {
          b.recv(w0, "k" + std::to_string(i % 2), h, 30s);
        }
      }
      CHECK(b.size() == n);
      b.submit();
      CHECK(b.size() == 0);
    }
    // Sends: a direct call, then a batch, then a direct call, all on two keys.
    countdown sends(n);
    std::atomic<int> send_errors{0};
    auto on_sent = [&](std::error_code ec) {
      if (ec) ++send_errors;
      sends.hit();
    };
    std::vector<fw::tensor_buffer> parts;  // scatter-gather pieces, alive until the sends completed
    worker.send(ps0, "k0", pattern(1, 0), on_sent, 30s);
    {
      typename rv::endpoint<T>::op_batch b(worker);
      for (std::uint32_t i = 1; i + 1 < n; ++i) {
        const std::size_t size = 1 + i * 5;
        if (i % 4 == 1) {
          // Scatter-gather: the same bytes in two pieces.
          auto whole = pattern(size, i);
          const std::size_t cut = size / 2;
          parts.push_back(whole.share(0, cut));
          parts.push_back(whole.share(cut, size - cut));
          const fw::const_buffer sg[] = {parts[parts.size() - 2].bytes(), parts.back().bytes()};
          b.send(ps0, "k" + std::to_string(i % 2), std::span<const fw::const_buffer>(sg), on_sent, 30s);
        } else {
          b.send(ps0, "k" + std::to_string(i % 2), pattern(size, i), on_sent, 30s);
        }
      }
    }  // the destructor submits
    worker.send(ps0, "k" + std::to_string((n - 1) % 2), pattern(1 + (n - 1) * 5, n - 1), on_sent, 30s);
    REQUIRE(sends.wait());
    REQUIRE(recvs.wait());
    CHECK(send_errors.load() == 0);
    for (std::uint32_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(got.calls[i] == 1);
      REQUIRE_FALSE(got.ec[i]);
      CHECK(matches(got.buf[i], 1 + i * 5, i));
    }
    if (coalesce) CHECK(worker.stats().fused_frames_sent > 0);
  }
}
TEST_CASE_TEMPLATE_APPLY(batch_per_key_fifo, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("batch: bad operations fail alone, with the same errors as direct calls", T,
                          batch_bad_operations) {
  auto spec = loopback_cluster(1, 1);
  auto o = test_options();
  o.chunking = false;
  o.max_frame_bytes = 1 << 16;
  rv::endpoint<T> ps(ps0, spec, {.options = o});
  rv::endpoint<T> worker(w0, spec, {.options = o});
  std::vector<std::promise<std::error_code>> sent(4);
  std::vector<std::promise<rv::recv_result>> recvd(3);
  {
    typename rv::endpoint<T>::op_batch b(worker);
    b.send({"chief", 0}, "k", pattern(1, 1), [&](std::error_code ec) { sent[0].set_value(ec); });
    b.send(ps0, std::string(70000, 'x'), pattern(1, 1), [&](std::error_code ec) { sent[1].set_value(ec); });
    b.send(ps0, "big", pattern(1 << 17, 1), [&](std::error_code ec) { sent[2].set_value(ec); });
    b.send(ps0, "good", pattern(10, 2), [&](std::error_code ec) { sent[3].set_value(ec); });
    b.submit();
  }
  {
    typename rv::endpoint<T>::op_batch b(ps);
    b.recv({"worker", 9}, "k", [&](std::error_code ec, fw::tensor_buffer x) {
      recvd[0].set_value({ec, std::move(x)});
    });
    b.recv(w0, "good", fw::tensor_buffer::allocate(11), [&](std::error_code ec, fw::tensor_buffer x) {
      recvd[1].set_value({ec, std::move(x)});
    });
    b.submit();
    b.recv(w0, "good2", [&](std::error_code ec, fw::tensor_buffer x) { recvd[2].set_value({ec, std::move(x)}); });
    b.submit();
  }
  REQUIRE_FALSE(worker.send_sync(ps0, "good2", pattern(5, 3), 30s));
  auto get = [](auto& p) {
    auto f = p.get_future();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    return f.get();
  };
  CHECK(get(sent[0]) == fw::make_error_code(fw::errc::invalid_argument));
  CHECK(get(sent[1]) == fw::make_error_code(fw::errc::invalid_argument));
  CHECK(get(sent[2]) == fw::make_error_code(fw::errc::frame_too_large));
  CHECK_FALSE(get(sent[3]));
  CHECK(get(recvd[0]).ec == fw::make_error_code(fw::errc::invalid_argument));
  CHECK(get(recvd[1]).ec == fw::make_error_code(fw::errc::size_mismatch));
  auto r2 = get(recvd[2]);
  REQUIRE_FALSE(r2.ec);
  CHECK(matches(r2.buffer, 5, 3));
}
TEST_CASE_TEMPLATE_APPLY(batch_bad_operations, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("batch: deadlines of batched operations", T, batch_deadlines) {
  auto spec = loopback_cluster(1, 2);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  std::promise<std::error_code> late, lost;
  std::promise<rv::recv_result> on_time;
  {
    typename rv::endpoint<T>::op_batch b(ps);
    b.recv(
        w0, "never", [&](std::error_code ec, fw::tensor_buffer) { late.set_value(ec); }, 50ms);
    b.recv(
        w0, "soon",
        [&](std::error_code ec, fw::tensor_buffer x) {
          on_time.set_value({ec, std::move(x)});
        },
        30s);
  }
  {
    // worker:1 never starts: the send fails at its deadline (or once connect_timeout passed).
    typename rv::endpoint<T>::op_batch b(worker);
    b.send(
        w1, "k", pattern(1, 1), [&](std::error_code ec) { lost.set_value(ec); }, 100ms);
  }
  auto f_late = late.get_future();
  REQUIRE(f_late.wait_for(60s) == std::future_status::ready);
  CHECK(f_late.get() == fw::make_error_code(fw::errc::timed_out));
  auto f_lost = lost.get_future();
  REQUIRE(f_lost.wait_for(60s) == std::future_status::ready);
  const auto e = f_lost.get();
  CHECK((e == fw::make_error_code(fw::errc::timed_out) || e == fw::make_error_code(fw::errc::connection_refused)));
  // The timed-out receive left its key usable; the one without a passed deadline gets its tensor.
  REQUIRE_FALSE(worker.send_sync(ps0, "soon", pattern(33, 4), 30s));
  auto f_on_time = on_time.get_future();
  REQUIRE(f_on_time.wait_for(60s) == std::future_status::ready);
  auto r = f_on_time.get();
  REQUIRE_FALSE(r.ec);
  CHECK(matches(r.buffer, 33, 4));
  REQUIRE_FALSE(worker.send_sync(ps0, "never", pattern(3, 5), 30s));
  auto again = ps.recv_sync(w0, "never", 30s);
  REQUIRE_FALSE(again.ec);
  CHECK(matches(again.buffer, 3, 5));
}
TEST_CASE_TEMPLATE_APPLY(batch_deadlines, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE(
    "batch: close fails pending batched operations once; a batch submitted after close fails inline", T, batch_close) {
  auto spec = loopback_cluster(1, 2);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  constexpr int n = 50;
  received got(n);
  countdown all(n);
  {
    typename rv::endpoint<T>::op_batch b(ps);
    for (int i = 0; i < n; ++i) {
      b.recv(w1, "pending" + std::to_string(i), [&, i](std::error_code ec, fw::tensor_buffer x) {
        got.set(static_cast<std::size_t>(i), ec, std::move(x));
        all.hit();
      });
    }
  }
  ps.close();
  REQUIRE(all.wait());
  for (int i = 0; i < n; ++i) {
    CHECK(got.calls[static_cast<std::size_t>(i)] == 1);
    CHECK(got.ec[static_cast<std::size_t>(i)] == fw::make_error_code(fw::errc::cancelled));
  }
  // After close: inline, in order, before submit() returns.
  std::vector<int> order;
  typename rv::endpoint<T>::op_batch b(ps);
  b.recv(w0, "a", [&](std::error_code ec, fw::tensor_buffer) {
    CHECK(ec == fw::make_error_code(fw::errc::cancelled));
    order.push_back(1);
  });
  b.send(w0, "b", pattern(4, 1), [&](std::error_code ec) {
    CHECK(ec == fw::make_error_code(fw::errc::cancelled));
    order.push_back(2);
  });
  CHECK(order.empty());
  b.submit();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(b.size() == 0);
}
TEST_CASE_TEMPLATE_APPLY(batch_close, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE(
    "many steps reuse the endpoint's per-key state; unmatched keys beyond the sweep limit survive", T,
    steps_reuse_key_state) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  // Steady steps: the same 100 keys each step, receives and sends batched.
  for (int step = 0; step < 30; ++step) {
    CAPTURE(step);
    constexpr int per_step = 100;
    received got(per_step);
    countdown recvs(per_step), sends(per_step);
    std::atomic<int> send_errors{0};
    typename rv::endpoint<T>::op_batch r(ps), s(worker);
    for (int k = 0; k < per_step; ++k) {
      r.recv(w0, "step_key_" + std::to_string(k), [&, k](std::error_code ec, fw::tensor_buffer b) {
        got.set(static_cast<std::size_t>(k), ec, std::move(b));
        recvs.hit();
      });
      s.send(ps0, "step_key_" + std::to_string(k), pattern(64, static_cast<std::uint32_t>(step * per_step + k)),
             [&](std::error_code ec) {
               if (ec) ++send_errors;
               sends.hit();
             });
    }
    if (step % 2 == 0) {
      r.submit();
      s.submit();
    } else {
      s.submit();  // sends first: the tensors arrive before their receives
      r.submit();
    }
    REQUIRE(recvs.wait());
    REQUIRE(sends.wait());
    CHECK(send_errors.load() == 0);
    for (int k = 0; k < per_step; ++k) {
      REQUIRE_FALSE(got.ec[static_cast<std::size_t>(k)]);
      CHECK(matches(got.buf[static_cast<std::size_t>(k)], 64, static_cast<std::uint32_t>(step * per_step + k)));
    }
  }
  // 5,000 distinct keys arrive before their receives: creating that many
  // per-key entries sweeps the empty ones, never one holding a tensor.
  constexpr int distinct = 5000;
  {
    countdown sends(distinct);
    typename rv::endpoint<T>::op_batch s(worker);
    for (int k = 0; k < distinct; ++k) {
      s.send(ps0, "once_" + std::to_string(k), pattern(8, static_cast<std::uint32_t>(k)),
             [&](std::error_code) { sends.hit(); });
    }
    s.submit();
    REQUIRE(sends.wait());
  }
  // A marker sent last on the ordered connection: once it is in, every tensor above is too.
  REQUIRE_FALSE(worker.send_sync(ps0, "marker", pattern(1, 1), 30s));
  REQUIRE_FALSE(ps.recv_sync(w0, "marker", 30s).ec);
  received got(distinct);
  countdown recvs(distinct);
  {
    typename rv::endpoint<T>::op_batch r(ps);
    for (int k = 0; k < distinct; ++k) {
      r.recv(w0, "once_" + std::to_string(k), [&, k](std::error_code ec, fw::tensor_buffer b) {
        got.set(static_cast<std::size_t>(k), ec, std::move(b));
        recvs.hit();
      });
    }
  }
  REQUIRE(recvs.wait());
  int bad = 0;
  for (int k = 0; k < distinct; ++k) {
    if (got.ec[static_cast<std::size_t>(k)] ||
        !matches(got.buf[static_cast<std::size_t>(k)], 8, static_cast<std::uint32_t>(k))) {
      ++bad;
    }
  }
  CHECK(bad == 0);
}
TEST_CASE_TEMPLATE_APPLY(steps_reuse_key_state, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("hundreds of tensors queued on one key keep their order, both ways round", T,
                          hundreds_on_one_key) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  constexpr int n = 300;
  for (const bool sends_first : {true, false}) {
    CAPTURE(sends_first);
    received got(n);
    countdown recvs(n), sends(n);
    std::atomic<int> send_errors{0};
    typename rv::endpoint<T>::op_batch r(ps), s(worker);
    for (int i = 0; i < n; ++i) {
      r.recv(w0, "deep", [&, i](std::error_code ec, fw::tensor_buffer b) {
        got.set(static_cast<std::size_t>(i), ec, std::move(b));
        recvs.hit();
      });
      s.send(ps0, "deep", pattern(16 + static_cast<std::size_t>(i % 7), static_cast<std::uint32_t>(i)),
             [&](std::error_code ec) {
               if (ec) ++send_errors;
               sends.hit();
             });
    }
    if (sends_first) {
      s.submit();
      REQUIRE(sends.wait());
      // A marker on the same ordered connection: once it is in, all 300 wait in the key's queue.
      REQUIRE_FALSE(worker.send_sync(ps0, "marker", pattern(1, 1), 30s));
      REQUIRE_FALSE(ps.recv_sync(w0, "marker", 30s).ec);
      r.submit();
    } else {
      r.submit();
      s.submit();
      REQUIRE(sends.wait());
    }
    REQUIRE(recvs.wait());
    CHECK(send_errors.load() == 0);
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      REQUIRE_FALSE(got.ec[static_cast<std::size_t>(i)]);
      CHECK(got.calls[static_cast<std::size_t>(i)] == 1);
      CHECK(matches(got.buf[static_cast<std::size_t>(i)], 16 + static_cast<std::size_t>(i % 7),
                    static_cast<std::uint32_t>(i)));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(hundreds_on_one_key, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a batched operation that completes releases its handler while its block-mates still wait", T,
                          batched_completion_releases_handler) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  auto token = std::make_shared<int>(0);
  countdown first(1), rest(1);
  {
    typename rv::endpoint<T>::op_batch r(ps);
    r.recv(w0, "now", [&, t = token](std::error_code ec, fw::tensor_buffer) {
      CHECK_FALSE(ec);
      first.hit();
    });
    r.recv(
        w0, "later",
        [&](std::error_code ec, fw::tensor_buffer) {
          CHECK(ec == fw::make_error_code(fw::errc::timed_out));
          rest.hit();
        },
        2s);
  }
  REQUIRE_FALSE(worker.send_sync(ps0, "now", pattern(8, 3), 30s));
  REQUIRE(first.wait());
  // The handler (and its capture) is gone once it ran, though "later" still holds the records' block.
  for (int i = 0; i < 1000 && token.use_count() != 1; ++i) std::this_thread::sleep_for(1ms);
  CHECK(token.use_count() == 1);
  REQUIRE(rest.wait());
}
TEST_CASE_TEMPLATE_APPLY(batched_completion_releases_handler, tcp_transports);

TEST_CASE_TEMPLATE_DEFINE("a streaming batch hands over every N operations; per-key FIFO holds across its groups", T,
                          streaming_batch_groups) {
  auto spec = loopback_cluster(1, 1);
  rv::endpoint<T> ps(ps0, spec, {.options = test_options()});
  rv::endpoint<T> worker(w0, spec, {.options = test_options()});
  // Receives in groups of 4: the first 8 are on the reactor after 8 adds, the last 2 are not.
  constexpr int n = 10;
  received got(n);
  countdown first_eight(8), last_two(2);
  std::atomic<int> late_calls{0};
  typename rv::endpoint<T>::op_batch r(ps, 4);
  for (int i = 0; i < n; ++i) {
    r.recv(w0, "fifo", [&, i](std::error_code ec, fw::tensor_buffer b) {
      got.set(static_cast<std::size_t>(i), ec, std::move(b));
      if (i < 8) {
        first_eight.hit();
      } else {
        ++late_calls;
        last_two.hit();
      }
    });
    CHECK(r.size() == static_cast<std::size_t>((i + 1) % 4));
  }
  // Sends in groups of 3 (the destructor hands over the last one).
  countdown sent(n);
  {
    typename rv::endpoint<T>::op_batch s(worker, 3);
    for (int i = 0; i < n; ++i) {
      s.send(ps0, "fifo", pattern(16 + static_cast<std::size_t>(i), static_cast<std::uint32_t>(i)),
             [&](std::error_code ec) {
               CHECK_FALSE(ec);
               sent.hit();
             });
    }
  }
  REQUIRE(sent.wait());
  REQUIRE(first_eight.wait());  // completed before r.submit()
  // A marker behind the ten tensors on the ordered connection: once it is in, they all are.
  REQUIRE_FALSE(worker.send_sync(ps0, "marker", pattern(1, 1), 30s));
  REQUIRE_FALSE(ps.recv_sync(w0, "marker", 30s).ec);
  CHECK(late_calls.load() == 0);  // the last two receives were never handed over
  r.submit();
  REQUIRE(last_two.wait());
  CHECK(late_calls.load() == 2);
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(got.calls[static_cast<std::size_t>(i)] == 1);
    REQUIRE_FALSE(got.ec[static_cast<std::size_t>(i)]);
    CHECK(
        matches(got.buf[static_cast<std::size_t>(i)], 16 + static_cast<std::size_t>(i), static_cast<std::uint32_t>(i)));
  }
}
TEST_CASE_TEMPLATE_APPLY(streaming_batch_groups, tcp_transports);

}  // namespace batch_cases
