#pragma once
/// Hand-built graphs shared by the graph and tf unit tests and the graph
/// multi-process test. No doctest here: the multi-process drivers have their
/// own main.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/channel.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition.hpp>

namespace fusewire::test {

namespace fg = fusewire::graph;

inline const std::string worker = "/job:worker/replica:0/task:0";
inline const std::string worker1 = "/job:worker/replica:0/task:1";
inline const std::string ps0 = "/job:ps/replica:0/task:0";
inline const std::string ps1 = "/job:ps/replica:0/task:1";
// The same tasks as core task ids, for graph_def::tasks.
inline const fusewire::task_id worker_task{"worker", 0};
inline const fusewire::task_id worker1_task{"worker", 1};
inline const fusewire::task_id ps0_task{"ps", 0};
inline const fusewire::task_id ps1_task{"ps", 1};

inline std::vector<float> ramp(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

inline fg::node_def& constant(fg::graph_def& g, std::string name, const std::string& device,
                              std::vector<std::int64_t> shape, std::vector<float> values) {
  return g.add(std::move(name), "Const", {}, device).set("value", std::move(values)).set("shape", std::move(shape));
}

inline fg::node_def& variable(fg::graph_def& g, std::string name, const std::string& device,
                              std::vector<std::int64_t> shape, std::vector<float> values) {
  return g.add(std::move(name), "Variable", {}, device).set("value", std::move(values)).set("shape", std::move(shape));
}

inline fg::node_def& placeholder(fg::graph_def& g, std::string name, const std::string& device,
                                 std::vector<std::int64_t> shape) {
  return g.add(std::move(name), "Placeholder", {}, device).spec({fusewire::dtype::float32, std::move(shape)});
}

inline fg::node_def& enter(fg::graph_def& g, std::string name, std::string input, const std::string& device,
                           const std::string& frame, bool is_constant = false) {
  auto& n = g.add(std::move(name), "Enter", {std::move(input)}, device).set("frame_name", frame);
  if (is_constant) n.set("is_constant", true);
  return n;
}

// A wide-and-deep-like step: 16 sparse features, each an embedding lookup in
// its own table (tables alternate between ps0 and ps1), some ids preprocessed
// by one or two worker ops first, some lookups scaled on the PS; a dense tower
// on the worker; a wide weight per PS that the worker reads and then updates.
//
// Feature k: table on ps(k % 2); stage (k/2) % 3 = number of worker Identity
// ops on its ids; (k/2) % 2 == 0: the PS scales the lookup.
// Feeds: ids<k> (float32[4]); fetch: "out" (float32[4,1]).
inline constexpr int features = 16;
inline constexpr int batch = 4, rows = 10, dim = 4;

inline fg::graph_def wide_and_deep() {
  fg::graph_def g;
  g.tasks = {worker_task, ps0_task, ps1_task};
  std::vector<std::string> concat_inputs;
  for (const auto* ps : {&ps0, &ps1}) {
    const std::string p = *ps == ps0 ? "ps0" : "ps1";
    constant(g, p + "/scale", *ps, {}, {0.5f});
    variable(g, p + "/wide", *ps, {batch, 1}, ramp(batch, 0.1f, 0.1f));
  }
  for (int k = 0; k < features; ++k) {
    const std::string f = "f" + std::to_string(k);
    const auto& ps = k % 2 == 0 ? ps0 : ps1;
    const std::string p = k % 2 == 0 ? "ps0" : "ps1";
    placeholder(g, "ids" + std::to_string(k), worker, {batch});
    std::string ids = "ids" + std::to_string(k);
    for (int s = 0; s < (k / 2) % 3; ++s) {
      std::string next = f + "/hash" + std::to_string(s);
      g.add(next, "Identity", {ids}, worker);
      ids = next;
    }
    variable(g, f + "/table", ps, {rows, dim}, ramp(rows * dim, 0.01f * static_cast<float>(k + 1), 0.01f));
    g.add(f + "/lookup", "Gather", {f + "/table", ids}, ps);
    std::string emb = f + "/lookup";
    if ((k / 2) % 2 == 0) {
      g.add(f + "/scaled", "Mul", {emb, p + "/scale"}, ps);
      emb = f + "/scaled";
    }
    concat_inputs.push_back(emb);
  }
  g.add("deep/concat", "Concat", concat_inputs, worker).set("axis", std::int64_t{1});
  variable(g, "deep/w1", worker, {features * dim, 8}, ramp(features * dim * 8, -0.5f, 0.002f));
  g.add("deep/h1", "MatMul", {"deep/concat", "deep/w1"}, worker);
  variable(g, "deep/w2", worker, {8, 1}, ramp(8, 0.1f, 0.05f));
  g.add("deep/logit", "MatMul", {"deep/h1", "deep/w2"}, worker);
  g.add("wide/sum0", "Add", {"deep/logit", "ps0/wide"}, worker);
  g.add("out", "Add", {"wide/sum0", "ps1/wide"}, worker);
  constant(g, "lr", worker, {}, {0.01f});
  g.add("grad", "Mul", {"out", "lr"}, worker);
  g.add("ps0/update", "AssignSub", {"ps0/wide", "grad"}, ps0);
  g.add("ps1/update", "AssignSub", {"ps1/wide", "grad"}, ps1);
  return g;
}

// Feeds for wide_and_deep(): ids<k> = {k, k+3, k+5, k+7} mod rows.
inline std::map<std::string, fg::tensor, std::less<>> wide_and_deep_feeds() {
  std::map<std::string, fg::tensor, std::less<>> feeds;
  for (int k = 0; k < features; ++k)
    feeds.emplace("ids" + std::to_string(k),
                  fg::tensor({batch}, {static_cast<float>(k % rows), static_cast<float>((k + 3) % rows),
                                       static_cast<float>((k + 5) % rows), static_cast<float>((k + 7) % rows)}));
  return feeds;
}

// A diamond across tasks: x (worker) -> a (ps0), b (ps1) -> d (worker).
inline fg::graph_def diamond() {
  fg::graph_def g;
  g.tasks = {worker_task, ps0_task, ps1_task};
  placeholder(g, "x", worker, {2, 2});
  variable(g, "wa", ps0, {2, 2}, {1, 2, 3, 4});
  variable(g, "wb", ps1, {2, 2}, {0, 1, 1, 0});
  g.add("a", "MatMul", {"x", "wa"}, ps0);
  g.add("b", "MatMul", {"x", "wb"}, ps1);
  g.add("d", "Add", {"a", "b"}, worker);
  return g;
}

// An RNN-like loop run by the worker whose body runs partly on ps0 every
// iteration: h <- (h x W + b) * 0.5 while i < 3, with W and b entered on ps0.
// After the loop the worker pushes an update of b computed from the result.
inline fg::graph_def rnn_loop(float limit = 3.0f) {
  fg::graph_def g;
  g.tasks = {worker_task, ps0_task};
  const std::string L = "rnn/while";
  placeholder(g, "h0", worker, {1, 4});
  constant(g, "i0", worker, {}, {0.0f});
  constant(g, "limit", worker, {}, {limit});
  constant(g, "one", worker, {}, {1.0f});
  constant(g, "half", worker, {}, {0.5f});
  constant(g, "lr", worker, {}, {0.1f});
  variable(g, "W", ps0, {4, 4}, ramp(16, -0.4f, 0.05f));
  variable(g, "b", ps0, {1, 4}, {0.1f, 0.2f, 0.3f, 0.4f});
  enter(g, L + "/enter_i", "i0", worker, L);
  enter(g, L + "/enter_h", "h0", worker, L);
  enter(g, L + "/enter_limit", "limit", worker, L, true);
  enter(g, L + "/enter_one", "one", worker, L, true);
  enter(g, L + "/enter_half", "half", worker, L, true);
  enter(g, L + "/enter_W", "W", ps0, L, true);
  enter(g, L + "/enter_b", "b", ps0, L, true);
  g.add(L + "/merge_i", "Merge", {L + "/enter_i", L + "/next_i"}, worker);
  g.add(L + "/merge_h", "Merge", {L + "/enter_h", L + "/next_h"}, worker);
  g.add(L + "/less", "Less", {L + "/merge_i", L + "/enter_limit"}, worker);
  g.add(L + "/cond", "LoopCond", {L + "/less"}, worker);
  g.add(L + "/switch_i", "Switch", {L + "/merge_i", L + "/cond"}, worker);
  g.add(L + "/switch_h", "Switch", {L + "/merge_h", L + "/cond"}, worker);
  g.add(L + "/inc", "Add", {L + "/switch_i:1", L + "/enter_one"}, worker);
  g.add(L + "/proj", "MatMul", {L + "/switch_h:1", L + "/enter_W"}, ps0);
  g.add(L + "/act", "Add", {L + "/proj", L + "/enter_b"}, ps0);
  g.add(L + "/h_new", "Mul", {L + "/act", L + "/enter_half"}, worker);
  g.add(L + "/next_i", "NextIteration", {L + "/inc"}, worker);
  g.add(L + "/next_h", "NextIteration", {L + "/h_new"}, worker);
  g.add(L + "/exit_i", "Exit", {L + "/switch_i:0"}, worker);
  g.add(L + "/exit_h", "Exit", {L + "/switch_h:0"}, worker);
  g.add("grad", "Mul", {L + "/exit_h", "lr"}, worker);
  g.add("update_b", "AssignSub", {"b", "grad"}, ps0);
  return g;
}

// Two tasks that each wait for the other's message before sending their own.
inline fg::plan deadlocked_plan() {
  fg::plan p;
  fg::graph_def a, b;
  a.tasks = b.tasks = {worker_task, ps0_task};
  a.add("r", "_Recv", {}, worker).set("key", std::string("kb")).set("entries", std::int64_t{1});
  a.add("s", "_Send", {"r"}, worker).set("key", std::string("ka")).set("entries", std::int64_t{1});
  b.add("r2", "_Recv", {}, ps0).set("key", std::string("ka")).set("entries", std::int64_t{1});
  b.add("s2", "_Send", {"r2"}, ps0).set("key", std::string("kb")).set("entries", std::int64_t{1});
  p.partitions.push_back({worker_task, std::move(a)});
  p.partitions.push_back({ps0_task, std::move(b)});
  return p;
}

// worker -> ps0 -> worker -> the same part of ps0: a chain (star_server splits
// it into rounds; star_server_lite refuses it).
inline fg::graph_def chain() {
  fg::graph_def g;
  g.tasks = {worker_task, ps0_task};
  placeholder(g, "x", worker, {2});
  variable(g, "w", ps0, {2}, {1, 2});
  g.add("a", "Mul", {"x", "w"}, ps0);
  g.add("z", "Mul", {"a", "a"}, worker);
  g.add("b", "Add", {"a", "z"}, ps0);
  g.add("out", "Identity", {"b"}, worker);
  g.add("learn", "AssignAdd", {"w", "b"}, ps0);
  return g;
}

// Control edges across tasks: ps0 bumps a counter once the worker's "ready"
// ran, and the worker's "after" waits for the bump. Feed x (float32[2]).
inline fg::graph_def control_tokens() {
  fg::graph_def def;
  def.tasks = {worker_task, ps0_task};
  placeholder(def, "x", worker, {2});
  def.add("ready", "NoOp", {"^x"}, worker);
  variable(def, "counter", ps0, {1}, {0});
  constant(def, "one", ps0, {1}, {1});
  def.add("bump", "AssignAdd", {"counter", "one", "^ready"}, ps0);
  def.add("after", "Identity", {"x", "^bump"}, worker);
  return def;
}

// A conditional whose branches run on two PS tasks: the worker switches x on
// p; the true branch scales x by ps0's weight, the false branch shifts it by
// ps1's; the worker merges them. The untaken branch's values are dead and
// cross the wire as dead entries. A shared input (x) feeds both PS and the
// worker; each PS also trains its weight from the merged result, gated by a
// control edge from the worker. Feeds x (float32[2]), p (float32[]); fetch
// "join", "join:1", "out".
inline fg::graph_def branches() {
  fg::graph_def g;
  g.tasks = {worker_task, ps0_task, ps1_task};
  placeholder(g, "x", worker, {2});
  placeholder(g, "p", worker, {});
  g.add("sw", "Switch", {"x", "p"}, worker);
  variable(g, "scale", ps0, {2}, {2, 3});
  variable(g, "shift", ps1, {2}, {10, 20});
  g.add("if_true", "Mul", {"sw:1", "scale"}, ps0);
  g.add("if_false", "Add", {"sw:0", "shift"}, ps1);
  g.add("join", "Merge", {"if_false", "if_true"}, worker);
  g.add("out", "Add", {"join", "x"}, worker);
  constant(g, "lr", worker, {}, {0.125f});
  g.add("step", "Mul", {"out", "lr"}, worker);
  g.add("go", "NoOp", {"^out"}, worker);
  g.add("learn_scale", "AssignSub", {"scale", "step", "^go"}, ps0);
  g.add("learn_shift", "AssignAdd", {"shift", "step", "^go"}, ps1);
  return g;
}

}  // namespace fusewire::test
