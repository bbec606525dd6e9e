#pragma once
/// Cuts a placed graph into one subgraph per task and plans the messages
/// between them, in the three ways the systems we replace do it:
///
/// - `send_recv`: one message per cross-task tensor (a tensor feeding several
///   nodes of one task is sent once). With `tensor_fuse`, tensors between the
///   same two tasks in the same ready-wave and loop frame share one message.
/// - `star_server`: pull/push. Each worker-to-PS exchange becomes a call: one
///   request carrying the PS's feeds, one response carrying its fetches. Calls
///   are clustered in rounds: a PS value computed from worker values that
///   themselves needed an earlier fetch from that PS goes in a later round, so
///   the step never waits on itself. A final check proves the message graph
///   acyclic and moves any tensor that would close a cycle to its own message.
/// - `star_server_lite`: the aggressive merge: the PS subgraph's connected
///   parts (variables apart) that are ready together merge into one call per
///   wave. It needs a loop-free graph with no worker->PS->worker->same-part
///   chains; otherwise it reports errc::graph_cycle naming the loop or chain.
///
/// Loops whose nodes span tasks get a control-loop skeleton on every task
/// involved (as TensorFlow's partitioner does): the loop predicate is sent to
/// each of them once per iteration, so each partition runs on its own.
/// Messages of a loop frame repeat once per iteration (including the final
/// one that exits); the plan counts them per iteration.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// How cross-task edges become messages.
enum class partition_mode { send_recv, star_server, star_server_lite };

/// "send_recv", "star_server", "star_server_lite".
constexpr std::string_view to_string(partition_mode m) noexcept {
  switch (m) {
    case partition_mode::send_recv: return "send_recv";
    case partition_mode::star_server: return "star_server";
    case partition_mode::star_server_lite: return "star_server_lite";
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
    case message_kind::send: return "send";
    case message_kind::request: return "request";
    case message_kind::response: return "response";
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
  std::string frame;       ///< loop frame it repeats in; "" for once per step
  std::size_t round = 0;   ///< send: ready-wave of its sources; call: round (lite: merge wave)
  bool fallback = false;   ///< star modes: a send/recv outside any call
  std::string key;         ///< rendezvous key without ";frame_id:iter_id"
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
  std::size_t calls = 0;    ///< request/response pairs among them
  std::size_t tensors = 0;  ///< entries, control tokens included
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
                      (options.tensor_fuse ? "on" : "off") + ", " + std::to_string(partitions.size()) +
                      " task" + (partitions.size() == 1 ? "" : "s");
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

namespace detail {

/// Builds a plan; every failure is reported as (errc, text), never thrown from
/// the algorithm itself (allocation failure aside).
class partitioner {
 public:
  struct failure {
    errc code;
    std::string what;
  };

  partitioner(const placed_graph& g, partition_options opts) : user_(g), opts_(std::move(opts)) {}

  std::optional<failure> run(plan& out) {
    if (auto f = check_input()) return f;
    if (auto f = build_augmented()) return f;
    if (auto f = build_condensed()) return f;
    collect_transfers();
    std::optional<failure> f;
    switch (opts_.mode) {
      case partition_mode::send_recv: group_sends(all_transfers(), false); break;
      case partition_mode::star_server: plan_star(); break;
      case partition_mode::star_server_lite: f = plan_lite(); break;
    }
    if (f) return f;
    if (auto c = break_cycles()) return c;
    sort_messages();
    emit(out);
    return std::nullopt;
  }

 private:
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  struct transfer {
    std::size_t src = 0;
    int port = 0;  // -1: control token
    std::size_t src_task = 0, dst_task = 0, frame = 0, wave = 0;
    std::vector<std::size_t> consumers;
    std::size_t message = npos;
  };
  struct work_message {
    message_kind kind = message_kind::send;
    std::size_t src_task = 0, dst_task = 0, frame = 0, round = 0;
    bool fallback = false;
    std::vector<std::size_t> transfers;
    std::size_t call = npos;
  };
  struct call_info {
    std::size_t client = 0, server = 0, frame = 0, round = 0;
    std::size_t request = npos, response = npos;
    std::vector<std::size_t> triggers;  // server nodes that wait for the request
    std::vector<std::size_t> acks;      // server nodes the response waits for
    bool ordered = true;                // the response waits for the request
  };

  // ---- input checks and the augmented graph -------------------------------

  std::optional<failure> check_input() {
    const auto& g = user_;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto& nd = g.node(i);
      if (nd.name[0] == '_' || is_internal(nd.op))
        return failure{errc::invalid_graph, "node " + g.describe(i) +
                                                ": names and ops starting with '_' are reserved for nodes "
                                                "the partitioner adds"};
      if (writes_variable(nd.op) && g.data_input_count(i) > 0) {
        const auto& e = g.edges()[g.in_edges(i)[0]];
        if (g.task_of(e.src) != g.task_of(i))
          return failure{errc::invalid_graph,
                         "node " + g.describe(i) + " is on " + g.tasks()[g.task_of(i)].to_string() +
                             " but the variable it writes, " + g.describe(e.src) + ", is on " +
                             g.tasks()[g.task_of(e.src)].to_string() + "; they must share a task"};
      }
    }
    if (opts_.mode == partition_mode::star_server_lite && g.has_loops()) {
      const auto& fr = g.frames()[1];
      std::string where;
      for (auto n : fr.control_nodes) {
        if (!is_merge(g.node(n).op)) continue;
        for (auto ei : g.in_edges(n)) {
          const auto& e = g.edges()[ei];
          if (g.is_back_edge(e)) {
            where = " (Merge " + util::quoted(g.node(n).name) + " <- NextIteration " +
                    util::quoted(g.node(e.src).name) + ")";
            break;
          }
        }
        if (!where.empty()) break;
      }
      return failure{errc::graph_cycle, "star_server_lite cannot merge the ps graphs: the graph has loop frame " +
                                            util::quoted(fr.name) + where +
                                            ", and the aggressive merge needs a graph without loops; use "
                                            "star_server or send_recv"};
    }
    return std::nullopt;
  }

  std::string task_tag(std::size_t t) const {
    const auto& id = user_.tasks()[t];
    return id.job + "_" + std::to_string(id.index);
  }

  std::string skeleton_name(std::size_t task, std::size_t frame, std::string_view part) const {
    return "_loop/" + user_.frames()[frame].name + "/" + task_tag(task) + "/" + std::string(part);
  }

  std::optional<failure> build_augmented() {
    const auto& g = user_;
    const auto nf = g.frames().size();
    std::vector<std::set<std::size_t>> participants(nf);
    for (std::size_t i = 0; i < g.size(); ++i) {
      for (std::size_t f : {g.frame_of(i), g.input_frame_of(i)})
        for (; f != 0; f = g.frames()[f].parent) participants[f].insert(g.task_of(i));
    }
    graph_def def = g.def();
    skeleton_.assign(nf, {});
    // Parents before children: frames are numbered in discovery order, and a
    // frame is discovered after its parent.
    for (std::size_t f = 1; f < nf; ++f) {
      const auto& fr = g.frames()[f];
      if (participants[f].size() < 2) continue;
      if (!fr.loop_cond) {
        std::vector<std::string> names;
        for (auto t : participants[f]) names.push_back(g.tasks()[t].to_string());
        return failure{errc::invalid_graph, "frame " + util::quoted(fr.name) + " spans tasks " + join(names, ", ") +
                                                " but has no LoopCond to drive their iterations"};
      }
      for (auto t : participants[f]) {
        const std::string device = task_name(g.tasks()[t]);
        auto name = [&](std::string_view part) { return skeleton_name(t, f, part); };
        auto& start = def.add(name("start"), "Const", {}, device);
        start.set("value", std::vector<float>{0.0f}).set("shape", std::vector<std::int64_t>{});
        if (fr.parent != 0) start.inputs.push_back("^" + skeleton_[fr.parent].at(t).pivot);
        def.add(name("enter"), "Enter", {name("start")}, device).set("frame_name", fr.name);
        def.add(name("merge"), "Merge", {name("enter"), name("next")}, device);
        def.add(name("switch"), "Switch", {name("merge"), g.node(*fr.loop_cond).name}, device);
        def.add(name("pivot"), "Identity", {name("switch") + ":1"}, device);
        def.add(name("next"), "NextIteration", {name("pivot")}, device);
        def.add(name("exit"), "Exit", {name("switch") + ":0"}, device);
        skeleton_[f][t] = skeleton{name("merge"), name("pivot")};
      }
    }
    try {
      aug_.emplace(std::move(def), relaxed_frames);
    } catch (const std::system_error& e) {
      return failure{errc::invalid_graph, std::string("internal: the loop skeletons do not validate: ") + e.what()};
    }
    return std::nullopt;
  }

  // ---- the condensed dependency graph ----------------------------------------
  //
  // The augmented graph without its NextIteration -> Merge edges, plus one
  // virtual node per loop frame ("the frame instance is done"): every node of
  // the frame except its Exits feeds it, it feeds the frame's Exits, and a
  // nested frame's node feeds its parent's. A loop's result thereby depends on
  // everything the loop did in any iteration, which the graph without back
  // edges alone would not show. Waves, rounds and the cycle check use it.

  std::size_t frame_node(std::size_t frame) const { return aug_->size() + frame; }

  std::optional<failure> build_condensed() {
    const auto& g = *aug_;
    const auto n = g.size(), total = n + g.frames().size();
    cin_.assign(total, {});
    for (const auto& e : g.edges())
      if (!g.is_back_edge(e)) cin_[e.dst].push_back(e.src);
    for (std::size_t i = 0; i < n; ++i) {
      const auto f = g.frame_of(i);
      if (f == 0) continue;
      if (is_exit(g.node(i).op))
        cin_[i].push_back(frame_node(f));
      else
        cin_[frame_node(f)].push_back(i);
    }
    for (std::size_t f = 1; f < g.frames().size(); ++f)
      if (g.frames()[f].parent != 0) cin_[frame_node(g.frames()[f].parent)].push_back(frame_node(f));
    std::vector<std::vector<std::size_t>> outs(total);
    std::vector<std::size_t> pending(total, 0);
    for (std::size_t v = 0; v < total; ++v)
      for (auto u : cin_[v]) outs[u].push_back(v), ++pending[v];
    std::vector<std::size_t> ready;
    for (std::size_t v = total; v-- > 0;)
      if (pending[v] == 0) ready.push_back(v);
    corder_.clear();
    while (!ready.empty()) {
      auto v = ready.back();
      ready.pop_back();
      corder_.push_back(v);
      for (auto w : outs[v])
        if (--pending[w] == 0) ready.push_back(w);
    }
    if (corder_.size() != total) {
      std::size_t f = 1;
      while (f < g.frames().size() && pending[frame_node(f)] == 0) ++f;
      return failure{errc::graph_cycle, "loop " + (f < g.frames().size() ? g.describe_frame(f) : std::string("frame")) +
                                            " needs its own result before it can start (a value computed "
                                            "from its Exit flows back into it)"};
    }
    cwave_.assign(total, 0);
    cpos_.assign(total, 0);
    for (std::size_t k = 0; k < corder_.size(); ++k) {
      const auto v = corder_[k];
      cpos_[v] = k;
      for (auto u : cin_[v]) cwave_[v] = std::max(cwave_[v], cwave_[u] + 1);
    }
    return std::nullopt;
  }

  // ---- transfers ------------------------------------------------------------

  void collect_transfers() {
    const auto& g = *aug_;
    std::map<std::tuple<std::size_t, int, std::size_t>, std::size_t> index;
    for (auto i : g.topological_order())
      for (auto ei : g.out_edges(i)) {
        const auto& e = g.edges()[ei];
        const auto st = g.task_of(e.src), dt = g.task_of(e.dst);
        if (st == dt) continue;
        auto key = std::make_tuple(e.src, e.src_port, dt);
        auto [it, fresh] = index.emplace(key, transfers_.size());
        if (fresh) {
          transfer t;
          t.src = e.src;
          t.port = e.src_port;
          t.src_task = st;
          t.dst_task = dt;
          t.frame = g.output_frame_of(e.src);
          t.wave = cwave_[e.src];
          transfers_.push_back(std::move(t));
        }
        auto& cons = transfers_[it->second].consumers;
        if (std::find(cons.begin(), cons.end(), e.dst) == cons.end()) cons.push_back(e.dst);
      }
    transfer_index_ = std::move(index);
  }

  std::vector<std::size_t> all_transfers() const {
    std::vector<std::size_t> v(transfers_.size());
    std::iota(v.begin(), v.end(), 0);
    return v;
  }

  std::size_t new_message(message_kind kind, std::size_t src, std::size_t dst, std::size_t frame,
                          std::size_t round, bool fallback) {
    work_message m;
    m.kind = kind;
    m.src_task = src;
    m.dst_task = dst;
    m.frame = frame;
    m.round = round;
    m.fallback = fallback;
    messages_.push_back(std::move(m));
    return messages_.size() - 1;
  }

  void attach(std::size_t t, std::size_t m) {
    transfers_[t].message = m;
    messages_[m].transfers.push_back(t);
  }

  void group_sends(const std::vector<std::size_t>& ids, bool fallback) {
    std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>, std::size_t> fused;
    for (auto t : ids) {
      const auto& tr = transfers_[t];
      if (!opts_.tensor_fuse) {
        attach(t, new_message(message_kind::send, tr.src_task, tr.dst_task, tr.frame, tr.wave, fallback));
        continue;
      }
      auto key = std::make_tuple(tr.frame, tr.wave, tr.src_task, tr.dst_task);
      auto it = fused.find(key);
      if (it == fused.end())
        it = fused.emplace(key, new_message(message_kind::send, tr.src_task, tr.dst_task, tr.frame, tr.wave, fallback))
                 .first;
      attach(t, it->second);
    }
  }

  bool is_server(std::size_t task) const { return user_.tasks()[task].job == opts_.server_job; }

  /// Returns the call for (client, server, frame, round), creating it.
  std::size_t call_for(std::size_t client, std::size_t server, std::size_t frame, std::size_t round) {
    auto key = std::make_tuple(client, server, frame, round);
    auto it = call_index_.find(key);
    if (it != call_index_.end()) return it->second;
    call_info c;
    c.client = client;
    c.server = server;
    c.frame = frame;
    c.round = round;
    c.request = new_message(message_kind::request, client, server, frame, round, false);
    c.response = new_message(message_kind::response, server, client, frame, round, false);
    calls_.push_back(c);
    messages_[c.request].call = messages_[c.response].call = calls_.size() - 1;
    call_index_.emplace(key, calls_.size() - 1);
    return calls_.size() - 1;
  }

  /// Fills each call's triggers (root-frame sources of its server group) and
  /// acks (group nodes the response waits for). `group_of(node)` says which
  /// (frame, round) a server node runs in, or nullopt.
  template <class GroupOf>
  void finish_calls(GroupOf group_of) {
    const auto& g = *aug_;
    std::map<std::tuple<std::size_t, std::size_t, std::size_t>, std::vector<std::size_t>> groups;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!is_server(g.task_of(i))) continue;
      if (auto r = group_of(i)) groups[{g.task_of(i), g.frame_of(i), *r}].push_back(i);
    }
    for (auto& c : calls_) {
      auto it = groups.find({c.server, c.frame, c.round});
      if (it == groups.end()) continue;
      const auto& members = it->second;
      std::set<std::size_t> in_group(members.begin(), members.end());
      for (auto n : members) {
        const auto& op = g.node(n).op;
        if (g.in_edges(n).empty() && c.frame == 0) c.triggers.push_back(n);
        if (is_enter(op) || is_exit(op) || is_next_iteration(op)) continue;
        bool feeds_group = false;
        for (auto ei : g.out_edges(n)) feeds_group = feeds_group || in_group.count(g.edges()[ei].dst) != 0;
        if (!feeds_group) c.acks.push_back(n);
      }
    }
  }

  void plan_star() {
    const auto& g = *aug_;
    std::vector<std::size_t> servers;
    std::vector<std::size_t> server_slot(g.tasks().size(), npos);
    for (std::size_t t = 0; t < g.tasks().size(); ++t)
      if (is_server(t)) {
        server_slot[t] = servers.size();
        servers.push_back(t);
      }
    // rounds[v][s]: how many responses of server s condensed node v depends
    // on. A frame's virtual node counts every server node of the loop as a
    // response (a loop's result may carry any of them back to the worker).
    const auto ns = servers.size();
    const auto n = g.size();
    std::vector<std::vector<std::size_t>> rounds(cin_.size(), std::vector<std::size_t>(ns, 0));
    for (auto v : corder_)
      for (auto u : cin_[v]) {
        const std::size_t tu = u < n ? g.task_of(u) : npos;
        const bool to_client = v >= n || !is_server(g.task_of(v));
        for (std::size_t s = 0; s < ns; ++s) {
          std::size_t r = rounds[u][s] + ((to_client && tu == servers[s]) ? 1 : 0);
          rounds[v][s] = std::max(rounds[v][s], r);
        }
      }
    const bool single = opts_.clustering == star_clustering::single_call;
    std::vector<std::size_t> plain;
    for (std::size_t t = 0; t < transfers_.size(); ++t) {
      const auto& tr = transfers_[t];
      const bool src_server = is_server(tr.src_task), dst_server = is_server(tr.dst_task);
      if (!src_server && dst_server) {
        std::size_t r = npos;
        for (auto c : tr.consumers) r = std::min(r, rounds[c][server_slot[tr.dst_task]]);
        auto call = call_for(tr.src_task, tr.dst_task, tr.frame, single ? 0 : r);
        attach(t, calls_[call].request);
      } else if (src_server && !dst_server) {
        auto call =
            call_for(tr.dst_task, tr.src_task, tr.frame, single ? 0 : rounds[tr.src][server_slot[tr.src_task]]);
        attach(t, calls_[call].response);
      } else {
        plain.push_back(t);
      }
    }
    group_sends(plain, true);
    if (single) return;
    finish_calls([&](std::size_t i) -> std::optional<std::size_t> {
      return rounds[i][server_slot[g.task_of(i)]];
    });
  }

  std::optional<failure> plan_lite() {
    const auto& g = *aug_;
    const auto n = g.size();
    std::vector<std::size_t> parent(n);
    std::iota(parent.begin(), parent.end(), 0);
    auto find = [&](std::size_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (const auto& e : g.edges()) {
      const auto ts = g.task_of(e.src);
      if (ts != g.task_of(e.dst) || !is_server(ts) || is_variable(g.node(e.src).op)) continue;
      parent[find(e.src)] = find(e.dst);
    }
    std::map<std::size_t, std::vector<std::size_t>> units;
    for (std::size_t i = 0; i < n; ++i)
      if (is_server(g.task_of(i))) units[find(i)].push_back(i);
    std::vector<char> ready(n, 0);
    std::vector<std::size_t> wave_of(n, npos);
    std::size_t wave = 0;
    while (true) {
      for (bool changed = true; changed;) {
        changed = false;
        for (auto i : g.topological_order()) {
          if (ready[i] || is_server(g.task_of(i))) continue;
          bool ok = true;
          for (auto ei : g.in_edges(i)) ok = ok && ready[g.edges()[ei].src];
          if (ok) ready[i] = 1, changed = true;
        }
      }
      if (units.empty()) break;
      // Merge every part that is ready, then every part of the same PS that
      // only waits on parts merged into this wave, until nothing changes.
      bool merged_any = false;
      for (bool changed = true; changed;) {
        changed = false;
        for (auto it = units.begin(); it != units.end();) {
          const auto root = it->first;
          const auto task = g.task_of(it->second.front());
          bool ok = true;
          for (auto m : it->second)
            for (auto ei : g.in_edges(m)) {
              auto src = g.edges()[ei].src;
              ok = ok && (find(src) == root ||
                          (ready[src] && (wave_of[src] != wave || g.task_of(src) == task)));
            }
          if (!ok) {
            ++it;
            continue;
          }
          for (auto m : it->second) ready[m] = 1, wave_of[m] = wave;
          it = units.erase(it);
          changed = merged_any = true;
        }
      }
      if (!merged_any) return stuck_unit(units.begin()->second, ready, find);
      ++wave;
    }
    std::vector<std::size_t> plain;
    for (std::size_t t = 0; t < transfers_.size(); ++t) {
      const auto& tr = transfers_[t];
      const bool src_server = is_server(tr.src_task), dst_server = is_server(tr.dst_task);
      if (!src_server && dst_server) {
        std::size_t r = npos;
        for (auto c : tr.consumers) r = std::min(r, wave_of[c]);
        attach(t, calls_[call_for(tr.src_task, tr.dst_task, 0, r)].request);
      } else if (src_server && !dst_server) {
        attach(t, calls_[call_for(tr.dst_task, tr.src_task, 0, wave_of[tr.src])].response);
      } else {
        plain.push_back(t);
      }
    }
    group_sends(plain, true);
    finish_calls([&](std::size_t i) -> std::optional<std::size_t> { return wave_of[i]; });
    return std::nullopt;
  }

  template <class Find>
  failure stuck_unit(const std::vector<std::size_t>& members, const std::vector<char>& ready, Find find) const {
    const auto& g = *aug_;
    const auto root = find(members.front());
    std::size_t blocker = npos;
    for (auto m : members)
      for (auto ei : g.in_edges(m)) {
        auto src = g.edges()[ei].src;
        if (!ready[src] && find(src) != root && blocker == npos) blocker = src;
      }
    // Is the blocker computed from this part's own outputs?
    std::vector<char> seen(g.size(), 0);
    std::vector<std::size_t> todo(members.begin(), members.end());
    for (auto m : members) seen[m] = 1;
    while (!todo.empty()) {
      auto x = todo.back();
      todo.pop_back();
      for (auto ei : g.out_edges(x)) {
        auto d = g.edges()[ei].dst;
        if (!seen[d]) seen[d] = 1, todo.push_back(d);
      }
    }
    std::vector<std::string> names;
    for (std::size_t k = 0; k < members.size() && k < 3; ++k) names.push_back(util::quoted(g.node(members[k]).name));
    if (members.size() > 3) names.push_back("...");
    std::string text = "star_server_lite cannot merge the ps graphs: the part of " +
                       g.tasks()[g.task_of(members.front())].to_string() + " holding " + join(names, ", ") +
                       " needs " + util::quoted(g.node(blocker).name) + " from " +
                       g.tasks()[g.task_of(blocker)].to_string();
    text += seen[blocker] ? ", which is computed from that part's own outputs"
                          : ", which never becomes ready";
    text += "; use star_server, which splits such chains into rounds";
    return failure{errc::graph_cycle, text};
  }

  // ---- acyclicity -----------------------------------------------------------

  enum class dep_kind { local, into, out_of, trigger, ack, order, activation };
  struct dep {
    std::size_t from, to;
    dep_kind kind;
    std::size_t ref = 0;  // transfer (into/out_of) or call (trigger/ack/order)
  };

  std::vector<dep> dependencies() const {
    const auto& g = *aug_;
    const auto n = cin_.size();  // messages are numbered after the condensed nodes
    std::vector<dep> deps;
    for (std::size_t v = 0; v < cin_.size(); ++v)
      for (auto u : cin_[v])
        if (u >= g.size() || v >= g.size() || g.task_of(u) == g.task_of(v)) deps.push_back({u, v, dep_kind::local});
    for (std::size_t t = 0; t < transfers_.size(); ++t) {
      const auto& tr = transfers_[t];
      deps.push_back({tr.src, n + tr.message, dep_kind::into, t});
      for (auto c : tr.consumers) deps.push_back({n + tr.message, c, dep_kind::out_of, t});
    }
    for (std::size_t c = 0; c < calls_.size(); ++c) {
      const auto& ci = calls_[c];
      for (auto x : ci.triggers) deps.push_back({n + ci.request, x, dep_kind::trigger, c});
      for (auto x : ci.acks) deps.push_back({x, n + ci.response, dep_kind::ack, c});
      if (ci.ordered) deps.push_back({n + ci.request, n + ci.response, dep_kind::order, c});
    }
    for (std::size_t m = 0; m < messages_.size(); ++m) {
      const auto& wm = messages_[m];
      if (wm.frame == 0) continue;
      deps.push_back({n + m, frame_node(wm.frame), dep_kind::local});
      if (auto s = skeleton_merge(wm.dst_task, wm.frame)) deps.push_back({*s, n + m, dep_kind::activation});
      if (wm.transfers.empty())
        if (auto s = skeleton_merge(wm.src_task, wm.frame)) deps.push_back({*s, n + m, dep_kind::activation});
    }
    return deps;
  }

  std::optional<std::size_t> skeleton_merge(std::size_t task, std::size_t frame) const {
    auto it = skeleton_[frame].find(task);
    if (it == skeleton_[frame].end()) return std::nullopt;
    return aug_->find(it->second.merge);
  }

  /// A cycle in the dependency graph, as the deps along it, or empty.
  std::vector<dep> find_cycle(const std::vector<dep>& deps) const {
    const auto total = cin_.size() + messages_.size();
    std::vector<std::vector<std::size_t>> in(total), out(total);
    std::vector<std::size_t> pending(total, 0);
    for (std::size_t d = 0; d < deps.size(); ++d) {
      out[deps[d].from].push_back(d);
      in[deps[d].to].push_back(d);
      ++pending[deps[d].to];
    }
    std::vector<std::size_t> todo;
    for (std::size_t v = 0; v < total; ++v)
      if (pending[v] == 0) todo.push_back(v);
    while (!todo.empty()) {
      auto v = todo.back();
      todo.pop_back();
      for (auto d : out[v])
        if (--pending[deps[d].to] == 0) todo.push_back(deps[d].to);
    }
    std::size_t cur = 0;
    while (cur < total && pending[cur] == 0) ++cur;
    if (cur == total) return {};
    std::vector<std::size_t> path;  // dep indices, walking backwards
    std::vector<int> pos(total, -1);
    while (pos[cur] < 0) {
      pos[cur] = static_cast<int>(path.size());
      for (auto d : in[cur])
        if (pending[deps[d].from] != 0) {
          path.push_back(d);
          cur = deps[d].from;
          break;
        }
    }
    std::vector<dep> cycle;
    for (auto k = static_cast<std::size_t>(pos[cur]); k < path.size(); ++k) cycle.push_back(deps[path[k]]);
    std::reverse(cycle.begin(), cycle.end());
    return cycle;
  }

  std::optional<failure> break_cycles() {
    const std::size_t limit = transfers_.size() + 4 * calls_.size() + 8 + aug_->size();
    for (std::size_t round = 0; round <= limit; ++round) {
      auto cycle = find_cycle(dependencies());
      if (cycle.empty()) return std::nullopt;
      // Move out the tensor that closes the cycle: of the fused messages on
      // it, the entry whose source comes last in topological order.
      const dep* evict = nullptr;
      for (const auto& d : cycle) {
        if (d.kind != dep_kind::into) continue;
        const auto& wm = messages_[transfers_[d.ref].message];
        std::size_t others = 0;
        for (auto t : wm.transfers) others += transfers_[t].src != d.from;
        if (wm.kind == message_kind::send && others == 0) continue;
        if (!evict || cpos_[d.from] > cpos_[evict->from]) evict = &d;
      }
      bool fixed = false;
      if (evict) {
        const auto d = *evict;
        auto& wm = messages_[transfers_[d.ref].message];
        std::vector<std::size_t> keep, moved;
        for (auto t : wm.transfers) (transfers_[t].src == d.from ? moved : keep).push_back(t);
        wm.transfers = keep;
        for (auto t : moved) {
          const auto& tr = transfers_[t];
          attach(t, new_message(message_kind::send, tr.src_task, tr.dst_task, tr.frame, tr.wave, true));
          ++cycle_breaks_;
        }
        fixed = true;
      }
      for (std::size_t k = 0; !fixed && k < cycle.size(); ++k) {
        const auto& d = cycle[k];
        auto& c = calls_[d.ref];
        if (d.kind == dep_kind::trigger) {
          c.triggers.erase(std::remove(c.triggers.begin(), c.triggers.end(), d.to), c.triggers.end());
          fixed = true;
        } else if (d.kind == dep_kind::ack) {
          c.acks.erase(std::remove(c.acks.begin(), c.acks.end(), d.from), c.acks.end());
          fixed = true;
        } else if (d.kind == dep_kind::order) {
          c.ordered = false;
          fixed = true;
        }
      }
      if (!fixed) return failure{errc::graph_cycle, "internal: the plan has a cycle that no message split removes"};
    }
    return failure{errc::graph_cycle, "internal: cycle breaking did not converge"};
  }

  // ---- output ---------------------------------------------------------------

  void sort_messages() {
    std::vector<std::size_t> order(messages_.size());
    std::iota(order.begin(), order.end(), 0);
    auto first_src = [&](std::size_t m) {
      std::size_t best = npos;
      for (auto t : messages_[m].transfers) best = std::min(best, transfers_[t].src);
      return best;
    };
    auto key = [&](std::size_t m) {
      const auto& wm = messages_[m];
      const std::size_t call_client = wm.call == npos ? wm.src_task : calls_[wm.call].client;
      const std::size_t call_server = wm.call == npos ? wm.dst_task : calls_[wm.call].server;
      return std::make_tuple(wm.frame, wm.round, wm.kind == message_kind::send ? 0 : 1, call_client, call_server,
                             wm.kind == message_kind::response ? 1 : 0, wm.src_task, wm.dst_task, first_src(m));
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    std::vector<std::size_t> new_index(messages_.size());
    std::vector<work_message> sorted;
    for (std::size_t k = 0; k < order.size(); ++k) {
      new_index[order[k]] = k;
      sorted.push_back(std::move(messages_[order[k]]));
    }
    messages_ = std::move(sorted);
    for (auto& t : transfers_) t.message = new_index[t.message];
    for (auto& c : calls_) {
      c.request = new_index[c.request];
      c.response = new_index[c.response];
    }
    // Data entries first, then control tokens, each in transfer order.
    for (auto& m : messages_)
      std::stable_sort(m.transfers.begin(), m.transfers.end(), [&](std::size_t a, std::size_t b) {
        return std::make_pair(transfers_[a].port < 0, a) < std::make_pair(transfers_[b].port < 0, b);
      });
  }

  std::string message_name(std::size_t m) const { return "m" + std::to_string(m); }

  std::string tensor_text(const transfer& t) const {
    const auto& name = aug_->node(t.src).name;
    return t.port < 0 ? "^" + name : name + ":" + std::to_string(t.port);
  }

  void emit(plan& out) {
    const auto& g = *aug_;
    out = plan{};
    out.options = opts_;
    out.cycle_breaks = cycle_breaks_;
    std::vector<std::size_t> entry_of(transfers_.size(), 0);
    for (std::size_t m = 0; m < messages_.size(); ++m)
      for (std::size_t k = 0; k < messages_[m].transfers.size(); ++k) entry_of[messages_[m].transfers[k]] = k;

    for (std::size_t m = 0; m < messages_.size(); ++m) {
      const auto& wm = messages_[m];
      plan_message pm;
      pm.name = message_name(m);
      pm.kind = wm.kind;
      pm.src = g.tasks()[wm.src_task];
      pm.dst = g.tasks()[wm.dst_task];
      pm.frame = wm.frame == 0 ? std::string() : g.frames()[wm.frame].name;
      pm.round = wm.round;
      pm.fallback = wm.fallback;
      pm.key = task_name(pm.src) + "/device:CPU:0;0000000000000001;" + task_name(pm.dst) + "/device:CPU:0;" +
               pm.name;
      for (auto t : wm.transfers) {
        const auto& tr = transfers_[t];
        plan_entry e;
        e.tensor = tensor_text(tr);
        for (auto c : tr.consumers) e.consumers.push_back(g.node(c).name);
        if (tr.port < 0) {
          e.descriptor = token_descriptor();
        } else if (const auto& s = g.output_spec(tr.src, static_cast<std::size_t>(tr.port))) {
          e.descriptor = s->descriptor();
        }
        pm.entries.push_back(std::move(e));
      }
      out.messages.push_back(std::move(pm));
    }

    std::vector<std::vector<std::size_t>> triggers_of(g.size());
    std::vector<std::vector<std::size_t>> acks_of(messages_.size());
    std::vector<std::size_t> request_of(messages_.size(), npos);
    for (const auto& c : calls_) {
      for (auto x : c.triggers) triggers_of[x].push_back(c.request);
      acks_of[c.response] = c.acks;
      if (c.ordered) request_of[c.response] = c.request;
    }

    std::vector<graph_def> parts(g.tasks().size());
    std::vector<char> used(g.tasks().size(), 0);
    for (auto& p : parts) p.tasks = g.def().tasks;
    auto recv_name = [&](std::size_t m) { return "_recv/" + message_name(m); };
    std::set<std::pair<std::size_t, std::size_t>> adapters;

    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto task = g.task_of(i);
      used[task] = 1;
      node_def nd = g.node(i);
      nd.inputs.clear();
      for (auto ei : g.in_edges(i)) {
        const auto& e = g.edges()[ei];
        const auto& src_name = g.node(e.src).name;
        if (g.task_of(e.src) == task) {
          nd.inputs.push_back(e.control() ? "^" + src_name : src_name + ":" + std::to_string(e.src_port));
          continue;
        }
        auto t = transfer_index_.at({e.src, e.src_port, task});
        auto m = transfers_[t].message;
        auto k = entry_of[t];
        if (!e.control()) {
          nd.inputs.push_back(recv_name(m) + ":" + std::to_string(k));
        } else {
          const std::string adapter = recv_name(m) + "/ctl" + std::to_string(k);
          if (adapters.emplace(m, k).second)
            parts[task].add(adapter, "Identity", {recv_name(m) + ":" + std::to_string(k)}, g.node(i).device);
          nd.inputs.push_back("^" + adapter);
        }
      }
      for (auto req : triggers_of[i]) nd.inputs.push_back("^" + recv_name(req));
      parts[task].nodes.push_back(std::move(nd));
    }

    for (std::size_t m = 0; m < messages_.size(); ++m) {
      const auto& wm = messages_[m];
      const auto& pm = out.messages[m];
      const std::int64_t entries = static_cast<std::int64_t>(wm.transfers.size());
      // Sender.
      auto& send = parts[wm.src_task].add("_send/" + pm.name, "_Send", {}, task_name(pm.src));
      send.set("key", pm.key).set("entries", entries);
      for (auto t : wm.transfers)
        if (transfers_[t].port >= 0) send.inputs.push_back(tensor_text(transfers_[t]));
      for (auto t : wm.transfers)
        if (transfers_[t].port < 0) send.inputs.push_back(tensor_text(transfers_[t]));
      for (auto x : acks_of[m]) {
        bool carried = false;
        for (auto t : wm.transfers) carried = carried || transfers_[t].src == x;
        if (!carried) send.inputs.push_back("^" + g.node(x).name);
      }
      if (request_of[m] != npos) send.inputs.push_back("^" + recv_name(request_of[m]));
      if (wm.frame != 0 && wm.transfers.empty() && request_of[m] == npos && acks_of[m].empty())
        if (auto s = skeleton_merge(wm.src_task, wm.frame)) send.inputs.push_back("^" + g.node(*s).name);
      // Receiver.
      auto& recv = parts[wm.dst_task].add(recv_name(m), "_Recv", {}, task_name(pm.dst));
      recv.set("key", pm.key).set("entries", entries);
      if (wm.frame != 0)
        if (auto s = skeleton_merge(wm.dst_task, wm.frame)) recv.inputs.push_back("^" + g.node(*s).name);
      for (std::size_t k = 0; k < wm.transfers.size(); ++k) {
        const auto& tr = transfers_[wm.transfers[k]];
        if (tr.port < 0) continue;
        if (const auto& s = g.output_spec(tr.src, static_cast<std::size_t>(tr.port))) recv.spec(*s, k);
      }
      used[wm.src_task] = used[wm.dst_task] = 1;
    }

    for (std::size_t t = 0; t < parts.size(); ++t)
      if (used[t]) out.partitions.push_back(plan_partition{g.tasks()[t], std::move(parts[t])});
  }

  struct skeleton {
    std::string merge, pivot;
  };

  const placed_graph& user_;
  partition_options opts_;
  std::optional<placed_graph> aug_;
  std::vector<std::map<std::size_t, skeleton>> skeleton_;  // [frame][task]
  std::vector<transfer> transfers_;
  std::map<std::tuple<std::size_t, int, std::size_t>, std::size_t> transfer_index_;
  std::vector<work_message> messages_;
  std::vector<call_info> calls_;
  std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>, std::size_t> call_index_;
  std::size_t cycle_breaks_ = 0;
  std::vector<std::vector<std::size_t>> cin_;  // condensed graph inputs
  std::vector<std::size_t> corder_, cwave_, cpos_;
};

}  // namespace detail

/// Plans `g` as `opts` says. Throws std::system_error: errc::invalid_graph
/// for graphs the partitioner cannot cut (reserved names, a variable written
/// from another task, a cross-task loop without LoopCond), errc::graph_cycle
/// when star_server_lite cannot merge; what() names the nodes or frame.
inline plan partition(const placed_graph& g, const partition_options& opts = {}) {
  plan out;
  detail::partitioner p(g, opts);
  if (auto f = p.run(out)) throw_error(f->code, f->what);
  return out;
}

/// Non-throwing partition: on failure sets `ec` and, if given, `*what`.
inline std::optional<plan> partition(const placed_graph& g, const partition_options& opts, std::error_code& ec,
                                     std::string* what = nullptr) {
  plan out;
  detail::partitioner p(g, opts);
  if (auto f = p.run(out)) {
    ec = make_error_code(f->code);
    if (what) *what = std::move(f->what);
    return std::nullopt;
  }
  ec.clear();
  return out;
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
