#include <fusewire/graph/graph.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include "support/error_text.hpp"
#include "support/graphs.hpp"
#include "support/tensor_string_maker.hpp"

namespace graph_cases {

namespace fg = fusewire::graph;
using fusewire::errc;
using namespace fusewire::test;

namespace {

// The what() of the system_error that validating `g` throws.
std::string invalid(fg::graph_def g) {
  return error_of([&] { fg::placed_graph p(std::move(g)); }, errc::invalid_graph);
}

fg::graph_def two_tasks() {
  fg::graph_def g;
  g.tasks = {worker_task, ps0_task};
  return g;
}

}  // namespace

TEST_CASE("parse_task accepts the task and device forms TensorFlow writes") {
  CHECK(fg::parse_task("/job:ps/replica:0/task:1") == fusewire::task_id{"ps", 1});
  CHECK(fg::parse_task("/job:worker/task:3") == fusewire::task_id{"worker", 3});
  CHECK(fg::parse_task("/job:ps/replica:0/task:0/device:CPU:0") == fusewire::task_id{"ps", 0});
  CHECK(fg::parse_task("/job:chief_2/replica:0/task:12/cpu:0") == fusewire::task_id{"chief_2", 12});
  CHECK(fg::parse_task("/task:4/job:ps") == fusewire::task_id{"ps", 4});  // any order, as TensorFlow allows
  CHECK(fg::task_name(fusewire::task_id{"ps", 2}) == "/job:ps/replica:0/task:2");
  CHECK(fg::parse_task(fg::task_name(fusewire::task_id{"worker", 7})) == fusewire::task_id{"worker", 7});
}

TEST_CASE("parse_task names the bad part") {
  auto message = [](std::string_view text) { return error_of([&] { fg::parse_task(text); }, errc::invalid_argument); };
  CHECK(message("ps:0") ==
        "bad task 'ps:0': unexpected 'ps:0' (expected /job:, /replica:, /task:, /device:, /cpu: or /gpu:): "
        "invalid argument");
  CHECK(message("/job:1ps/task:0") ==
        "bad task '/job:1ps/task:0': job name '1ps' must be a letter followed by letters, digits or '_': "
        "invalid argument");
  CHECK(message("/job:ps/replica:x/task:0") ==
        "bad task '/job:ps/replica:x/task:0': replica 'x' is not a number: invalid argument");
  CHECK(message("/job:ps/replica:2/task:0") ==
        "bad task '/job:ps/replica:2/task:0': replica 2 is not supported (only replica 0): invalid argument");
  CHECK(message("/job:ps/replica:0") ==
        "bad task '/job:ps/replica:0': it names no task; a task needs /job:<name> and /task:<index>: "
        "invalid argument");
  CHECK(message("/task:0/device:CPU:0") ==
        "bad task '/task:0/device:CPU:0': it names no job; a task needs /job:<name> and /task:<index>: "
        "invalid argument");
  CHECK(message("/job:ps/task:-1") == "bad task '/job:ps/task:-1': task '-1' is not a number: invalid argument");
  CHECK(message("/job:ps/task:0/foo") ==
        "bad task '/job:ps/task:0/foo': unexpected '/foo' (expected /job:, /replica:, /task:, /device:, /cpu: or "
        "/gpu:): invalid argument");

  std::error_code ec;
  std::string why;
  CHECK_FALSE(fg::parse_task("/job:ps", ec, &why));
  CHECK(ec == errc::invalid_argument);
  CHECK(why == "it names no task; a task needs /job:<name> and /task:<index>");
  auto ok = fg::parse_task("/job:ps/task:4", ec);
  CHECK_FALSE(ec);
  REQUIRE(ok);
  CHECK(ok->index == 4);
}

TEST_CASE("tensor_spec sizes and prints; fully known, it is a core tensor_descriptor") {
  fg::tensor_spec s{fusewire::dtype::float32, {4, 8}};
  CHECK(s.byte_size() == 128u);
  CHECK(s.to_string() == "float32[4,8]");
  REQUIRE(s.descriptor());
  CHECK(*s.descriptor() == fusewire::tensor_descriptor::make(fusewire::dtype::float32, {4, 8}));
  CHECK(fg::tensor_spec{fusewire::dtype::int64, {}}.byte_size() == 8u);
  CHECK(fg::tensor_spec{fusewire::dtype::bfloat16, {3}}.byte_size() == 6u);
  fg::tensor_spec unknown{fusewire::dtype::float32, {-1, 8}};
  CHECK_FALSE(unknown.byte_size());
  CHECK_FALSE(unknown.descriptor());
  CHECK(unknown.to_string() == "float32[?,8]");
  CHECK_FALSE(fg::tensor_spec{fusewire::dtype::float32, std::vector<std::int64_t>(9, 1)}.descriptor());
  CHECK_FALSE(fg::tensor_spec{fusewire::dtype::float64, {INT64_MAX / 4, 2}}.byte_size());  // overflows int64
  CHECK(fg::token_descriptor().byte_size() == 0u);
}

TEST_CASE("a placed graph indexes tasks, edges, waves and inferred specs") {
  fg::placed_graph g(diamond());
  REQUIRE(g.tasks().size() == 3);
  CHECK(g.tasks()[2] == fusewire::task_id{"ps", 1});
  const auto x = *g.find("x"), a = *g.find("a"), b = *g.find("b"), d = *g.find("d");
  CHECK(g.task_of(x) == 0);
  CHECK(g.task_of(a) == 1);
  CHECK(g.task_of(b) == 2);
  CHECK(g.data_input_count(d) == 2);
  CHECK(g.out_edges(x).size() == 2);
  CHECK(g.wave(x) == 0);
  CHECK(g.wave(a) == 1);
  CHECK(g.wave(d) == 2);
  REQUIRE(g.output_spec(d, 0));
  CHECK(*g.output_spec(d, 0) == fg::tensor_spec{fusewire::dtype::float32, {2, 2}});
  CHECK_FALSE(g.has_loops());
  CHECK_FALSE(g.find("nope"));
  const auto& order = g.topological_order();
  CHECK(order.size() == g.size());
  CHECK(std::find(order.begin(), order.end(), a) < std::find(order.begin(), order.end(), d));
}

TEST_CASE("specs are inferred through Gather, Concat and MatMul, and declared ones win") {
  fg::graph_def g = two_tasks();
  placeholder(g, "ids", worker, {3});
  variable(g, "table", ps0, {10, 4}, ramp(40, 0, 1));
  g.add("rows", "Gather", {"table", "ids"}, ps0);
  g.add("both", "Concat", {"rows", "rows"}, worker).set("axis", std::int64_t{1});
  variable(g, "w", worker, {8, 2}, ramp(16, 0, 1));
  g.add("mm", "MatMul", {"both", "w"}, worker);
  g.add("opaque", "SomeCustomOp", {"mm"}, worker);
  g.add("declared", "SomeCustomOp", {"mm"}, worker).spec({fusewire::dtype::int64, {5}});
  fg::placed_graph p(g);
  auto spec = [&](const char* name) { return p.output_spec(*p.find(name), 0); };
  CHECK(spec("rows")->shape == std::vector<std::int64_t>{3, 4});
  CHECK(spec("both")->shape == std::vector<std::int64_t>{3, 8});
  CHECK(spec("mm")->shape == std::vector<std::int64_t>{3, 2});
  CHECK_FALSE(spec("opaque"));
  CHECK(spec("declared")->byte_size() == 40u);
}

TEST_CASE("loop frames are inferred from Enter and Exit") {
  fg::placed_graph g(rnn_loop());
  REQUIRE(g.frames().size() == 2);
  const auto& f = g.frames()[1];
  CHECK(f.name == "rnn/while");
  CHECK(f.parent == 0);
  CHECK(f.depth == 1);
  CHECK(f.home_task == 0);
  REQUIRE(f.loop_cond);
  CHECK(g.node(*f.loop_cond).name == "rnn/while/cond");
  CHECK(f.enters.size() == 7);
  CHECK(f.exits.size() == 2);
  CHECK(f.control_nodes.size() == 7);  // 2 Merge, 2 Switch, 2 NextIteration, 1 LoopCond
  const auto enter_w = *g.find("rnn/while/enter_W");
  CHECK(g.frame_of(enter_w) == 1);
  CHECK(g.input_frame_of(enter_w) == 0);
  CHECK(g.frame_of(*g.find("rnn/while/proj")) == 1);
  const auto exit_h = *g.find("rnn/while/exit_h");
  CHECK(g.frame_of(exit_h) == 1);
  CHECK(g.output_frame_of(exit_h) == 0);
  CHECK(g.frame_of(*g.find("grad")) == 0);
  CHECK(g.has_loops());
  int back_edges = 0;
  for (const auto& e : g.edges()) back_edges += g.is_back_edge(e);
  CHECK(back_edges == 2);
}

TEST_CASE("validation names the node at fault") {
  SUBCASE("dangling input") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {2});
    g.add("d", "Identity", {"c:0"}, worker);
    CHECK(invalid(g) == "node 'd': input 'c:0' names no node in the graph: invalid graph");
  }
  SUBCASE("unknown task") {
    auto g = two_tasks();
    placeholder(g, "a", "/job:ps/replica:0/task:7", {2});
    CHECK(invalid(g) == "node 'a': task 'ps:7' is not in the cluster (cluster: worker:0, ps:0): invalid graph");
  }
  SUBCASE("duplicate names") {
    auto g = two_tasks();
    placeholder(g, "a", worker, {2});
    placeholder(g, "b", worker, {2});
    placeholder(g, "a", ps0, {2});
    CHECK(invalid(g) == "duplicate node name 'a' (nodes 0 and 2): invalid graph");
  }
  SUBCASE("bad input text") {
    auto g = two_tasks();
    placeholder(g, "a", worker, {2});
    g.add("b", "Identity", {"^a:0"}, worker);
    CHECK(invalid(g) == "node 'b': bad input '^a:0' (expected \"node\", \"node:port\" or \"^node\"): invalid graph");
  }
  SUBCASE("data input after a control input") {
    auto g = two_tasks();
    placeholder(g, "a", worker, {2});
    placeholder(g, "b", worker, {2});
    g.add("c", "Add", {"^a", "b"}, worker);
    CHECK(invalid(g) ==
          "node 'c': data input 'b' comes after a control input; list control inputs (\"^node\") last: "
          "invalid graph");
  }
  SUBCASE("output port out of range") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {2});
    g.add("y", "Identity", {"x:1"}, worker);
    CHECK(invalid(g) == "node 'y': input 'x:1' names output 1 but 'x' (Placeholder) has 1 output: invalid graph");
  }
  SUBCASE("a cycle without NextIteration") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {2});
    g.add("a", "Add", {"x", "c"}, worker);
    g.add("b", "Identity", {"a"}, ps0);
    g.add("c", "Identity", {"b"}, worker);
    CHECK(invalid(g) ==
          "graph has a cycle: 'a' -> 'b' -> 'c' -> 'a' (only a NextIteration -> Merge edge may close a loop): "
          "invalid graph");
  }
  SUBCASE("NextIteration feeding something else than a Merge") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {2});
    g.add("n", "NextIteration", {"x"}, worker);
    g.add("y", "Identity", {"n"}, worker);
    CHECK(invalid(g) ==
          "node 'n' (NextIteration) feeds 'y' (Identity); a NextIteration may only feed a Merge's data input: "
          "invalid graph");
  }
  SUBCASE("mixing frames without an Enter") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {});
    placeholder(g, "y", worker, {});
    enter(g, "e", "x", worker, "loop");
    g.add("bad", "Add", {"e", "y"}, worker);
    CHECK(invalid(g) ==
          "node 'bad' mixes inputs from frame 'loop' (via 'e') and the root frame (via 'y'): invalid graph");
  }
  SUBCASE("Exit outside a loop") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {});
    g.add("e", "Exit", {"x"}, worker);
    CHECK(invalid(g) == "node 'e' (Exit) is not inside a loop frame: invalid graph");
  }
  SUBCASE("Enter without a frame name") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {});
    g.add("e", "Enter", {"x"}, worker);
    CHECK(invalid(g) == "node 'e' (Enter) has no \"frame_name\" attribute: invalid graph");
  }
  SUBCASE("a frame entered from two frames") {
    auto g = two_tasks();
    placeholder(g, "x", worker, {});
    enter(g, "outer", "x", worker, "a");
    enter(g, "inner", "outer", worker, "b");
    enter(g, "again", "x", worker, "b");
    CHECK(invalid(g) ==
          "frame 'b' is entered from frame 'a' by 'inner' and from the root frame by 'again': invalid graph");
  }
  SUBCASE("loop control on two tasks") {
    auto g = rnn_loop();
    for (auto& n : g.nodes)
      if (n.name == "rnn/while/switch_h") n.device = ps0;
    CHECK(invalid(g) ==
          "frame 'rnn/while': control nodes 'rnn/while/merge_i' (Merge) on worker:0 and "
          "'rnn/while/switch_h' (Switch) on ps:0 are on different tasks; a frame's "
          "Merge/Switch/NextIteration/LoopCond must share one task (its Enter and Exit nodes may be anywhere): "
          "invalid graph");
  }
  SUBCASE("two LoopConds") {
    auto g = rnn_loop();
    g.add("rnn/while/cond2", "LoopCond", {"rnn/while/less"}, worker);
    CHECK(invalid(g) ==
          "frame 'rnn/while' has two LoopCond nodes, 'rnn/while/cond' and 'rnn/while/cond2': invalid graph");
  }
  SUBCASE("unplaced node") {
    auto g = two_tasks();
    g.add("a", "NoOp");
    CHECK(invalid(g) == "node 'a' is not placed on a task: invalid graph");
  }
  SUBCASE("bad device") {
    auto g = two_tasks();
    g.add("a", "NoOp", {}, "ps0");
    CHECK(invalid(g) ==
          "node 'a': bad device 'ps0': unexpected 'ps0' (expected /job:, /replica:, /task:, /device:, /cpu: or "
          "/gpu:): invalid graph");
  }
  SUBCASE("bad name") {
    auto g = two_tasks();
    g.add("a b", "NoOp", {}, worker);
    CHECK(invalid(g) ==
          "node 'a b': a name is a letter, digit, '.' or '_' followed by letters, digits and \"_.-/>\": "
          "invalid graph");
  }
  SUBCASE("bad cluster") {
    fg::graph_def g;
    g.tasks = {worker_task, worker_task};
    CHECK(invalid(g) == "task 'worker:0' is listed twice in the cluster: invalid graph");
    g.tasks = {worker_task, {"param-server", 0}};
    CHECK(invalid(g) ==
          "cluster task 'param-server:0': job name 'param-server' must be a letter followed by letters, digits "
          "or '_' (it names TensorFlow devices): invalid graph");
  }
}

TEST_CASE("make() reports through an error code") {
  auto g = two_tasks();
  g.add("d", "Identity", {"missing"}, worker);
  std::error_code ec;
  std::string what;
  auto p = fg::placed_graph::make(g, ec, &what);
  CHECK_FALSE(p);
  CHECK(ec == errc::invalid_graph);
  CHECK(what == "node 'd': input 'missing' names no node in the graph");

  auto ok = fg::placed_graph::make(diamond(), ec);
  CHECK_FALSE(ec);
  REQUIRE(ok);
  CHECK(ok->size() == 6);
}

}  // namespace graph_cases
