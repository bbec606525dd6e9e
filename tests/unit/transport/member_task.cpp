// transport::detail::member_task: the posted call embedded in a connection
// state (the TCP transports' read and write pumps, asio's write completions).
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/detail/member_task.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "support/reactor_wait.hpp"

namespace fw = fusewire;
using namespace std::chrono_literals;

using fw::test::get;
using fw::test::make_config;

namespace {

/// A ref_counted state with an embedded posted call, as the TCP transports have.
struct pumped final : fw::detail::ref_counted {
  explicit pumped(std::atomic<int>* alive) : alive_(alive) { ++*alive_; }
  ~pumped() override { --*alive_; }
  void pump() {
    ++runs;
    if (again > 0) {
      --again;
      task.schedule(*fw::asio_reactor::current());
    }
  }
  std::atomic<int>* alive_;
  int runs = 0;
  int again = 0;
  fw::detail::member_task<pumped> task{*this, &pumped::pump};
};

}  // namespace

TEST_CASE("member_task: posted without an allocation, once at a time, holding its state until it ran") {
  fw::asio_reactor_group group(make_config(fw::reactor_mode::block, 1));
  std::atomic<int> alive{0};
  auto on_reactor = [&group](auto fn) {
    auto f = group.submit(0, std::move(fn));
    return get(f);
  };
  // Reads s->runs on the reactor until it reaches `n` (bounded).
  auto wait_runs = [&](const fw::detail::ref_ptr<pumped>& s, int n) {
    int seen = -1;
    for (int i = 0; i < 2000 && seen != n; ++i) {
      seen = on_reactor([&s] { return s->runs; });
      if (seen != n) std::this_thread::sleep_for(1ms);
    }
    return seen;
  };

  SUBCASE("two schedules before it runs give one run; a run may schedule it again") {
    auto s = on_reactor([&alive] {
      fw::detail::ref_ptr<pumped> p(new pumped(&alive));
      p->task.schedule(*fw::asio_reactor::current());
      p->task.schedule(*fw::asio_reactor::current());
      CHECK(p->task.scheduled());
      CHECK(p->runs == 0);         // never inline
      CHECK(p->use_count() == 2);  // ours and the queue's
      return p;
    });
    CHECK(wait_runs(s, 1) == 1);
    CHECK(on_reactor([&s] { return s->use_count(); }) == 1);  // the queue let go once it ran
    on_reactor([&s] {
      s->again = 2;
      s->task.schedule(*fw::asio_reactor::current());
    });
    CHECK(wait_runs(s, 4) == 4);
    CHECK_FALSE(on_reactor([&s] { return s->task.scheduled(); }));
    on_reactor([s = std::move(s)]() mutable { s.reset(); });
    CHECK(alive == 0);
  }
  SUBCASE("the queue's reference keeps a state alive that nobody else holds") {
    on_reactor([&alive] {
      fw::detail::ref_ptr<pumped> p(new pumped(&alive));
      p->task.schedule(*fw::asio_reactor::current());
    });  // our reference is gone: the queued call still runs on a live state, then frees it
    for (int i = 0; i < 2000 && alive != 0; ++i) std::this_thread::sleep_for(1ms);
    CHECK(alive == 0);
  }
  SUBCASE("a reactor that stops with the call queued leaves nothing behind") {
    fw::asio_reactor_group other(make_config(fw::reactor_mode::block, 1));
    auto f = other.submit(0, [&alive] {
      fw::detail::ref_ptr<pumped> p(new pumped(&alive));
      p->task.schedule(*fw::asio_reactor::current());
    });
    get(f);
    other.stop();
    CHECK(alive == 0);
  }
}
