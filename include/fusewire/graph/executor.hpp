#pragma once
/// A small dataflow executor for checking plans: float32 tensors, a handful
/// of ops, variables that keep their value across steps, and TensorFlow-style
/// loops (Enter/Merge/Switch/NextIteration/Exit/LoopCond with dead tokens).
///
/// It runs a whole graph in one process (`run`), or one task's partition of a
/// plan (`begin_step` / `poll` / `end_step`) exchanging messages with the
/// other tasks through any `channel`. One executor is driven by one thread at
/// a time; channel handlers may complete on any thread.
///
/// Ops: Const, Placeholder, Identity, Add, Sub, Mul (elementwise, a
/// one-element side broadcasts), Less (1 or 0), MatMul (rank 2), Gather
/// (rows of input 0 at the indices in input 1), Concat ("axis", default -1),
/// Variable ("value", "shape"), Assign/AssignAdd/AssignSub (input 0 is the
/// Variable), NoOp, the loop ops, and the partitioner's _Send/_Recv.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/channel.hpp>
#include <fusewire/graph/detail/edge_value.hpp>
#include <fusewire/graph/graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// Placeholder name -> value.
using feed_map = std::map<std::string, tensor, std::less<>>;

/// Limits of one executor.
struct executor_options {
  /// A loop frame that iterates more often than this fails the step (no hang).
  std::int64_t max_iterations = 1'000'000;
};

/// Runs a graph (or one task's partition of a plan); see the file comment.
class executor {
 public:
  /// Validates `def` and the ops it uses; throws std::system_error
  /// (errc::invalid_graph, or errc::not_supported for an unknown op).
  explicit executor(graph_def def, executor_options opts = {}) : executor(placed_graph(std::move(def)), opts) {}

  /// As above, from an already validated graph.
  explicit executor(placed_graph g, executor_options opts = {})
      : graph_(std::move(g)), opts_(opts), inbox_(std::make_shared<inbox>()) {
    compile();
  }

  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  /// The graph this executor runs.
  const placed_graph& graph() const noexcept { return graph_; }

  /// Runs one step of a graph without _Send/_Recv nodes in this thread and
  /// returns the fetched outputs ("node" or "node:port") by the given names.
  /// Throws std::system_error naming the failing node.
  std::map<std::string, tensor> run(const feed_map& feeds, const std::vector<std::string>& fetches) {
    if (has_transfers_)
      throw_error(errc::invalid_argument, "this graph has _Send/_Recv nodes; run it with begin_step over a channel");
    start(nullptr, nullptr, next_local_step_, feeds, fetches);
    ++next_local_step_;
    while (!finished()) poll();
    return end_step();
  }

  /// Starts step `step`: validates feeds (by Placeholder name) and fetches,
  /// and queues the source nodes. `ch` and `feeds` must outlive the step;
  /// throws std::system_error(errc::invalid_argument) naming a bad feed or fetch.
  template <channel C>
  void begin_step(C& ch, std::uint64_t step, const feed_map& feeds, const std::vector<std::string>& fetches) {
    start([&ch](std::uint64_t s, const std::string& key,
                payload p) -> std::error_code { return ch.send(s, key, std::move(p)); },
          [&ch](std::uint64_t s, const std::string& key, recv_handler h) { ch.async_recv(s, key, std::move(h)); }, step,
          feeds, fetches);
  }

  /// Runs every node that is ready, including those whose messages arrived;
  /// returns how many events it handled (0: nothing to do right now).
  std::size_t poll() {
    if (!running_ || done_) return 0;
    std::size_t events = drain_inbox();
    while (!ready_.empty() && !failed()) {
      ready_item item = std::move(ready_.front());
      ready_.pop_front();
      fire(item);
      ++events;
      events += drain_inbox();
    }
    if (!failed() && ready_.empty() && pending_recvs_ == 0) settle();
    if (failed()) done_ = true;
    return events;
  }

  /// Blocks until a message arrives or `timeout` passes; true if one arrived.
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(inbox_->mutex);
    return inbox_->ready.wait_for(lock, timeout, [&] { return !inbox_->arrivals.empty(); });
  }

  /// True once the step completed or failed.
  bool finished() const noexcept { return !running_ || done_; }

  /// The step's error (empty while it runs or when it succeeded).
  std::error_code error() const noexcept { return error_; }

  /// Ends the step: returns the fetches, or throws the step's error.
  std::map<std::string, tensor> end_step() {
    if (running_ && !done_)
      throw_error(errc::invalid_argument, "end_step called while step " + std::to_string(step_) + " still runs");
    running_ = false;
    if (error_) throw std::system_error(error_, error_text_);
    return std::move(results_);
  }

  /// Abandons the running step (e.g. after another task failed).
  void abandon() {
    running_ = false;
    done_ = true;
  }

  /// The receives this executor is waiting for: "node 'x' in <tag>: <key>".
  std::vector<std::string> waiting_for() const {
    std::vector<std::string> out;
    for (const auto& [id, text] : pending_keys_) out.push_back(text);
    return out;
  }

  /// The current value of Variable `name`, or nullptr if this graph has none.
  const tensor* variable(std::string_view name) const {
    auto i = graph_.find(name);
    if (!i) return nullptr;
    auto it = variables_.find(*i);
    return it == variables_.end() ? nullptr : &it->second;
  }

 private:
  using edge_value = detail::edge_value;
  using edge_values = detail::edge_values;

  enum class op_kind {
    constant,
    placeholder,
    identity,
    add,
    sub,
    mul,
    less,
    matmul,
    gather,
    concat,
    variable,
    assign,
    assign_add,
    assign_sub,
    no_op,
    enter,
    exit,
    next_iteration,
    merge,
    switch_,
    loop_cond,
    send,
    recv
  };

  struct out_link {
    std::size_t dst = 0;
    int port = 0;          ///< output port, -1 for a control edge
    std::size_t slot = 0;  ///< data slot, or control slot when port < 0
  };

  struct compiled_node {
    op_kind kind = op_kind::no_op;
    std::size_t data_inputs = 0, control_inputs = 0, outputs = 0;
    std::vector<out_link> outs;
    tensor value;                                     // Const
    std::size_t frame = 0;                            // Enter
    bool is_constant = false;                         // Enter
    std::string key;                                  // _Send/_Recv
    std::size_t entries = 0;                          // _Send/_Recv
    std::int64_t axis = -1;                           // Concat
    std::size_t variable = 0;                         // Assign*: the Variable node
    std::size_t forward_inputs = 0, back_inputs = 0;  // Merge
  };

  struct instance {
    std::vector<edge_value> data;
    std::vector<char> have;            // data slot filled
    std::vector<signed char> control;  // -1 missing, 0 live, 1 dead
    std::size_t filled = 0, controls = 0, dead_inputs = 0;
    bool dead = false, fired = false;
    int merge_index = -1;
  };

  struct ready_item {
    std::size_t node = 0, tag = 0;
    instance in;
  };

  struct tag_info {
    std::size_t parent = 0, frame = 0;
    std::int64_t iter = 0;
    std::string text;  ///< "" for root, "<parent>/<frame>:<iter>"
    std::uint64_t frame_id = 0;
  };

  struct invariant {
    out_link link;
    edge_value value;
  };
  struct frame_state {
    std::int64_t max_iter = 0;
    std::vector<invariant> invariants;
  };

  struct arrival {
    std::size_t node = 0, tag = 0, recv_id = 0;
    std::error_code ec;
    payload values;
  };
  struct inbox {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<arrival> arrivals;
  };

  using send_fn = std::function<std::error_code(std::uint64_t, const std::string&, payload)>;
  using recv_fn = std::function<void(std::uint64_t, const std::string&, recv_handler)>;

  // ---- construction (defined in detail/executor_compile.hpp) --------------

  [[noreturn]] void bad_node(std::size_t i, const std::string& what, errc code = errc::invalid_graph) const;
  void expect_inputs(std::size_t i, std::size_t want) const;
  tensor value_attr(std::size_t i) const;
  void compile();

  // ---- steps (defined in detail/executor_step.hpp) ------------------------

  void start(send_fn send, recv_fn recv, std::uint64_t step, const feed_map& feeds,
             const std::vector<std::string>& fetches);

  bool failed() const noexcept { return static_cast<bool>(error_); }

  void fail(std::error_code ec, std::string text);
  void fail(errc code, std::string text) { fail(make_error_code(code), std::move(text)); }

  instance new_instance(std::size_t i) const;
  std::size_t child_tag(std::size_t parent, std::size_t frame, std::int64_t iter);

  std::string tag_text(std::size_t tag) const {
    return tag == 0 ? std::string("the root frame") : "iteration " + util::quoted(tags_[tag].text);
  }

  std::string full_key(const compiled_node& c, std::size_t tag) const {
    return c.key + ";" + std::to_string(tags_[tag].frame_id) + ":" + std::to_string(tags_[tag].iter);
  }

  std::size_t drain_inbox();

  // ---- firing (defined in detail/executor_fire.hpp) -----------------------

  void fire(ready_item& item);
  void start_recv(std::size_t n, std::size_t tag);
  void do_send(std::size_t n, std::size_t tag, instance& in);
  void compute(std::size_t n, instance& in, edge_values& outs);

  /// Why `t` does not fit the declared spec of output `port` of `n` (" output 0 is ...").
  std::optional<std::string> spec_mismatch(std::size_t n, std::size_t port, const tensor& t) const;

  // ---- propagation (defined in detail/executor_propagate.hpp) -------------

  void finish(std::size_t n, std::size_t tag, edge_values outs, bool control_dead);
  std::size_t advance(std::size_t tag);
  void deliver(const out_link& l, std::size_t tag, edge_value v);
  void settle();

  struct fetch_spec {
    std::size_t node;
    int port;
    std::string name;
  };

  placed_graph graph_;
  executor_options opts_;
  std::vector<compiled_node> nodes_;
  bool has_transfers_ = false;
  std::map<std::size_t, tensor> variables_;

  // per step
  send_fn send_;
  recv_fn recv_;
  std::uint64_t step_ = 0;
  std::uint64_t next_local_step_ = 1;
  const feed_map* feeds_ = nullptr;
  std::vector<fetch_spec> fetches_;
  std::map<std::string, tensor> results_;
  std::map<std::pair<std::size_t, std::size_t>, instance> instances_;
  std::map<std::pair<std::size_t, std::size_t>, frame_state> frames_;
  std::vector<tag_info> tags_;
  std::map<std::tuple<std::size_t, std::size_t, std::int64_t>, std::size_t> tag_index_;
  std::deque<ready_item> ready_;
  std::size_t pending_recvs_ = 0;
  std::size_t next_recv_id_ = 0;
  std::map<std::size_t, std::string> pending_keys_;
  std::shared_ptr<inbox> inbox_;
  std::error_code error_;
  std::string error_text_;
  bool running_ = false, done_ = false;
};

/// The feeds of `all` that name a Placeholder of `g` (one task's share of a step's feeds).
inline feed_map feeds_for(const placed_graph& g, const feed_map& all) {
  feed_map out;
  for (const auto& [name, value] : all)
    if (auto i = g.find(name); i && g.node(*i).op == "Placeholder") out.emplace(name, value);
  return out;
}

/// The fetches of `all` ("node" or "node:port") whose node is in `g`.
inline std::vector<std::string> fetches_for(const placed_graph& g, const std::vector<std::string>& all) {
  std::vector<std::string> out;
  for (const auto& f : all) {
    auto in = detail::split_input(f);
    if (in && !in->control && g.find(in->node)) out.push_back(f);
  }
  return out;
}

/// Runs step `step` of one task's executor over `ch` in the calling thread,
/// waiting for messages as they arrive: the way a process runs its partition.
/// `feeds` and `fetches` are this task's (see feeds_for / fetches_for).
/// Throws std::system_error: the step's error, or errc::timed_out (what()
/// lists the receives still waiting) when nothing happened for `idle_timeout`.
template <channel C>
std::map<std::string, tensor> run_step(executor& ex, C& ch, std::uint64_t step, const feed_map& feeds,
                                       const std::vector<std::string>& fetches,
                                       std::chrono::milliseconds idle_timeout = std::chrono::seconds(30)) {
  ex.begin_step(ch, step, feeds, fetches);
  auto idle_since = std::chrono::steady_clock::now();
  while (!ex.finished()) {
    if (ex.poll() > 0) {
      idle_since = std::chrono::steady_clock::now();
      continue;
    }
    if (ex.finished()) break;
    if (!ex.wait(std::chrono::milliseconds(50)) && std::chrono::steady_clock::now() - idle_since > idle_timeout) {
      std::string text =
          "step " + std::to_string(step) + " waited longer than " + std::to_string(idle_timeout.count()) + " ms for:";
      for (const auto& w : ex.waiting_for()) text += " " + w + ";";
      ex.abandon();
      throw_error(errc::timed_out, text);
    }
  }
  return ex.end_step();
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire

// The executor's member definitions, by phase. Each includes this header, so
// each compiles on its own.
#include <fusewire/graph/detail/executor_compile.hpp>
#include <fusewire/graph/detail/executor_fire.hpp>
#include <fusewire/graph/detail/executor_propagate.hpp>
#include <fusewire/graph/detail/executor_step.hpp>
