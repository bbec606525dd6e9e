#pragma once
/// placed_graph's first validation steps: the cluster's tasks, node names
/// and placement, and the edges their inputs name.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fusewire/graph/detail/ops.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/placed_graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline std::optional<std::string> placed_graph::index_tasks() {
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

inline std::string placed_graph::cluster_list() const {
  if (def_.tasks.empty()) return "the cluster is empty";
  std::vector<std::string> names;
  for (const auto& t : def_.tasks) names.push_back(t.to_string());
  return "cluster: " + detail::join(names, ", ");
}

inline std::optional<std::string> placed_graph::index_nodes() {
  const auto n = def_.nodes.size();
  task_of_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& nd = def_.nodes[i];
    if (!detail::is_node_name(nd.name))
      return "node " + util::quoted(nd.name) +
             ": a name is a letter, digit, '.' or '_' followed by letters, digits and \"_.-/>\"";
    auto [it, fresh] = index_.emplace(nd.name, i);
    if (!fresh)
      return "duplicate node name " + util::quoted(nd.name) + " (nodes " + std::to_string(it->second) + " and " +
             std::to_string(i) + ")";
    if (nd.op.empty()) return "node " + util::quoted(nd.name) + " has no op";
    task_id t;
    if (nd.device.empty()) return "node " + util::quoted(nd.name) + " is not placed on a task";
    if (auto why = detail::parse_task_into(nd.device, t))
      return "node " + util::quoted(nd.name) + ": bad device " + util::quoted(nd.device) + ": " + *why;
    auto pos = std::find(def_.tasks.begin(), def_.tasks.end(), t);
    if (pos == def_.tasks.end())
      return "node " + util::quoted(nd.name) + ": task " + util::quoted(t.to_string()) + " is not in the cluster (" +
             cluster_list() + ")";
    task_of_[i] = static_cast<std::size_t>(pos - def_.tasks.begin());
  }
  return std::nullopt;
}

inline std::optional<std::string> placed_graph::resolve_inputs() {
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
        return "node " + util::quoted(nd.name) + ": input " + util::quoted(text) + " names no node in the graph";
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
      if (!entries || *entries < 0) return "node " + util::quoted(nd.name) + " (_Recv) needs an \"entries\" attribute";
      count = static_cast<std::size_t>(*entries);
    } else if (fixed >= 0) {
      count = static_cast<std::size_t>(fixed);
    } else {
      count = std::max<std::size_t>({1, nd.output_specs.size(), static_cast<std::size_t>(max_port[i] + 1)});
    }
    outputs_[i] = count;
  }
  for (std::size_t i = 0; i < n; ++i) {
    int slot = 0;
    for (const auto& p : parsed_inputs[i]) {
      if (!p.in.control && static_cast<std::size_t>(p.in.port) >= outputs_[p.node])
        return "node " + util::quoted(def_.nodes[i].name) + ": input " + util::quoted(p.text) + " names output " +
               std::to_string(p.in.port) + " but " + describe(p.node) + " has " + std::to_string(outputs_[p.node]) +
               " output" + (outputs_[p.node] == 1 ? "" : "s");
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

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
