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

namespace detail {

/// What flows along an edge inside an executor: a tensor, or a dead value
/// from an untaken Switch branch (TensorFlow's is_dead). Control tokens are
/// empty tensors.
struct edge_value {
  tensor value;
  bool dead = false;
};

/// The outputs of one node firing, by port.
using edge_values = std::vector<edge_value>;

/// 64-bit FNV-1a; names a loop-frame instance in rendezvous keys.
inline std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace detail

/// Runs a graph (or one task's partition of a plan); see the file comment.
class executor {
 public:
  /// Validates `def` and the ops it uses; throws std::system_error
  /// (errc::invalid_graph, or errc::not_supported for an unknown op).
  explicit executor(graph_def def, executor_options opts = {})
      : executor(placed_graph(std::move(def)), opts) {}

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
      throw_error(errc::invalid_argument,
                  "this graph has _Send/_Recv nodes; run it with begin_step over a channel");
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
    start([&ch](std::uint64_t s, const std::string& key, payload p) -> std::error_code {
          return ch.send(s, key, std::move(p));
        },
          [&ch](std::uint64_t s, const std::string& key, recv_handler h) {
            ch.async_recv(s, key, std::move(h));
          },
          step, feeds, fetches);
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
    constant, placeholder, identity, add, sub, mul, less, matmul, gather, concat,
    variable, assign, assign_add, assign_sub, no_op,
    enter, exit, next_iteration, merge, switch_, loop_cond, send, recv
  };

  struct out_link {
    std::size_t dst = 0;
    int port = 0;      ///< output port, -1 for a control edge
    std::size_t slot = 0;  ///< data slot, or control slot when port < 0
  };

  struct compiled_node {
    op_kind kind = op_kind::no_op;
    std::size_t data_inputs = 0, control_inputs = 0, outputs = 0;
    std::vector<out_link> outs;
    tensor value;                  // Const
    std::size_t frame = 0;         // Enter
    bool is_constant = false;      // Enter
    std::string key;               // _Send/_Recv
    std::size_t entries = 0;       // _Send/_Recv
    std::int64_t axis = -1;        // Concat
    std::size_t variable = 0;      // Assign*: the Variable node
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

  // ---- construction -------------------------------------------------------

  [[noreturn]] void bad_node(std::size_t i, const std::string& what, errc code = errc::invalid_graph) const {
    throw_error(code, "node " + graph_.describe(i) + ": " + what);
  }

  void expect_inputs(std::size_t i, std::size_t want) const {
    auto got = graph_.data_input_count(i);
    if (got != want)
      bad_node(i, "takes " + std::to_string(want) + " data input" + (want == 1 ? "" : "s") + ", got " +
                      std::to_string(got));
  }

  tensor value_attr(std::size_t i) const {
    const auto& nd = graph_.node(i);
    const auto* v = nd.attr<std::vector<float>>("value");
    if (!v) bad_node(i, "needs a \"value\" attribute (list of floats)");
    std::vector<std::int64_t> shape{static_cast<std::int64_t>(v->size())};
    if (const auto* s = nd.attr<std::vector<std::int64_t>>("shape")) shape = *s;
    if (tensor::count_of(shape) != v->size())
      bad_node(i, "\"shape\" " + tensor::shape_string(shape) + " needs " +
                      std::to_string(tensor::count_of(shape)) + " values, \"value\" has " +
                      std::to_string(v->size()));
    return tensor(shape, *v);
  }

  void compile() {
    static const std::map<std::string_view, op_kind> kinds = {
        {"Const", op_kind::constant}, {"Placeholder", op_kind::placeholder},
        {"Identity", op_kind::identity}, {"Add", op_kind::add}, {"Sub", op_kind::sub},
        {"Mul", op_kind::mul}, {"Less", op_kind::less}, {"MatMul", op_kind::matmul},
        {"Gather", op_kind::gather}, {"Concat", op_kind::concat}, {"Variable", op_kind::variable},
        {"VariableV2", op_kind::variable}, {"Assign", op_kind::assign},
        {"AssignAdd", op_kind::assign_add}, {"AssignSub", op_kind::assign_sub},
        {"NoOp", op_kind::no_op}, {"Enter", op_kind::enter}, {"Exit", op_kind::exit},
        {"NextIteration", op_kind::next_iteration}, {"Merge", op_kind::merge},
        {"Switch", op_kind::switch_}, {"LoopCond", op_kind::loop_cond}, {"_Send", op_kind::send},
        {"_Recv", op_kind::recv}};
    const auto n = graph_.size();
    nodes_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& nd = graph_.node(i);
      auto& c = nodes_[i];
      auto k = kinds.find(nd.op);
      if (k == kinds.end()) {
        std::string names;
        for (const auto& [name, kind] : kinds) names += (names.empty() ? "" : ", ") + std::string(name);
        bad_node(i, "op " + util::quoted(nd.op) + " is not supported by the executor (supported: " + names + ")",
                 errc::not_supported);
      }
      c.kind = k->second;
      c.data_inputs = graph_.data_input_count(i);
      c.control_inputs = graph_.control_input_count(i);
      c.outputs = graph_.output_count(i);
      switch (c.kind) {
        case op_kind::constant: expect_inputs(i, 0); c.value = value_attr(i); break;
        case op_kind::placeholder: expect_inputs(i, 0); break;
        case op_kind::variable:
          expect_inputs(i, 0);
          variables_.emplace(i, value_attr(i));
          break;
        case op_kind::identity: case op_kind::exit: case op_kind::next_iteration:
        case op_kind::loop_cond: expect_inputs(i, 1); break;
        case op_kind::enter:
          expect_inputs(i, 1);
          c.frame = graph_.frame_of(i);
          if (const auto* b = nd.attr<bool>("is_constant")) c.is_constant = *b;
          break;
        case op_kind::add: case op_kind::sub: case op_kind::mul: case op_kind::less:
        case op_kind::matmul: case op_kind::gather: case op_kind::switch_: expect_inputs(i, 2); break;
        case op_kind::assign: case op_kind::assign_add: case op_kind::assign_sub: {
          expect_inputs(i, 2);
          const auto& e = graph_.edges()[graph_.in_edges(i)[0]];
          if (!detail::is_variable(graph_.node(e.src).op))
            bad_node(i, "input 0 must be a Variable, got " + graph_.describe(e.src));
          c.variable = e.src;
          break;
        }
        case op_kind::concat:
          if (c.data_inputs == 0) bad_node(i, "takes at least 1 data input, got 0");
          if (const auto* a = nd.attr<std::int64_t>("axis")) c.axis = *a;
          break;
        case op_kind::merge:
          if (c.data_inputs == 0) bad_node(i, "takes at least 1 data input, got 0");
          if (c.control_inputs != 0) bad_node(i, "a Merge may not have control inputs");
          for (auto ei : graph_.in_edges(i))
            (graph_.is_back_edge(graph_.edges()[ei]) ? c.back_inputs : c.forward_inputs) += 1;
          break;
        case op_kind::no_op: expect_inputs(i, 0); break;
        case op_kind::send:
        case op_kind::recv: {
          has_transfers_ = true;
          const auto* key = nd.attr<std::string>("key");
          const auto* entries = nd.attr<std::int64_t>("entries");
          if (!key || key->empty() || !entries || *entries < 0)
            bad_node(i, "needs \"key\" (string) and \"entries\" (int) attributes");
          c.key = *key;
          c.entries = static_cast<std::size_t>(*entries);
          if (c.kind == op_kind::recv) expect_inputs(i, 0);
          if (c.kind == op_kind::send &&
              (c.data_inputs > c.entries || c.entries - c.data_inputs > c.control_inputs))
            bad_node(i, "has " + std::to_string(c.data_inputs) + " data and " +
                            std::to_string(c.control_inputs) + " control inputs for " +
                            std::to_string(c.entries) + " entries");
          break;
        }
        default: break;
      }
    }
    std::vector<std::size_t> next_control(n, 0);
    for (std::size_t i = 0; i < n; ++i)
      for (auto ei : graph_.in_edges(i)) {
        const auto& e = graph_.edges()[ei];
        out_link l;
        l.dst = i;
        l.port = e.src_port;
        l.slot = e.control() ? next_control[i]++ : static_cast<std::size_t>(e.dst_slot);
        nodes_[e.src].outs.push_back(l);
      }
  }

  // ---- steps --------------------------------------------------------------

  void start(send_fn send, recv_fn recv, std::uint64_t step, const feed_map& feeds,
             const std::vector<std::string>& fetches) {
    if (running_ && !done_)
      throw_error(errc::invalid_argument, "step " + std::to_string(step_) + " is still running");
    for (const auto& [name, value] : feeds) {
      auto i = graph_.find(name);
      if (!i || nodes_[*i].kind != op_kind::placeholder)
        throw_error(errc::invalid_argument, "feed " + util::quoted(name) + " names no Placeholder in this graph");
      if (auto bad = spec_mismatch(*i, 0, value))
        throw_error(errc::invalid_argument, "feed " + util::quoted(name) + " does not fit: Placeholder " +
                                                graph_.describe(*i) + *bad);
    }
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].kind == op_kind::placeholder && !feeds.count(graph_.node(i).name))
        throw_error(errc::invalid_argument, "no feed for Placeholder " + util::quoted(graph_.node(i).name));
    std::vector<std::pair<std::size_t, int>> fetch_ports;
    for (const auto& f : fetches) {
      auto in = detail::split_input(f);
      std::optional<std::size_t> i;
      if (in && !in->control) i = graph_.find(in->node);
      if (!i || static_cast<std::size_t>(in->port) >= nodes_[*i].outputs)
        throw_error(errc::invalid_argument, "fetch " + util::quoted(f) + " names no output in this graph");
      if (graph_.output_frame_of(*i) != 0)
        throw_error(errc::invalid_argument, "fetch " + util::quoted(f) + " is inside " +
                                                graph_.describe_frame(graph_.output_frame_of(*i)) +
                                                "; fetch the loop's Exit instead");
      fetch_ports.emplace_back(*i, in->port);
    }
    send_ = std::move(send);
    recv_ = std::move(recv);
    step_ = step;
    feeds_ = &feeds;
    fetches_.clear();
    for (std::size_t k = 0; k < fetches.size(); ++k) fetches_.push_back({fetch_ports[k].first, fetch_ports[k].second, fetches[k]});
    results_.clear();
    instances_.clear();
    frames_.clear();
    tags_.assign(1, tag_info{});
    tag_index_.clear();
    ready_.clear();
    pending_recvs_ = 0;
    pending_keys_.clear();
    {
      std::lock_guard lock(inbox_->mutex);
      inbox_->arrivals.clear();
    }
    inbox_ = std::make_shared<inbox>();  // late handlers of an abandoned step land in the old one
    error_.clear();
    error_text_.clear();
    running_ = true;
    done_ = false;
    for (auto i : graph_.topological_order())
      if (graph_.in_edges(i).empty()) ready_.push_back({i, 0, new_instance(i)});
  }

  bool failed() const noexcept { return static_cast<bool>(error_); }

  void fail(std::error_code ec, std::string text) {
    if (failed()) return;
    error_ = ec;
    error_text_ = "step " + std::to_string(step_) + ": " + std::move(text);
  }
  void fail(errc code, std::string text) { fail(make_error_code(code), std::move(text)); }

  instance new_instance(std::size_t i) const {
    instance in;
    in.data.resize(nodes_[i].data_inputs);
    in.have.assign(nodes_[i].data_inputs, 0);
    in.control.assign(nodes_[i].control_inputs, -1);
    return in;
  }

  std::size_t child_tag(std::size_t parent, std::size_t frame, std::int64_t iter) {
    auto key = std::make_tuple(parent, frame, iter);
    auto it = tag_index_.find(key);
    if (it != tag_index_.end()) return it->second;
    tag_info t;
    t.parent = parent;
    t.frame = frame;
    t.iter = iter;
    std::string instance_name = tags_[parent].text + "/" + graph_.frames()[frame].name;
    t.frame_id = detail::fnv1a64(instance_name);
    t.text = instance_name + ":" + std::to_string(iter);
    tags_.push_back(std::move(t));
    tag_index_.emplace(key, tags_.size() - 1);
    return tags_.size() - 1;
  }

  std::string tag_text(std::size_t tag) const {
    return tag == 0 ? std::string("the root frame") : "iteration " + util::quoted(tags_[tag].text);
  }

  std::string full_key(const compiled_node& c, std::size_t tag) const {
    return c.key + ";" + std::to_string(tags_[tag].frame_id) + ":" + std::to_string(tags_[tag].iter);
  }

  std::size_t drain_inbox() {
    std::deque<arrival> got;
    {
      std::lock_guard lock(inbox_->mutex);
      got.swap(inbox_->arrivals);
    }
    for (auto& a : got) {
      --pending_recvs_;
      pending_keys_.erase(a.recv_id);
      if (failed()) continue;
      const auto& c = nodes_[a.node];
      if (a.ec) {
        fail(a.ec, "receive of " + full_key(c, a.tag) + " by node " + graph_.describe(a.node) +
                       " failed: " + a.ec.message());
        continue;
      }
      if (a.values.size() != c.entries) {
        fail(errc::size_mismatch, "node " + graph_.describe(a.node) + " expected " + std::to_string(c.entries) +
                                      " entries under " + full_key(c, a.tag) + ", got " +
                                      std::to_string(a.values.size()));
        continue;
      }
      edge_values values(a.values.size());
      for (std::size_t p = 0; p < a.values.size() && !failed(); ++p) {
        const auto& entry = a.values[p];
        values[p].dead = entry.dead;
        if (entry.dead) continue;
        if (auto ec = entry.to_tensor(values[p].value)) {
          fail(ec, "node " + graph_.describe(a.node) + " got entry " + std::to_string(p) + " under " +
                       full_key(c, a.tag) + " as " + fusewire::to_string(entry.descriptor) + " in " +
                       std::to_string(entry.bytes.size()) + " bytes (expected float32 values filling the shape)");
        } else if (auto bad = spec_mismatch(a.node, p, values[p].value)) {
          fail(errc::invalid_argument, "node " + graph_.describe(a.node) + *bad);
        }
      }
      if (failed()) continue;
      // Each entry carries its own deadness on its data output. The control
      // output means "the message arrived" (the partitioner hangs call
      // triggers and request/response ordering on it), so it is never dead:
      // a request whose entries all come from an untaken branch still runs
      // the server's part, as one process would.
      finish(a.node, a.tag, std::move(values), false);
    }
    return got.size();
  }

  // ---- firing -------------------------------------------------------------

  void fire(ready_item& item) {
    const auto n = item.node;
    const auto& c = nodes_[n];
    auto& in = item.in;
    if (c.kind == op_kind::recv) {
      start_recv(n, item.tag);
      return;
    }
    if (c.kind == op_kind::send) {
      do_send(n, item.tag, in);
      return;
    }
    edge_values outs(c.outputs);
    if (c.kind == op_kind::merge) {
      if (in.merge_index >= 0) {
        outs[0] = std::move(in.data[0]);
        outs[1].value = tensor::scalar(static_cast<float>(in.merge_index));
      } else {
        for (auto& o : outs) o.dead = true;
      }
      finish(n, item.tag, std::move(outs), in.merge_index < 0);
      return;
    }
    if (in.dead) {
      for (auto& o : outs) o.dead = true;
      finish(n, item.tag, std::move(outs), true);
      return;
    }
    try {
      compute(n, in, outs);
    } catch (const op_failure& e) {
      fail(errc::invalid_argument, "node " + graph_.describe(n) + ": " + e.what());
      return;
    }
    for (std::size_t p = 0; p < outs.size(); ++p)
      if (auto bad = outs[p].dead ? std::nullopt : spec_mismatch(n, p, outs[p].value)) {
        fail(errc::invalid_argument, "node " + graph_.describe(n) + *bad);
        return;
      }
    finish(n, item.tag, std::move(outs), false);
  }

  void start_recv(std::size_t n, std::size_t tag) {
    if (!recv_) {
      fail(errc::invalid_argument, "node " + graph_.describe(n) + " needs a channel");
      return;
    }
    const auto id = next_recv_id_++;
    ++pending_recvs_;
    std::string key = full_key(nodes_[n], tag);
    pending_keys_.emplace(id, "node " + graph_.describe(n) + " in " + tag_text(tag) + ": " + key);
    recv_(step_, key, [box = inbox_, n, tag, id](std::error_code ec, payload values) {
      {
        std::lock_guard lock(box->mutex);
        box->arrivals.push_back(arrival{n, tag, id, ec, std::move(values)});
      }
      box->ready.notify_all();
    });
  }

  void do_send(std::size_t n, std::size_t tag, instance& in) {
    const auto& c = nodes_[n];
    if (!send_) {
      fail(errc::invalid_argument, "node " + graph_.describe(n) + " needs a channel");
      return;
    }
    payload p;
    p.reserve(c.entries);
    for (const auto& v : in.data) {
      if (!v.dead && v.value.shape.size() > max_rank) {
        fail(errc::invalid_argument, "node " + graph_.describe(n) + " cannot send a tensor of rank " +
                                         std::to_string(v.value.shape.size()) + " (at most " +
                                         std::to_string(max_rank) + ")");
        return;
      }
      p.push_back(v.dead ? message_entry::token(true) : message_entry::of(v.value));
    }
    for (std::size_t k = 0; p.size() < c.entries; ++k) p.push_back(message_entry::token(in.control[k] == 1));
    const auto key = full_key(c, tag);
    if (auto ec = send_(step_, key, std::move(p)))
      fail(ec, "send of " + key + " by node " + graph_.describe(n) + " failed: " + ec.message());
  }

  struct op_failure : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  static void need(bool ok, const std::string& what) {
    if (!ok) throw op_failure(what);
  }

  static std::string shapes(const tensor& a, const tensor& b) {
    return tensor::shape_string(a.shape) + " and " + tensor::shape_string(b.shape);
  }

  template <class F>
  static tensor elementwise(const tensor& a, const tensor& b, F f) {
    tensor out;
    if (a.shape == b.shape || b.values.size() == 1) {
      out.shape = a.shape;
      out.values.resize(a.values.size());
      for (std::size_t k = 0; k < a.values.size(); ++k)
        out.values[k] = f(a.values[k], b.values.size() == 1 ? b.values[0] : b.values[k]);
      return out;
    }
    need(a.values.size() == 1, "shapes " + shapes(a, b) + " are not compatible");
    out.shape = b.shape;
    out.values.resize(b.values.size());
    for (std::size_t k = 0; k < b.values.size(); ++k) out.values[k] = f(a.values[0], b.values[k]);
    return out;
  }

  static tensor matmul(const tensor& a, const tensor& b) {
    need(a.shape.size() == 2 && b.shape.size() == 2 && a.shape[1] == b.shape[0],
         "cannot multiply matrices of shapes " + shapes(a, b));
    const auto m = static_cast<std::size_t>(a.shape[0]), k = static_cast<std::size_t>(a.shape[1]),
               n = static_cast<std::size_t>(b.shape[1]);
    tensor out({a.shape[0], b.shape[1]}, std::vector<float>(m * n, 0.0f));
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < k; ++j) {
        const float x = a.values[i * k + j];
        for (std::size_t c = 0; c < n; ++c) out.values[i * n + c] += x * b.values[j * n + c];
      }
    return out;
  }

  static tensor gather(const tensor& params, const tensor& indices) {
    need(!params.shape.empty(), "cannot gather from a scalar");
    const auto rows = params.shape[0];
    const std::size_t row = rows == 0 ? 0 : params.values.size() / static_cast<std::size_t>(rows);
    tensor out;
    out.shape = indices.shape;
    out.shape.insert(out.shape.end(), params.shape.begin() + 1, params.shape.end());
    for (float x : indices.values) {
      need(x >= 0 && x < static_cast<float>(rows) && std::floor(x) == x,
           "index " + std::to_string(x) + " is not a row of a tensor with " + std::to_string(rows) + " rows");
      auto first = params.values.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(x) * row);
      out.values.insert(out.values.end(), first, first + static_cast<std::ptrdiff_t>(row));
    }
    return out;
  }

  static tensor concat(const std::vector<edge_value>& parts, std::int64_t axis) {
    const auto& first = parts[0].value;
    const auto rank = static_cast<std::int64_t>(first.shape.size());
    if (axis < 0) axis += rank;
    need(axis >= 0 && axis < rank, "axis out of range for rank " + std::to_string(rank));
    const auto ax = static_cast<std::size_t>(axis);
    tensor out;
    out.shape = first.shape;
    out.shape[ax] = 0;
    for (const auto& p : parts) {
      const auto& s = p.value.shape;
      bool same = s.size() == first.shape.size();
      for (std::size_t d = 0; same && d < s.size(); ++d) same = d == ax || s[d] == first.shape[d];
      need(same, "cannot concatenate shapes " + shapes(first, p.value) + " on axis " + std::to_string(axis));
      out.shape[ax] += s[ax];
    }
    std::size_t outer = 1;
    for (std::size_t d = 0; d < ax; ++d) outer *= static_cast<std::size_t>(first.shape[d]);
    for (std::size_t o = 0; o < outer; ++o)
      for (const auto& p : parts) {
        const std::size_t chunk = outer == 0 ? 0 : p.value.values.size() / outer;
        auto from = p.value.values.begin() + static_cast<std::ptrdiff_t>(o * chunk);
        out.values.insert(out.values.end(), from, from + static_cast<std::ptrdiff_t>(chunk));
      }
    return out;
  }

  void compute(std::size_t n, instance& in, edge_values& outs) {
    const auto& c = nodes_[n];
    auto& d = in.data;
    switch (c.kind) {
      case op_kind::constant: outs[0].value = c.value; break;
      case op_kind::placeholder: outs[0].value = feeds_->find(graph_.node(n).name)->second; break;
      case op_kind::identity: case op_kind::loop_cond: case op_kind::enter: case op_kind::exit:
      case op_kind::next_iteration: outs[0] = std::move(d[0]); break;
      case op_kind::add: outs[0].value = elementwise(d[0].value, d[1].value, [](float a, float b) { return a + b; }); break;
      case op_kind::sub: outs[0].value = elementwise(d[0].value, d[1].value, [](float a, float b) { return a - b; }); break;
      case op_kind::mul: outs[0].value = elementwise(d[0].value, d[1].value, [](float a, float b) { return a * b; }); break;
      case op_kind::less:
        outs[0].value = elementwise(d[0].value, d[1].value, [](float a, float b) { return a < b ? 1.0f : 0.0f; });
        break;
      case op_kind::matmul: outs[0].value = matmul(d[0].value, d[1].value); break;
      case op_kind::gather: outs[0].value = gather(d[0].value, d[1].value); break;
      case op_kind::concat: outs[0].value = concat(d, c.axis); break;
      case op_kind::variable: outs[0].value = variables_.at(n); break;
      case op_kind::assign: case op_kind::assign_add: case op_kind::assign_sub: {
        auto& var = variables_.at(c.variable);
        const auto& v = d[1].value;
        need(v.shape == var.shape, "cannot assign a value of shape " + tensor::shape_string(v.shape) +
                                       " to a variable of shape " + tensor::shape_string(var.shape));
        if (c.kind == op_kind::assign) var = v;
        for (std::size_t k = 0; c.kind != op_kind::assign && k < var.values.size(); ++k)
          var.values[k] += c.kind == op_kind::assign_add ? v.values[k] : -v.values[k];
        outs[0].value = var;
        break;
      }
      case op_kind::no_op: break;
      case op_kind::switch_: {
        need(d[1].value.values.size() == 1,
             "predicate must hold one value, got shape " + tensor::shape_string(d[1].value.shape));
        const bool taken = d[1].value.values[0] != 0.0f;
        outs[taken ? 1 : 0] = std::move(d[0]);
        outs[taken ? 0 : 1].dead = true;
        break;
      }
      default: break;
    }
  }

  /// Why `t` does not fit the declared spec of output `port` of `n` (" output 0 is ...").
  std::optional<std::string> spec_mismatch(std::size_t n, std::size_t port, const tensor& t) const {
    const auto& declared = graph_.node(n).output_specs;
    if (port >= declared.size() || !declared[port]) return std::nullopt;
    const auto& s = *declared[port];
    bool ok = s.type == dtype::float32 && s.shape.size() == t.shape.size();
    for (std::size_t k = 0; ok && k < t.shape.size(); ++k) ok = s.shape[k] < 0 || s.shape[k] == t.shape[k];
    if (ok) return std::nullopt;
    return " output " + std::to_string(port) + " is float32" + tensor::shape_string(t.shape) +
           " but its spec says " + s.to_string();
  }

  // ---- propagation --------------------------------------------------------

  void finish(std::size_t n, std::size_t tag, edge_values outs, bool control_dead) {
    const auto& c = nodes_[n];
    const bool is_exit = c.kind == op_kind::exit;
    const std::size_t out_tag = is_exit ? tags_[tag].parent : tag;
    if (out_tag == 0 && !(is_exit && control_dead))
      for (const auto& f : fetches_)
        if (f.node == n) {
          if (outs[static_cast<std::size_t>(f.port)].dead) {
            fail(errc::invalid_argument, "fetch " + util::quoted(f.name) + " is dead (an untaken branch)");
            return;
          }
          results_[f.name] = outs[static_cast<std::size_t>(f.port)].value;
        }
    for (const auto& l : c.outs) {
      edge_value v = l.port < 0 ? edge_value{tensor{}, control_dead} : outs[static_cast<std::size_t>(l.port)];
      switch (c.kind) {
        case op_kind::enter: {
          auto& fs = frames_[{tag, c.frame}];
          if (c.is_constant) {
            fs.invariants.push_back({l, v});
            for (std::int64_t it = 0; it <= fs.max_iter; ++it) deliver(l, child_tag(tag, c.frame, it), v);
          } else {
            deliver(l, child_tag(tag, c.frame, 0), std::move(v));
          }
          break;
        }
        case op_kind::exit:
          if (!v.dead) deliver(l, tags_[tag].parent, std::move(v));
          break;
        case op_kind::next_iteration:
          if (!v.dead) {
            auto next = advance(tag);
            if (failed()) return;
            deliver(l, next, std::move(v));
          }
          break;
        default: deliver(l, tag, std::move(v)); break;
      }
      if (failed()) return;
    }
  }

  std::size_t advance(std::size_t tag) {
    const auto t = tags_[tag];
    const auto iter = t.iter + 1;
    if (iter > opts_.max_iterations) {
      fail(errc::invalid_argument, graph_.describe_frame(t.frame) + " ran more than " +
                                       std::to_string(opts_.max_iterations) + " iterations");
      return tag;
    }
    auto& fs = frames_[{t.parent, t.frame}];
    auto next = child_tag(t.parent, t.frame, iter);
    if (iter > fs.max_iter) {
      fs.max_iter = iter;
      auto invariants = fs.invariants;
      for (const auto& inv : invariants) deliver(inv.link, next, inv.value);
    }
    return next;
  }

  void deliver(const out_link& l, std::size_t tag, edge_value v) {
    const auto& c = nodes_[l.dst];
    auto key = std::make_pair(l.dst, tag);
    auto it = instances_.find(key);
    if (it == instances_.end()) it = instances_.emplace(key, new_instance(l.dst)).first;
    auto& in = it->second;
    if (c.kind == op_kind::merge) {
      if (in.fired) return;
      if (!v.dead) {
        in.fired = true;
        instance chosen;
        chosen.data.push_back(std::move(v));
        chosen.merge_index = static_cast<int>(l.slot);
        ready_.push_back({l.dst, tag, std::move(chosen)});
        return;
      }
      ++in.dead_inputs;
      const std::size_t expected = c.back_inputs == 0 ? c.forward_inputs
                                   : tags_[tag].iter == 0 ? c.forward_inputs
                                                          : c.back_inputs;
      if (in.dead_inputs >= expected) {
        in.fired = true;
        ready_.push_back({l.dst, tag, instance{}});
      }
      return;
    }
    const bool twice = l.port < 0 ? in.control[l.slot] >= 0 : in.have[l.slot] != 0;
    if (twice) {
      fail(errc::invalid_graph, "node " + graph_.describe(l.dst) + " got its " +
                                    (l.port < 0 ? "control" : "data") + " input " + std::to_string(l.slot) +
                                    " twice in " + tag_text(tag));
      return;
    }
    in.dead = in.dead || v.dead;
    if (l.port < 0) {
      in.control[l.slot] = v.dead ? 1 : 0;
      ++in.controls;
    } else {
      in.data[l.slot] = std::move(v);
      in.have[l.slot] = 1;
      ++in.filled;
    }
    if (in.filled == c.data_inputs && in.controls == c.control_inputs) {
      ready_.push_back({l.dst, tag, std::move(in)});
      instances_.erase(it);
    }
  }

  void settle() {
    // Nodes inside loops may wait forever for inputs of an iteration that
    // turned dead (TensorFlow drops them when the frame ends); a root-frame
    // node that never ran means an input was never produced.
    std::vector<std::string> stuck;
    for (const auto& [key, in] : instances_) {
      if (in.fired || key.second != 0) continue;
      const auto& c = nodes_[key.first];
      stuck.push_back("node " + graph_.describe(key.first) + " in " + tag_text(key.second) + " got " +
                      std::to_string(in.filled + in.controls + in.dead_inputs) + " of " +
                      std::to_string(c.data_inputs + c.control_inputs) + " inputs");
      if (stuck.size() == 3) break;
    }
    if (!stuck.empty()) {
      fail(errc::invalid_graph, "the step ended with nodes that never ran: " + detail::join(stuck, "; "));
    } else {
      for (const auto& f : fetches_)
        if (!results_.count(f.name)) {
          fail(errc::invalid_argument, "fetch " + util::quoted(f.name) + " was never produced");
          break;
        }
    }
    done_ = true;
  }

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
      std::string text = "step " + std::to_string(step) + " waited longer than " +
                         std::to_string(idle_timeout.count()) + " ms for:";
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
