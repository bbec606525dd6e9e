#include <fusewire/graph/partition.hpp>
#include <fusewire/graph/local_cluster.hpp>

#include <doctest/doctest.h>

#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_descriptor.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "support/error_text.hpp"
#include "support/graphs.hpp"
#include "support/tensor_string_maker.hpp"

namespace partition_cases {

namespace fg = fusewire::graph;
using fusewire::errc;
using namespace fusewire::test;

namespace {

fg::partition_options options(fg::partition_mode mode, bool fuse = false,
                              fg::star_clustering clustering = fg::star_clustering::rounds) {
  fg::partition_options o;
  o.mode = mode;
  o.tensor_fuse = fuse;
  o.clustering = clustering;
  return o;
}

// "a:0, ^b, ..." — what a message carries.
std::string tensors_of(const fg::plan_message& m) {
  std::string out;
  for (const auto& e : m.entries) out += (out.empty() ? "" : ", ") + e.tensor;
  return out;
}

// Runs `steps` steps of the whole graph in one executor and of the plan on a
// local cluster; every fetch and every named variable must agree after each
// step. Returns the channel traffic of the last step.
fg::local_channel::counters same_results(const fg::placed_graph& g, const fg::plan& p, const fg::feed_map& feeds,
                                         const std::vector<std::string>& fetches,
                                         const std::vector<std::string>& variables, int steps = 3) {
  fg::executor single(g);
  fg::local_cluster cluster(p);
  for (int s = 0; s < steps; ++s) {
    auto want = single.run(feeds, fetches);
    auto got = cluster.run(feeds, fetches);
    CHECK(got == want);
    for (const auto& v : variables) {
      REQUIRE(single.variable(v));
      REQUIRE(cluster.variable(v));
      CHECK(*cluster.variable(v) == *single.variable(v));
    }
  }
  return cluster.last_step_traffic();
}

// What the plan says a step sends, given each loop frame's iteration count.
std::size_t planned_messages(const fg::plan& p, std::size_t iterations = 0) {
  std::size_t n = p.per_step().messages;
  for (const auto& f : p.loop_frames()) n += p.per_iteration(f).messages * iterations;
  return n;
}

}  // namespace

TEST_CASE("wide-and-deep: messages per step in each mode") {
  fg::placed_graph g(wide_and_deep());
  const auto feeds = wide_and_deep_feeds();
  const std::vector<std::string> fetches{"out", "ps0/update", "ps1/update"};
  const std::vector<std::string> variables{"ps0/wide", "ps1/wide", "f3/table"};

  // 16 ids out, 16 embeddings and 2 wide weights back, 2 updates out.
  auto unfused = fg::partition(g, options(fg::partition_mode::send_recv));
  CHECK(unfused.per_step().messages == 36);
  CHECK(unfused.per_step().tensors == 36);
  CHECK(unfused.per_step().bytes == 1344u);
  CHECK(unfused.per_step().calls == 0);
  CHECK(unfused.partitions.size() == 3);
  auto traffic = same_results(g, unfused, feeds, fetches, variables);
  CHECK(traffic.messages == 36);
  CHECK(traffic.bytes == 1344);

  // Fused per (src, dst, wave): ids in 3 waves, embeddings in 4, wide, update, per PS.
  auto fused = fg::partition(g, options(fg::partition_mode::send_recv, true));
  CHECK(fused.per_step().messages == 18);
  CHECK(fused.per_step().tensors == 36);
  CHECK(fused.per_step().bytes == 1344u);
  CHECK(same_results(g, fused, feeds, fetches, variables).messages == 18);

  // One lookup call and one update call per PS.
  auto star = fg::partition(g, options(fg::partition_mode::star_server));
  CHECK(star.per_step().messages == 8);
  CHECK(star.per_step().calls == 4);
  CHECK(star.per_step().tensors == 36);
  CHECK(star.per_step().bytes == 1344u);
  CHECK(star.cycle_breaks == 0);
  REQUIRE(star.messages.size() == 8);
  const auto& request = star.messages[0];
  CHECK(request.kind == fg::message_kind::request);
  CHECK(request.src == fusewire::task_id{"worker", 0});
  CHECK(request.dst == fusewire::task_id{"ps", 0});
  CHECK(request.round == 0);
  CHECK(tensors_of(request) == "ids0:0, f2/hash0:0, f4/hash1:0, ids6:0, f8/hash0:0, f10/hash1:0, ids12:0, f14/hash0:0");
  const auto& response = star.messages[1];
  CHECK(response.kind == fg::message_kind::response);
  CHECK(tensors_of(response) ==
        "ps0/wide:0, f0/scaled:0, f2/lookup:0, f4/scaled:0, f6/lookup:0, f8/scaled:0, f10/lookup:0, "
        "f12/scaled:0, f14/lookup:0");
  CHECK(response.bytes() == 16u + 8u * 64u);
  CHECK(response.entries[0].consumers == std::vector<std::string>{"wide/sum0"});
  CHECK(star.messages[4].round == 1);
  CHECK(tensors_of(star.messages[4]) == "grad:0");
  CHECK(star.messages[5].entries.empty());
  CHECK(same_results(g, star, feeds, fetches, variables).messages == 8);

  // One call per PS; the updates would close a cycle and go as send/recv.
  auto single_call =
      fg::partition(g, options(fg::partition_mode::star_server, false, fg::star_clustering::single_call));
  CHECK(single_call.per_step().messages == 6);
  CHECK(single_call.per_step().calls == 2);
  CHECK(single_call.cycle_breaks == 2);
  CHECK(single_call.messages[4].fallback);
  CHECK(tensors_of(single_call.messages[4]) == "grad:0");
  CHECK(same_results(g, single_call, feeds, fetches, variables).messages == 6);

  auto lite = fg::partition(g, options(fg::partition_mode::star_server_lite));
  CHECK(lite.per_step().messages == 8);
  CHECK(lite.per_step().calls == 4);
  CHECK(same_results(g, lite, feeds, fetches, variables).messages == 8);

  MESSAGE("wide-and-deep messages per step: send_recv ", unfused.per_step().messages, ", send_recv+tensor_fuse ",
          fused.per_step().messages, ", star_server ", star.per_step().messages, ", star_server(single_call) ",
          single_call.per_step().messages, ", star_server_lite ", lite.per_step().messages);
}

TEST_CASE("TENSOR_FUSE fuses the messages of a plan built from the environment") {
  fg::placed_graph g(wide_and_deep());
  auto plan_with = [&](std::map<std::string, std::string, std::less<>> env) {
    const fusewire::env_lookup lookup = [env](std::string_view name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    const fusewire::options o = fusewire::options::from_env(fusewire::role::worker, lookup);
    return fg::partition(g, fg::partition_options::from(o));
  };
  const fg::plan unset = plan_with({});
  CHECK_FALSE(unset.options.tensor_fuse);
  CHECK(unset.per_step().messages == 36);
  const fg::plan on = plan_with({{"TENSOR_FUSE", "true"}});
  CHECK(on.options.tensor_fuse);
  CHECK(on.per_step().messages == 18);  // as partition_options{.tensor_fuse = true}
  CHECK(on.per_step().tensors == unset.per_step().tensors);
  CHECK(plan_with({{"TENSOR_FUSE", "off"}}).per_step().messages == 36);
}

TEST_CASE("a tensor feeding several nodes of one task is sent once") {
  fg::graph_def def;
  def.tasks = {worker_task, ps0_task};
  placeholder(def, "x", worker, {2});
  def.add("a", "Identity", {"x"}, ps0);
  def.add("b", "Mul", {"x", "x"}, ps0);
  def.add("c", "Add", {"a", "b"}, ps0);
  def.add("d", "Add", {"c", "x"}, worker);
  fg::placed_graph g(def);
  for (auto mode : {fg::partition_mode::send_recv, fg::partition_mode::star_server}) {
    auto p = fg::partition(g, options(mode));
    REQUIRE(p.messages.size() == 2);
    REQUIRE(p.messages[0].entries.size() == 1);
    CHECK(p.messages[0].entries[0].tensor == "x:0");
    CHECK(p.messages[0].entries[0].consumers == std::vector<std::string>{"a", "b"});
    CHECK(p.messages[1].entries[0].tensor == "c:0");
    same_results(g, p, {{"x", fg::tensor({2}, {2, 3})}}, {"d"}, {});
  }
}

TEST_CASE("a diamond across two PS tasks") {
  fg::placed_graph g(diamond());
  const fg::feed_map feeds{{"x", fg::tensor({2, 2}, {1, 2, 3, 4})}};
  auto p = fg::partition(g, options(fg::partition_mode::star_server));
  CHECK(p.summary() ==
        "plan: star_server, tensor_fuse off, 3 tasks\n"
        "per step: 4 messages (2 calls), 4 tensors, 64 bytes\n"
        "  m0 request    worker:0 -> ps:0  round 0  1 tensor  16 B\n"
        "  m1 response   ps:0 -> worker:0  round 0  1 tensor  16 B\n"
        "  m2 request    worker:0 -> ps:1  round 0  1 tensor  16 B\n"
        "  m3 response   ps:1 -> worker:0  round 0  1 tensor  16 B\n");
  CHECK(p.messages[0].key ==
        "/job:worker/replica:0/task:0/device:CPU:0;0000000000000001;/job:ps/replica:0/task:0/device:CPU:0;m0");
  // What each entry carries on the wire, for a transport to post receives with.
  CHECK(p.messages[1].entries[0].descriptor == fusewire::tensor_descriptor::make(fusewire::dtype::float32, {2, 2}));
  auto traffic = same_results(g, p, feeds, {"d"}, {"wa", "wb"});
  CHECK(traffic.messages == 4);
  CHECK(traffic.bytes == 64);
  for (bool fuse : {false, true}) {
    auto s = fg::partition(g, options(fg::partition_mode::send_recv, fuse));
    CHECK(s.per_step().messages == 4);  // x goes to two tasks; a and b come from two tasks
    same_results(g, s, feeds, {"d"}, {});
  }
  auto lite = fg::partition(g, options(fg::partition_mode::star_server_lite));
  CHECK(lite.per_step().messages == 4);
  same_results(g, lite, feeds, {"d"}, {});
}

TEST_CASE("control edges become zero-byte tokens") {
  fg::placed_graph g(control_tokens());
  for (auto mode :
       {fg::partition_mode::send_recv, fg::partition_mode::star_server, fg::partition_mode::star_server_lite}) {
    CAPTURE(fg::to_string(mode));
    auto p = fg::partition(g, options(mode));
    REQUIRE(p.messages.size() == 2);
    CHECK(tensors_of(p.messages[0]) == "^ready");
    CHECK(p.messages[0].bytes() == 0u);
    CHECK(p.messages[0].entries[0].descriptor == fg::token_descriptor());
    CHECK(tensors_of(p.messages[1]) == "^bump");
    CHECK(p.messages[1].entries[0].consumers == std::vector<std::string>{"after"});
    fg::local_cluster cluster(p);
    for (int step = 1; step <= 3; ++step) {
      auto r = cluster.run({{"x", fg::tensor({2}, {5, 6})}}, {"after"});
      CHECK(r["after"] == fg::tensor({2}, {5, 6}));
      CHECK(*cluster.variable("counter") == fg::tensor({1}, {static_cast<float>(step)}));
    }
    CHECK(cluster.last_step_traffic().messages == 2);
    CHECK(cluster.last_step_traffic().bytes == 0);
  }
}

TEST_CASE("loops: star_server_lite refuses, the others run them") {
  fg::placed_graph g(rnn_loop());
  const fg::feed_map feeds{{"h0", fg::tensor({1, 4}, {1, -1, 0.5f, 2})}};
  const std::vector<std::string> fetches{"rnn/while/exit_h", "rnn/while/exit_i", "update_b"};

  CHECK(error_of([&] { fg::partition(g, options(fg::partition_mode::star_server_lite)); }, errc::graph_cycle) ==
        "star_server_lite cannot merge the ps graphs: the graph has loop frame 'rnn/while' (Merge "
        "'rnn/while/merge_i' <- NextIteration 'rnn/while/next_i'), and the aggressive merge needs a graph "
        "without loops; use star_server or send_recv: graph plan would contain a cycle");
  std::error_code ec;
  std::string what;
  CHECK_FALSE(fg::partition(g, options(fg::partition_mode::star_server_lite), ec, &what));
  CHECK(ec == errc::graph_cycle);
  CHECK(what.find("loop frame 'rnn/while'") != std::string::npos);

  // The loop runs 3 times, so its frame has 4 iterations (the last one exits).
  constexpr std::size_t iterations = 4;
  for (bool fuse : {false, true}) {
    auto p = fg::partition(g, options(fg::partition_mode::send_recv, fuse));
    CHECK(p.loop_frames() == std::vector<std::string>{"rnn/while"});
    CHECK(p.per_step().messages == 1);                  // the update of b
    CHECK(p.per_iteration("rnn/while").messages == 3);  // predicate, h to ps0, act back
    CHECK(p.per_iteration("rnn/while").bytes == 36u);
    CHECK(same_results(g, p, feeds, fetches, {"b", "W"}).messages == planned_messages(p, iterations));
  }
  auto star = fg::partition(g, options(fg::partition_mode::star_server));
  CHECK(star.per_step().messages == 2);
  CHECK(star.per_step().calls == 1);
  CHECK(star.messages[0].round == 1);  // after the loop, which used ps0's responses
  CHECK(star.per_iteration("rnn/while").messages == 2);
  CHECK(star.per_iteration("rnn/while").calls == 1);
  CHECK(tensors_of(star.messages[2]) == "rnn/while/cond:0, rnn/while/switch_h:1");
  CHECK(star.messages[2].frame == "rnn/while");
  auto traffic = same_results(g, star, feeds, fetches, {"b", "W"});
  CHECK(traffic.messages == planned_messages(star, iterations));
  CHECK(traffic.messages == 10);

  // A loop that runs once more sends one more iteration's messages.
  fg::placed_graph longer(rnn_loop(4.0f));
  auto p5 = fg::partition(longer, options(fg::partition_mode::star_server));
  CHECK(same_results(longer, p5, feeds, fetches, {"b"}, 1).messages == planned_messages(p5, 5));
}

TEST_CASE("a worker->ps->worker->ps chain: rounds, single call, lite") {
  fg::placed_graph g(chain());
  const fg::feed_map feeds{{"x", fg::tensor({2}, {1, -2})}};
  const std::vector<std::string> fetches{"out", "learn"};

  CHECK(error_of([&] { fg::partition(g, options(fg::partition_mode::star_server_lite)); }, errc::graph_cycle) ==
        "star_server_lite cannot merge the ps graphs: the part of ps:0 holding 'a', 'b', 'learn' "
        "needs 'z' from worker:0, which is computed from that part's own outputs; use "
        "star_server, which splits such chains into rounds: graph plan would contain a cycle");

  auto rounds = fg::partition(g, options(fg::partition_mode::star_server));
  REQUIRE(rounds.messages.size() == 4);
  CHECK(rounds.per_step().calls == 2);
  CHECK(tensors_of(rounds.messages[0]) == "x:0");
  CHECK(tensors_of(rounds.messages[1]) == "a:0");
  CHECK(rounds.messages[2].round == 1);
  CHECK(tensors_of(rounds.messages[2]) == "z:0");
  CHECK(tensors_of(rounds.messages[3]) == "b:0");
  same_results(g, rounds, feeds, fetches, {"w"});

  auto single = fg::partition(g, options(fg::partition_mode::star_server, false, fg::star_clustering::single_call));
  CHECK(single.cycle_breaks == 2);
  REQUIRE(single.messages.size() == 4);
  CHECK(single.per_step().calls == 1);
  CHECK(tensors_of(single.messages[0]) == "x:0");
  CHECK(tensors_of(single.messages[1]) == "a:0");
  CHECK(single.messages[2].fallback);
  CHECK(single.messages[3].fallback);
  CHECK(single.summary().find("2 tensor(s) moved out to break cycles") != std::string::npos);
  same_results(g, single, feeds, fetches, {"w"});
}

TEST_CASE("partition errors name the node or frame") {
  auto reserved = chain();
  reserved.add("_mine", "NoOp", {}, worker);
  CHECK(error_of([&] { fg::partition(fg::placed_graph(reserved)); }, errc::invalid_graph) ==
        "node '_mine' (NoOp): names and ops starting with '_' are reserved for nodes the partitioner adds: "
        "invalid graph");

  auto remote = chain();
  placeholder(remote, "delta", worker, {2});
  remote.add("bad", "AssignAdd", {"w", "delta"}, worker);
  CHECK(error_of([&] { fg::partition(fg::placed_graph(remote)); }, errc::invalid_graph) ==
        "node 'bad' (AssignAdd) is on worker:0 but the variable it writes, 'w' (Variable), "
        "is on ps:0; they must share a task: invalid graph");

  auto no_cond = rnn_loop();
  for (auto& n : no_cond.nodes) {
    if (n.name == "rnn/while/cond") n.op = "Identity";
  }
  CHECK(error_of([&] { fg::partition(fg::placed_graph(no_cond)); }, errc::invalid_graph) ==
        "frame 'rnn/while' spans tasks worker:0, ps:0 but has no "
        "LoopCond to drive their iterations: invalid graph");
}

TEST_CASE("a graph on one task needs no messages") {
  fg::graph_def def;
  def.tasks = {worker_task, ps0_task};
  placeholder(def, "x", worker, {2});
  def.add("y", "Add", {"x", "x"}, worker);
  auto p = fg::partition(fg::placed_graph(def), options(fg::partition_mode::star_server));
  CHECK(p.messages.empty());
  REQUIRE(p.partitions.size() == 1);
  CHECK(p.partitions[0].task == fusewire::task_id{"worker", 0});
  CHECK(p.per_step().messages == 0);
  fg::local_cluster cluster(p);
  CHECK(cluster.run({{"x", fg::tensor({2}, {1, 2})}}, {"y"})["y"] == fg::tensor({2}, {2, 4}));
}

TEST_CASE("local_cluster reports a deadlock instead of hanging") {
  fg::local_cluster cluster(deadlocked_plan());
  CHECK(error_of([&] { cluster.run({}, {}); }, errc::graph_cycle) ==
        "step 1 deadlocked: worker:0 waits for node 'r' (_Recv) in the root frame: kb;0:0; "
        "ps:0 waits for node 'r2' (_Recv) in the root frame: ka;0:0;: graph plan would "
        "contain a cycle");
  CHECK(error_of(
            [&] {
              cluster.run({{"nope", fg::tensor::scalar(1)}}, {});
            },
            errc::invalid_argument) == "feed 'nope' names no Placeholder in the plan: invalid argument");
  CHECK(error_of([&] { cluster.run({}, {"nope"}); }, errc::invalid_argument) ==
        "fetch 'nope' names no node in the plan: invalid argument");
}

TEST_CASE("a failing task fails the step with its own error") {
  fg::placed_graph g(diamond());
  auto p = fg::partition(g, options(fg::partition_mode::send_recv));
  fg::local_cluster cluster(p);
  CHECK(error_of(
            [&] {
              cluster.run({{"x", fg::tensor({2}, {1, 2})}}, {"d"});
            },
            errc::invalid_argument) ==
        "feed 'x' does not fit: Placeholder 'x' (Placeholder) output 0 is float32[2] but its spec says "
        "float32[2,2]: invalid argument");
  auto bad = diamond();
  for (auto& n : bad.nodes)
    if (n.name == "x") n.output_specs.clear();
  fg::local_cluster loose(fg::partition(fg::placed_graph(bad), options(fg::partition_mode::send_recv)));
  CHECK(error_of(
            [&] {
              loose.run({{"x", fg::tensor({3}, {1, 2, 3})}}, {"d"});
            },
            errc::invalid_argument) ==
        "ps:0: step 1: node 'a' (MatMul): cannot multiply matrices of shapes [3] and [2,2]: "
        "invalid argument");
  // The cluster recovers for the next step.
  CHECK(loose.run({{"x", fg::tensor({2, 2}, {1, 0, 0, 1})}}, {"d"})["d"] == fg::tensor({2, 2}, {1, 3, 4, 4}));
}

TEST_CASE("a conditional whose branches run on two PS: dead values cross, the other side still runs") {
  fg::placed_graph g(branches());
  const std::vector<std::string> fetches{"join", "join:1", "out", "learn_scale", "learn_shift"};
  for (auto [mode, fuse] :
       {std::pair{fg::partition_mode::send_recv, false}, std::pair{fg::partition_mode::send_recv, true},
        std::pair{fg::partition_mode::star_server, false}, std::pair{fg::partition_mode::star_server_lite, false}}) {
    CAPTURE(fg::to_string(mode));
    CAPTURE(fuse);
    const auto p = fg::partition(g, options(mode, fuse));
    fg::executor single(g);
    fg::local_cluster cluster(p);
    for (int step = 1; step <= 4; ++step) {
      const fg::feed_map feeds{{"x", fg::tensor({2}, {1, static_cast<float>(step)})},
                               {"p", fg::tensor::scalar(static_cast<float>(step % 2))}};
      auto want = single.run(feeds, fetches);
      CHECK(want["join:1"] == fg::tensor::scalar(static_cast<float>(step % 2)));
      CHECK(cluster.run(feeds, fetches) == want);
      CHECK(*cluster.variable("scale") == *single.variable("scale"));
      CHECK(*cluster.variable("shift") == *single.variable("shift"));
    }
  }
}

}  // namespace partition_cases
