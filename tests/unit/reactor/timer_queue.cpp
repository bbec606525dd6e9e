#include <fusewire/util/timer_queue.hpp>

#include <doctest/doctest.h>

#include <vector>

using fusewire::util::timer_queue;
using namespace std::chrono_literals;

TEST_CASE("timer_queue fires due timers in deadline order, then by insertion") {
  timer_queue q;
  const auto t0 = timer_queue::clock::time_point{} + 1s;
  std::vector<int> fired;
  q.add(t0 + 3ms, [&](std::error_code) { fired.push_back(3); });
  q.add(t0 + 1ms, [&](std::error_code) { fired.push_back(1); });
  q.add(t0 + 2ms, [&](std::error_code) { fired.push_back(2); });
  q.add(t0 + 1ms, [&](std::error_code) { fired.push_back(11); });
  CHECK(q.size() == 4);
  CHECK(*q.next_deadline() == t0 + 1ms);

  CHECK(q.take_expired(t0, [](timer_queue::callback cb) { cb({}); }) == 0);
  CHECK(q.take_expired(t0 + 2ms, [](timer_queue::callback cb) { cb({}); }) == 3);
  CHECK(fired == std::vector<int>{1, 11, 2});
  CHECK(*q.next_deadline() == t0 + 3ms);
  q.take_expired(t0 + 10ms, [](timer_queue::callback cb) { cb({}); });
  CHECK(fired == std::vector<int>{1, 11, 2, 3});
  CHECK(q.empty());
  CHECK_FALSE(q.next_deadline().has_value());
}

TEST_CASE("timer_queue remove returns the callback once and skips it afterwards") {
  timer_queue q;
  const auto t0 = timer_queue::clock::time_point{} + 1s;
  int fired = 0;
  const auto a = q.add(t0, [&](std::error_code) { ++fired; });
  const auto b = q.add(t0 + 1ms, [&](std::error_code) { fired += 10; });
  timer_queue::callback cb = q.remove(a);
  REQUIRE(static_cast<bool>(cb));
  CHECK_FALSE(static_cast<bool>(q.remove(a)));
  CHECK(*q.next_deadline() == t0 + 1ms);
  q.take_expired(t0 + 1s, [](timer_queue::callback c) { c({}); });
  CHECK(fired == 10);
  CHECK_FALSE(static_cast<bool>(q.remove(b)));
}

TEST_CASE("timer_queue compacts when most entries are cancelled") {
  timer_queue q;
  const auto t0 = timer_queue::clock::time_point{} + 1s;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(q.add(t0 + std::chrono::milliseconds(i), [](std::error_code) {}));
  for (int i = 0; i < 999; ++i) q.remove(ids[static_cast<std::size_t>(i)]);
  CHECK(q.size() == 1);
  CHECK(*q.next_deadline() == t0 + 999ms);
  int n = 0;
  q.take_all([&](timer_queue::callback) { ++n; });
  CHECK(n == 1);
  CHECK(q.empty());
}

TEST_CASE("timer_queue take_expired: a cancelled earlier entry neither fires nor hides a due later one") {
  timer_queue q;
  const auto t0 = timer_queue::clock::time_point{} + 1s;
  std::vector<int> fired;
  const auto early = q.add(t0 + 1ms, [&](std::error_code) { fired.push_back(1); });
  q.add(t0 + 2ms, [&](std::error_code) { fired.push_back(2); });
  q.add(t0 + 5ms, [&](std::error_code) { fired.push_back(5); });
  REQUIRE(static_cast<bool>(q.remove(early)));
  // Before every deadline (the dead entry's included): nothing taken, nothing lost.
  CHECK(q.take_expired(t0, [](timer_queue::callback cb) { cb({}); }) == 0);
  CHECK(q.size() == 2);
  // Past the dead entry's deadline but before the next live one.
  CHECK(q.take_expired(t0 + 1ms, [](timer_queue::callback cb) { cb({}); }) == 0);
  CHECK(fired.empty());
  CHECK(q.take_expired(t0 + 2ms, [](timer_queue::callback cb) { cb({}); }) == 1);
  CHECK(fired == std::vector<int>{2});
  CHECK(*q.next_deadline() == t0 + 5ms);
  CHECK(q.take_expired(t0 + 4ms, [](timer_queue::callback cb) { cb({}); }) == 0);
  CHECK(q.take_expired(t0 + 5ms, [](timer_queue::callback cb) { cb({}); }) == 1);
  CHECK(fired == std::vector<int>{2, 5});
  CHECK(q.empty());
}

TEST_CASE("not_before is never later than the first live deadline; the coarse clock never runs ahead") {
  timer_queue q;
  CHECK(q.not_before() == timer_queue::clock::time_point::max());
  const auto t0 = timer_queue::clock::time_point{} + 1s;
  const auto a = q.add(t0, [](std::error_code) {});
  q.add(t0 + 5ms, [](std::error_code) {});
  CHECK(q.not_before() == t0);
  (void)q.remove(a);  // cancelled but still on top: not_before stays at or before the live one
  CHECK(q.not_before() <= t0 + 5ms);
  CHECK(*q.next_deadline() == t0 + 5ms);
  CHECK(q.not_before() == t0 + 5ms);
  // The reactor skips the precise clock when coarse_now() + coarse_lag() is before not_before():
  // that needs the coarse clock to lag steady_clock by less than coarse_lag().
  CHECK(fusewire::util::coarse_lag() > timer_queue::clock::duration::zero());
  for (int i = 0; i < 1000; ++i) {
    // Each bound is read in the order that a pause between the reads can only loosen.
    const auto before = timer_queue::clock::now();
    const auto coarse = fusewire::util::coarse_now();
    const auto after = timer_queue::clock::now();
    CHECK(coarse <= after);
    CHECK(before - coarse < fusewire::util::coarse_lag());
  }
}
