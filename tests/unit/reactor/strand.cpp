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

TEST_CASE("strand: a runner passes a long queue on, and resume() runs the rest in order") {
  strand s(2);
  std::vector<int> order;
  std::vector<std::function<void()>> passed;  // where pass() puts the continuation
  auto pass = [&] {
    passed.push_back([&] { s.resume([] { return false; }); });
    return true;
  };
  s.run(
      [&] {
        for (int i = 1; i <= 5; ++i) s.run([&order, i] { order.push_back(i); }, pass);
      },
      pass);
  CHECK(order == std::vector<int>{1, 2});  // a batch of two, then passed on
  REQUIRE(passed.size() == 1);
  CHECK(s.busy());
  s.run([&] { order.push_back(6); }, pass);  // still busy: queued behind 3, 4, 5
  CHECK(order == std::vector<int>{1, 2});
  const auto next = passed.back();
  // resume's own pass refuses: after the next batch of two, the rest is dropped.
  next();
  CHECK(order == std::vector<int>{1, 2, 3, 4});
  CHECK_FALSE(s.busy());
  s.run([&] { order.push_back(7); }, pass);  // a free strand again
  CHECK(order == std::vector<int>{1, 2, 3, 4, 7});
}

TEST_CASE("strand: a job that throws does not stop the ones after it") {
  strand s;
  std::vector<int> order;
  CHECK_THROWS_AS(s.run(
                      [&] {
                        s.run([&] { throw std::runtime_error("second"); }, no_pass);
                        s.run([&] { order.push_back(3); }, no_pass);
                        order.push_back(1);
                        throw std::runtime_error("first");
                      },
                      no_pass),
                  std::runtime_error);
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
