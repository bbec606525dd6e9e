#include <fusewire/graph/local_cluster.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <system_error>

#include "support/graphs.hpp"
#include "support/tensor_string_maker.hpp"

namespace local_cluster_threads_cases {

namespace fg = fusewire::graph;
using fusewire::errc;
using namespace fusewire::test;

TEST_CASE("one thread per task computes what one process computes") {
  struct mode {
    fg::partition_mode m;
    bool fuse;
  };
  SUBCASE("wide-and-deep") {
    fg::placed_graph g(wide_and_deep());
    const auto feeds = wide_and_deep_feeds();
    for (auto [m, fuse] :
         {mode{fg::partition_mode::send_recv, false}, mode{fg::partition_mode::send_recv, true},
          mode{fg::partition_mode::star_server, false}, mode{fg::partition_mode::star_server_lite, false}}) {
      CAPTURE(fg::to_string(m));
      fg::partition_options o;
      o.mode = m;
      o.tensor_fuse = fuse;
      auto p = fg::partition(g, o);
      fg::executor single(g);
      fg::local_cluster cluster(p);
      for (int step = 0; step < 3; ++step) {
        auto want = single.run(feeds, {"out"});
        CHECK(cluster.run_threaded(feeds, {"out"}) == want);
        CHECK(cluster.last_step_traffic().messages == p.per_step().messages);
      }
      CHECK(*cluster.variable("ps1/wide") == *single.variable("ps1/wide"));
    }
  }
  SUBCASE("a loop spanning two tasks") {
    fg::placed_graph g(rnn_loop());
    const fg::feed_map feeds{{"h0", fg::tensor({1, 4}, {0.5f, 1, -1, 2})}};
    for (auto m : {fg::partition_mode::send_recv, fg::partition_mode::star_server}) {
      CAPTURE(fg::to_string(m));
      fg::partition_options o;
      o.mode = m;
      auto p = fg::partition(g, o);
      fg::executor single(g);
      fg::local_cluster cluster(p);
      for (int step = 0; step < 3; ++step) {
        auto want = single.run(feeds, {"rnn/while/exit_h", "update_b"});
        CHECK(cluster.run_threaded(feeds, {"rnn/while/exit_h", "update_b"}) == want);
      }
    }
  }
}

TEST_CASE("a task that waits too long fails the step instead of hanging") {
  fg::local_cluster cluster(deadlocked_plan());
  try {
    cluster.run_threaded({}, {}, std::chrono::milliseconds(100));
    FAIL("expected a timeout");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::timed_out);
    const std::string what = e.what();
    CHECK((what.rfind("step 1: worker:0 waited longer than 100 ms for: node 'r' (_Recv)", 0) == 0 ||
           what.rfind("step 1: ps:0 waited longer than 100 ms for: node 'r2' (_Recv)", 0) == 0));
  }
}

}  // namespace local_cluster_threads_cases
