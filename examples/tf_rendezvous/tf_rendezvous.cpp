// The calls a TensorFlow fork's rendezvous manager makes into fusewire, in
// the order it makes them: read the session's protocol and tensor_fuse,
// take the placed graph TensorFlow hands over, partition it, run steps, and
// map the rendezvous keys TensorFlow writes onto fusewire's tasks and keys.
// By default the cluster runs in this process (graph::local_cluster); with
// --processes asio|uring every task runs in its own process and the messages
// cross loopback sockets through fusewire's rendezvous endpoints
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
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace fg = fusewire::graph;
namespace tf = fusewire::tf;

namespace {

constexpr std::string_view usage_text =
    "usage: tf_rendezvous [--protocol NAME] [--tensor-fuse[=BOOL]] [--steps N] [--loop] [--key KEY]\n"
    "                     [--processes asio|uring]\n"
    "\n"
    "Shows what a TensorFlow fork's rendezvous manager asks of fusewire: the session's\n"
    "protocol and tensor_fuse, the partition plan of a placed wide-and-deep graph, a few\n"
    "training steps on an in-process cluster, and TensorFlow rendezvous keys mapped onto\n"
    "fusewire's tasks and channel keys.\n"
    "\n"
    "options:\n"
    "  --protocol NAME      grpc, grpc++, star_server or star_server_lite (default star_server)\n"
    "  --tensor-fuse[=BOOL] fuse send/recv messages per ready-wave (ConfigProto.tensor_fuse);\n"
    "                       BOOL is true/false, 1/0, yes/no or on/off (default false)\n"
    "  --steps N            training steps to run, 1 to 1000 (default 3)\n"
    "  --loop               add a while loop whose body multiplies by a ps:1 variable each\n"
    "                       iteration (star_server_lite refuses graphs with loops)\n"
    "  --key KEY            also map this rendezvous key (src_device;incarnation;dst_device;name;frame:iter)\n"
    "  --processes NAME     run every task in its own process, messages over loopback TCP with\n"
    "                       fusewire's asio or uring transport (default: all tasks in this process)\n"
    "  --help               print this text\n"
    "\n"
    "exit status: 0 done, 1 the plan or a step failed, 2 bad command line\n";

/// A bad command line: printed with a pointer to --help, exit status 2.
struct usage_error {
  std::string what;
};

struct settings {
  std::string protocol = "star_server";
  std::string tensor_fuse = "false";
  int steps = 3;
  bool loop = false;
  std::optional<std::string> key;
  std::optional<std::string> processes;
  bool help = false;
};

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
      if (*t != "asio" && *t != "uring") throw usage_error{"--processes " + *t + ": expected asio or uring"};
#if !FUSEWIRE_HAS_URING
      if (*t == "uring") throw usage_error{"--processes uring: this build has no uring transport; use asio"};
#endif
      s.processes = *t;
    } else if (auto n = value_of(i, arg, "--steps")) {
      char* end = nullptr;
      const long steps = std::strtol(n->c_str(), &end, 10);
      if (n->empty() || *end != '\0' || steps < 1 || steps > 1000)
        throw usage_error{"--steps " + *n + ": expected a whole number from 1 to 1000"};
      s.steps = static_cast<int>(steps);
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

/// A loopback port the kernel just handed out (and took back).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error("no free loopback port");
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// What one task's process does: its partition, step after step, over an
/// endpoint; reports per step what it sent (and, on the worker, the loss and
/// whether its fetches equal the one-process run) through `out`.
template <class Transport>
int task_process(const fg::plan& plan, std::size_t index, const fusewire::cluster_spec& cluster, int steps,
                 const std::vector<std::map<std::string, fg::tensor>>& want, int out) {
  const auto& part = plan.partitions[index];
  fusewire::options opts;
  opts.mode = fusewire::reactor_mode::block;
  opts.connect_timeout = std::chrono::seconds(20);
  fusewire::rendezvous::endpoint<Transport> ep(part.task, cluster, {.options = opts});
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
    row.messages = sent.messages;
    row.tensors = sent.tensors;
    row.bytes = sent.bytes;
    if (::write(out, &row, sizeof row) != static_cast<ssize_t>(sizeof row)) return 1;
  }
  if (!channel.flush() || channel.error()) return 1;
  // Nobody closes its endpoint before every task is done.
  const auto& first = plan.partitions.front().task;
  if (index == 0) {
    for (std::size_t t = 1; t < plan.partitions.size(); ++t)
      if (ep.recv_sync(plan.partitions[t].task, "done", std::chrono::seconds(20)).ec) return 1;
    for (std::size_t t = 1; t < plan.partitions.size(); ++t)
      if (ep.send_sync(plan.partitions[t].task, "release", fusewire::tensor_buffer::allocate(1),
                       std::chrono::seconds(20)))
        return 1;
  } else if (ep.send_sync(first, "done", fusewire::tensor_buffer::allocate(1), std::chrono::seconds(20)) ||
             ep.recv_sync(first, "release", std::chrono::seconds(20)).ec) {
    return 1;
  }
  return 0;
}

/// Runs `steps` steps with one forked process per task; rows summed over tasks.
template <class Transport>
std::optional<std::vector<step_row>> run_processes(const fg::plan& plan, const fg::placed_graph& graph, int steps) {
  // The one-process answer, computed before forking so every task can compare.
  fg::executor whole(graph);
  std::vector<std::map<std::string, fg::tensor>> want;
  for (int step = 1; step <= steps; ++step) want.push_back(whole.run(feeds(), {"loss", "wide/update"}));
  // Fresh loopback ports: the example's own cluster string names ports that may be taken.
  std::string text = "worker=127.0.0.1:" + std::to_string(free_port()) +
                     ";ps=127.0.0.1:" + std::to_string(free_port()) + ",127.0.0.1:" + std::to_string(free_port());
  const auto cluster = fusewire::cluster_spec::from_string(text);
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (std::size_t i = 0; i < plan.partitions.size(); ++i) {
    int fds[2];
    if (::pipe(fds) != 0) return std::nullopt;
    std::cout.flush();
    const pid_t pid = ::fork();
    if (pid < 0) return std::nullopt;
    if (pid == 0) {
      ::close(fds[0]);
      ::alarm(60);
      int rc = 1;
      try {
        rc = task_process<Transport>(plan, i, cluster, steps, want, fds[1]);
      } catch (const std::exception& e) {
        std::cerr << "tf_rendezvous: " << plan.partitions[i].task.to_string() << ": " << e.what() << "\n";
      }
      std::cerr.flush();
      ::_exit(rc);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<step_row> rows(static_cast<std::size_t>(steps));
  bool ok = true;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    for (auto& row : rows) {
      step_row r;
      if (::read(pipes[i], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) {
        ok = false;
        break;
      }
      row.loss += r.loss;
      row.messages += r.messages;
      row.tensors += r.tensors;
      row.bytes += r.bytes;
      row.same = row.same && r.same;
    }
    ::close(pipes[i]);
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::cerr << "tf_rendezvous: the process of " << plan.partitions[i].task.to_string() << " failed\n";
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return rows;
}

int run(const settings& s) {
  // 1. The session's configuration, as the fork reads it from its server def and ConfigProto.
  const tf::session_config config = tf::session_config::parse(s.protocol, s.tensor_fuse);
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
    std::optional<std::vector<step_row>> got;
#if FUSEWIRE_HAS_URING
    if (*s.processes == "uring") got = run_processes<fusewire::uring_tcp>(*plan, graph, s.steps);
#endif
    if (*s.processes == "asio") got = run_processes<fusewire::asio_tcp>(*plan, graph, s.steps);
    if (!got) {
      std::cerr << "tf_rendezvous: the steps failed across processes\n";
      return 1;
    }
    rows = std::move(*got);
    std::cout << "steps: " << plan->partitions.size() << " processes, one per task, over loopback TCP ("
              << (*s.processes == "asio" ? "asio_tcp" : "uring_tcp") << ")\n";
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
    (void)tf::session_config::parse(s.protocol, s.tensor_fuse);
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
