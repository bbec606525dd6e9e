#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/reactor/reactor.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/reactor/uring_engine.hpp>
#endif

#include <boost/asio/post.hpp>
#include <doctest/doctest.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "support/reactor_wait.hpp"

namespace fw = fusewire;
using namespace std::chrono_literals;

#if FUSEWIRE_HAS_URING
#define ENGINES fw::asio_engine, fw::uring_engine
#else
#define ENGINES fw::asio_engine
#endif

namespace {

using fw::test::eventually;
using fw::test::get;
using fw::test::make_config;

const fw::reactor_mode all_modes[] = {fw::reactor_mode::poll, fw::reactor_mode::adaptive, fw::reactor_mode::block};

const char* mode_name(fw::reactor_mode m) {
  switch (m) {
    case fw::reactor_mode::poll:
      return "poll";
    case fw::reactor_mode::adaptive:
      return "adaptive";
    case fw::reactor_mode::block:
      return "block";
  }
  return "?";
}

}  // namespace

TEST_CASE("reactor_config validation names the bad field") {
  fw::reactor_config cfg;
  cfg.count = 0;
  CHECK_THROWS_WITH_AS(cfg.validate(), "reactor_config.count = 0: must be 1..4096: invalid argument",
                       std::system_error);
  cfg.count = 1;
  cfg.batch = 65;
  CHECK_THROWS_WITH_AS(cfg.validate(), "reactor_config.batch = 65: must be 1..64: invalid argument", std::system_error);
  cfg.batch = 16;
  cfg.inbox_capacity = 1;
  CHECK_THROWS_WITH_AS(cfg.validate(), "reactor_config.inbox_capacity = 1: must be 2..1048576: invalid argument",
                       std::system_error);
  try {
    fw::asio_reactor_group g(cfg);
    FAIL("constructor accepted a bad config");
  } catch (const std::system_error& e) {
    CHECK(e.code() == fw::errc::invalid_argument);
  }
}

TEST_CASE("make_reactor_config takes mode, idle poll, pinning and the reactor count from options") {
  fw::options o;
  o.mode = fw::reactor_mode::poll;
  o.idle_poll = 1234us;
  o.pin_cores = true;
  o.cores = 3;
  const fw::reactor_config few = fw::make_reactor_config(o, 2);
  CHECK(few.mode == fw::reactor_mode::poll);
  CHECK(few.idle_poll == 1234us);
  CHECK(few.pin_cores);
  CHECK(few.count == o.reactor_count(2));
  CHECK(fw::make_reactor_config(o, 100).count == 3);
  CHECK(fw::make_reactor_config(o, 0).count >= 1);
}

TEST_CASE_TEMPLATE("poll mode never sleeps; adaptive and block modes sleep when idle", E, ENGINES) {
  for (fw::reactor_mode mode : all_modes) {
    CAPTURE(mode_name(mode));
    fw::basic_reactor_group<E> group(make_config(mode, 1));
    auto f = group.submit(0, [] { return 1; });
    CHECK(get(f) == 1);
    std::this_thread::sleep_for(100ms);  // idle: far longer than idle_poll (50us)
    auto g = group.submit(0, [] { return 2; });
    CHECK(get(g) == 2);
    const auto stats = group.at(0).stats();
    if (mode == fw::reactor_mode::poll) {
      CHECK(stats.sleeps == 0);
      CHECK(stats.ticks > 100);
    } else {
      CHECK(stats.sleeps > 0);
    }
  }
}

TEST_CASE_TEMPLATE("submit_to runs tasks on the target reactor, FIFO per sender, in every mode", E, ENGINES) {
  for (fw::reactor_mode mode : all_modes) {
    CAPTURE(mode_name(mode));
    std::vector<int> seen_alien, seen_attached;  // touched only on reactor 1
    fw::basic_reactor_group<E> group(make_config(mode, 2));
    CHECK(group.size() == 2);
    CHECK(group.at(1).index() == 1);
    constexpr int n = 5000;
    for (int i = 0; i < n; ++i) {
      REQUIRE_FALSE(group.submit_to(1, [&, i] {
        REQUIRE(fw::basic_reactor<E>::current() == &group.at(1));
        seen_alien.push_back(i);
      }));
    }
    {
      typename fw::basic_reactor_group<E>::sender sender(group);
      for (int i = 0; i < n; ++i) {
        // Both the sender's own lane and the thread-local lookup through submit_to.
        auto ec = (i % 2 == 0) ? sender.submit_to(1, [&, i] { seen_attached.push_back(i); })
                               : group.submit_to(1, [&, i] { seen_attached.push_back(i); });
        REQUIRE_FALSE(ec);
      }
      auto done = group.submit(1, [&] { return std::make_pair(seen_alien.size(), seen_attached.size()); });
      const auto sizes = get(done);
      CHECK(sizes.second == static_cast<std::size_t>(n));
    }
    auto done = group.submit(1, [&] { return seen_alien.size(); });
    CHECK(get(done) == static_cast<std::size_t>(n));
    group.stop();
    for (int i = 0; i < n; ++i) {
      REQUIRE(seen_alien[static_cast<std::size_t>(i)] == i);
      REQUIRE(seen_attached[static_cast<std::size_t>(i)] == i);
    }
  }
}

TEST_CASE_TEMPLATE("reactor-to-reactor tasks keep their order beyond the inbox capacity", E, ENGINES) {
  fw::reactor_config cfg = make_config(fw::reactor_mode::block, 2);
  cfg.inbox_capacity = 8;
  cfg.batch = 4;
  std::vector<int> seen;  // reactor 1 only
  std::promise<void> all_done;
  fw::basic_reactor_group<E> group(cfg);
  constexpr int n = 3000;
  group.submit_to(0, [&] {
    for (int i = 0; i < n; ++i) {
      group.submit_to(1, [&, i] { seen.push_back(i); });
    }
    group.submit_to(1, [&] { all_done.set_value(); });
  });
  auto f = all_done.get_future();
  get(f);
  group.stop();
  REQUIRE(seen.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) REQUIRE(seen[static_cast<std::size_t>(i)] == i);
}

TEST_CASE_TEMPLATE("post runs later, never inline, in FIFO order" * doctest::timeout(120), E, ENGINES) {
  fw::basic_reactor_group<E> group(make_config(fw::reactor_mode::adaptive, 1));
  auto f = group.submit(0, [&] {
    auto* r = fw::basic_reactor<E>::current();
    auto order = std::make_shared<std::vector<int>>();
    r->post([order] { order->push_back(1); });
    r->post([order] { order->push_back(2); });
    order->push_back(0);
    return order;
  });
  auto order = get(f);
  auto g = group.submit(0, [order] { return *order; });
  CHECK(get(g) == std::vector<int>{0, 1, 2});
}

TEST_CASE_TEMPLATE("no lost wake-ups in block mode" * doctest::timeout(300), E, ENGINES) {
  fw::basic_reactor_group<E> group(make_config(fw::reactor_mode::block, 2));

  SUBCASE("external thread <-> reactor ping-pong") {
    for (int i = 0; i < 5000; ++i) {
      std::promise<int> p;
      auto f = p.get_future();
      REQUIRE_FALSE(group.submit_to(i % 2, [&p, i] { p.set_value(i); }));
      REQUIRE(get(f) == i);
    }
  }
  SUBCASE("reactor <-> reactor ping-pong") {
    constexpr int rounds = 20000;
    std::promise<int> done;
    std::function<void(int)> bounce = [&](int left) {
      auto* self = fw::basic_reactor<E>::current();
      if (left == 0) {
        done.set_value(static_cast<int>(self->index()));
        return;
      }
      group.submit_to(1 - self->index(), [&bounce, left] { bounce(left - 1); });
    };
    group.submit_to(0, [&] { bounce(rounds); });
    auto f = done.get_future();
    CHECK(get(f) == 0);  // an even number of hops ends where it started
    CHECK(group.at(0).stats().sleeps + group.at(1).stats().sleeps > 0);
  }
  SUBCASE("many external threads hammering both reactors") {
    std::atomic<int> ran{0};
    std::vector<std::thread> threads;
    constexpr int per_thread = 4000;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::optional<typename fw::basic_reactor_group<E>::sender> s;
        if (t % 2 == 0) s.emplace(group);
        for (int i = 0; i < per_thread; ++i) {
          auto ec = group.submit_to((i + t) % 2, [&] { ran.fetch_add(1, std::memory_order_relaxed); });
          if (ec) FAIL_CHECK("submit_to refused");
        }
        // Each thread waits for its own last task: that completes only if no wake-up was lost.
        auto f = group.submit(static_cast<unsigned>(t % 2), [] {});
        if (f.wait_for(60s) != std::future_status::ready) FAIL_CHECK("lost wake-up");
      });
    }
    for (auto& th : threads) th.join();
    group.stop();
    CHECK(ran.load() == 4 * per_thread);
  }
}

TEST_CASE_TEMPLATE("timers fire in order; cancel completes them with errc::cancelled exactly once", E, ENGINES) {
  fw::basic_reactor_group<E> group(make_config(fw::reactor_mode::block, 1));
  const auto text = [](std::error_code ec) { return ec ? ec.message() : std::string("ok"); };
  struct log {
    std::vector<std::string> events;
    fw::timer_id cancelled_id;
  };
  auto state = std::make_shared<log>();
  std::promise<void> done;
  group.submit_to(0, [&, state] {
    auto* r = fw::basic_reactor<E>::current();
    const auto now = std::chrono::steady_clock::now();
    r->run_at(now + 30ms, [state, text](std::error_code ec) { state->events.push_back("30:" + text(ec)); });
    r->run_at(now + 10ms, [state, text](std::error_code ec) { state->events.push_back("10:" + text(ec)); });
    r->run_at(now - 1s, [state, text](std::error_code ec) { state->events.push_back("past:" + text(ec)); });
    state->cancelled_id =
        r->run_after(20ms, [state, text](std::error_code ec) { state->events.push_back("20:" + text(ec)); });
    CHECK(r->timer_count() == 4);
    CHECK(r->cancel(state->cancelled_id));
    CHECK_FALSE(r->cancel(state->cancelled_id));
    CHECK_FALSE(r->cancel(fw::timer_id{}));
    r->run_after(50ms, [&done](std::error_code) { done.set_value(); });
  });
  auto f = done.get_future();
  get(f);
  auto g = group.submit(0, [state] {
    std::string joined;
    for (const auto& e : state->events) joined += e + ";";
    return joined;
  });
  // The past-due timer fires in the same tick as the task that set it; the
  // cancellation is posted and runs right after.
  CHECK(get(g) == "past:ok;20:operation cancelled;10:ok;30:ok;");
}

TEST_CASE_TEMPLATE("stop completes or refuses every piece of pending work" * doctest::timeout(120), E, ENGINES) {
  for (fw::reactor_mode mode : all_modes) {
    CAPTURE(mode_name(mode));
    std::atomic<int> ran{0}, refused{0}, timer_cancelled{0}, alive{0};
    constexpr int n = 2000;
    {
      fw::basic_reactor_group<E> group(make_config(mode, 2));
      // Long timers: stop must cancel them, not wait for them.
      for (unsigned core = 0; core < 2; ++core) {
        group.submit_to(core, [&] {
          fw::basic_reactor<E>::current()->run_after(1h, [&](std::error_code ec) {
            if (ec == fw::errc::cancelled) timer_cancelled.fetch_add(1);
          });
        });
      }
      std::thread producer([&] {
        for (int i = 0; i < n; ++i) {
          auto token = std::shared_ptr<int>(new int(i), [&](int* p) {
            alive.fetch_sub(1);
            delete p;
          });
          alive.fetch_add(1);
          auto ec = group.submit_to(static_cast<unsigned>(i % 2), [&, token] { ran.fetch_add(1); });
          if (ec) {
            CHECK(ec == fw::errc::cancelled);
            refused.fetch_add(1);
          }
        }
      });
      std::this_thread::sleep_for(1ms);
      group.stop();
      producer.join();
      auto ec = group.submit_to(0, [] {});
      CHECK(ec == fw::errc::cancelled);
      auto f = group.submit(1, [] { return 1; });
      CHECK_THROWS_WITH_AS(f.get(), "reactor task refused: the reactor has stopped: operation cancelled",
                           std::system_error);
    }
    CHECK(ran.load() + refused.load() == n);
    CHECK(timer_cancelled.load() == 2);
    CHECK(alive.load() == 0);
  }
}

TEST_CASE_TEMPLATE("exceptions from tasks and timers are reported, not propagated", E, ENGINES) {
  fw::reactor_config cfg = make_config(fw::reactor_mode::adaptive, 1);
  std::mutex m;
  std::vector<std::string> reports;
  cfg.on_error = [&](unsigned reactor, std::string_view what) {
    std::lock_guard lock(m);
    reports.push_back(std::to_string(reactor) + ": " + std::string(what));
  };
  fw::basic_reactor_group<E> group(cfg);
  group.submit_to(0, [] { throw std::runtime_error("boom"); });
  group.submit_to(0, [] { fw::basic_reactor<E>::current()->run_after(0ms, [](std::error_code) { throw 42; }); });
  auto later = group.submit(0, [] { return 7; });
  CHECK(get(later) == 7);
  std::this_thread::sleep_for(20ms);
  auto f = group.submit(0, [] { return 8; });
  CHECK(get(f) == 8);
  group.stop();
  CHECK(group.at(0).stats().exceptions == 2);
  std::lock_guard lock(m);
  REQUIRE(reports.size() == 2);
  CHECK(reports[0] == "0: exception escaped a task: boom");
  CHECK(reports[1] == "0: exception escaped a timer: an exception not derived from std::exception");
}

TEST_CASE("sender slots are bounded and one per thread per group") {
  fw::reactor_config cfg = make_config(fw::reactor_mode::block, 1);
  cfg.external_senders = 1;
  fw::asio_reactor_group group(cfg);
  fw::asio_reactor_group::sender s(group);
  CHECK_THROWS_WITH_AS(fw::asio_reactor_group::sender{group},
                       "reactor_group::sender: this thread already has one: invalid argument", std::system_error);
  std::thread([&] {
    CHECK_THROWS_WITH_AS(fw::asio_reactor_group::sender{group},
                         "reactor_group::sender: all 1 external sender slots are taken "
                         "(reactor_config::external_senders): invalid argument",
                         std::system_error);
  }).join();
  CHECK_THROWS_WITH_AS(group.submit_to(3, [] {}), "submit_to(3): no such reactor; the group has 1: invalid argument",
                       std::system_error);
}

namespace {

std::vector<int> thread_cpus() {
  std::error_code ec;
  auto cpus = fw::detail::allowed_cpus(ec);
  REQUIRE_FALSE(ec);
  return cpus;
}

}  // namespace

TEST_CASE_TEMPLATE("pinning uses only the CPUs the process is allowed, round-robin", E, ENGINES) {
  const std::vector<int> allowed = thread_cpus();
  REQUIRE_FALSE(allowed.empty());

  SUBCASE("full mask") {
    fw::reactor_config cfg = make_config(fw::reactor_mode::block, 3);
    cfg.pin_cores = true;
    fw::basic_reactor_group<E> group(cfg);
    for (unsigned i = 0; i < 3; ++i) {
      const int want = allowed[i % allowed.size()];
      CHECK(group.at(i).cpu() == want);
      auto f = group.submit(i, [] { return thread_cpus(); });
      CHECK(get(f) == std::vector<int>{want});
    }
  }
  SUBCASE("restricted mask in a child thread") {
    // Keep only the last allowed CPU, as a container's cpuset would.
    const int only = allowed.back();
    std::thread child([&] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(only, &set);
      REQUIRE(sched_setaffinity(0, sizeof set, &set) == 0);
      fw::reactor_config cfg = make_config(fw::reactor_mode::block, 2);
      cfg.pin_cores = true;
      fw::basic_reactor_group<E> group(cfg);
      CHECK(group.allowed_cpus() == std::vector<int>{only});
      for (unsigned i = 0; i < 2; ++i) {
        CHECK(group.at(i).cpu() == only);
        auto f = group.submit(i, [] { return thread_cpus(); });
        CHECK(get(f) == std::vector<int>{only});
      }
    });
    child.join();
  }
  SUBCASE("unpinned reactors keep the creator's mask") {
    fw::basic_reactor_group<E> group(make_config(fw::reactor_mode::block, 2));
    CHECK(group.at(0).cpu() == -1);
    auto f = group.submit(1, [] { return thread_cpus(); });
    CHECK(get(f) == allowed);
  }
}

#if FUSEWIRE_HAS_URING
TEST_CASE("uring engine reports its probed features and falls back when flags are refused") {
  fw::uring_engine::config ecfg;
  fw::uring_reactor_group group(make_config(fw::reactor_mode::block, 1), ecfg);
  auto f = group.submit(0, [] { return fw::uring_reactor::current()->engine().features(); });
  const fw::uring_features features = get(f);
  MESSAGE("features: ", features.to_string());
  CHECK(features.op_recv);
  CHECK(features.to_string().rfind("io_uring setup=", 0) == 0);

  fw::uring_engine::config plain;
  plain.single_issuer = plain.defer_taskrun = plain.coop_taskrun = false;
  plain.provided_buffers = false;
  fw::uring_reactor_group group2(make_config(fw::reactor_mode::block, 1), plain);
  auto g = group2.submit(0, [] { return fw::uring_reactor::current()->engine().features(); });
  const fw::uring_features p = get(g);
  CHECK_FALSE(p.single_issuer);
  CHECK_FALSE(p.defer_taskrun);
  CHECK_FALSE(p.buf_ring);
  CHECK(p.buf_ring_error == "disabled by config");
}

// A block-mode reactor with a far timer pending sleeps once per message: one
// ring timeout must serve all those sleeps, and must still move when a nearer
// timer comes (or when the armed one fired and a new deadline follows it).
TEST_CASE("uring engine: one armed ring timeout serves many sleeps and moves for an earlier timer" *
          doctest::timeout(120)) {
  fw::uring_reactor_group group(make_config(fw::reactor_mode::block, 1));
  using clock = std::chrono::steady_clock;
  auto ext = group.submit(0, [] {
    auto* r = fw::uring_reactor::current();
    r->run_after(60s, [](std::error_code) {});
    return r->engine().features().ext_arg;
  });
  if (!get(ext)) {
    MESSAGE("kernel without IORING_FEAT_EXT_ARG: the reactor passes a timeout to each wait instead");
    return;
  }
  // Wake the sleeping reactor 200 times (a task, then 200 us idle).
  const auto read_arms = [&] {
    auto f = group.submit(0, [] { return fw::uring_reactor::current()->engine().timeout_arms(); });
    return get(f);
  };
  const std::uint64_t arms0 = read_arms();
  const std::uint64_t sleeps0 = group.at(0).stats().sleeps;
  for (int i = 0; i < 200; ++i) {
    auto f = group.submit(0, [i] { return i; });
    CHECK(get(f) == i);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const std::uint64_t sleeps = group.at(0).stats().sleeps - sleeps0;
  const std::uint64_t arms = read_arms() - arms0;
  MESSAGE(sleeps, " sleeps, ", arms, " timeout arms");
  CHECK(sleeps >= 100);
  CHECK(arms <= 2);  // not one per sleep

  // A nearer timer, set while the 60 s one is armed, fires on time; then one
  // set after the armed timeout fired (a stale deadline) does too.
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    auto fired = std::make_shared<std::promise<clock::time_point>>();  // outlives a failed wait
    auto f = fired->get_future();
    const auto set = clock::now();
    group.submit_to(0, [fired] {
      fw::uring_reactor::current()->run_after(30ms, [fired](std::error_code) { fired->set_value(clock::now()); });
    });
    REQUIRE_MESSAGE(f.wait_for(20s) == std::future_status::ready, "a 30 ms timer did not fire while the reactor slept");
    CHECK(f.get() - set >= 30ms);
    std::this_thread::sleep_for(20ms);  // let it sleep again
  }
}
#endif

#if FUSEWIRE_HAS_URING
// The kernel fills a provided buffer; take() hands it out under a control block
// made with the ring (one per buffer id). Here take() stands in for the kernel.
TEST_CASE("provided buffers: handed out without an allocation, back in the ring when the last alias dies") {
  io_uring ring;
  REQUIRE(io_uring_queue_init(8, &ring, 0) == 0);
  std::error_code ec;
  auto br = fw::detail::provided_buffer_ring::create(ring, 7, 4, 64, ec);
  if (!br) {
    io_uring_queue_exit(&ring);
    MESSAGE("no provided-buffer rings on this kernel: ", ec.message());
    return;
  }
  REQUIRE(br->in_ring() == 4);

  SUBCASE("the last alias puts it back, and the same id goes out again with a fresh count") {
    for (int round = 0; round < 3; ++round) {
      fw::tensor_buffer a = br->take(1, 10);
      std::memset(a.data(), 'a' + round, a.size());
      CHECK(a.size() == 10);
      CHECK(br->in_ring() == 3);
      fw::tensor_buffer b = a.share(2, 4);
      CHECK(b.use_count() == 2);
      a = fw::tensor_buffer();
      CHECK(br->in_ring() == 3);  // b still holds it
      CHECK(static_cast<char>(b.data()[0]) == 'a' + round);
      b = fw::tensor_buffer();
      CHECK(br->in_ring() == 4);
    }
    CHECK(br->handed_over() == 3);
  }
  SUBCASE("dropped on another thread: queued, put back by the owning thread") {
    fw::tensor_buffer a = br->take(2, 20);
    std::thread([a = std::move(a)]() mutable { a = fw::tensor_buffer(); }).join();
    CHECK(br->in_ring() == 3);
    br->collect_returns();
    CHECK(br->in_ring() == 4);
  }
  SUBCASE("a buffer that outlives its ring keeps its bytes") {
    fw::tensor_buffer a = br->take(3, 64);
    std::memset(a.data(), 'z', a.size());
    br.reset();  // the ring goes; its memory stays while `a` holds it (ASan would see a use after free)
    CHECK(static_cast<char>(a.data()[63]) == 'z');
    a = fw::tensor_buffer();
  }
  br.reset();
  io_uring_queue_exit(&ring);
}
#endif

namespace {

/// A spin reader that counts its calls and gives the answer it is told.
struct counting_reader final : fw::detail::spin_reader {
  std::atomic<int> calls{0};
  std::atomic<int> stopped{0};  // spin_stopped() calls
  std::atomic<result> answer{result::idle};
  std::function<void()> during;  // runs inside each call
  result spin_read() override {
    ++calls;
    if (during) during();
    return answer.load();
  }
  void spin_stopped() noexcept override { ++stopped; }
};

template <class E>
E& this_engine() {
  return fw::basic_reactor<E>::current()->engine();
}

}  // namespace

TEST_CASE_TEMPLATE("a spinning reactor reads the connections it watches each tick, the latest ones first", E, ENGINES) {
  for (fw::reactor_mode mode : all_modes) {
    CAPTURE(mode_name(mode));
    counting_reader a, b, c, d;  // outlive the reactor, which may still call them until it stops
    typename E::config ecfg;
    ecfg.spin_readers = 2;
    fw::basic_reactor_group<E> group(make_config(mode, 1), ecfg);
    auto on = [&group](auto fn) {
      auto f = group.submit(0, std::move(fn));
      return get(f);
    };
#if FUSEWIRE_HAS_URING
    if constexpr (std::is_same_v<E, fw::uring_engine>) {
      if (!on([] { return this_engine<E>().features().defer_taskrun; })) {
        MESSAGE("no DEFER_TASKRUN on this kernel: spin reads are off");
        CHECK_FALSE(on([] { return this_engine<E>().spin_reads(); }));
        return;
      }
    }
#endif
    if (mode == fw::reactor_mode::block) {
      // Never spins: watching does nothing.
      on([&] {
        this_engine<E>().watch(a);
        return 0;
      });
      std::this_thread::sleep_for(20ms);
      on([] { return 0; });
      CHECK_FALSE(on([] { return this_engine<E>().spin_reads(); }));
      CHECK(a.calls == 0);
      continue;
    }
    // Spinning starts with the first spinning tick.
    REQUIRE(eventually([&] { return on([] { return this_engine<E>().spin_reads(); }); }));
    on([&] {  // two places: the first one watched is evicted
      this_engine<E>().watch(a);
      this_engine<E>().watch(b);
      this_engine<E>().watch(c);
      this_engine<E>().watch(b);  // already watched: stays where it is
      return 0;
    });
    CHECK(eventually([&] { return b.calls > 0 && c.calls > 0; }));
    CHECK(a.calls == 0);
    CHECK(a.stopped == 1);  // told when evicted, so that its engine reports it again
    if (mode == fw::reactor_mode::adaptive) {
      // It sleeps after 50 us: no more calls to count. The uring engine then
      // tells every watched reader (its connections arm their multishot recvs).
#if FUSEWIRE_HAS_URING
      if constexpr (std::is_same_v<E, fw::uring_engine>) {
        CHECK(eventually([&] { return b.stopped == 1 && c.stopped == 1; }));
      }
#endif
      continue;
    }
    CHECK(b.stopped == 0);  // watched again while watched: no change

    // A reader that says done is called no more.
    c.answer = counting_reader::result::done;
    CHECK(eventually([&] { return on([&] { return c.calls.load(); }) == on([&] { return c.calls.load(); }); }));
    const int c_calls = c.calls;
    const int b_calls = b.calls;
    CHECK(eventually([&] { return b.calls > b_calls + 100; }));
    CHECK(c.calls == c_calls);
    CHECK(c.stopped == 1);  // it said done: told once

    // A reader unwatched by an earlier reader's call in the same tick is not called in it.
    int b_watched_at = 0;
    on([&] {
      this_engine<E>().unwatch(b);
      d.during = [&b] { this_engine<E>().unwatch(b); };
      this_engine<E>().watch(d);
      this_engine<E>().watch(b);
      b_watched_at = b.calls;
      return 0;
    });
    CHECK(eventually([&] { return d.calls > 100; }));
    CHECK(b.calls == b_watched_at);
    CHECK(b.stopped == 0);  // unwatched by a call, not stopped by the list
    on([&] {
      this_engine<E>().unwatch(d);
      return 0;
    });
  }
}

namespace {

/// The hooks an engine needs, without a reactor: a wake eventfd nobody writes.
class bare_hooks final : public fw::detail::engine_hooks {
 public:
  bare_hooks() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) { REQUIRE(fd_ >= 0); }
  ~bare_hooks() { ::close(fd_); }
  bare_hooks(const bare_hooks&) = delete;
  bare_hooks& operator=(const bare_hooks&) = delete;
  int wake_fd() const noexcept override { return fd_; }
  void report(std::string_view) noexcept override {}

 private:
  int fd_;
};

}  // namespace

TEST_CASE("an idle spinning Asio engine asks epoll ever less often, and again at once after a handler") {
  bare_hooks hooks;
  fw::asio_engine::config cfg;
  cfg.idle_poll_stride = 8;
  fw::asio_engine engine(cfg, hooks);
  int ran = 0;
  auto post_one = [&] { boost::asio::post(engine.context(), [&ran] { ++ran; }); };
  // Calls of poll_spinning() until the posted handler ran.
  auto calls_until_run = [&] {
    const int before = ran;
    int calls = 0;
    while (ran == before) {
      ++calls;
      const bool worked = engine.poll_spinning();
      CHECK(worked == (ran != before));
      REQUIRE(calls <= 64);
    }
    return calls;
  };

  post_one();
  CHECK(calls_until_run() == 1);  // a fresh engine asks at once

  // An event is seen at most as many calls late as had passed since the last
  // handler ran (the gap doubles: asked after 1, 2, 4, ... calls).
  for (int idle = 0; idle <= 20; ++idle) {
    CAPTURE(idle);
    post_one();
    REQUIRE(calls_until_run() == 1);  // right after a handler: asked at once
    for (int i = 0; i < idle; ++i) CHECK_FALSE(engine.poll_spinning());
    post_one();
    const int late = calls_until_run();
    CHECK(late <= idle + 1);
    CHECK(late <= 8);  // never more than the stride apart
  }

  // A long idle spell: still at most the stride.
  for (int i = 0; i < 1000; ++i) (void)engine.poll_spinning();
  post_one();
  CHECK(calls_until_run() <= 8);

  // poll() always asks, whatever the gap.
  for (int i = 0; i < 100; ++i) (void)engine.poll_spinning();
  post_one();
  CHECK(engine.poll());
}
