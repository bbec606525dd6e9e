// The calls a TensorFlow fork's rendezvous manager makes into fusewire, in
// the order it makes them: read the session's protocol and tensor_fuse,
// take the placed graph TensorFlow hands over, partition it, run steps, and
// map the rendezvous keys TensorFlow writes onto fusewire's tasks and keys.
// By default the cluster runs in this process (graph::local_cluster); with
// --processes NAME (auto, uring, asio, shm, shm+asio, shm+uring) every task runs in its own process and the
// messages cross loopback connections through fusewire's rendezvous endpoints
// (graph::rendezvous_channel), as they would between a fork's servers.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <stdexcept>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/local_cluster.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/graph/rendezvous_channel.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/tf/tf.hpp>

#include <chrono>

#include "common/launcher.hpp"
#include "common/options.hpp"
#include "common/ports.hpp"
#include "common/result_line.hpp"
#include "common/transport.hpp"

namespace fg = fusewire::graph;
namespace tf = fusewire::tf;

namespace {

constexpr std::string_view usage_text =
    "usage: tf_rendezvous [--protocol NAME] [--tensor-fuse[=BOOL]] [--steps N] [--loop] [--key KEY]\n"
    "                     [--processes NAME] [--timeout S]\n"
    "\n"
    "Shows what a TensorFlow fork's rendezvous manager asks of fusewire: the session's\n"
    "protocol and tensor_fuse, the partition plan of a placed wide-and-deep graph, a few\n"
    "training steps on an in-process cluster, and TensorFlow rendezvous keys mapped onto\n"
    "fusewire's tasks and channel keys.\n"
    "\n"
    "options:\n"
    "  --protocol NAME      grpc, grpc++, star_server or star_server_lite (default star_server)\n"
    "  --tensor-fuse[=BOOL] fuse send/recv messages per ready-wave (ConfigProto.tensor_fuse);\n"
    "                       BOOL is true/false, 1/0, yes/no or on/off (default: the\n"
    "                       TENSOR_FUSE environment variable, else false)\n"
    "  --steps N            training steps to run, 1 to 1000 (default 3)\n"
    "  --loop               add a while loop whose body multiplies by a ps:1 variable each\n"
    "                       iteration (star_server_lite refuses graphs with loops)\n"
    "  --key KEY            also map this rendezvous key (src_device;incarnation;dst_device;name;frame:iter)\n"
    "  --processes NAME     run every task in its own process, messages over loopback with\n"
    "                       fusewire's transport NAME: auto (shm here, every task being on this\n"
    "                       host), uring, asio, shm, shm+asio or shm+uring (default: all tasks\n"
    "                       in this process)\n"
    "  --timeout S          with --processes: stop every process still running S seconds after\n"
    "                       the first started, 1 to 3600 (default 60)\n"
    "  --help               print this text\n"
    "\n"
    "With --processes every task reads fusewire's environment knobs (docs/configuration.md),\n"
    "e.g. FUSEWIRE_CLUSTER_TOKEN.\n"
    "\n"
    "exit status: 0 done, 1 the plan or a step failed, 2 bad command line\n";

/// A bad command line: printed with a pointer to --help, exit status 2.
struct usage_error {
  std::string what;
};

struct settings {
  std::string protocol = "star_server";
  std::optional<std::string> tensor_fuse;  // unset: TENSOR_FUSE, as options::from_env reads it
  int steps = 3;
  bool loop = false;
  std::optional<std::string> key;
  std::optional<std::string> processes;
  int timeout_seconds = 60;
  bool help = false;
};

/// `text` as a whole number from 1 to `max`, else a usage_error naming `flag`.
int whole_number(std::string_view flag, const std::string& text, long max) {
  char* end = nullptr;
  const long n = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1 || n > max) {
    throw usage_error{std::string(flag) + " " + text + ": expected a whole number from 1 to " + std::to_string(max)};
  }
  return static_cast<int>(n);
}

/// The session's configuration: --tensor-fuse when given, else TENSOR_FUSE
/// (options::from_env, which also checks the other knobs).
tf::session_config session(const settings& s) {
  if (s.tensor_fuse) return tf::session_config::parse(s.protocol, *s.tensor_fuse);
  return tf::session_config::from(s.protocol, fusewire::options::from_env(fusewire::role::worker));
}

settings parse_args(int argc, char** argv) {
  settings s;
  auto value_of = [&](int& i, std::string_view arg, std::string_view name) -> std::optional<std::string> {
    if (arg == name) {
      if (i + 1 >= argc) throw usage_error{std::string(name) + " needs a value"};
      return std::string(argv[++i]);
    }
    if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=')
      return std::string(arg.substr(name.size() + 1));
    return std::nullopt;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      s.help = true;
    } else if (arg == "--loop") {
      s.loop = true;
    } else if (arg == "--tensor-fuse") {
      s.tensor_fuse = "true";
    } else if (arg.substr(0, 14) == "--tensor-fuse=") {
      s.tensor_fuse = std::string(arg.substr(14));
    } else if (auto v = value_of(i, arg, "--protocol")) {
      s.protocol = *v;
    } else if (auto k = value_of(i, arg, "--key")) {
      s.key = *k;
    } else if (auto t = value_of(i, arg, "--processes")) {
      if (auto problem = example::transport_problem(*t)) throw usage_error{"--processes " + *t + ": " + *problem};
      s.processes = *t;
    } else if (auto n = value_of(i, arg, "--steps")) {
      s.steps = whole_number("--steps", *n, 1000);
    } else if (auto n = value_of(i, arg, "--timeout")) {
      s.timeout_seconds = whole_number("--timeout", *n, 3600);
    } else {
      throw usage_error{"unknown option '" + std::string(arg) + "'"};
    }
  }
  return s;
}

constexpr int features = 4, batch = 4, rows = 8, dim = 2;

std::vector<float> ramp(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

/// What TensorFlow's placer hands a rendezvous manager: every node with its
/// device. Embedding tables alternate between ps:0 and ps:1; the dense tower
/// runs on the worker; ps:0 holds a per-example bias the step trains.
fg::graph_def wide_and_deep(const fusewire::cluster_spec& cluster, bool loop) {
  const std::string worker = "/job:worker/replica:0/task:0/device:CPU:0";
  const std::string ps[2] = {"/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"};
  using shape = std::vector<std::int64_t>;
  fg::graph_def g;
  g.tasks = cluster.tasks();
  auto variable = [&](std::string name, const std::string& device, shape s, std::vector<float> v) -> fg::node_def& {
    return g.add(std::move(name), "VariableV2", {}, device).set("shape", std::move(s)).set("value", std::move(v));
  };
  auto constant = [&](std::string name, const std::string& device, shape s, std::vector<float> v) -> fg::node_def& {
    return g.add(std::move(name), "Const", {}, device).set("shape", std::move(s)).set("value", std::move(v));
  };
  std::vector<std::string> lookups;
  for (int k = 0; k < features; ++k) {
    const std::string f = "emb_" + std::to_string(k);
    g.add("ids_" + std::to_string(k), "Placeholder", {}, worker).spec({fusewire::dtype::float32, {batch}});
    variable(f + "/table", ps[k % 2], {rows, dim}, ramp(rows * dim, 0.05f * static_cast<float>(k + 1), 0.01f));
    g.add(f + "/lookup", "Gather", {f + "/table", "ids_" + std::to_string(k)}, ps[k % 2]);
    lookups.push_back(f + "/lookup");
  }
  g.add("dense/concat", "Concat", lookups, worker).set("axis", std::int64_t{1});
  variable("dense/w", worker, {features * dim, 1}, ramp(features * dim, -0.2f, 0.05f));
  g.add("dense/logit", "MatMul", {"dense/concat", "dense/w"}, worker);
  std::string logit = "dense/logit";
  if (loop) {
    // scale = decay^3, computed by a loop on the worker whose multiply runs on ps:1.
    const std::string L = "scale/while";
    constant("scale/i0", worker, {}, {0});
    constant("scale/s0", worker, {}, {1});
    constant("scale/limit", worker, {}, {3});
    constant("scale/one", worker, {}, {1});
    variable("scale/decay", ps[1], {}, {0.9f});
    g.add(L + "/enter_i", "Enter", {"scale/i0"}, worker).set("frame_name", L);
    g.add(L + "/enter_s", "Enter", {"scale/s0"}, worker).set("frame_name", L);
    g.add(L + "/enter_limit", "Enter", {"scale/limit"}, worker).set("frame_name", L).set("is_constant", true);
    g.add(L + "/enter_one", "Enter", {"scale/one"}, worker).set("frame_name", L).set("is_constant", true);
    g.add(L + "/enter_decay", "Enter", {"scale/decay"}, ps[1]).set("frame_name", L).set("is_constant", true);
    g.add(L + "/merge_i", "Merge", {L + "/enter_i", L + "/next_i"}, worker);
    g.add(L + "/merge_s", "Merge", {L + "/enter_s", L + "/next_s"}, worker);
    g.add(L + "/less", "Less", {L + "/merge_i", L + "/enter_limit"}, worker);
    g.add(L + "/cond", "LoopCond", {L + "/less"}, worker);
    g.add(L + "/switch_i", "Switch", {L + "/merge_i", L + "/cond"}, worker);
    g.add(L + "/switch_s", "Switch", {L + "/merge_s", L + "/cond"}, worker);
    g.add(L + "/inc", "Add", {L + "/switch_i:1", L + "/enter_one"}, worker);
    g.add(L + "/decayed", "Mul", {L + "/switch_s:1", L + "/enter_decay"}, ps[1]);
    g.add(L + "/next_i", "NextIteration", {L + "/inc"}, worker);
    g.add(L + "/next_s", "NextIteration", {L + "/decayed"}, worker);
    g.add(L + "/exit_s", "Exit", {L + "/switch_s:0"}, worker);
    g.add("dense/scaled", "Mul", {logit, L + "/exit_s"}, worker);
    logit = "dense/scaled";
  }
  variable("wide/bias", ps[0], {batch, 1}, std::vector<float>(batch, 0.0f));
  g.add("out", "Add", {logit, "wide/bias"}, worker);
  g.add("label", "Placeholder", {}, worker).spec({fusewire::dtype::float32, {batch, 1}});
  g.add("err", "Sub", {"out", "label"}, worker);
  constant("ones", worker, {1, batch}, std::vector<float>(batch, 1.0f));
  g.add("loss", "MatMul", {"ones", "sq"}, worker);
  g.add("sq", "Mul", {"err", "err"}, worker);
  constant("lr", worker, {}, {0.5f});
  g.add("grad", "Mul", {"err", "lr"}, worker);
  g.add("wide/update", "AssignSub", {"wide/bias", "grad"}, ps[0]);
  return g;
}

fg::feed_map feeds() {
  fg::feed_map f;
  for (int k = 0; k < features; ++k) {
    std::vector<float> ids(batch);
    for (int b = 0; b < batch; ++b) ids[static_cast<std::size_t>(b)] = static_cast<float>((k + 3 * b) % rows);
    f.emplace("ids_" + std::to_string(k), fg::tensor({batch}, ids));
  }
  f.emplace("label", fg::tensor({batch, 1}, {1, 0, 1, 0}));
  return f;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

std::string fixed(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", static_cast<double>(v));
  return buf;
}

/// What a rendezvous manager does with a key TensorFlow hands it.
void show_key(std::string_view text, const fusewire::cluster_spec& cluster) {
  const tf::rendezvous_key key = tf::parse_rendezvous_key(text);
  const tf::rendezvous_route route = tf::route(key);
  char incarnation[17];
  std::snprintf(incarnation, sizeof incarnation, "%016llx", static_cast<unsigned long long>(key.src_incarnation));
  std::cout << "  key          " << text << "\n"
            << "  sender       " << key.src_device << " -> task " << route.src.to_string() << " at "
            << cluster.fast_path_endpoint(route.src).to_string() << "\n"
            << "  receiver     " << key.dst_device << " -> task " << route.dst.to_string() << " at "
            << cluster.fast_path_endpoint(route.dst).to_string() << "\n"
            << "  tensor       " << key.tensor_name << " (frame " << key.frame_id << ", iteration " << key.iter_id
            << ", sender incarnation " << incarnation << ")\n"
            << "  channel key  " << route.channel_key << "\n";
}

/// One step's traffic and loss, as the table prints them.
struct step_row {
  double loss = 0;
  std::uint64_t messages = 0, tensors = 0, bytes = 0;
  bool same = true;
};

/// The options of the process of task `t`: the environment's knobs; unless they
/// say otherwise, reactors that sleep when idle (three processes share the
/// machine) and 20 s to reach a peer.
fusewire::options task_options(const fusewire::task_id& t) {
  return example::task_options(example::role_of_job(t.job), {},
                               {.mode = fusewire::reactor_mode::block, .connect_timeout = std::chrono::seconds(20)});
}

/// What one task's process does: its partition, step after step, over an
/// endpoint; reports per step what it sent (and, on the worker, the loss and
/// whether its fetches equal the one-process run) in an "@step" line.
template <class Transport>
int task_process(const fg::plan& plan, std::size_t index, const fusewire::cluster_spec& cluster, int steps,
                 const std::vector<std::map<std::string, fg::tensor>>& want) {
  const auto& part = plan.partitions[index];
  fusewire::rendezvous::endpoint<Transport> ep(part.task, cluster, {.options = task_options(part.task)});
  fg::rendezvous_channel<Transport> channel(ep, {.recv_timeout = std::chrono::seconds(20), .on_send_error = {}});
  fg::executor ex(part.graph);
  const auto inputs = feeds();
  const auto fetches = fg::fetches_for(ex.graph(), {"loss", "wide/update"});
  for (int step = 1; step <= steps; ++step) {
    auto got = fg::run_step(ex, channel, static_cast<std::uint64_t>(step), fg::feeds_for(ex.graph(), inputs), fetches,
                            std::chrono::seconds(20));
    step_row row;
    for (const auto& f : fetches) row.same = row.same && got.at(f) == want[static_cast<std::size_t>(step - 1)].at(f);
    if (got.count("loss")) row.loss = got.at("loss").values.at(0);
    const auto sent = channel.sent(static_cast<std::uint64_t>(step));
    // %.17g: the launcher adds up the very same double.
    std::printf("@step n=%d loss=%.17g messages=%llu tensors=%llu bytes=%llu same=%d\n", step, row.loss,
                static_cast<unsigned long long>(sent.messages), static_cast<unsigned long long>(sent.tensors),
                static_cast<unsigned long long>(sent.bytes), row.same ? 1 : 0);
    std::fflush(stdout);
  }
  if (!channel.flush()) {
    std::fprintf(stderr, "tf_rendezvous: sends still in flight after 30 s\n");
    return 1;
  }
  if (const std::error_code ec = channel.error()) {
    std::fprintf(stderr, "tf_rendezvous: a send failed: %s\n", ec.message().c_str());
    return 1;
  }
  // Nobody closes its endpoint before every task is done.
  const auto& first = plan.partitions.front().task;
  constexpr auto wait = std::chrono::seconds(20);
  auto failed = [&](const char* what, const fusewire::task_id& peer, std::error_code ec) {
    std::fprintf(stderr, "tf_rendezvous: '%s' with %s did not complete within %lld s: %s\n", what,
                 peer.to_string().c_str(), static_cast<long long>(wait.count()), ec.message().c_str());
    return 1;
  };
  if (index == 0) {
    for (std::size_t t = 1; t < plan.partitions.size(); ++t) {
      const auto& peer = plan.partitions[t].task;
      if (auto r = ep.recv_sync(peer, "done", wait); r.ec) return failed("done", peer, r.ec);
    }
    for (std::size_t t = 1; t < plan.partitions.size(); ++t) {
      const auto& peer = plan.partitions[t].task;
      if (auto ec = ep.send_sync(peer, "release", fusewire::tensor_buffer::allocate(1), wait))
        return failed("release", peer, ec);
    }
  } else {
    if (auto ec = ep.send_sync(first, "done", fusewire::tensor_buffer::allocate(1), wait))
      return failed("done", first, ec);
    if (auto r = ep.recv_sync(first, "release", wait); r.ec) return failed("release", first, r.ec);
  }
  return 0;
}

/// Runs `steps` steps with one forked process per task; rows summed over tasks.
/// Every process still running `timeout` after the first started is killed.
template <class Transport>
std::optional<std::vector<step_row>> run_processes(const fg::plan& plan, const fg::placed_graph& graph,
                                                   const fusewire::cluster_spec& cluster, int steps,
                                                   std::chrono::seconds timeout) {
  // The one-process answer, computed before forking so every task can compare.
  fg::executor whole(graph);
  std::vector<std::map<std::string, fg::tensor>> want;
  for (int step = 1; step <= steps; ++step) want.push_back(whole.run(feeds(), {"loss", "wide/update"}));
  for (const auto& part : plan.partitions) (void)task_options(part.task);  // a bad knob fails before any fork
  std::vector<example::child_process> kids;
  for (std::size_t i = 0; i < plan.partitions.size(); ++i) {
    kids.push_back(example::spawn_function(plan.partitions[i].task.to_string(), example::child_kind::task, [&, i] {
      try {
        return task_process<Transport>(plan, i, cluster, steps, want);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tf_rendezvous: %s\n", e.what());
        return 1;
      }
    }));
  }
  std::vector<step_row> rows(static_cast<std::size_t>(steps));
  std::map<std::string, int> reported;  // "@step" lines per task
  const bool ok = example::supervise(
      kids,
      [&](const example::child_process& c, const std::string& line) {
        const example::result_fields r = example::parse_result(line);
        const auto n = static_cast<std::size_t>(example::num(r, "n"));
        if (r.at("@") != "@step" || n < 1 || n > rows.size()) return;
        step_row& row = rows[n - 1];
        row.loss += example::num(r, "loss");
        row.messages += static_cast<std::uint64_t>(example::num(r, "messages"));
        row.tensors += static_cast<std::uint64_t>(example::num(r, "tensors"));
        row.bytes += static_cast<std::uint64_t>(example::num(r, "bytes"));
        row.same = row.same && example::num(r, "same") != 0;
        ++reported[c.name];
      },
      {.deadline = timeout}, "tf_rendezvous");
  bool all_reported = true;
  for (const auto& c : kids) {
    if (reported[c.name] == steps) continue;
    std::cerr << "tf_rendezvous: " << c.name << " reported " << reported[c.name] << " of " << steps << " steps\n";
    all_reported = false;
  }
  if (!ok || !all_reported) return std::nullopt;
  return rows;
}

int run(const settings& s) {
  // 1. The session's configuration, as the fork reads it from its server def and ConfigProto.
  const tf::session_config config = session(s);
  const fg::partition_options options = config.partition_options();
  std::cout << "session: protocol " << tf::to_string(config.proto) << ", tensor_fuse "
            << (config.tensor_fuse ? "on" : "off") << " -> partition mode " << fg::to_string(options.mode) << "\n";

  // 2. The cluster (TF_CONFIG or a cluster string) and the placed graph.
  const auto cluster = fusewire::cluster_spec::from_string("worker=localhost:2222;ps=localhost:2223,localhost:2224");
  const fg::placed_graph graph(wide_and_deep(cluster, s.loop));
  std::map<fusewire::task_id, int> per_task;
  for (std::size_t i = 0; i < graph.size(); ++i) ++per_task[graph.tasks()[graph.task_of(i)]];
  std::cout << "cluster: " << cluster.to_string() << "\n"
            << "graph: " << graph.size() << " nodes (";
  for (auto it = per_task.begin(); it != per_task.end(); ++it)
    std::cout << (it == per_task.begin() ? "" : ", ") << it->first.to_string() << " " << it->second;
  std::cout << ")" << (graph.has_loops() ? ", with a while loop" : "") << "\n\n";

  // 3. Partition: which messages cross between which tasks, per step.
  std::error_code ec;
  std::string why;
  const std::optional<fg::plan> plan = fg::partition(graph, options, ec, &why);
  if (!plan) {
    std::cerr << "tf_rendezvous: cannot partition this graph: " << why << "\n";
    return 1;
  }
  std::cout << plan->summary();
  std::cout << "\nmessages per step" << (graph.has_loops() ? " (loop iterations not counted)" : "")
            << ", by protocol (tensor_fuse off / on):\n";
  for (tf::protocol p : tf::all_protocols) {
    std::cout << "  " << std::string(tf::to_string(p)).append(18 - tf::to_string(p).size(), ' ');
    for (bool fuse : {false, true}) {
      auto other = fg::partition(graph, tf::session_config{p, fuse}.partition_options(), ec);
      std::cout << (fuse ? " / " : "") << (other ? std::to_string(other->per_step().messages) : "refused");
    }
    std::cout << (p == config.proto ? "   <- this session\n" : "\n");
  }
  std::cout << "\n";

  // 4. Steps: every task's partition exchanges its messages through the channel;
  //    the same steps on the whole graph in one executor must agree.
  const std::vector<std::string> fetches{"loss", "wide/update"};
  std::vector<step_row> rows;
  if (s.processes) {
    std::string transport;
    // Fresh loopback ports: the example's own cluster string names ports that may be taken.
    const auto cluster = fusewire::cluster_spec::from_string(example::host_cluster({{"worker", 1}, {"ps", 2}}));
    const fusewire::options o = task_options(plan->partitions.front().task);
    std::optional<std::vector<step_row>> got =
        example::with_transport(*s.processes, o, cluster, [&]<class Transport>() {
          transport = Transport::name();
          return run_processes<Transport>(*plan, graph, cluster, s.steps, std::chrono::seconds(s.timeout_seconds));
        });
    if (!got) {
      std::cerr << "tf_rendezvous: the steps failed across processes\n";
      return 1;
    }
    rows = std::move(*got);
    std::cout << "steps: " << plan->partitions.size() << " processes, one per task, over loopback (" << transport
              << ")\n";
  } else {
    fg::local_cluster tasks(*plan);
    fg::executor whole(graph);
    const auto inputs = feeds();
    for (int step = 1; step <= s.steps; ++step) {
      auto got = tasks.run(inputs, fetches);
      const auto traffic = tasks.last_step_traffic();
      rows.push_back(step_row{got.at("loss").values.at(0), traffic.messages, traffic.tensors, traffic.bytes,
                              got == whole.run(inputs, fetches)});
    }
    std::cout << "steps: every task in this process\n";
  }
  bool same = true;
  std::cout << "step  " << pad("loss", 10) << pad("messages", 10) << pad("tensors", 9) << pad("bytes", 8) << "\n";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto& r = rows[k];
    same = same && r.same;
    std::cout << pad(std::to_string(k + 1), 4) << "  " << pad(fixed(static_cast<float>(r.loss)), 10)
              << pad(std::to_string(r.messages), 10) << pad(std::to_string(r.tensors), 9)
              << pad(std::to_string(r.bytes), 8) << "\n";
  }
  std::cout << "results match one process running the whole graph: " << (same ? "yes" : "NO") << "\n\n";

  // 5. Rendezvous keys: one TensorFlow wrote, the plan's first, and --key.
  std::cout << "rendezvous keys -> fusewire tasks and channel keys\n"
            << "a key TensorFlow wrote for a worker -> ps:1 edge:\n";
  show_key(
      "/job:worker/replica:0/task:0/device:CPU:0;7f3a9c21b4e8d0aa;/job:ps/replica:0/task:1/device:CPU:0;"
      "edge_12_ids_1;0:0",
      cluster);
  if (!plan->messages.empty()) {
    std::cout << "the key of plan message " << plan->messages.front().name
              << " (the partitioner writes TensorFlow keys):\n";
    show_key(plan->messages.front().key + ";0:0", cluster);
  }
  if (s.key) {
    std::cout << "--key:\n";
    show_key(*s.key, cluster);
  }
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  try {
    s = parse_args(argc, argv);
    if (s.help) {
      std::cout << usage_text;
      return 0;
    }
    // Bad configuration values are the command line's fault: check them first.
    (void)session(s);
    if (s.key) (void)tf::route(tf::parse_rendezvous_key(*s.key));
  } catch (const usage_error& e) {
    std::cerr << "tf_rendezvous: " << e.what << " (see --help)\n";
    return 2;
  } catch (const std::system_error& e) {
    std::cerr << "tf_rendezvous: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    return run(s);
  } catch (const std::exception& e) {
    std::cerr << "tf_rendezvous: " << e.what() << "\n";
    return 1;
  }
}
