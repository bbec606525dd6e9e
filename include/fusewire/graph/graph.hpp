#pragma once
/// The dataflow-graph model: nodes placed on tasks, data and control edges
/// written as TensorFlow writes them ("node", "node:port", "^node"), loop
/// frames made of Enter/Merge/Switch/NextIteration/Exit/LoopCond, and the
/// validation that turns a `graph_def` into an indexed `placed_graph`.
///
/// A `graph_def` is plain data you fill in. Building a `placed_graph` from it
/// checks everything the partitioner and executor rely on and throws
/// `std::system_error(errc::invalid_graph)` whose what() names the node at
/// fault (or use `placed_graph::make(def, ec, &what)` to get an error code).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/device_name.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// What an output carries: element type and shape; -1 marks an unknown
/// dimension. Fully known, it is a core `tensor_descriptor` (see descriptor()).
struct tensor_spec {
  dtype type = dtype::float32;
  std::vector<std::int64_t> shape;  ///< empty = scalar

  /// True when every dimension is known.
  bool fully_defined() const noexcept {
    return std::all_of(shape.begin(), shape.end(), [](std::int64_t d) { return d >= 0; });
  }
  /// The descriptor of a tensor of this spec; nullopt unless every dimension
  /// is known, the rank is at most max_rank and the byte size fits an int64.
  std::optional<tensor_descriptor> descriptor() const {
    if (!fully_defined() || shape.size() > max_rank || !is_valid(type)) return std::nullopt;
    tensor_descriptor d = tensor_descriptor::make(type, shape);
    if (d.validate()) return std::nullopt;
    return d;
  }
  /// Bytes of one tensor of this spec, when descriptor() is known.
  std::optional<std::size_t> byte_size() const {
    auto d = descriptor();
    if (!d) return std::nullopt;
    return d->byte_size();
  }
  /// "float32[4,8]" ("float32[]" for a scalar, "?" for unknown dimensions).
  std::string to_string() const {
    std::string out(fusewire::to_string(type));
    out += '[';
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (i) out += ',';
      out += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
    }
    out += ']';
    return out;
  }
  friend bool operator==(const tensor_spec&, const tensor_spec&) = default;
};

/// What a control token or a dead value carries: float32[0], no bytes.
inline tensor_descriptor token_descriptor() { return tensor_descriptor::make(dtype::float32, {0}); }

/// An attribute value. Attributes the model and executor read:
/// "frame_name" (string, Enter), "is_constant" (bool, Enter), "value" (floats,
/// Const/Variable), "shape" (ints, Const/Variable), "axis" (int, Concat),
/// "key" and "entries" (the partitioner's _Send/_Recv).
using attr_value = std::variant<bool, std::int64_t, std::string, std::vector<float>,
                                std::vector<std::int64_t>>;

/// One node, as TensorFlow's NodeDef: inputs are "node", "node:port" or
/// "^node" (control, after all data inputs); `device` names the task.
struct node_def {
  std::string name;
  std::string op;
  std::vector<std::string> inputs;
  std::string device;  ///< "/job:ps/replica:0/task:0" (a "/device:CPU:0" part is fine); see device_name
  std::map<std::string, attr_value, std::less<>> attrs;
  std::vector<std::optional<tensor_spec>> output_specs;  ///< declared, per output port

  /// Sets attribute `key`; returns *this for chaining.
  node_def& set(std::string key, attr_value value) {
    attrs.insert_or_assign(std::move(key), std::move(value));
    return *this;
  }
  /// Declares the spec of output `port`; returns *this for chaining.
  node_def& spec(tensor_spec s, std::size_t port = 0) {
    if (output_specs.size() <= port) output_specs.resize(port + 1);
    output_specs[port] = std::move(s);
    return *this;
  }
  /// The attribute `key` if present and of type T, else nullptr.
  template <class T>
    requires std::is_constructible_v<attr_value, T>
  const T* attr(std::string_view key) const {
    auto it = attrs.find(key);
    return it == attrs.end() ? nullptr : std::get_if<T>(&it->second);
  }
};

/// A whole graph: the cluster (every task a node may be placed on, e.g.
/// `cluster_spec::tasks()`) and the nodes.
struct graph_def {
  std::vector<task_id> tasks;
  std::vector<node_def> nodes;

  /// Appends a node; the reference stays valid until the next add().
  node_def& add(std::string name, std::string op, std::vector<std::string> inputs = {},
                std::string device = {}) {
    node_def n;
    n.name = std::move(name);
    n.op = std::move(op);
    n.inputs = std::move(inputs);
    n.device = std::move(device);
    nodes.push_back(std::move(n));
    return nodes.back();
  }
};

/// A resolved edge. Data edges connect output `src_port` to data input
/// `dst_slot`; control edges have src_port == dst_slot == -1.
struct edge {
  std::size_t src = 0;
  int src_port = 0;
  std::size_t dst = 0;
  int dst_slot = 0;
  bool control() const noexcept { return src_port < 0; }
};

/// A loop frame. Frame 0 is the root frame (name "", no parent).
struct frame_info {
  std::string name;
  std::size_t parent = 0;
  std::size_t depth = 0;                 ///< 0 for root, 1 for a top-level loop, ...
  std::vector<std::size_t> nodes;        ///< nodes whose frame() is this frame
  std::vector<std::size_t> control_nodes;///< its Merge/Switch/NextIteration/LoopCond
  std::vector<std::size_t> enters, exits;///< its Enter and Exit nodes (any task)
  std::optional<std::size_t> loop_cond;  ///< its LoopCond node, if it has one
  std::size_t home_task = 0;             ///< task of its control nodes (root: 0)
};

namespace detail {
struct relaxed_frames_t {
  explicit relaxed_frames_t() = default;
};
/// Lets the partitioner validate graphs whose loop skeletons span tasks.
inline constexpr relaxed_frames_t relaxed_frames{};
}  // namespace detail

/// A validated, indexed, immutable graph: tasks resolved, edges built, frames
/// inferred, topological order and waves computed, output specs declared or
/// inferred. Cheap to query; copyable.
class placed_graph {
 public:
  /// Validates `def`; throws std::system_error(errc::invalid_graph) naming the node.
  explicit placed_graph(graph_def def) { build_or_throw(std::move(def), true); }

  /// As above, but allows a frame's control nodes on several tasks (partitioner use).
  placed_graph(graph_def def, detail::relaxed_frames_t) { build_or_throw(std::move(def), false); }

  /// Non-throwing: on failure sets `ec` (errc::invalid_graph) and, if given, `*what`.
  static std::optional<placed_graph> make(graph_def def, std::error_code& ec,
                                          std::string* what = nullptr) {
    placed_graph g;
    if (auto fail = g.build(std::move(def), true)) {
      ec = make_error_code(errc::invalid_graph);
      if (what) *what = std::move(*fail);
      return std::nullopt;
    }
    ec.clear();
    return g;
  }

  /// The validated definition (node indices below index its nodes).
  const graph_def& def() const noexcept { return def_; }
  /// Number of nodes.
  std::size_t size() const noexcept { return def_.nodes.size(); }
  /// Node `i`; throws std::out_of_range past size().
  const node_def& node(std::size_t i) const { return def_.nodes.at(i); }
  /// Index of the node called `name`.
  std::optional<std::size_t> find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }

  /// The cluster, in the order graph_def::tasks lists it.
  const std::vector<task_id>& tasks() const noexcept { return def_.tasks; }
  /// Index into tasks() of the task node `i` runs on.
  std::size_t task_of(std::size_t i) const { return task_of_.at(i); }

  /// Every edge, in the order the nodes list their inputs.
  const std::vector<edge>& edges() const noexcept { return edges_; }
  /// Edge indices into node `i`: data inputs in slot order, then control inputs.
  std::span<const std::size_t> in_edges(std::size_t i) const { return in_.at(i); }
  /// Edge indices out of node `i`.
  std::span<const std::size_t> out_edges(std::size_t i) const { return out_.at(i); }
  /// Number of data inputs of node `i` (its data slots).
  std::size_t data_input_count(std::size_t i) const { return data_inputs_.at(i); }
  /// Number of control inputs of node `i`.
  std::size_t control_input_count(std::size_t i) const { return in_.at(i).size() - data_inputs_.at(i); }
  /// Number of output ports of node `i`.
  std::size_t output_count(std::size_t i) const { return outputs_.at(i); }

  /// True for an edge that closes a loop (its source is a NextIteration).
  bool is_back_edge(const edge& e) const { return detail::is_next_iteration(def_.nodes[e.src].op); }

  /// Every node, sources first; NextIteration -> Merge edges are ignored.
  const std::vector<std::size_t>& topological_order() const noexcept { return order_; }
  /// The ready-wave of node `i`: 0 for sources, else 1 + the largest wave of its inputs.
  std::size_t wave(std::size_t i) const { return wave_.at(i); }

  /// Frames; frames()[0] is the root frame.
  const std::vector<frame_info>& frames() const noexcept { return frames_; }
  /// The frame node `i` belongs to (an Enter belongs to the frame it enters).
  std::size_t frame_of(std::size_t i) const { return frame_.at(i); }
  /// The frame of node `i`'s inputs (differs from frame_of only for Enter).
  std::size_t input_frame_of(std::size_t i) const { return in_frame_.at(i); }
  /// The frame node `i`'s outputs live in (differs from frame_of only for Exit).
  std::size_t output_frame_of(std::size_t i) const { return out_frame_.at(i); }
  /// True when the graph has at least one loop frame.
  bool has_loops() const noexcept { return frames_.size() > 1; }

  /// Declared or inferred spec of output `port` of node `i`; nullopt when unknown.
  const std::optional<tensor_spec>& output_spec(std::size_t i, std::size_t port) const {
    static const std::optional<tensor_spec> none;
    const auto& v = specs_.at(i);
    return port < v.size() ? v[port] : none;
  }

  /// "'name' (Op)" — how messages refer to node `i`.
  std::string describe(std::size_t i) const {
    return util::quoted(def_.nodes[i].name) + " (" + def_.nodes[i].op + ")";
  }
  /// "frame 'name'" or "the root frame".
  std::string describe_frame(std::size_t f) const {
    return f == 0 ? std::string("the root frame") : "frame " + util::quoted(frames_[f].name);
  }

 private:
  placed_graph() = default;

  void build_or_throw(graph_def def, bool strict_frames) {
    if (auto fail = build(std::move(def), strict_frames)) throw_error(errc::invalid_graph, *fail);
  }

  std::optional<std::string> build(graph_def def, bool strict_frames) {
    def_ = std::move(def);
    if (auto f = index_tasks()) return f;
    if (auto f = index_nodes()) return f;
    if (auto f = resolve_inputs()) return f;
    if (auto f = sort_topologically()) return f;
    if (auto f = infer_frames(strict_frames)) return f;
    compute_waves();
    infer_specs();
    return std::nullopt;
  }

  std::optional<std::string> index_tasks() {
    const auto& tasks = def_.tasks;
    for (auto t = tasks.begin(); t != tasks.end(); ++t) {
      if (!detail::is_job_name(t->job))
        return "cluster task " + util::quoted(t->to_string()) + ": " + detail::bad_job_name(t->job) +
               " (it names TensorFlow devices)";
      if (std::find(tasks.begin(), t, *t) != t)
        return "task " + util::quoted(t->to_string()) + " is listed twice in the cluster";
    }
    return std::nullopt;
  }

  std::string cluster_list() const {
    if (def_.tasks.empty()) return "the cluster is empty";
    std::vector<std::string> names;
    for (const auto& t : def_.tasks) names.push_back(t.to_string());
    return "cluster: " + detail::join(names, ", ");
  }

  std::optional<std::string> index_nodes() {
    const auto n = def_.nodes.size();
    task_of_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& nd = def_.nodes[i];
      if (!detail::is_node_name(nd.name))
        return "node " + util::quoted(nd.name) +
               ": a name is a letter, digit, '.' or '_' followed by letters, digits and \"_.-/>\"";
      auto [it, fresh] = index_.emplace(nd.name, i);
      if (!fresh)
        return "duplicate node name " + util::quoted(nd.name) + " (nodes " +
               std::to_string(it->second) + " and " + std::to_string(i) + ")";
      if (nd.op.empty()) return "node " + util::quoted(nd.name) + " has no op";
      task_id t;
      if (nd.device.empty()) return "node " + util::quoted(nd.name) + " is not placed on a task";
      if (auto why = detail::parse_task_into(nd.device, t))
        return "node " + util::quoted(nd.name) + ": bad device " + util::quoted(nd.device) + ": " + *why;
      auto pos = std::find(def_.tasks.begin(), def_.tasks.end(), t);
      if (pos == def_.tasks.end())
        return "node " + util::quoted(nd.name) + ": task " + util::quoted(t.to_string()) +
               " is not in the cluster (" + cluster_list() + ")";
      task_of_[i] = static_cast<std::size_t>(pos - def_.tasks.begin());
    }
    return std::nullopt;
  }

  std::optional<std::string> resolve_inputs() {
    const auto n = def_.nodes.size();
    in_.assign(n, {});
    out_.assign(n, {});
    data_inputs_.assign(n, 0);
    outputs_.assign(n, 0);
    std::vector<int> max_port(n, -1);
    struct parsed {
      std::size_t node;
      detail::input_text in;
      std::string_view text;
    };
    std::vector<std::vector<parsed>> parsed_inputs(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& nd = def_.nodes[i];
      bool seen_control = false;
      for (const auto& text : nd.inputs) {
        auto in = detail::split_input(text);
        if (!in)
          return "node " + util::quoted(nd.name) + ": bad input " + util::quoted(text) +
                 " (expected \"node\", \"node:port\" or \"^node\")";
        if (!in->control && seen_control)
          return "node " + util::quoted(nd.name) + ": data input " + util::quoted(text) +
                 " comes after a control input; list control inputs (\"^node\") last";
        seen_control = seen_control || in->control;
        auto src = index_.find(std::string(in->node));
        if (src == index_.end())
          return "node " + util::quoted(nd.name) + ": input " + util::quoted(text) +
                 " names no node in the graph";
        if (src->second == i)
          return "node " + util::quoted(nd.name) + ": input " + util::quoted(text) + " is the node itself";
        max_port[src->second] = std::max(max_port[src->second], in->port);
        parsed_inputs[i].push_back({src->second, *in, text});
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto& nd = def_.nodes[i];
      int fixed = detail::fixed_output_count(nd.op);
      std::size_t count;
      if (fixed == -2) {
        auto entries = nd.attr<std::int64_t>("entries");
        if (!entries || *entries < 0)
          return "node " + util::quoted(nd.name) + " (_Recv) needs an \"entries\" attribute";
        count = static_cast<std::size_t>(*entries);
      } else if (fixed >= 0) {
        count = static_cast<std::size_t>(fixed);
      } else {
        count = std::max<std::size_t>({1, nd.output_specs.size(),
                                       static_cast<std::size_t>(max_port[i] + 1)});
      }
      outputs_[i] = count;
    }
    for (std::size_t i = 0; i < n; ++i) {
      int slot = 0;
      for (const auto& p : parsed_inputs[i]) {
        if (!p.in.control && static_cast<std::size_t>(p.in.port) >= outputs_[p.node])
          return "node " + util::quoted(def_.nodes[i].name) + ": input " + util::quoted(p.text) +
                 " names output " + std::to_string(p.in.port) + " but " + describe(p.node) + " has " +
                 std::to_string(outputs_[p.node]) + " output" + (outputs_[p.node] == 1 ? "" : "s");
        edge e;
        e.src = p.node;
        e.dst = i;
        e.src_port = p.in.control ? -1 : p.in.port;
        e.dst_slot = p.in.control ? -1 : slot++;
        in_[i].push_back(edges_.size());
        out_[p.node].push_back(edges_.size());
        edges_.push_back(e);
      }
      data_inputs_[i] = static_cast<std::size_t>(slot);
    }
    return std::nullopt;
  }

  std::optional<std::string> sort_topologically() {
    const auto n = def_.nodes.size();
    std::vector<std::size_t> pending(n, 0);
    for (const auto& e : edges_)
      if (!is_back_edge(e)) ++pending[e.dst];
    std::vector<std::size_t> ready;
    for (std::size_t i = n; i-- > 0;)
      if (pending[i] == 0) ready.push_back(i);
    order_.clear();
    while (!ready.empty()) {
      std::size_t i = ready.back();
      ready.pop_back();
      order_.push_back(i);
      std::vector<std::size_t> next;
      for (auto ei : out_[i]) {
        const auto& e = edges_[ei];
        if (is_back_edge(e)) continue;
        if (--pending[e.dst] == 0) next.push_back(e.dst);
      }
      std::sort(next.rbegin(), next.rend());
      ready.insert(ready.end(), next.begin(), next.end());
    }
    if (order_.size() == n) {
      for (const auto& e : edges_) {
        if (!is_back_edge(e)) continue;
        if (e.control() || !detail::is_merge(def_.nodes[e.dst].op))
          return "node " + util::quoted(def_.nodes[e.src].name) + " (NextIteration) feeds " +
                 describe(e.dst) + (e.control() ? " through a control edge" : "") +
                 "; a NextIteration may only feed a Merge's data input";
      }
      return std::nullopt;
    }
    // Name one cycle: walk from an unsorted node up its unsorted inputs until
    // a node repeats; every unsorted node has at least one unsorted input.
    std::size_t cur = 0;
    while (pending[cur] == 0) ++cur;
    std::vector<std::size_t> path;
    std::vector<int> pos(n, -1);
    while (pos[cur] < 0) {
      pos[cur] = static_cast<int>(path.size());
      path.push_back(cur);
      for (auto ei : in_[cur]) {
        const auto& e = edges_[ei];
        if (!is_back_edge(e) && pending[e.src] != 0) {
          cur = e.src;
          break;
        }
      }
    }
    std::vector<std::size_t> cycle(path.begin() + pos[cur], path.end());
    std::reverse(cycle.begin(), cycle.end());
    std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
    std::string text;
    for (auto v : cycle) text += util::quoted(def_.nodes[v].name) + " -> ";
    text += util::quoted(def_.nodes[cycle.front()].name);
    return "graph has a cycle: " + text + " (only a NextIteration -> Merge edge may close a loop)";
  }

  std::optional<std::string> infer_frames(bool strict) {
    const auto n = def_.nodes.size();
    frame_.assign(n, 0);
    in_frame_.assign(n, 0);
    out_frame_.assign(n, 0);
    frames_.clear();
    frames_.push_back(frame_info{});
    std::unordered_map<std::string, std::size_t> frame_index;
    std::vector<std::size_t> frame_entered_by(1, 0);
    for (auto i : order_) {
      const auto& nd = def_.nodes[i];
      std::optional<std::size_t> in_frame;
      std::size_t via = 0;
      for (auto ei : in_[i]) {
        const auto& e = edges_[ei];
        if (is_back_edge(e)) continue;
        std::size_t f = out_frame_[e.src];
        if (!in_frame) {
          in_frame = f;
          via = e.src;
        } else if (*in_frame != f) {
          return "node " + util::quoted(nd.name) + " mixes inputs from " + describe_frame(*in_frame) +
                 " (via " + util::quoted(def_.nodes[via].name) + ") and " + describe_frame(f) +
                 " (via " + util::quoted(def_.nodes[e.src].name) + ")";
        }
      }
      if (detail::is_merge(nd.op) && !in_frame)
        return "node " + util::quoted(nd.name) + " (Merge) has only NextIteration inputs";
      std::size_t f = in_frame.value_or(0);
      in_frame_[i] = f;
      frame_[i] = f;
      out_frame_[i] = f;
      if (detail::is_enter(nd.op)) {
        const auto* name = nd.attr<std::string>("frame_name");
        if (!name || name->empty())
          return "node " + util::quoted(nd.name) + " (Enter) has no \"frame_name\" attribute";
        auto [it, fresh] = frame_index.emplace(*name, frames_.size());
        if (fresh) {
          frame_info fi;
          fi.name = *name;
          fi.parent = f;
          fi.depth = frames_[f].depth + 1;
          frames_.push_back(std::move(fi));
          frame_entered_by.push_back(i);
        } else if (frames_[it->second].parent != f) {
          return "frame " + util::quoted(*name) + " is entered from " +
                 describe_frame(frames_[it->second].parent) + " by " +
                 util::quoted(def_.nodes[frame_entered_by[it->second]].name) + " and from " +
                 describe_frame(f) + " by " + util::quoted(nd.name);
        }
        frame_[i] = it->second;
        out_frame_[i] = it->second;
      } else if (detail::is_exit(nd.op)) {
        if (f == 0) return "node " + util::quoted(nd.name) + " (Exit) is not inside a loop frame";
        out_frame_[i] = frames_[f].parent;
      }
    }
    for (const auto& e : edges_) {
      if (!is_back_edge(e)) continue;
      if (out_frame_[e.src] != frame_[e.dst])
        return "node " + util::quoted(def_.nodes[e.dst].name) + " (Merge) is in " +
               describe_frame(frame_[e.dst]) + " but its NextIteration " +
               util::quoted(def_.nodes[e.src].name) + " is in " + describe_frame(out_frame_[e.src]);
    }
    for (std::size_t i = 0; i < n; ++i) {
      auto& fr = frames_[frame_[i]];
      fr.nodes.push_back(i);
      if (detail::is_enter(def_.nodes[i].op)) fr.enters.push_back(i);
      if (detail::is_exit(def_.nodes[i].op)) fr.exits.push_back(i);
      if (frame_[i] == 0 || !detail::is_frame_control(def_.nodes[i].op) || detail::is_enter(def_.nodes[i].op) ||
          detail::is_exit(def_.nodes[i].op))
        continue;
      if (detail::is_loop_cond(def_.nodes[i].op)) {
        if (fr.loop_cond)
          return "frame " + util::quoted(fr.name) + " has two LoopCond nodes, " +
                 util::quoted(def_.nodes[*fr.loop_cond].name) + " and " + util::quoted(def_.nodes[i].name);
        fr.loop_cond = i;
      }
      if (fr.control_nodes.empty()) {
        fr.home_task = task_of_[i];
      } else if (strict && fr.home_task != task_of_[i]) {
        std::size_t first = fr.control_nodes.front();
        return "frame " + util::quoted(fr.name) + ": control nodes " + describe(first) + " on " +
               def_.tasks[task_of_[first]].to_string() + " and " + describe(i) + " on " +
               def_.tasks[task_of_[i]].to_string() +
               " are on different tasks; a frame's Merge/Switch/NextIteration/LoopCond must share "
               "one task (its Enter and Exit nodes may be anywhere)";
      }
      fr.control_nodes.push_back(i);
    }
    return std::nullopt;
  }

  void compute_waves() {
    wave_.assign(def_.nodes.size(), 0);
    for (auto i : order_)
      for (auto ei : out_[i]) {
        const auto& e = edges_[ei];
        if (!is_back_edge(e)) wave_[e.dst] = std::max(wave_[e.dst], wave_[i] + 1);
      }
  }

  const std::optional<tensor_spec>& input_spec(std::size_t i, std::size_t slot) const {
    static const std::optional<tensor_spec> none;
    for (auto ei : in_[i]) {
      const auto& e = edges_[ei];
      if (e.dst_slot == static_cast<int>(slot) && !is_back_edge(e))
        return output_spec(e.src, static_cast<std::size_t>(e.src_port));
    }
    return none;
  }

  std::optional<tensor_spec> infer_spec(std::size_t i, std::size_t port) const {
    const auto& nd = def_.nodes[i];
    const auto& op = nd.op;
    using shape_t = std::vector<std::int64_t>;
    if (op == "Const" || detail::is_variable(op)) {
      if (const auto* s = nd.attr<shape_t>("shape")) return tensor_spec{dtype::float32, *s};
      if (const auto* v = nd.attr<std::vector<float>>("value"))
        return tensor_spec{dtype::float32, {static_cast<std::int64_t>(v->size())}};
      return std::nullopt;
    }
    if (op == "Identity" || detail::is_loop_cond(op) || detail::is_enter(op) || detail::is_exit(op) ||
        detail::is_next_iteration(op) || detail::is_switch(op) || detail::writes_variable(op))
      return input_spec(i, 0);
    if (detail::is_merge(op)) {
      if (port == 1) return tensor_spec{dtype::float32, {}};
      for (std::size_t s = 0; s < data_inputs_[i]; ++s)
        if (const auto& sp = input_spec(i, s)) return sp;
      return std::nullopt;
    }
    const auto& a = input_spec(i, 0);
    const auto& b = input_spec(i, 1);
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Less") {
      if (!a || !b) return std::nullopt;
      if (a->shape == b->shape) return a;
      if (a->shape.empty()) return b;
      if (b->shape.empty()) return a;
      return std::nullopt;
    }
    if (op == "MatMul") {
      if (!a || !b || a->shape.size() != 2 || b->shape.size() != 2) return std::nullopt;
      return tensor_spec{a->type, {a->shape[0], b->shape[1]}};
    }
    if (op == "Gather") {
      if (!a || !b || a->shape.empty()) return std::nullopt;
      shape_t s = b->shape;
      s.insert(s.end(), a->shape.begin() + 1, a->shape.end());
      return tensor_spec{a->type, s};
    }
    if (op == "Concat") {
      if (!a || data_inputs_[i] == 0) return std::nullopt;
      const auto rank = static_cast<std::int64_t>(a->shape.size());
      std::int64_t axis = -1;
      if (const auto* ax = nd.attr<std::int64_t>("axis")) axis = *ax;
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank) return std::nullopt;
      shape_t s = a->shape;
      for (std::size_t k = 1; k < data_inputs_[i]; ++k) {
        const auto& o = input_spec(i, k);
        if (!o || o->shape.size() != s.size()) return std::nullopt;
        s[axis] = (s[axis] < 0 || o->shape[axis] < 0) ? -1 : s[axis] + o->shape[axis];
      }
      return tensor_spec{a->type, s};
    }
    return std::nullopt;
  }

  void infer_specs() {
    specs_.assign(def_.nodes.size(), {});
    for (auto i : order_) {
      auto& out = specs_[i];
      out.resize(outputs_[i]);
      const auto& declared = def_.nodes[i].output_specs;
      for (std::size_t p = 0; p < out.size(); ++p)
        out[p] = (p < declared.size() && declared[p]) ? declared[p] : infer_spec(i, p);
    }
  }

  graph_def def_;
  std::vector<std::size_t> task_of_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<edge> edges_;
  std::vector<std::vector<std::size_t>> in_, out_;
  std::vector<std::size_t> data_inputs_, outputs_;
  std::vector<std::size_t> order_, wave_;
  std::vector<std::size_t> frame_, in_frame_, out_frame_;
  std::vector<frame_info> frames_;
  std::vector<std::vector<std::optional<tensor_spec>>> specs_;
};

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
