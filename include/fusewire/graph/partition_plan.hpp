#pragma once
/// What the partitioner is asked (`partition_options`: mode, clustering,
/// tensor_fuse) and what it returns (`plan`: per-task subgraphs and messages).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// How cross-task edges become messages.
enum class partition_mode { send_recv, star_server, star_server_lite };

/// "send_recv", "star_server", "star_server_lite".
constexpr std::string_view to_string(partition_mode m) noexcept {
  switch (m) {
    case partition_mode::send_recv:
      return "send_recv";
    case partition_mode::star_server:
      return "star_server";
    case partition_mode::star_server_lite:
      return "star_server_lite";
  }
  return "?";
}

/// How star_server groups a worker's exchanges with one PS into calls.
enum class star_clustering {
  /// Topological rounds: a call's request never needs its own or a later
  /// response, so the plan is acyclic by construction; calls also carry
  /// "run this part" (the request) and "done" (the response) semantics.
  rounds,
  /// One call per (worker, PS, loop frame), fetches and feeds fused
  /// maximally; tensors that would close a cycle fall back to send/recv.
  single_call,
};

/// What to plan.
struct partition_options {
  partition_mode mode = partition_mode::send_recv;
  /// Fuse send/recv messages per (source, destination, loop frame, ready-wave).
  /// In the star modes it applies to the send/recv messages outside calls.
  bool tensor_fuse = false;
  /// Tasks of this job serve calls in the star modes; every other task is a client.
  std::string server_job = "ps";
  /// star_server only.
  star_clustering clustering = star_clustering::rounds;

  /// The plan that fusewire's options ask for (options::from_env reads
  /// TENSOR_FUSE into options::tensor_fuse): tensor_fuse from `o`, the other
  /// fields at their defaults.
  static partition_options from(const options& o) {
    partition_options p;
    p.tensor_fuse = o.tensor_fuse;
    return p;
  }
};

/// What a message is for.
enum class message_kind {
  send,      ///< a send/recv transfer
  request,   ///< a call's request (client -> server), carries the server's feeds
  response,  ///< a call's response (server -> client), carries its fetches
};

/// "send", "request", "response".
constexpr std::string_view to_string(message_kind k) noexcept {
  switch (k) {
    case message_kind::send:
      return "send";
    case message_kind::request:
      return "request";
    case message_kind::response:
      return "response";
  }
  return "?";
}

/// One tensor (or control token) a message carries.
struct plan_entry {
  std::string tensor;                  ///< "node:port", or "^node" for a control token
  std::vector<std::string> consumers;  ///< nodes of the destination task that use it
  /// What it carries, when its spec is fully known (a control token: token_descriptor()).
  std::optional<tensor_descriptor> descriptor;

  /// Bytes it carries, when the descriptor is known.
  std::optional<std::size_t> bytes() const {
    if (!descriptor) return std::nullopt;
    return descriptor->byte_size();
  }
};

/// One message of a step (or of one loop iteration).
struct plan_message {
  std::string name;  ///< "m<k>", unique in the plan
  message_kind kind = message_kind::send;
  task_id src, dst;
  std::string frame;      ///< loop frame it repeats in; "" for once per step
  std::size_t round = 0;  ///< send: ready-wave of its sources; call: round (lite: merge wave)
  bool fallback = false;  ///< star modes: a send/recv outside any call
  std::string key;        ///< rendezvous key without ";frame_id:iter_id"
  std::vector<plan_entry> entries;

  /// Sum of the entries' bytes, when every one is known.
  std::optional<std::size_t> bytes() const {
    std::size_t n = 0;
    for (const auto& e : entries) {
      auto b = e.bytes();
      if (!b) return std::nullopt;
      n += *b;
    }
    return n;
  }
};

/// The subgraph one task runs.
struct plan_partition {
  task_id task;
  graph_def graph;
};

/// Message counts of a step, or of one iteration of a loop frame.
struct plan_totals {
  std::size_t messages = 0;
  std::size_t calls = 0;                 ///< request/response pairs among them
  std::size_t tensors = 0;               ///< entries, control tokens included
  std::optional<std::size_t> bytes = 0;  ///< nullopt when a spec is unknown
};

/// A partitioned graph and its communication plan.
struct plan {
  partition_options options;
  std::vector<plan_partition> partitions;  ///< in cluster order; tasks without nodes omitted
  std::vector<plan_message> messages;      ///< by frame, then round, then tasks
  std::size_t cycle_breaks = 0;            ///< tensors the acyclicity check moved to their own message

  /// Messages that happen once per step (root frame).
  plan_totals per_step() const { return totals(""); }
  /// Messages that happen once per iteration of loop frame `frame`.
  plan_totals per_iteration(std::string_view frame) const { return totals(frame); }
  /// Loop frames that have messages, in first-message order.
  std::vector<std::string> loop_frames() const {
    std::vector<std::string> out;
    for (const auto& m : messages)
      if (!m.frame.empty() && std::find(out.begin(), out.end(), m.frame) == out.end()) out.push_back(m.frame);
    return out;
  }
  /// The partition of `t`, or nullptr.
  const plan_partition* partition_for(const task_id& t) const {
    for (const auto& p : partitions)
      if (p.task == t) return &p;
    return nullptr;
  }

  /// A table for people: totals per step and per loop iteration, then each message.
  std::string summary() const {
    std::string out = "plan: " + std::string(to_string(options.mode)) + ", tensor_fuse " +
                      (options.tensor_fuse ? "on" : "off") + ", " + std::to_string(partitions.size()) + " task" +
                      (partitions.size() == 1 ? "" : "s");
    if (cycle_breaks) out += ", " + std::to_string(cycle_breaks) + " tensor(s) moved out to break cycles";
    out += "\n";
    auto route = [](const plan_message& m) { return m.src.to_string() + " -> " + m.dst.to_string(); };
    auto padded = [](std::string text, std::size_t width) {
      if (text.size() < width) text.resize(width, ' ');
      return text;
    };
    auto count = [](const plan_message& m) {
      return std::to_string(m.entries.size()) + " tensor" + (m.entries.size() == 1 ? "" : "s");
    };
    std::size_t name_width = 0, route_width = 0, count_width = 0;
    for (const auto& m : messages) {
      name_width = std::max(name_width, m.name.size());
      route_width = std::max(route_width, route(m).size());
      count_width = std::max(count_width, count(m).size());
    }
    auto section = [&](const std::string& frame, const std::string& title) {
      auto t = totals(frame);
      out += title + ": " + std::to_string(t.messages) + " message" + (t.messages == 1 ? "" : "s");
      if (t.calls) out += " (" + std::to_string(t.calls) + " call" + (t.calls == 1 ? "" : "s") + ")";
      out += ", " + std::to_string(t.tensors) + " tensor" + (t.tensors == 1 ? "" : "s") + ", " +
             (t.bytes ? std::to_string(*t.bytes) + " bytes" : std::string("bytes unknown")) + "\n";
      for (const auto& m : messages) {
        if (m.frame != frame) continue;
        out += "  " + padded(m.name, name_width) + " " +
               padded(std::string(to_string(m.kind)) + (m.fallback ? "*" : ""), 9) + "  " +
               padded(route(m), route_width) + "  round " + std::to_string(m.round) + "  " +
               padded(count(m), count_width) + "  " +
               (m.bytes() ? std::to_string(*m.bytes()) + " B" : std::string("? B")) + "\n";
      }
    };
    section("", "per step");
    for (const auto& f : loop_frames()) section(f, "per iteration of frame '" + f + "'");
    if (std::any_of(messages.begin(), messages.end(), [](const plan_message& m) { return m.fallback; }))
      out += "  (* send/recv outside a call)\n";
    return out;
  }

 private:
  plan_totals totals(std::string_view frame) const {
    plan_totals t;
    for (const auto& m : messages) {
      if (m.frame != frame) continue;
      ++t.messages;
      if (m.kind == message_kind::request) ++t.calls;
      t.tensors += m.entries.size();
      auto b = m.bytes();
      t.bytes = (t.bytes && b) ? std::optional<std::size_t>(*t.bytes + *b) : std::nullopt;
    }
    return t;
  }
};

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
