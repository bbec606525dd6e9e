#include <fusewire/util/strand.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

using fusewire::util::strand;

namespace {
/// A pass that never is asked for (the batch is never reached).
bool no_pass() {
  FAIL("the strand passed itself on");
  return false;
}
}  // namespace

TEST_CASE("strand: an idle strand runs the job on the calling thread, at once") {
  strand s;
  std::thread::id ran_on;
  s.run([&] { ran_on = std::this_thread::get_id(); }, no_pass);
  CHECK(ran_on == std::this_thread::get_id());
  CHECK_FALSE(s.busy());
}

TEST_CASE("strand: a job given while one runs waits for it, and runs on the runner's thread") {
  strand s;
  std::vector<int> order;
  s.run(
      [&] {
        // Given from inside the running job (as another reactor would while it runs):
        s.run([&] { order.push_back(2); }, no_pass);
        s.run([&] { order.push_back(3); }, no_pass);
        order.push_back(1);  // the queued ones have not run yet
      },
      no_pass);
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK_FALSE(s.busy());
}

/// Records the continuation a pass hands on, for the test to run later.
struct recorded_passes {
  strand& s;
  std::vector<std::function<void()>> continuations;
  bool operator()() {
    continuations.push_back([this] { s.resume([] { return false; }); });
    return true;
  }
};

TEST_CASE("strand: a runner passes a long queue on, and resume() runs the rest in order") {
  strand s(2);
  std::vector<int> order;
  recorded_passes passes{s, {}};
  auto pass = [&] { return passes(); };
  s.run(
      [&] {
        for (int i = 1; i <= 5; ++i) s.run([&order, i] { order.push_back(i); }, pass);
      },
      pass);
  CHECK(order == std::vector<int>{1, 2});  // a batch of two, then passed on
  REQUIRE(passes.continuations.size() == 1);
  CHECK(s.busy());
  s.run([&] { order.push_back(6); }, pass);  // still busy: queued behind 3, 4, 5
  CHECK(order == std::vector<int>{1, 2});
  // resume's own pass refuses: the runner keeps the strand and runs all the rest.
  passes.continuations.back()();
  CHECK(order == std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK_FALSE(s.busy());
  s.run([&] { order.push_back(7); }, pass);  // a free strand again
  CHECK(order == std::vector<int>{1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("strand: a pass that throws leaves the strand with its runner") {
  strand s(1);
  std::vector<int> order;
  auto pass = []() -> bool { throw std::runtime_error("no reactor"); };
  s.run(
      [&] {
        for (int i = 1; i <= 3; ++i) s.run([&order, i] { order.push_back(i); }, pass);
      },
      pass);
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK_FALSE(s.busy());
}

TEST_CASE("strand: post() starts an idle strand through pass, and queues behind a busy one") {
  strand s;
  std::vector<int> order;
  recorded_passes passes{s, {}};
  auto pass = [&] { return passes(); };
  s.post([&] { order.push_back(1); }, pass);
  CHECK(order.empty());  // not run here
  REQUIRE(passes.continuations.size() == 1);
  CHECK(s.busy());
  s.run([&] { order.push_back(2); }, pass);  // busy: queued behind 1
  s.post([&] { order.push_back(3); }, pass);
  CHECK(passes.continuations.size() == 1);  // started once
  passes.continuations.back()();
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK_FALSE(s.busy());
  s.post([&] { order.push_back(4); }, [] { return false; });  // nowhere to pass: runs here
  CHECK(order == std::vector<int>{1, 2, 3, 4});
  CHECK_FALSE(s.busy());
}

TEST_CASE("strand: a job that throws: its runner passes the rest on and rethrows") {
  strand s;
  std::vector<int> order;
  recorded_passes passes{s, {}};
  auto pass = [&] { return passes(); };
  CHECK_THROWS_WITH_AS(s.run(
                           [&] {
                             s.run([&] { order.push_back(2); }, pass);
                             order.push_back(1);
                             throw std::runtime_error("first");
                           },
                           pass),
                       "first", std::runtime_error);
  CHECK(order == std::vector<int>{1});
  REQUIRE(passes.continuations.size() == 1);
  passes.continuations.back()();
  CHECK(order == std::vector<int>{1, 2});
  CHECK_FALSE(s.busy());
}

TEST_CASE("strand: with nowhere to pass, a runner runs every job and rethrows the first exception") {
  strand s;
  std::vector<int> order;
  auto pass = [] { return false; };
  CHECK_THROWS_WITH_AS(s.run(
                           [&] {
                             s.run([&] { throw std::runtime_error("second"); }, pass);
                             s.run([&] { order.push_back(3); }, pass);
                             order.push_back(1);
                             throw std::runtime_error("first");
                           },
                           pass),
                       "first", std::runtime_error);
  CHECK(order == std::vector<int>{1, 3});
  CHECK_FALSE(s.busy());
  s.run([&] { order.push_back(4); }, no_pass);
  CHECK(order == std::vector<int>{1, 3, 4});
}

TEST_CASE("strand: threads feeding one strand: one job at a time, each thread's jobs in order") {
  strand s(8);
  constexpr int threads = 4, per_thread = 20000;
  int running = 0;  // guarded by the strand alone: a race here is TSan's to see
  bool overlap = false;
  std::vector<int> last(threads, -1);
  bool out_of_order = false;
  long total = 0;
  std::atomic<int> passes{0};
  // No reactor here: a pass leaves the rest to the passing thread, which
  // resumes once its run() returned (as a reactor posting to itself).
  static thread_local bool resume_here = false;
  auto pass = [&] {
    passes.fetch_add(1, std::memory_order_relaxed);
    resume_here = true;
    return true;
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        s.run(
            [&, t, i] {
              if (++running != 1) overlap = true;
              if (last[t] + 1 != i) out_of_order = true;
              last[t] = i;
              ++total;
              --running;
            },
            pass);
        while (std::exchange(resume_here, false)) s.resume(pass);
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK_FALSE(s.busy());
  CHECK_FALSE(overlap);
  CHECK_FALSE(out_of_order);
  CHECK(total == long{threads} * per_thread);
}
