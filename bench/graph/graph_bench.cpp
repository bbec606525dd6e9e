// graph_bench: step time of a wide-and-deep-like graph over loopback, per
// partition mode. One process per task (worker:0, ps:0, ps:1), each running
// its partition of the plan over a rendezvous endpoint; the worker times its
// steps. Prints, per mode, the messages, tensors and bytes one step sends
// (measured on the wire, all processes together) and the step time.
//
//   graph_bench [--transport NAME] [--modes LIST] [--steps N] [--warmup N]
//               [--features N] [--batch N] [--dim N] [--rows N] [--hidden N]
//               [--reactor block|adaptive|poll]
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/graph/rendezvous_channel.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/select.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fw = fusewire;
namespace fg = fusewire::graph;
using namespace std::chrono_literals;

namespace {

constexpr std::string_view usage_text =
    "usage: graph_bench [options]\n"
    "\n"
    "Step time of a wide-and-deep-like graph (many small embedding lookups on ps:0 and\n"
    "ps:1, one dense tower on worker:0) over loopback, one process per task, for each\n"
    "partition mode. Prints messages, tensors and bytes per step and the step time.\n"
    "\n"
    "options:\n"
    "  --transport NAME   auto, uring, asio, shm, shm+asio, shm+uring or verbs (default auto: shm on one host)\n"
    "  --modes LIST       comma-separated, from send_recv, send_recv_fuse, star_server,\n"
    "                     star_server_single_call, star_server_lite (default: all)\n"
    "  --steps N          timed steps per mode, 1 to 100000 (default 200)\n"
    "  --warmup N         untimed steps first, 0 to 100000 (default 20)\n"
    "  --features N       sparse features, one embedding table each, 2 to 1024 (default 16)\n"
    "  --batch N          examples per step, 1 to 65536 (default 64)\n"
    "  --dim N            embedding width, 1 to 4096 (default 16)\n"
    "  --rows N           rows per embedding table, 1 to 1000000 (default 1000)\n"
    "  --hidden N         width of the tower's hidden layer, 1 to 4096 (default 64)\n"
    "  --reactor MODE     block, adaptive or poll (default block: this machine may be busy)\n"
    "  --help             print this text\n"
    "\n"
    "exit status: 0 done, 1 a mode failed, 2 bad command line\n";

struct settings {
  std::string transport;
  std::vector<std::string> modes{"send_recv", "send_recv_fuse", "star_server", "star_server_single_call",
                                 "star_server_lite"};
  long steps = 200, warmup = 20, features = 16, batch = 64, dim = 16, rows = 1000, hidden = 64;
  fw::reactor_mode reactor = fw::reactor_mode::block;
  bool help = false;
};

struct usage_error {
  std::string what;
};

long number(std::string_view name, const std::string& text, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi)
    throw usage_error{std::string(name) + " " + text + ": expected a whole number from " + std::to_string(lo) + " to " +
                      std::to_string(hi)};
  return v;
}

std::optional<fg::partition_options> mode_options(std::string_view mode) {
  fg::partition_options o;
  if (mode == "send_recv") return o;
  if (mode == "send_recv_fuse") {
    o.tensor_fuse = true;
    return o;
  }
  o.mode = mode == "star_server_lite" ? fg::partition_mode::star_server_lite : fg::partition_mode::star_server;
  if (mode == "star_server_single_call") o.clustering = fg::star_clustering::single_call;
  if (mode == "star_server" || mode == "star_server_single_call" || mode == "star_server_lite") return o;
  return std::nullopt;
}

settings parse_args(int argc, char** argv) {
  settings s;
  s.transport = "auto";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg == "--help" || arg == "-h") {
      s.help = true;
      continue;
    }
    const auto eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (arg.rfind("--", 0) == 0) {
      if (i + 1 >= argc) throw usage_error{arg + " needs a value"};
      value = argv[++i];
    }
    if (arg == "--transport") {
      if (auto problem = fw::transport_problem(value)) throw usage_error{"--transport " + value + ": " + *problem};
      s.transport = value;
    } else if (arg == "--modes") {
      s.modes.clear();
      std::size_t start = 0;
      while (start <= value.size()) {
        const auto comma = std::min(value.find(',', start), value.size());
        const std::string m = value.substr(start, comma - start);
        if (!mode_options(m))
          throw usage_error{"--modes: unknown mode '" + m +
                            "' (allowed: send_recv, send_recv_fuse, star_server, star_server_single_call, "
                            "star_server_lite)"};
        s.modes.push_back(m);
        start = comma + 1;
      }
    } else if (arg == "--steps") {
      s.steps = number(arg, value, 1, 100000);
    } else if (arg == "--warmup") {
      s.warmup = number(arg, value, 0, 100000);
    } else if (arg == "--features") {
      s.features = number(arg, value, 2, 1024);
    } else if (arg == "--batch") {
      s.batch = number(arg, value, 1, 65536);
    } else if (arg == "--dim") {
      s.dim = number(arg, value, 1, 4096);
    } else if (arg == "--rows") {
      s.rows = number(arg, value, 1, 1000000);
    } else if (arg == "--hidden") {
      s.hidden = number(arg, value, 1, 4096);
    } else if (arg == "--reactor") {
      if (value == "block") {
        s.reactor = fw::reactor_mode::block;
      } else if (value == "adaptive") {
        s.reactor = fw::reactor_mode::adaptive;
      } else if (value == "poll") {
        s.reactor = fw::reactor_mode::poll;
      } else {
        throw usage_error{"--reactor " + value + ": expected block, adaptive or poll"};
      }
    } else {
      throw usage_error{"unknown option '" + arg + "'"};
    }
  }
  return s;
}

// ---- the graph --------------------------------------------------------------

const std::string worker = "/job:worker/replica:0/task:0";
const std::string ps[2] = {"/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"};

std::vector<float> ramp(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i % 97);
  return v;
}

/// Wide and deep: feature k's table lives on ps(k % 2); some ids pass one or
/// two worker ops first, some lookups are scaled on the PS; the worker
/// concatenates the embeddings into a two-layer tower, adds a wide weight from
/// each PS and pushes an update of both back.
fg::graph_def wide_and_deep(const settings& s) {
  using shape = std::vector<std::int64_t>;
  fg::graph_def g;
  g.tasks = {fw::task_id{"worker", 0}, fw::task_id{"ps", 0}, fw::task_id{"ps", 1}};
  auto variable = [&](std::string name, const std::string& device, shape sh, std::vector<float> v) {
    g.add(std::move(name), "Variable", {}, device).set("value", std::move(v)).set("shape", std::move(sh));
  };
  const auto b = s.batch, d = s.dim;
  std::vector<std::string> lookups;
  for (int p = 0; p < 2; ++p) {
    const std::string tag = "ps" + std::to_string(p);
    g.add(tag + "/scale", "Const", {}, ps[p]).set("value", std::vector<float>{0.5f}).set("shape", shape{});
    variable(tag + "/wide", ps[p], {b, 1}, ramp(static_cast<std::size_t>(b), 0.1f, 0.01f));
  }
  for (long k = 0; k < s.features; ++k) {
    const std::string f = "f" + std::to_string(k), tag = "ps" + std::to_string(k % 2);
    std::string ids = "ids" + std::to_string(k);
    g.add(ids, "Placeholder", {}, worker).spec({fw::dtype::float32, {b}});
    for (long h = 0; h < (k / 2) % 3; ++h) {
      const std::string next = f + "/hash" + std::to_string(h);
      g.add(next, "Identity", {ids}, worker);
      ids = next;
    }
    variable(f + "/table", ps[k % 2], {s.rows, d},
             ramp(static_cast<std::size_t>(s.rows * d), 0.001f * static_cast<float>(k + 1), 0.0001f));
    std::string emb = f + "/lookup";
    g.add(emb, "Gather", {f + "/table", ids}, ps[k % 2]);
    if ((k / 2) % 2 == 0) {
      g.add(f + "/scaled", "Mul", {emb, tag + "/scale"}, ps[k % 2]);
      emb = f + "/scaled";
    }
    lookups.push_back(emb);
  }
  g.add("deep/concat", "Concat", lookups, worker).set("axis", std::int64_t{1});
  variable("deep/w1", worker, {s.features * d, s.hidden},
           ramp(static_cast<std::size_t>(s.features * d * s.hidden), -0.05f, 0.001f));
  g.add("deep/h1", "MatMul", {"deep/concat", "deep/w1"}, worker);
  variable("deep/w2", worker, {s.hidden, 1}, ramp(static_cast<std::size_t>(s.hidden), 0.01f, 0.001f));
  g.add("deep/logit", "MatMul", {"deep/h1", "deep/w2"}, worker);
  g.add("wide/sum0", "Add", {"deep/logit", "ps0/wide"}, worker);
  g.add("out", "Add", {"wide/sum0", "ps1/wide"}, worker);
  g.add("lr", "Const", {}, worker).set("value", std::vector<float>{0.001f}).set("shape", shape{});
  g.add("grad", "Mul", {"out", "lr"}, worker);
  g.add("ps0/update", "AssignSub", {"ps0/wide", "grad"}, ps[0]);
  g.add("ps1/update", "AssignSub", {"ps1/wide", "grad"}, ps[1]);
  return g;
}

fg::feed_map feeds(const settings& s, long step) {
  fg::feed_map f;
  for (long k = 0; k < s.features; ++k) {
    std::vector<float> ids(static_cast<std::size_t>(s.batch));
    for (long i = 0; i < s.batch; ++i)
      ids[static_cast<std::size_t>(i)] = static_cast<float>((k * 7 + i * 13 + step) % s.rows);
    f.emplace("ids" + std::to_string(k), fg::tensor({s.batch}, std::move(ids)));
  }
  return f;
}

// ---- processes ----------------------------------------------------------------

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("no free port");
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

template <class T>
int run_task(const settings& s, const fg::plan& plan, std::size_t index, const fw::cluster_spec& spec, int out) {
  const auto& part = plan.partitions[index];
  fw::options opts;
  opts.mode = s.reactor;
  opts.connect_timeout = 20000ms;
  fw::rendezvous::endpoint<T> ep(part.task, spec, {.options = opts});
  fg::rendezvous_channel<T> ch(ep, {.recv_timeout = 60000ms, .on_send_error = {}});
  fg::executor ex(part.graph);
  const std::vector<std::string> all_fetches{"out", "ps0/update", "ps1/update"};
  const auto fetches = fg::fetches_for(ex.graph(), all_fetches);
  std::uint64_t totals[4] = {};
  std::vector<double> times;
  for (long step = 1; step <= s.warmup + s.steps; ++step) {
    const auto my_feeds = fg::feeds_for(ex.graph(), feeds(s, step));
    const auto t0 = std::chrono::steady_clock::now();
    fg::run_step(ex, ch, static_cast<std::uint64_t>(step), my_feeds, fetches, 60s);
    const auto t1 = std::chrono::steady_clock::now();
    const auto c = ch.sent(static_cast<std::uint64_t>(step));
    ch.forget(static_cast<std::uint64_t>(step));
    if (step <= s.warmup) continue;
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    totals[0] += c.messages;
    totals[1] += c.tensors;
    totals[2] += c.bytes;
    totals[3] += c.wire_bytes;
  }
  if (!ch.flush(30s) || ch.error()) {
    std::fprintf(stderr, "%s: sends failed or still in flight\n", part.task.to_string().c_str());
    return 1;
  }
  // Barrier before closing: the first partition collects "done" and releases the others.
  if (index == 0) {
    for (std::size_t t = 1; t < plan.partitions.size(); ++t)
      if (ep.recv_sync(plan.partitions[t].task, "done", 60s).ec) return 1;
    for (std::size_t t = 1; t < plan.partitions.size(); ++t)
      if (ep.send_sync(plan.partitions[t].task, "release", fw::tensor_buffer::allocate(1), 60s)) return 1;
  } else {
    if (ep.send_sync(plan.partitions[0].task, "done", fw::tensor_buffer::allocate(1), 60s)) return 1;
    if (ep.recv_sync(plan.partitions[0].task, "release", 60s).ec) return 1;
  }
  const std::uint64_t n = times.size();
  bool ok = ::write(out, totals, sizeof totals) == static_cast<ssize_t>(sizeof totals);
  ok = ok && ::write(out, &n, sizeof n) == static_cast<ssize_t>(sizeof n);
  ok = ok && ::write(out, times.data(), n * sizeof(double)) == static_cast<ssize_t>(n * sizeof(double));
  return ok ? 0 : 1;
}

bool read_all(int fd, void* p, std::size_t n) {
  auto* at = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t got = ::read(fd, at, n);
    if (got <= 0) return false;
    at += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

struct mode_result {
  std::string mode;
  std::size_t planned = 0;
  double messages = 0, tensors = 0, bytes = 0, wire_bytes = 0;
  double mean = 0, p50 = 0, p99 = 0;
};

/// The cluster a mode runs on: one worker and two PS on loopback, on free
/// ports (each mode gets new ones, so that no task meets the last mode's).
fw::cluster_spec loopback_cluster() {
  return fw::cluster_spec::from_string("worker=127.0.0.1:" + std::to_string(free_port()) + ";ps=127.0.0.1:" +
                                       std::to_string(free_port()) + ",127.0.0.1:" + std::to_string(free_port()));
}

template <class T>
std::optional<mode_result> run_mode(const settings& s, const fg::placed_graph& g, const std::string& mode) {
  std::error_code ec;
  std::string why;
  const auto plan = fg::partition(g, *mode_options(mode), ec, &why);
  if (!plan) {
    std::fprintf(stderr, "graph_bench: %s cannot partition this graph: %s\n", mode.c_str(), why.c_str());
    return std::nullopt;
  }
  const auto spec = loopback_cluster();
  std::vector<pid_t> pids;
  std::vector<int> reads;
  for (std::size_t i = 0; i < plan->partitions.size(); ++i) {
    int fds[2];
    if (::pipe(fds) != 0) return std::nullopt;
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid < 0) return std::nullopt;
    if (pid == 0) {
      ::close(fds[0]);
      int rc = 1;
      try {
        rc = run_task<T>(s, *plan, i, spec, fds[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[%s] %s\n", plan->partitions[i].task.to_string().c_str(), e.what());
      }
      std::fflush(stderr);
      ::_exit(rc);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    reads.push_back(fds[0]);
  }
  mode_result r;
  r.mode = mode;
  r.planned = plan->per_step().messages;
  bool ok = true;
  std::vector<double> worker_times;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    std::uint64_t totals[4] = {}, n = 0;
    bool got = read_all(reads[i], totals, sizeof totals) && read_all(reads[i], &n, sizeof n);
    std::vector<double> times(got ? n : 0);
    got = got && read_all(reads[i], times.data(), times.size() * sizeof(double));
    ::close(reads[i]);
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "graph_bench: %s: %s failed\n", mode.c_str(), plan->partitions[i].task.to_string().c_str());
      ok = false;
      continue;
    }
    const auto steps = static_cast<double>(s.steps);
    r.messages += static_cast<double>(totals[0]) / steps;
    r.tensors += static_cast<double>(totals[1]) / steps;
    r.bytes += static_cast<double>(totals[2]) / steps;
    r.wire_bytes += static_cast<double>(totals[3]) / steps;
    if (plan->partitions[i].task.job == "worker") worker_times = std::move(times);
  }
  if (!ok || worker_times.empty()) return std::nullopt;
  r.mean = std::accumulate(worker_times.begin(), worker_times.end(), 0.0) / static_cast<double>(worker_times.size());
  std::sort(worker_times.begin(), worker_times.end());
  r.p50 = worker_times[worker_times.size() / 2];
  r.p99 = worker_times[std::min(worker_times.size() - 1, worker_times.size() * 99 / 100)];
  return r;
}

template <class T>
int run(const settings& s) {
  const fg::placed_graph g(wide_and_deep(s));
  const char* reactor = s.reactor == fw::reactor_mode::block  ? "block"
                        : s.reactor == fw::reactor_mode::poll ? "poll"
                                                              : "adaptive";
  std::printf(
      "wide-and-deep: %ld features (tables %ldx%ld float32 on ps:0/ps:1), batch %ld, tower %ldx%ldx1 on "
      "worker:0\n%s, %s reactors, %ld timed steps after %ld warmup, one process per task on loopback\n\n",
      s.features, s.rows, s.dim, s.batch, s.features * s.dim, s.hidden, T::name().data(), reactor, s.steps, s.warmup);
  std::printf("%-24s %9s %9s %12s %12s %9s %9s %9s\n", "mode", "msgs/step", "tensors", "value B", "payload B",
              "mean ms", "p50 ms", "p99 ms");
  bool ok = true;
  for (const auto& mode : s.modes) {
    std::fflush(stdout);
    auto r = run_mode<T>(s, g, mode);
    if (!r) {
      ok = false;
      continue;
    }
    std::printf("%-24s %9.1f %9.1f %12.0f %12.0f %9.3f %9.3f %9.3f\n", r->mode.c_str(), r->messages, r->tensors,
                r->bytes, r->wire_bytes, r->mean, r->p50, r->p99);
    if (static_cast<std::size_t>(r->messages + 0.5) != r->planned) {
      std::fprintf(stderr, "graph_bench: %s sent %.1f messages per step but its plan says %zu\n", mode.c_str(),
                   r->messages, r->planned);
      ok = false;
    }
  }
  std::printf("\n(msgs, tensors and bytes: per step, every process together; times: the worker's steps)\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  try {
    s = parse_args(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "graph_bench: %s (see --help)\n", e.what.c_str());
    return 2;
  }
  if (s.help) {
    std::fputs(usage_text.data(), stdout);
    return 0;
  }
  ::signal(SIGPIPE, SIG_IGN);
  try {
    // Every task runs on loopback: "auto" picks shm when this machine can run it.
    return fw::with_transport(s.transport, fw::options{}, loopback_cluster(), [&]<class T>(T) { return run<T>(s); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "graph_bench: %s\n", e.what());
    return 1;
  }
}
