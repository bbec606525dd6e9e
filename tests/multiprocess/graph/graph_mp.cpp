// Executor equivalence across processes: every task of a partitioned plan runs
// in its own forked process with its own rendezvous endpoint (on loopback; over
// verbs on the soft-RoCE QEMU guest's RDMA interface), and
// the fetches and variables must equal, bit for bit, one process running the
// whole graph. The messages each process sends must add up to what the plan
// says a step needs.
//
//   graph_mp <mode> <asio|uring|verbs>
//     mode: send_recv, send_recv_fuse, star_server, star_server_single_call, star_server_lite
//
// Graphs: wide-and-deep (shared inputs, 16 lookups on 2 PS), a diamond, a
// conditional whose branches run on two PS (dead values cross the wire), control
// edges, a worker->ps->worker->ps chain and a while loop spanning two tasks.
// star_server_lite must refuse the loop and the chain (errc::graph_cycle).
//
// Every process runs under alarm(); exit 0 = pass, 1 = fail, 2 = bad usage, 77 = skipped.
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/graph/rendezvous_channel.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support/graphs.hpp"
#include "support/transport_setup.hpp"
#include "support/mp.hpp"
#include "support/mp_main.hpp"

namespace fw = fusewire;
namespace fg = fusewire::graph;
using namespace std::chrono_literals;
using namespace fusewire::test;
using fusewire::test::spawn;
using fusewire::test::succeeded;

namespace {

constexpr int steps = 3;

/// One graph of the catalogue: how to build it, what to feed each step, what to fetch.
struct case_def {
  std::string name;
  std::function<fg::graph_def()> build;
  std::function<fg::feed_map(int step)> feeds;
  std::vector<std::string> fetches;
  std::size_t loop_iterations = 0;  ///< iterations of each loop frame per step
  bool lite_refuses = false;
  bool sends_dead = false;  ///< some message must carry a dead entry
};

std::vector<case_def> catalogue() {
  std::vector<case_def> out;
  out.push_back(
      {"wide_and_deep", wide_and_deep, [](int) { return wide_and_deep_feeds(); }, {"out", "ps0/update", "ps1/update"}});
  out.push_back({"diamond",
                 diamond,
                 [](int s) {
                   const auto f = static_cast<float>(s);
                   return fg::feed_map{{"x", fg::tensor({2, 2}, {1 + f, 2, 3 - f, 4})}};
                 },
                 {"d"}});
  out.push_back({"branches",
                 branches,
                 [](int s) {
                   const auto f = static_cast<float>(s);
                   return fg::feed_map{{"x", fg::tensor({2}, {1 + f, 2 - f})},
                                       {"p", fg::tensor::scalar(static_cast<float>(s % 2))}};
                 },
                 {"join", "join:1", "out", "learn_scale", "learn_shift"},
                 0,
                 false,
                 true});
  out.push_back({"control_tokens",
                 control_tokens,
                 [](int s) {
                   return fg::feed_map{{"x", fg::tensor({2}, {5, static_cast<float>(s)})}};
                 },
                 {"after"}});
  out.push_back({"chain",
                 chain,
                 [](int s) {
                   return fg::feed_map{{"x", fg::tensor({2}, {1, -2 + 0.5f * static_cast<float>(s)})}};
                 },
                 {"out", "learn"},
                 0,
                 true});
  out.push_back({"while_loop",
                 [] { return rnn_loop(); },
                 [](int s) {
                   const auto f = static_cast<float>(s);
                   return fg::feed_map{{"h0", fg::tensor({1, 4}, {1, -1, 0.5f * f, 2})}};
                 },
                 {"rnn/while/exit_h", "rnn/while/exit_i", "update_b"},
                 4,
                 true,
                 true});
  return out;
}

template <class T>
fw::options mp_options() {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 4u << 20;
  o.connect_timeout = 20000ms;
  fw::test::transport_setup<T>::adjust(o);
  return o;
}

bool same_bits(const fg::tensor& a, const fg::tensor& b) {
  return a.shape == b.shape && a.values.size() == b.values.size() &&
         (a.values.empty() || std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0);
}

bool is_variable(const std::string& op) { return op == "Variable" || op == "VariableV2"; }

/// What the whole graph computes in one process: fetches per step, variables at the end.
struct reference {
  std::vector<std::map<std::string, fg::tensor>> fetched;
  std::map<std::string, fg::tensor> variables;
};

reference run_single(const case_def& c, const fg::placed_graph& g) {
  reference r;
  fg::executor ex(g);
  for (int s = 1; s <= steps; ++s) r.fetched.push_back(ex.run(c.feeds(s), c.fetches));
  for (std::size_t i = 0; i < g.size(); ++i)
    if (is_variable(g.node(i).op)) r.variables.emplace(g.node(i).name, *ex.variable(g.node(i).name));
  return r;
}

/// What a task process reports to the driver through its pipe.
struct task_report {
  std::uint64_t messages[steps] = {};
  std::uint64_t bytes[steps] = {};
  std::uint64_t wire_bytes[steps] = {};
  std::uint64_t dead = 0;  ///< dead entries sent over all steps
  std::uint64_t fused_frames = 0;
};

#define TASK_EXPECT(cond, ...)                                                                                     \
  do {                                                                                                             \
    if (!(cond)) {                                                                                                 \
      std::fprintf(stderr, "[%s] %s:%d: check failed: %s: ", self.to_string().c_str(), __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                                           \
      std::fprintf(stderr, "\n");                                                                                  \
      return 1;                                                                                                    \
    }                                                                                                              \
  } while (0)

/// The body of one task's process.
template <class T>
int run_task(const case_def& c, const fg::plan& plan, std::size_t index, const fw::cluster_spec& spec,
             const reference& want, int report_fd) {
  const auto& part = plan.partitions[index];
  const fw::task_id self = part.task;
  fw::rendezvous::endpoint<T> ep(self, spec,
                                 {.options = mp_options<T>(), .transport = fw::test::transport_setup<T>::make()});
  fg::rendezvous_channel<T> ch(ep, {.recv_timeout = 20000ms, .on_send_error = {}});
  fg::executor ex(part.graph);
  task_report report;
  for (int s = 1; s <= steps; ++s) {
    const auto fetches = fg::fetches_for(ex.graph(), c.fetches);
    auto got = fg::run_step(ex, ch, static_cast<std::uint64_t>(s), fg::feeds_for(ex.graph(), c.feeds(s)), fetches, 20s);
    for (const auto& f : fetches) {
      const auto& expected = want.fetched[static_cast<std::size_t>(s - 1)].at(f);
      TASK_EXPECT(got.count(f) && same_bits(got.at(f), expected), "step %d fetch '%s' is %s, one process computed %s",
                  s, f.c_str(), got.count(f) ? got.at(f).to_string().c_str() : "missing", expected.to_string().c_str());
    }
    const auto sent = ch.sent(static_cast<std::uint64_t>(s));
    report.messages[s - 1] = sent.messages;
    report.bytes[s - 1] = sent.bytes;
    report.wire_bytes[s - 1] = sent.wire_bytes;
    report.dead += sent.dead;
  }
  for (std::size_t i = 0; i < ex.graph().size(); ++i) {
    const auto& name = ex.graph().node(i).name;
    if (!is_variable(ex.graph().node(i).op)) continue;
    const auto& expected = want.variables.at(name);
    TASK_EXPECT(same_bits(*ex.variable(name), expected), "variable '%s' is %s after %d steps, one process has %s",
                name.c_str(), ex.variable(name)->to_string().c_str(), steps, expected.to_string().c_str());
  }
  TASK_EXPECT(ch.flush(20s), "sends still in flight after 20 s");
  TASK_EXPECT(!ch.error(), "a send failed: %s", ch.error().message().c_str());
  report.fused_frames = ep.stats().fused_frames_sent;
  // Barrier: nobody closes its endpoint before every task finished its steps.
  const fw::task_id coordinator = plan.partitions.front().task;
  if (index == 0) {
    for (std::size_t t = 1; t < plan.partitions.size(); ++t)
      TASK_EXPECT(!ep.recv_sync(plan.partitions[t].task, "done", 30s).ec, "no 'done' from %s",
                  plan.partitions[t].task.to_string().c_str());
    for (std::size_t t = 1; t < plan.partitions.size(); ++t)
      TASK_EXPECT(!ep.send_sync(plan.partitions[t].task, "release", fw::tensor_buffer::allocate(1), 30s),
                  "cannot release %s", plan.partitions[t].task.to_string().c_str());
  } else {
    TASK_EXPECT(!ep.send_sync(coordinator, "done", fw::tensor_buffer::allocate(1), 30s), "cannot report done");
    TASK_EXPECT(!ep.recv_sync(coordinator, "release", 30s).ec, "no release");
  }
  TASK_EXPECT(::write(report_fd, &report, sizeof report) == static_cast<ssize_t>(sizeof report), "pipe write failed");
  return 0;
}

#undef TASK_EXPECT

/// Runs one graph of the catalogue in one process per task; true if it passed.
template <class T>
bool run_case(const case_def& c, const fg::partition_options& opts, const std::string& mode_name) {
  const fg::placed_graph g(c.build());
  std::error_code ec;
  std::string why;
  const auto plan = fg::partition(g, opts, ec, &why);
  if (opts.mode == fg::partition_mode::star_server_lite && c.lite_refuses) {
    if (plan || ec != fw::errc::graph_cycle) {
      std::fprintf(stderr, "%s: star_server_lite should refuse it with graph_cycle, got %s\n", c.name.c_str(),
                   plan ? "a plan" : ec.message().c_str());
      return false;
    }
    std::printf("  %-15s refused by star_server_lite, as it must be: %s\n", c.name.c_str(), why.c_str());
    return true;
  }
  if (!plan) {
    std::fprintf(stderr, "%s: cannot partition in %s: %s\n", c.name.c_str(), mode_name.c_str(), why.c_str());
    return false;
  }
  const reference want = run_single(c, g);
  std::size_t planned = plan->per_step().messages;
  for (const auto& f : plan->loop_frames()) planned += plan->per_iteration(f).messages * c.loop_iterations;

  // The cluster spec needs every task of the graph; only tasks with a partition run.
  std::size_t ps = 0, workers = 0;
  for (const auto& t : g.tasks()) (t.job == "ps" ? ps : workers) += 1;
  const auto spec = fw::test::transport_setup<T>::cluster(static_cast<unsigned>(ps), static_cast<unsigned>(workers));
  std::vector<pid_t> pids;
  std::vector<int> reads;
  for (std::size_t i = 0; i < plan->partitions.size(); ++i) {
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("pipe");
      return false;
    }
    const pid_t pid = spawn(
        50,
        [&] {
          ::close(fds[0]);
          return run_task<T>(c, *plan, i, spec, want, fds[1]);
        },
        plan->partitions[i].task.to_string());
    ::close(fds[1]);
    pids.push_back(pid);
    reads.push_back(fds[0]);
  }
  bool ok = true;
  std::uint64_t messages[steps] = {}, bytes[steps] = {}, wire_bytes[steps] = {}, fused = 0, dead = 0;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    task_report r;
    const bool got = ::read(reads[i], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    ::close(reads[i]);
    const auto who = c.name + ": " + plan->partitions[i].task.to_string();
    if (!succeeded(pids[i], who.c_str())) {
      ok = false;
    } else if (!got) {
      std::fprintf(stderr, "%s exited with 0 but sent no report\n", who.c_str());
      ok = false;
    }
    for (int s = 0; s < steps; ++s) {
      messages[s] += r.messages[s];
      bytes[s] += r.bytes[s];
      wire_bytes[s] += r.wire_bytes[s];
    }
    fused += r.fused_frames;
    dead += r.dead;
  }
  if (!ok) return false;
  for (int s = 0; s < steps; ++s)
    if (messages[s] != planned) {
      std::fprintf(stderr, "%s: step %d sent %llu messages, the plan says %zu\n", c.name.c_str(), s + 1,
                   static_cast<unsigned long long>(messages[s]), planned);
      return false;
    }
  if (c.sends_dead && dead == 0) {
    std::fprintf(stderr, "%s: no dead entry crossed the wire, but the untaken branches must send some\n",
                 c.name.c_str());
    return false;
  }
  std::printf(
      "  %-15s %zu processes, %d steps equal bit for bit; %llu messages/step (plan %zu), %llu value bytes, "
      "%llu payload bytes; %llu dead entries, %llu fused frames in %d steps\n",
      c.name.c_str(), plan->partitions.size(), steps, static_cast<unsigned long long>(messages[0]), planned,
      static_cast<unsigned long long>(bytes[0]), static_cast<unsigned long long>(wire_bytes[0]),
      static_cast<unsigned long long>(dead), static_cast<unsigned long long>(fused), steps);
  return true;
}

template <class T>
int run_all(const std::string& mode) {
  fg::partition_options opts;
  if (mode == "send_recv") {
    opts.mode = fg::partition_mode::send_recv;
  } else if (mode == "send_recv_fuse") {
    opts.mode = fg::partition_mode::send_recv;
    opts.tensor_fuse = true;
  } else if (mode == "star_server") {
    opts.mode = fg::partition_mode::star_server;
  } else if (mode == "star_server_single_call") {
    opts.mode = fg::partition_mode::star_server;
    opts.clustering = fg::star_clustering::single_call;
  } else if (mode == "star_server_lite") {
    opts.mode = fg::partition_mode::star_server_lite;
  } else {
    std::fprintf(stderr,
                 "unknown mode '%s' (allowed: send_recv, send_recv_fuse, star_server, star_server_single_call, "
                 "star_server_lite)\n",
                 mode.c_str());
    return 2;
  }
  std::printf("%s over %s:\n", mode.c_str(), T::name().data());
  bool ok = true;
  for (const auto& c : catalogue()) ok = run_case<T>(c, opts, mode) && ok;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return fusewire::test::main_over_transport<true>(argc, argv, "<mode>", 170,
                                                   []<class T>(const std::string& what) { return run_all<T>(what); });
}
