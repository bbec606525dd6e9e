#pragma once
/// The executor firing a ready node: computing its op, or sending and
/// receiving the messages of _Send/_Recv nodes.

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/tensor_ops.hpp>
#include <fusewire/graph/executor.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

inline void executor::fire(ready_item& item) {
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
  } catch (const detail::op_failure& e) {
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

inline void executor::start_recv(std::size_t n, std::size_t tag) {
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

inline void executor::do_send(std::size_t n, std::size_t tag, instance& in) {
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
                                       std::to_string(v.value.shape.size()) + " (at most " + std::to_string(max_rank) +
                                       ")");
      return;
    }
    p.push_back(v.dead ? message_entry::token(true) : message_entry::of(v.value));
  }
  for (std::size_t k = 0; p.size() < c.entries; ++k) p.push_back(message_entry::token(in.control[k] == 1));
  const auto key = full_key(c, tag);
  if (auto ec = send_(step_, key, std::move(p)))
    fail(ec, "send of " + key + " by node " + graph_.describe(n) + " failed: " + ec.message());
}

inline void executor::compute(std::size_t n, instance& in, edge_values& outs) {
  const auto& c = nodes_[n];
  auto& d = in.data;
  switch (c.kind) {
    case op_kind::constant:
      outs[0].value = c.value;
      break;
    case op_kind::placeholder:
      outs[0].value = feeds_->find(graph_.node(n).name)->second;
      break;
    case op_kind::identity:
    case op_kind::loop_cond:
    case op_kind::enter:
    case op_kind::exit:
    case op_kind::next_iteration:
      outs[0] = std::move(d[0]);
      break;
    case op_kind::add:
      outs[0].value = detail::elementwise(d[0].value, d[1].value, [](float a, float b) { return a + b; });
      break;
    case op_kind::sub:
      outs[0].value = detail::elementwise(d[0].value, d[1].value, [](float a, float b) { return a - b; });
      break;
    case op_kind::mul:
      outs[0].value = detail::elementwise(d[0].value, d[1].value, [](float a, float b) { return a * b; });
      break;
    case op_kind::less:
      outs[0].value = detail::elementwise(d[0].value, d[1].value, [](float a, float b) { return a < b ? 1.0f : 0.0f; });
      break;
    case op_kind::matmul:
      outs[0].value = detail::matmul(d[0].value, d[1].value);
      break;
    case op_kind::gather:
      outs[0].value = detail::gather(d[0].value, d[1].value);
      break;
    case op_kind::concat:
      outs[0].value = detail::concat(d, c.axis);
      break;
    case op_kind::variable:
      outs[0].value = variables_.at(n);
      break;
    case op_kind::assign:
    case op_kind::assign_add:
    case op_kind::assign_sub: {
      auto& var = variables_.at(c.variable);
      const auto& v = d[1].value;
      detail::need(v.shape == var.shape, "cannot assign a value of shape " + tensor::shape_string(v.shape) +
                                             " to a variable of shape " + tensor::shape_string(var.shape));
      if (c.kind == op_kind::assign) var = v;
      for (std::size_t k = 0; c.kind != op_kind::assign && k < var.values.size(); ++k)
        var.values[k] += c.kind == op_kind::assign_add ? v.values[k] : -v.values[k];
      outs[0].value = var;
      break;
    }
    case op_kind::no_op:
      break;
    case op_kind::switch_: {
      detail::need(d[1].value.values.size() == 1,
                   "predicate must hold one value, got shape " + tensor::shape_string(d[1].value.shape));
      const bool taken = d[1].value.values[0] != 0.0f;
      outs[taken ? 1 : 0] = std::move(d[0]);
      outs[taken ? 0 : 1].dead = true;
      break;
    }
    default:
      break;
  }
}

inline std::optional<std::string> executor::spec_mismatch(std::size_t n, std::size_t port, const tensor& t) const {
  const auto& declared = graph_.node(n).output_specs;
  if (port >= declared.size() || !declared[port]) return std::nullopt;
  const auto& s = *declared[port];
  bool ok = s.type == dtype::float32 && s.shape.size() == t.shape.size();
  for (std::size_t k = 0; ok && k < t.shape.size(); ++k) ok = s.shape[k] < 0 || s.shape[k] == t.shape[k];
  if (ok) return std::nullopt;
  return " output " + std::to_string(port) + " is float32" + tensor::shape_string(t.shape) + " but its spec says " +
         s.to_string();
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
