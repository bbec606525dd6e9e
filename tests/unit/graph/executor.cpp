#include <fusewire/graph/executor.hpp>

#include <doctest/doctest.h>

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/channel.hpp>

#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "support/error_text.hpp"
#include "support/graphs.hpp"
#include "support/tensor_string_maker.hpp"

namespace executor_cases {

namespace fg = fusewire::graph;
using fusewire::errc;
using namespace fusewire::test;

namespace {

fg::graph_def one_task() {
  fg::graph_def g;
  g.tasks = {worker_task};
  return g;
}

// while (i < limit) { i += 1; acc = acc + acc }  — and, when nested, an inner
// loop adding 1 to a counter twice per outer iteration.
fg::graph_def counting_loop(bool nested) {
  auto g = one_task();
  constant(g, "i0", worker, {}, {0});
  constant(g, "limit", worker, {}, {5});
  constant(g, "one", worker, {}, {1});
  constant(g, "two", worker, {}, {2});
  constant(g, "zero", worker, {}, {0});
  placeholder(g, "acc0", worker, {2});
  const std::string L = "outer";
  enter(g, L + "/ei", "i0", worker, L);
  enter(g, L + "/eacc", "acc0", worker, L);
  enter(g, L + "/ecount", "zero", worker, L);
  enter(g, L + "/elimit", "limit", worker, L, true);
  enter(g, L + "/eone", "one", worker, L, true);
  enter(g, L + "/etwo", "two", worker, L, true);
  g.add(L + "/mi", "Merge", {L + "/ei", L + "/ni"}, worker);
  g.add(L + "/macc", "Merge", {L + "/eacc", L + "/nacc"}, worker);
  g.add(L + "/mcount", "Merge", {L + "/ecount", L + "/ncount"}, worker);
  g.add(L + "/less", "Less", {L + "/mi", L + "/elimit"}, worker);
  g.add(L + "/cond", "LoopCond", {L + "/less"}, worker);
  g.add(L + "/si", "Switch", {L + "/mi", L + "/cond"}, worker);
  g.add(L + "/sacc", "Switch", {L + "/macc", L + "/cond"}, worker);
  g.add(L + "/scount", "Switch", {L + "/mcount", L + "/cond"}, worker);
  g.add(L + "/inc", "Add", {L + "/si:1", L + "/eone"}, worker);
  g.add(L + "/dbl", "Add", {L + "/sacc:1", L + "/sacc:1"}, worker);
  std::string count_next = L + "/scount:1";
  if (nested) {
    const std::string I = "inner";
    enter(g, I + "/ej", L + "/eone", worker, I);  // j starts at 1 (not constant)
    enter(g, I + "/ec", L + "/scount:1", worker, I);
    enter(g, I + "/etwo", L + "/etwo", worker, I, true);
    enter(g, I + "/eone", L + "/eone", worker, I, true);
    g.add(I + "/mj", "Merge", {I + "/ej", I + "/nj"}, worker);
    g.add(I + "/mc", "Merge", {I + "/ec", I + "/nc"}, worker);
    g.add(I + "/three", "Add", {I + "/etwo", I + "/eone"}, worker);
    g.add(I + "/cmp", "Less", {I + "/mj", I + "/three"}, worker);  // j = 1, 2
    g.add(I + "/cond", "LoopCond", {I + "/cmp"}, worker);
    g.add(I + "/sj", "Switch", {I + "/mj", I + "/cond"}, worker);
    g.add(I + "/sc", "Switch", {I + "/mc", I + "/cond"}, worker);
    g.add(I + "/incj", "Add", {I + "/sj:1", I + "/eone"}, worker);
    g.add(I + "/incc", "Add", {I + "/sc:1", I + "/eone"}, worker);
    g.add(I + "/nj", "NextIteration", {I + "/incj"}, worker);
    g.add(I + "/nc", "NextIteration", {I + "/incc"}, worker);
    g.add(I + "/xc", "Exit", {I + "/sc:0"}, worker);
    count_next = I + "/xc";
  }
  g.add(L + "/ni", "NextIteration", {L + "/inc"}, worker);
  g.add(L + "/nacc", "NextIteration", {L + "/dbl"}, worker);
  g.add(L + "/ncount", "NextIteration", {count_next}, worker);
  g.add(L + "/xi", "Exit", {L + "/si:0"}, worker);
  g.add(L + "/xacc", "Exit", {L + "/sacc:0"}, worker);
  g.add(L + "/xcount", "Exit", {L + "/scount:0"}, worker);
  return g;
}

}  // namespace

TEST_CASE("arithmetic ops") {
  auto g = one_task();
  placeholder(g, "x", worker, {2, 2});
  constant(g, "k", worker, {}, {10});
  constant(g, "v", worker, {2}, {1, 2});
  g.add("add", "Add", {"x", "k"}, worker);
  g.add("sub", "Sub", {"k", "x"}, worker);
  g.add("mul", "Mul", {"x", "x"}, worker);
  g.add("less", "Less", {"x", "k"}, worker);
  g.add("mm", "MatMul", {"x", "x"}, worker);
  constant(g, "ids", worker, {3}, {1, 0, 1});
  g.add("rows", "Gather", {"x", "ids"}, worker);
  g.add("cat0", "Concat", {"x", "rows"}, worker).set("axis", std::int64_t{0});
  g.add("cat1", "Concat", {"x", "x"}, worker);
  g.add("noop", "NoOp", {"^mm"}, worker);
  fg::executor ex(g);
  auto r = ex.run({{"x", fg::tensor({2, 2}, {1, 2, 3, 4})}},
                  {"add", "sub", "mul", "less", "mm", "rows", "cat0", "cat1", "k:0"});
  CHECK(r["add"] == fg::tensor({2, 2}, {11, 12, 13, 14}));
  CHECK(r["sub"] == fg::tensor({2, 2}, {9, 8, 7, 6}));
  CHECK(r["mul"] == fg::tensor({2, 2}, {1, 4, 9, 16}));
  CHECK(r["less"] == fg::tensor({2, 2}, {1, 1, 1, 1}));
  CHECK(r["mm"] == fg::tensor({2, 2}, {7, 10, 15, 22}));
  CHECK(r["rows"] == fg::tensor({3, 2}, {3, 4, 1, 2, 3, 4}));
  CHECK(r["cat0"] == fg::tensor({5, 2}, {1, 2, 3, 4, 3, 4, 1, 2, 3, 4}));
  CHECK(r["cat1"] == fg::tensor({2, 4}, {1, 2, 1, 2, 3, 4, 3, 4}));
  CHECK(r["k:0"] == fg::tensor::scalar(10));
}

TEST_CASE("variables keep their value across steps") {
  auto g = one_task();
  variable(g, "v", worker, {2}, {1, 1});
  placeholder(g, "delta", worker, {2});
  g.add("read", "Identity", {"v"}, worker);
  g.add("inc", "AssignAdd", {"v", "delta"}, worker);
  g.add("dec", "AssignSub", {"v", "delta"}, worker);
  g.add("after", "Identity", {"inc"}, worker);
  fg::executor ex(g);
  // inc and dec both run each step, so only the snapshot moves with "set".
  auto r = ex.run({{"delta", fg::tensor({2}, {1, 2})}}, {"read"});
  CHECK(r["read"] == fg::tensor({2}, {1, 1}));
  REQUIRE(ex.variable("v"));
  CHECK(*ex.variable("v") == fg::tensor({2}, {1, 1}));

  auto g2 = one_task();
  variable(g2, "v", worker, {2}, {1, 1});
  placeholder(g2, "delta", worker, {2});
  g2.add("read", "Identity", {"v"}, worker);
  g2.add("inc", "AssignAdd", {"v", "delta"}, worker);
  fg::executor ex2(g2);
  for (int step = 0; step < 3; ++step) {
    auto out = ex2.run({{"delta", fg::tensor({2}, {1, 2})}}, {"read", "inc"});
    CHECK(out["read"] == fg::tensor({2}, {1.0f + static_cast<float>(step), 1.0f + 2.0f * static_cast<float>(step)}));
    CHECK(out["inc"] == fg::tensor({2}, {2.0f + static_cast<float>(step), 3.0f + 2.0f * static_cast<float>(step)}));
  }
  CHECK(*ex2.variable("v") == fg::tensor({2}, {4, 7}));
  CHECK(ex2.variable("read") == nullptr);
}

TEST_CASE("a while loop runs until its predicate is false") {
  fg::executor ex(counting_loop(false));
  auto r = ex.run({{"acc0", fg::tensor({2}, {1, 3})}}, {"outer/xi", "outer/xacc", "outer/xcount"});
  CHECK(r["outer/xi"] == fg::tensor::scalar(5));
  CHECK(r["outer/xacc"] == fg::tensor({2}, {32, 96}));
  CHECK(r["outer/xcount"] == fg::tensor::scalar(0));
}

TEST_CASE("nested loops run their inner loop in every outer iteration") {
  fg::executor ex(counting_loop(true));
  auto r = ex.run({{"acc0", fg::tensor({2}, {1, 1})}}, {"outer/xi", "outer/xcount"});
  CHECK(r["outer/xi"] == fg::tensor::scalar(5));
  CHECK(r["outer/xcount"] == fg::tensor::scalar(10));  // 5 outer iterations x 2 inner
}

TEST_CASE("a conditional takes one branch; the other is dead") {
  auto g = one_task();
  placeholder(g, "x", worker, {});
  placeholder(g, "p", worker, {});
  g.add("sw", "Switch", {"x", "p"}, worker);
  constant(g, "ten", worker, {}, {10});
  g.add("if_false", "Add", {"sw:0", "ten"}, worker);
  g.add("if_true", "Mul", {"sw:1", "ten"}, worker);
  g.add("join", "Merge", {"if_false", "if_true"}, worker);
  fg::executor ex(g);
  auto t = ex.run({{"x", fg::tensor::scalar(3)}, {"p", fg::tensor::scalar(1)}}, {"join", "join:1"});
  CHECK(t["join"] == fg::tensor::scalar(30));
  CHECK(t["join:1"] == fg::tensor::scalar(1));
  auto f = ex.run({{"x", fg::tensor::scalar(3)}, {"p", fg::tensor::scalar(0)}}, {"join", "join:1"});
  CHECK(f["join"] == fg::tensor::scalar(13));
  CHECK(f["join:1"] == fg::tensor::scalar(0));
  CHECK(error_of(
            [&] {
              ex.run({{"x", fg::tensor::scalar(3)}, {"p", fg::tensor::scalar(0)}}, {"if_true"});
            },
            errc::invalid_argument) == "step 3: fetch 'if_true' is dead (an untaken branch): invalid argument");
}

TEST_CASE("construction rejects what the executor cannot run") {
  auto g = one_task();
  g.add("weird", "Conv2D", {}, worker);
  CHECK(error_of([&] { fg::executor ex(g); }, errc::not_supported) ==
        "node 'weird' (Conv2D): op 'Conv2D' is not supported by the executor (supported: Add, Assign, AssignAdd, "
        "AssignSub, Concat, Const, Enter, Exit, Gather, Identity, Less, LoopCond, MatMul, Merge, Mul, "
        "NextIteration, NoOp, Placeholder, Sub, Switch, Variable, VariableV2, _Recv, _Send): not supported here");

  auto arity = one_task();
  placeholder(arity, "x", worker, {});
  arity.add("bad", "Add", {"x"}, worker);
  CHECK(error_of([&] { fg::executor ex(arity); }, errc::invalid_graph) ==
        "node 'bad' (Add): takes 2 data inputs, got 1: invalid graph");

  auto assign = one_task();
  placeholder(assign, "x", worker, {});
  assign.add("bad", "Assign", {"x", "x"}, worker);
  CHECK(error_of([&] { fg::executor ex(assign); }, errc::invalid_graph) ==
        "node 'bad' (Assign): input 0 must be a Variable, got 'x' (Placeholder): invalid graph");

  auto shape = one_task();
  constant(shape, "c", worker, {2, 2}, {1, 2, 3});
  CHECK(error_of([&] { fg::executor ex(shape); }, errc::invalid_graph) ==
        "node 'c' (Const): \"shape\" [2,2] needs 4 values, \"value\" has 3: invalid graph");

  fg::executor transfers([] {
    auto t = one_task();
    t.add("r", "_Recv", {}, worker).set("key", std::string("k")).set("entries", std::int64_t{0});
    return t;
  }());
  CHECK(error_of([&] { transfers.run({}, {}); }, errc::invalid_argument) ==
        "this graph has _Send/_Recv nodes; run it with begin_step over a channel: invalid argument");
}

TEST_CASE("step errors name the node, feed or fetch") {
  auto g = one_task();
  placeholder(g, "x", worker, {-1});
  constant(g, "m", worker, {3, 1}, {1, 2, 3});
  g.add("mm", "MatMul", {"x", "m"}, worker);
  g.add("sum", "Add", {"x", "x"}, worker).spec({fusewire::dtype::float32, {2}});
  fg::executor ex(g);
  CHECK(error_of([&] { ex.run({}, {}); }, errc::invalid_argument) == "no feed for Placeholder 'x': invalid argument");
  CHECK(error_of(
            [&] {
              ex.run({{"y", fg::tensor::scalar(1)}}, {});
            },
            errc::invalid_argument) == "feed 'y' names no Placeholder in this graph: invalid argument");
  CHECK(error_of(
            [&] {
              ex.run({{"x", fg::tensor::scalar(1)}}, {});
            },
            errc::invalid_argument) ==
        "feed 'x' does not fit: Placeholder 'x' (Placeholder) output 0 is float32[] but its spec says "
        "float32[?]: invalid argument");
  CHECK(error_of(
            [&] {
              ex.run({{"x", fg::tensor({2}, {1, 2})}}, {"nope"});
            },
            errc::invalid_argument) == "fetch 'nope' names no output in this graph: invalid argument");
  CHECK(error_of(
            [&] {
              ex.run({{"x", fg::tensor({2}, {1, 2})}}, {"mm"});
            },
            errc::invalid_argument) ==
        "step 1: node 'mm' (MatMul): cannot multiply matrices of shapes [2] and [3,1]: invalid argument");
  CHECK(error_of(
            [&] {
              ex.run({{"x", fg::tensor({3}, {1, 2, 3})}}, {"sum"});
            },
            errc::invalid_argument) ==
        "step 2: node 'sum' (Add) output 0 is float32[3] but its spec says float32[2]: invalid argument");

  auto g2 = one_task();
  placeholder(g2, "x", worker, {-1});
  g2.add("sum", "Add", {"x", "x"}, worker).spec({fusewire::dtype::float32, {2}});
  fg::executor ex2(g2);
  CHECK(error_of(
            [&] {
              ex2.run({{"x", fg::tensor({3}, {1, 2, 3})}}, {"sum"});
            },
            errc::invalid_argument) ==
        "step 1: node 'sum' (Add) output 0 is float32[3] but its spec says float32[2]: invalid argument");
  // The executor stays usable after a failed step.
  CHECK(ex2.run({{"x", fg::tensor({2}, {1, 2})}}, {"sum"})["sum"] == fg::tensor({2}, {2, 4}));
  CHECK(error_of(
            [&] {
              fg::executor(counting_loop(false)).run({{"acc0", fg::tensor({2}, {1, 1})}}, {"outer/dbl"});
            },
            errc::invalid_argument) ==
        "fetch 'outer/dbl' is inside frame 'outer'; fetch the loop's Exit instead: invalid argument");
}

TEST_CASE("a loop that never ends fails at max_iterations") {
  auto g = counting_loop(false);
  for (auto& n : g.nodes)
    if (n.name == "outer/inc") n.inputs = {"outer/si:1", "outer/si:1"};  // i stays 0
  fg::executor ex(g, fg::executor_options{100});
  CHECK(error_of(
            [&] {
              ex.run({{"acc0", fg::tensor({2}, {1, 1})}}, {"outer/xi"});
            },
            errc::invalid_argument) == "step 1: frame 'outer' ran more than 100 iterations: invalid argument");
}

TEST_CASE("a receive checks the descriptor and bytes a channel delivers") {
  auto g = one_task();
  g.add("r", "_Recv", {}, worker).set("key", std::string("k")).set("entries", std::int64_t{2});
  g.add("y", "Add", {"r:0", "r:1"}, worker);
  fg::executor ex(g);
  fg::local_channel ch;
  auto run = [&](std::uint64_t step, fg::payload p) {
    ex.begin_step(ch, step, {}, {"y"});
    CHECK_FALSE(ch.send(step, "k;0:0", std::move(p)));
    while (!ex.finished()) ex.poll();
    return ex.end_step();
  };
  auto two = [](fg::message_entry second) {
    fg::payload p;
    p.push_back(fg::message_entry::of(fg::tensor({2}, {1, 2})));
    p.push_back(std::move(second));
    return p;
  };
  CHECK(run(1, two(fg::message_entry::of(fg::tensor({2}, {10, 20}))))["y"] == fg::tensor({2}, {11, 22}));
  fg::message_entry int32{fusewire::tensor_descriptor::make(fusewire::dtype::int32, {2}),
                          fusewire::tensor_buffer::allocate(8), false};
  CHECK(error_of([&] { run(2, two(std::move(int32))); }, errc::invalid_argument) ==
        "step 2: node 'r' (_Recv) got entry 1 under k;0:0 as int32[2] in 8 bytes (expected float32 values filling "
        "the shape): invalid argument");
  fg::message_entry truncated{fusewire::tensor_descriptor::make(fusewire::dtype::float32, {2}),
                              fusewire::tensor_buffer::allocate(4), false};
  CHECK(error_of([&] { run(3, two(std::move(truncated))); }, errc::size_mismatch) ==
        "step 3: node 'r' (_Recv) got entry 1 under k;0:0 as float32[2] in 4 bytes (expected float32 values "
        "filling the shape): payload size does not match the destination");
}

}  // namespace executor_cases
