// ps_bench: push and pull throughput through fusewire's parameter-server
// layer (ps::server, ps::client). P PS processes x W worker processes on
// loopback; every worker keeps one step in flight, a step being one
// client::run() of a batch with one dense slice (or R embedding rows) per PS.
// See bench/README.md.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/version.hpp>

#include "common/launcher.hpp"
#include "common/options.hpp"
#include "common/ports.hpp"
#include "common/result_line.hpp"
#include "common/transport.hpp"
#include "main_job.hpp"
#include "payload.hpp"
#include "proc_usage.hpp"
#include "ps_api.hpp"
#include "report.hpp"
#include "results.hpp"
#include "roles.hpp"

namespace fusewire::bench::psb {
namespace {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

/// Floats per PS slice when --floats is not given: 40 B, 1 KiB, 64 KiB, 1 MiB, 6 MiB.
const std::vector<std::string> default_floats{"10", "256", "16K", "256K", "1536K"};
/// Largest slice: 64 MiB (each of P x W processes holds a few of them).
constexpr std::size_t max_floats = std::size_t{16} << 20;

struct cli_options {
  run_settings run;
  std::vector<std::string> floats = default_floats;
  std::vector<std::string> ops{"push", "pull"};
  bool embedding = false;
  unsigned rows = 64;
  std::size_t dim = 64;
  std::size_t id_range = 100000;
  unsigned timeout = 0;
  std::string json_path;
  bool quiet = false;
  bool main_job = false;
  bool main_job_only = false;
  std::string main_job_exe;
  std::string main_job_args;
  unsigned main_job_timeout = 900;
  // A process of one measurement (started by the launcher):
  std::string role;
  unsigned task = 0;
  std::string cluster;
};

std::size_t parse_floats(const std::string& text) {
  // parse_size's K and M are 1024 and 1024^2: here they multiply floats.
  const std::size_t n = parse_size(text, "--floats");
  if (n == 0 || n > max_floats) {
    throw_error(errc::invalid_argument,
                "--floats '" + text + "': floats per slice must be 1 to " + std::to_string(max_floats) + " (16M)");
  }
  return n;
}

op_kind parse_op(const std::string& text) {
  for (op_kind o : {op_kind::push, op_kind::pull, op_kind::both}) {
    if (text == option_name(o)) return o;
  }
  throw_error(errc::invalid_argument, "--op '" + text + "' is not an op; choose push, pull, both or all");
}

std::vector<op_kind> parse_ops(const std::vector<std::string>& list) {
  std::vector<op_kind> out;
  for (const std::string& text : list) {
    if (text == "all") return {op_kind::push, op_kind::pull, op_kind::both};
    const op_kind o = parse_op(text);
    if (std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
  }
  return out;
}

/// The cells of the sweep: every size x every op (or every op of the embedding shape).
std::vector<cell_spec> plan_cells(const cli_options& o) {
  std::vector<cell_spec> cells;
  const std::vector<op_kind> ops = parse_ops(o.ops);
  if (o.run.sync && (ops.size() != 1 || ops.front() != op_kind::both)) {
    throw_error(errc::invalid_argument,
                "--sync needs --op both: a sync step is a worker's push and its pull of the values after every "
                "worker's push");
  }
  if (o.embedding) {
    for (op_kind op : ops) cells.push_back({op, true, 0, o.rows, o.dim, o.id_range});
    return cells;
  }
  for (const std::string& f : o.floats) {
    const std::size_t n = parse_floats(f);
    for (op_kind op : ops) cells.push_back({op, false, n, 0, 0, 0});
  }
  for (const cell_spec& c : cells) check_placement(make_model(c, o.run.ps), o.run.ps);
  return cells;
}

std::string size_label(const cell_spec& c) {
  if (c.embedding) return std::to_string(c.rows) + " x " + std::to_string(c.dim) + " rows";
  return std::to_string(c.floats) + " fl (" + format_size(c.floats * sizeof(float)) + ")";
}

/// The arguments a process of cell `c` is started with (the settings, one size, one op).
std::vector<std::string> child_args(const cli_options& o, const cell_spec& c, const char* role, unsigned task,
                                    const std::string& cluster) {
  const run_settings& s = o.run;
  std::vector<std::string> a{"ps_bench",
                             "--role",
                             role,
                             "--task",
                             std::to_string(task),
                             "--cluster",
                             cluster,
                             "--ps",
                             std::to_string(s.ps),
                             "--workers",
                             std::to_string(s.workers),
                             "--transport",
                             s.transport,
                             "--op",
                             std::string(option_name(c.op)),
                             "--warmup",
                             std::to_string(s.warmup_s),
                             "--time",
                             std::to_string(s.time_s),
                             "--steps",
                             std::to_string(s.sync_steps),
                             "--step-timeout",
                             std::to_string(s.step_timeout_s)};
  if (!s.reactor_mode.empty()) a.insert(a.end(), {"--reactor-mode", s.reactor_mode});
  if (s.sync) a.push_back("--sync");
  if (c.embedding) {
    a.insert(a.end(), {"--embedding", "--rows", std::to_string(c.rows), "--dim", std::to_string(c.dim), "--id-range",
                       std::to_string(c.id_range)});
  } else {
    a.insert(a.end(), {"--floats", std::to_string(c.floats)});
  }
  return a;
}

/// What one cell measured.
struct cell_result {
  cell_spec spec;
  repetition rep;  ///< fwbench's per-repetition figures: rates, latency, usage
  std::uint64_t runs = 0;
  std::string transport;  ///< what the workers ran ("auto" resolved)
  std::vector<std::uint64_t> ps_requests;
};

cell_result run_cell(const cli_options& o, const cell_spec& c, std::size_t index, std::size_t total) {
  const run_settings& s = o.run;
  cell_result out;
  out.spec = c;
  const std::string label = "[" + std::to_string(index + 1) + "/" + std::to_string(total) + "] " +
                            std::string(option_name(c.op)) + " " + size_label(c);
  if (!o.quiet) {
    std::printf("%s: starting %u PS + %u workers\n", label.c_str(), s.ps, s.workers);
    std::fflush(stdout);
  }
  const std::string cluster = example::host_cluster({{"ps", s.ps}, {"worker", s.workers}});
  std::vector<example::child_process> kids;
  std::vector<worker_result> workers;
  std::vector<proc_sample> at_start(s.ps);
  std::vector<process_usage> ps_usage;
  std::optional<clock_type::time_point> window_start, window_end;
  out.ps_requests.assign(s.ps, 0);

  auto on_line = [&](const example::child_process& from, const std::string& line) {
    const example::result_fields r = example::parse_result(line);
    const std::string& tag = r.at("@");
    if (tag == "@start" && !window_start) {
      window_start = clock_type::now();
      for (unsigned p = 0; p < s.ps; ++p) at_start[p] = sample_proc(kids[p].pid);
    } else if (tag == "@progress" && !o.quiet) {
      const double elapsed = example::num(r, "elapsed");
      const double rate = elapsed > 0 ? example::num(r, "runs") * s.ps * s.workers / elapsed : 0;
      std::printf("%s: %.0f s, about %.0f RPC/s\n", label.c_str(), elapsed, rate);
      std::fflush(stdout);
    } else if (tag == "@result") {
      worker_result w;
      w.task = static_cast<unsigned>(example::num(r, "task"));
      w.exchanges = static_cast<std::uint64_t>(example::num(r, "runs"));
      w.calls = w.exchanges * s.ps;
      w.seconds = example::num(r, "seconds");
      w.payload_bytes = c.rpc_bytes();
      w.buffers = 1;
      w.latency = {example::num(r, "mean_us"), example::num(r, "p50_us"), example::num(r, "p99_us"),
                   example::num(r, "min_us"), example::num(r, "max_us")};
      w.usage = {role_kind::worker,         w.task,
                 example::num(r, "user_s"), example::num(r, "sys_s"),
                 example::num(r, "wall_s"), static_cast<long>(example::num(r, "max_rss_kib"))};
      if (r.count("net_interface") && r.at("net_interface") != "-") {
        char host[256] = {};
        ::gethostname(host, sizeof host - 1);
        w.hostname = host;
        w.net_interface = r.at("net_interface");
        w.net_tx_bytes = static_cast<std::uint64_t>(example::num(r, "net_tx_bytes"));
        w.net_rx_bytes = static_cast<std::uint64_t>(example::num(r, "net_rx_bytes"));
      }
      out.transport = r.count("transport") ? r.at("transport") : "";
      workers.push_back(w);
      if (workers.size() == s.workers) window_end = clock_type::now();
    } else if (tag == "@ps") {
      const auto task = static_cast<unsigned>(example::num(r, "task"));
      if (task < s.ps) out.ps_requests[task] = static_cast<std::uint64_t>(example::num(r, "requests"));
      const proc_sample& begin = task < s.ps ? at_start[task] : proc_sample{};
      const double wall =
          window_start && window_end ? std::chrono::duration<double>(*window_end - *window_start).count() : 0.0;
      process_usage u{role_kind::ps,
                      task,
                      std::max(0.0, example::num(r, "user_s") - begin.user_s),
                      std::max(0.0, example::num(r, "sys_s") - begin.sys_s),
                      wall,
                      static_cast<long>(example::num(r, "max_rss_kib"))};
      ps_usage.push_back(u);
    }
    (void)from;
  };

  const double window = s.sync ? 0.0 : s.warmup_s + s.time_s;
  const unsigned deadline =
      o.timeout ? o.timeout : static_cast<unsigned>(window) + 2 * s.step_timeout_s + (s.sync ? 120u : 30u);
  bool ok = false;
  try {
    for (unsigned p = 0; p < s.ps; ++p) {
      kids.push_back(example::spawn_self("ps:" + std::to_string(p), example::child_kind::server,
                                         child_args(o, c, "ps", p, cluster)));
    }
    for (unsigned w = 0; w < s.workers; ++w) {
      kids.push_back(example::spawn_self("worker:" + std::to_string(w), example::child_kind::task,
                                         child_args(o, c, "worker", w, cluster)));
    }
    ok = example::supervise(kids, on_line, {.deadline = std::chrono::seconds(deadline), .deadline_source = "--timeout"},
                            "ps_bench");
  } catch (const std::exception& e) {
    for (auto& k : kids) example::stop(k);
    example::supervise(kids, on_line, {.deadline = std::chrono::seconds(deadline)}, "ps_bench");
    out.rep.ok = false;
    out.rep.error = e.what();
    return out;
  }
  if (!ok || workers.size() != s.workers) {
    // Name what went wrong: the processes killed at the deadline, those that
    // failed on their own (not the ones the launcher stopped because of them).
    std::string why;
    for (const auto& k : kids) {
      const bool clean = WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0;
      if (k.killed) {
        why += (why.empty() ? "" : "; ") + k.name + " killed after " + std::to_string(deadline) + " s (--timeout)";
      } else if (!clean && !k.stop_sent) {
        why += (why.empty() ? "" : "; ") + k.name + " ended with " + example::describe_status(k.status);
      }
    }
    out.rep.ok = false;
    out.rep.error = !why.empty() ? why
                                 : "only " + std::to_string(workers.size()) + " of " + std::to_string(s.workers) +
                                       " workers reported";
    return out;
  }
  std::sort(workers.begin(), workers.end(), [](const auto& a, const auto& b) { return a.task < b.task; });
  out.rep = combine(workers);
  std::sort(ps_usage.begin(), ps_usage.end(), [](const auto& a, const auto& b) { return a.task < b.task; });
  out.rep.usage.insert(out.rep.usage.begin(), ps_usage.begin(), ps_usage.end());
  for (const worker_result& w : workers) out.runs += w.exchanges;
  if (!o.quiet) {
    std::printf("%s: %.0f RPC/s, %.1f MB/s, p50 %.1f us, p99 %.1f us\n", label.c_str(), out.rep.rpc_per_s,
                out.rep.mb_per_s, out.rep.latency.p50_us, out.rep.latency.p99_us);
    std::fflush(stdout);
  }
  return out;
}

double cpu_of(const repetition& r, role_kind role) {
  double sum = 0;
  for (const process_usage& u : r.usage) {
    if (u.role == role) sum += u.cpu_percent();
  }
  return sum;
}

double rss_mib(const repetition& r, role_kind role) {
  long peak = 0;
  for (const process_usage& u : r.usage) {
    if (u.role == role) peak = std::max(peak, u.max_rss_kib);
  }
  return static_cast<double>(peak) / 1024.0;
}

void print_table(const cli_options& o, const std::vector<cell_result>& results) {
  const run_settings& s = o.run;
  std::printf("\nps_bench: %u PS x %u workers, transport %s%s, %s, %s\n", s.ps, s.workers, s.transport.c_str(),
              results.empty() || results.front().transport.empty() || results.front().transport == s.transport
                  ? ""
                  : (" (" + results.front().transport + ")").c_str(),
              s.sync ? "sync" : "async",
              s.reactor_mode.empty() ? "reactor mode from the environment, else block"
                                     : ("reactor mode " + s.reactor_mode).c_str());
  std::printf("one RPC = one request a PS answered (a step is one request to every PS); MB = 10^6 B of values\n");
  std::printf("%-5s %-22s %10s %9s %9s %9s %8s %8s %8s %8s\n", "op", "per PS per step", "RPC/s", "MB/s", "p50 us",
              "p99 us", "PS cpu%", "wk cpu%", "PS MiB", "wk MiB");
  for (const cell_result& r : results) {
    if (!r.rep.ok) {
      std::printf("%-5s %-22s FAILED: %s\n", std::string(option_name(r.spec.op)).c_str(), size_label(r.spec).c_str(),
                  r.rep.error.c_str());
      continue;
    }
    std::printf("%-5s %-22s %10.0f %9.1f %9.1f %9.1f %8.0f %8.0f %8.1f %8.1f\n",
                std::string(option_name(r.spec.op)).c_str(), size_label(r.spec).c_str(), r.rep.rpc_per_s,
                r.rep.mb_per_s, r.rep.latency.p50_us, r.rep.latency.p99_us, cpu_of(r.rep, role_kind::ps),
                cpu_of(r.rep, role_kind::worker), rss_mib(r.rep, role_kind::ps), rss_mib(r.rep, role_kind::worker));
  }
  std::printf(
      "p50: mean of the workers' medians of one step (client::run); p99: the worst worker's; cpu%%: sum over\n"
      "the processes of a role over the measured window (100 = one core); MiB: the largest peak RSS\n");
  std::fflush(stdout);
}

json settings_json(const cli_options& o) {
  const run_settings& s = o.run;
  return {{"ps", s.ps},
          {"workers", s.workers},
          {"transport", s.transport},
          {"reactor_mode", s.reactor_mode.empty() ? "default" : s.reactor_mode},
          {"training", s.sync ? "sync" : "async"},
          {"warmup_s", s.warmup_s},
          {"time_s", s.time_s},
          {"sync_steps", s.sync_steps},
          {"embedding", o.embedding}};
}

json cell_json(const cli_options& o, const cell_result& r) {
  json j = r.rep;
  j["op"] = std::string(option_name(r.spec.op));
  j["kind"] = r.spec.embedding ? "embedding" : "dense";
  if (r.spec.embedding) {
    j["rows"] = r.spec.rows;
    j["dim"] = r.spec.dim;
    j["id_range"] = r.spec.id_range;
  } else {
    j["floats"] = r.spec.floats;
  }
  j["bytes_per_rpc"] = r.spec.rpc_bytes();
  j["ps"] = o.run.ps;
  j["workers"] = o.run.workers;
  j["transport"] = r.transport;
  j["steps"] = r.runs;
  j["ps_requests_total"] = r.ps_requests;
  return j;
}

void write_json(const std::string& path, const json& doc) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw_error(errc::invalid_argument, "--json: cannot write '" + path + "': " + std::strerror(errno));
  file << doc.dump(2) << '\n';
  file.close();
  if (!file) throw_error(errc::invalid_argument, "--json: cannot write '" + path + "'");
}

cell_spec role_cell(const cli_options& o) {
  cell_spec c;
  c.op = parse_op(o.ops.at(0));
  c.embedding = o.embedding;
  c.rows = o.rows;
  c.dim = o.dim;
  c.id_range = o.id_range;
  if (!o.embedding) c.floats = parse_floats(o.floats.at(0));
  return c;
}

int launch(const cli_options& o, int argc, char** argv) {
  // The environment's knobs, checked once before any process starts.
  example::option_choices mode;
  if (!o.run.reactor_mode.empty()) mode.mode = fusewire::reactor_mode_from_string(o.run.reactor_mode);
  (void)example::task_options(fusewire::role::ps, mode);
  (void)example::task_options(fusewire::role::worker, mode);
  std::vector<cell_spec> cells;
  if (!o.main_job_only) cells = plan_cells(o);
  std::vector<cell_result> results;
  bool all_ok = true;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    results.push_back(run_cell(o, cells[i], i, cells.size()));
    all_ok = all_ok && results.back().rep.ok;
  }
  if (!cells.empty()) print_table(o, results);

  std::optional<main_job_result> job;
  if (o.main_job || o.main_job_only) {
    main_job_request req;
    req.exe = o.main_job_exe;
    req.args = o.main_job_args;
    req.transport = o.run.transport;
    req.reactor_mode = o.run.reactor_mode;
    req.timeout_s = o.main_job_timeout;
    req.quiet = o.quiet;
    job = run_main_job(req);
    print_main_job(*job);
    all_ok = all_ok && job->ok;
  }

  if (!o.json_path.empty()) {
    std::time_t now = std::time(nullptr);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    json doc = {{"ps_bench", {{"version", FUSEWIRE_VERSION_STRING}, {"date", when}, {"command", command}}},
                {"host", host_info()},
                {"settings", settings_json(o)},
                {"results", json::array()}};
    for (const cell_result& r : results) doc["results"].push_back(cell_json(o, r));
    if (job) doc["main_job"] = main_job_json(*job);
    write_json(o.json_path, doc);
  }
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace fusewire::bench::psb

int main(int argc, char** argv) {
  using namespace fusewire::bench::psb;
  cli_options o;
  run_settings& s = o.run;
  CLI::App app{
      "ps_bench: push and pull throughput through fusewire's parameter-server layer. Launches P PS and W worker\n"
      "processes on loopback for each size and op; every worker keeps one step (one client::run, one request\n"
      "to every PS) in flight. See bench/README.md."};
  app.add_option("--ps", s.ps, "parameter servers")->check(CLI::Range(1u, 64u))->capture_default_str();
  app.add_option("--workers", s.workers, "workers")->check(CLI::Range(1u, 64u))->capture_default_str();
  app.add_option("--floats", o.floats,
                 "floats per PS slice, comma-separated (K = 1024, M = 1024 K floats); default 10,256,16K,256K,1536K")
      ->delimiter(',')
      ->type_name("LIST");
  app.add_option("--op", o.ops, "push, pull, both (one request pushing and pulling), comma-separated, or all")
      ->delimiter(',')
      ->type_name("LIST")
      ->capture_default_str();
  app.add_flag("--embedding", o.embedding, "embedding rows (push_rows/pull_rows) instead of dense slices");
  app.add_option("--rows", o.rows, "embedding: rows per request (per PS per step)")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--dim", o.dim, "embedding: floats per row")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--id-range", o.id_range, "embedding: ids are drawn at random from [0, N)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40))
      ->capture_default_str();
  app.add_flag("--sync,!--async", s.sync, "synchronous training (needs --op both); default async");
  app.add_option("--steps", s.sync_steps, "sync: measured steps per worker (after 10 warm-up steps)")
      ->check(CLI::Range(1u, 10000000u))
      ->capture_default_str();
  app.add_option("--warmup", s.warmup_s, "async: warm-up seconds before each measurement")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("-t,--time", s.time_s, "async: measured seconds per size and op")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  std::string names;
  for (const auto& n : example::transport_names(false)) names += (names.empty() ? "" : "|") + n;
  app.add_option("--transport", s.transport, "transport by name (auto: shm on one host, else uring or asio)")
      ->check(CLI::Validator(
          [](const std::string& name) {
            auto problem = example::transport_problem(name, false);
            return problem ? "transport '" + name + "': " + *problem : std::string();
          },
          names, "transport"))
      ->capture_default_str();
  app.add_option("--reactor-mode", s.reactor_mode,
                 "poll, adaptive or block (default: as FUSEWIRE_REACTOR_MODE says, else block)")
      ->check(CLI::IsMember({"poll", "adaptive", "block"}));
  app.add_option("--step-timeout", s.step_timeout_s, "a step fails when a PS has not answered in this many seconds")
      ->check(CLI::Range(1u, 3600u))
      ->capture_default_str();
  app.add_option("--timeout", o.timeout,
                 "kill a measurement's processes after this many seconds (default: warm-up + time + 30 s + "
                 "2 step timeouts; sync: 120 s + 2 step timeouts)")
      ->check(CLI::Range(1u, 86400u));
  app.add_option("--json", o.json_path, "write every figure as JSON")->type_name("FILE");
  app.add_flag("-q,--quiet", o.quiet, "no progress lines");
  app.add_flag("--main-job", o.main_job, "afterwards run the main job (examples/ps_worker) and report it too");
  app.add_flag("--main-job-only", o.main_job_only, "only run the main job");
  app.add_option("--main-job-exe", o.main_job_exe,
                 "the ps_worker executable (default: examples/ps_worker/ps_worker of this build)");
  app.add_option("--main-job-args", o.main_job_args, "extra arguments for ps_worker, space-separated");
  app.add_option("--main-job-timeout", o.main_job_timeout, "kill the main job after this many seconds")
      ->check(CLI::Range(1u, 86400u))
      ->capture_default_str();
  app.add_option("--role", o.role, "")->check(CLI::IsMember({"ps", "worker"}))->group("");
  app.add_option("--task", o.task, "")->group("");
  app.add_option("--cluster", o.cluster, "")->group("");
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  try {
    if (!o.role.empty()) {
      const cell_spec c = role_cell(o);
      return o.role == "ps" ? run_ps_role(s, c, o.cluster, o.task) : run_worker_role(s, c, o.cluster, o.task);
    }
    return launch(o, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_bench%s: %s\n",
                 o.role.empty() ? "" : (" " + o.role + ":" + std::to_string(o.task)).c_str(), e.what());
    return o.role.empty() ? 2 : 1;
  }
}
