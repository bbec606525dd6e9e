#pragma once
/// A validated, indexed graph: tasks resolved, edges built, loop frames and
/// output specs inferred. Building one from a graph_def checks everything the
/// partitioner and executor rely on.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/graph_def.hpp>
#include <fusewire/graph/tensor_spec.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

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
  std::size_t depth = 0;                   ///< 0 for root, 1 for a top-level loop, ...
  std::vector<std::size_t> nodes;          ///< nodes whose frame() is this frame
  std::vector<std::size_t> control_nodes;  ///< its Merge/Switch/NextIteration/LoopCond
  std::vector<std::size_t> enters, exits;  ///< its Enter and Exit nodes (any task)
  std::optional<std::size_t> loop_cond;    ///< its LoopCond node, if it has one
  std::size_t home_task = 0;               ///< task of its control nodes (root: 0)
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
  static std::optional<placed_graph> make(graph_def def, std::error_code& ec, std::string* what = nullptr) {
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
  std::string describe(std::size_t i) const { return util::quoted(def_.nodes[i].name) + " (" + def_.nodes[i].op + ")"; }
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

  // Indexing tasks, nodes and edges (defined in detail/placed_graph_index.hpp).
  std::optional<std::string> index_tasks();
  std::string cluster_list() const;
  std::optional<std::string> index_nodes();
  std::optional<std::string> resolve_inputs();
  // Order and waves (detail/placed_graph_order.hpp).
  std::optional<std::string> sort_topologically();
  void compute_waves();
  // Loop frames (detail/placed_graph_frames.hpp).
  std::optional<std::string> infer_frames(bool strict);
  // Output specs (detail/placed_graph_specs.hpp).
  const std::optional<tensor_spec>& input_spec(std::size_t i, std::size_t slot) const;
  std::optional<tensor_spec> infer_spec(std::size_t i, std::size_t port) const;
  void infer_specs();

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

// placed_graph's validation steps. Each includes this header, so each
// compiles on its own.
#include <fusewire/graph/detail/placed_graph_frames.hpp>
#include <fusewire/graph/detail/placed_graph_index.hpp>
#include <fusewire/graph/detail/placed_graph_order.hpp>
#include <fusewire/graph/detail/placed_graph_specs.hpp>
