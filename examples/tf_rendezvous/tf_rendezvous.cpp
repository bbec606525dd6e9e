// The calls a TensorFlow fork's rendezvous manager makes into fusewire, in
// the order it makes them: read the session's protocol and tensor_fuse,
// take the placed graph TensorFlow hands over, partition it, run steps, and
// map the rendezvous keys TensorFlow writes onto fusewire's tasks and keys.
// The cluster runs in this process (graph::local_cluster); a real fork puts a
// transport behind the same channel calls.

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
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/local_cluster.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/tf/tf.hpp>

namespace fg = fusewire::graph;
namespace tf = fusewire::tf;

namespace {

constexpr std::string_view usage_text =
    "usage: tf_rendezvous [--protocol NAME] [--tensor-fuse[=BOOL]] [--steps N] [--loop] [--key KEY]\n"
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

int run(const settings& s) {
  // 1. The session's configuration, as the fork reads it from its server def and ConfigProto.
  const tf::session_config config = tf::session_config::parse(s.protocol, s.tensor_fuse);
  const fg::partition_options options = config.partition_options();
  std::cout << "session: protocol " << tf::to_string(config.proto) << ", tensor_fuse "
            << (config.tensor_fuse ? "on" : "off") << " -> partition mode " << fg::to_string(options.mode)
            << "\n";

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
  fg::local_cluster tasks(*plan);
  fg::executor whole(graph);
  const auto inputs = feeds();
  const std::vector<std::string> fetches{"loss", "wide/update"};
  bool same = true;
  std::cout << "step  " << pad("loss", 10) << pad("messages", 10) << pad("tensors", 9) << pad("bytes", 8) << "\n";
  for (int step = 1; step <= s.steps; ++step) {
    auto got = tasks.run(inputs, fetches);
    same = same && got == whole.run(inputs, fetches);
    const auto traffic = tasks.last_step_traffic();
    std::cout << pad(std::to_string(step), 4) << "  " << pad(fixed(got.at("loss").values.at(0)), 10)
              << pad(std::to_string(traffic.messages), 10) << pad(std::to_string(traffic.tensors), 9)
              << pad(std::to_string(traffic.bytes), 8) << "\n";
  }
  std::cout << "results match one process running the whole graph: " << (same ? "yes" : "NO") << "\n\n";

  // 5. Rendezvous keys: one TensorFlow wrote, the plan's first, and --key.
  std::cout << "rendezvous keys -> fusewire tasks and channel keys\n"
            << "a key TensorFlow wrote for a worker -> ps:1 edge:\n";
  show_key("/job:worker/replica:0/task:0/device:CPU:0;7f3a9c21b4e8d0aa;/job:ps/replica:0/task:1/device:CPU:0;"
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
