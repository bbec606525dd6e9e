#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fusewire/core/error.hpp>
#include <sstream>

namespace fusewire::bench {
namespace {

[[noreturn]] void bad(const std::string& what) { throw_error(errc::invalid_argument, what); }

unsigned long long parse_whole(const std::string& text, std::string_view option) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos) {
    bad(std::string(option) + " '" + text + "' is not a whole number");
  }
  return std::strtoull(text.c_str(), nullptr, 10);
}

unsigned long long parse_bounded(const std::string& text, std::string_view option, unsigned long long min,
                                 unsigned long long max, const std::string& allowed) {
  const unsigned long long v = parse_whole(text, option);
  if (v < min || v > max) bad(std::string(option) + " " + text + ": out of range, " + allowed);
  return v;
}

double parse_seconds(const std::string& text, std::string_view option) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v)) {
    bad(std::string(option) + " '" + text + "' is not a number of seconds");
  }
  return v;
}

std::string number_text(double v) {
  char out[40];
  std::snprintf(out, sizeof out, "%.17g", v);
  return out;
}

/// Every option as text, so that fwbench (not CLI11) judges the values.
struct raw_options {
  std::vector<std::string> backends{"all"};
  std::vector<std::string> benchmarks{"p2p-latency"};
  std::vector<std::string> schemes{"uniform"};
  std::vector<std::string> modes{"non-serialized"};
  std::string count = "10";
  std::string small = "10";
  std::string medium = "10K";
  std::string large = "1M";
  std::string categories = "small,medium,large";
  std::string skew_bias = "large";
  std::string buffers;
  std::string seed = "1";
  bool random_sizes = false;
  std::string warmup = "2";
  std::string time = "10";
  std::string repetitions = "1";
  std::string ps = "1";
  std::string workers = "1";
  std::string host = "127.0.0.1";
  std::string port = "0";
  std::string cluster;
  std::string role;
  std::string task = "0";
  std::string reactor_mode = "adaptive";
  std::string idle_poll = "200";
  bool fusion = false;
  bool shared_pool = false;
  bool pin = false;
  std::string grpc_threads = "1";
  std::string zc_threshold;
  std::string local_send_buffer;
  std::string connect_timeout = "30";
  std::string json;
  std::string csv;
  std::string plot;
  bool quiet = false;
  bool managed = false;
  bool quick = false;
  std::string subject = "fusewire";
};

std::vector<std::string> expand(const std::vector<std::string>& values, const std::vector<std::string>& all) {
  if (values.size() == 1 && values[0] == "all") return all;
  return values;
}

payload_spec payload_from(const raw_options& o) {
  payload_spec p;
  p.count = static_cast<std::size_t>(parse_whole(o.count, "--count"));
  p.sizes[static_cast<std::size_t>(category::small)] = parse_size(o.small, "--small");
  p.sizes[static_cast<std::size_t>(category::medium)] = parse_size(o.medium, "--medium");
  p.sizes[static_cast<std::size_t>(category::large)] = parse_size(o.large, "--large");
  p.categories = parse_categories(o.categories, "--categories");
  p.bias = parse_category(o.skew_bias, "--skew-bias");
  p.random_sizes = o.random_sizes;
  p.seed = parse_whole(o.seed, "--seed");
  if (!o.buffers.empty()) p.custom = parse_size_list(o.buffers, "--buffers");
  return p;
}

transport_settings transport_from(const raw_options& o) {
  transport_settings t;
  t.mode = parse_wait_mode(o.reactor_mode);
  t.idle_poll = std::chrono::microseconds(
      parse_bounded(o.idle_poll, "--idle-poll", 0, 10'000'000, "the idle poll is 0 to 10000000 us"));
  t.fusion = o.fusion;
  t.shared_pool = o.shared_pool;
  t.pin = o.pin;
  t.grpc_threads =
      static_cast<unsigned>(parse_bounded(o.grpc_threads, "--grpc-threads", 1, 64, "gRPC takes 1 to 64 threads"));
  if (!o.zc_threshold.empty()) {
    t.zc_threshold = o.zc_threshold == "0" ? std::size_t{0} : parse_size(o.zc_threshold, "--zc-threshold");
  }
  if (!o.local_send_buffer.empty()) {
    const std::size_t n = o.local_send_buffer == "0" ? 0 : parse_size(o.local_send_buffer, "--local-send-buffer");
    if (n != 0 && (n < 4096 || n > (std::size_t{1} << 30))) {
      bad("--local-send-buffer " + o.local_send_buffer + ": must be 0 (the kernel's autotuning) or 4K to 1024M");
    }
    t.local_send_buffer = n;
  }
  t.connect_timeout_s = parse_seconds(o.connect_timeout, "--connect-timeout");
  if (!(t.connect_timeout_s > 0 && t.connect_timeout_s <= 3600)) {
    bad("--connect-timeout " + o.connect_timeout +
        ": out of range, the connect timeout is more than 0 s and at most 3600 s");
  }
  return t;
}

timing timing_from(const raw_options& o) {
  timing t;
  t.warmup_s = parse_seconds(o.warmup, "--warmup");
  if (!(t.warmup_s >= 0 && t.warmup_s <= 3600))
    bad("--warmup " + o.warmup + ": out of range, the warmup is 0 to 3600 s");
  t.run_s = parse_seconds(o.time, "--time");
  if (!(t.run_s > 0 && t.run_s <= 86400)) {
    bad("--time " + o.time + ": out of range, the run time is more than 0 s and at most 86400 s");
  }
  t.repetitions =
      static_cast<unsigned>(parse_bounded(o.repetitions, "--repetitions", 1, 100, "a run has 1 to 100 repetitions"));
  return t;
}

/// Validates `p` once per scheme it will be used with.
void check_payload(payload_spec p, const std::vector<scheme>& schemes) {
  for (scheme s : schemes) {
    p.kind = s;
    validate(p);
  }
}

const std::string footer = R"(
Backends: floor (plain sockets; floor:poll busy-polls, floor:block blocks), zmq,
grpc, and fusewire's transports once built; `fwbench list` says which are here.
Sizes take K and M suffixes (1 K = 1024 B); MB/s counts 10^6 bytes.

Examples:
  fwbench --backend grpc,zmq,floor --benchmark all --scheme all --plot out.svg
  fwbench --benchmark ps-throughput --ps 2 --workers 3 --backend grpc
  fwbench --scheme custom --buffers 10,64K,4M --mode serialized --json r.json
  fwbench compare --quick
  fwbench --role ps --backend zmq --cluster 'ps=host1:50001;worker=host2:0'
  fwbench --role worker --backend zmq --cluster 'ps=host1:50001;worker=host2:0'
)";

}  // namespace

std::string error_text(const std::system_error& e) {
  std::string text = e.what();
  const std::string suffix = ": " + e.code().message();
  if (text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
    text.resize(text.size() - suffix.size());
  }
  return text;
}

parse_result parse_command_line(const std::vector<std::string>& args) {
  raw_options o;
  CLI::App app{
      "fwbench: TF-gRPC-Bench rebuilt for fusewire; point-to-point latency and bandwidth, and\n"
      "parameter-server throughput, over fusewire's transports, gRPC, ZeroMQ and plain sockets.",
      "fwbench"};
  app.footer(footer);
  app.get_formatter()->column_width(34);

  const std::string what = "What to run";
  app.add_option("-b,--backend", o.backends, "Backends, comma-separated, or 'all' (every built one)")
      ->type_name("LIST")
      ->delimiter(',')
      ->capture_default_str()
      ->group(what);
  app.add_option("--benchmark", o.benchmarks, "p2p-latency, p2p-bandwidth, ps-throughput, or 'all'")
      ->type_name("LIST")
      ->delimiter(',')
      ->capture_default_str()
      ->group(what);
  app.add_option("--mode", o.modes, "non-serialized, serialized, or 'all'")
      ->type_name("LIST")
      ->delimiter(',')
      ->capture_default_str()
      ->group(what);

  const std::string pay = "Payload (iovec buffers)";
  app.add_option("-s,--scheme", o.schemes, "uniform, random, skew, custom, or 'all' (the first three)")
      ->type_name("LIST")
      ->delimiter(',')
      ->capture_default_str()
      ->group(pay);
  app.add_option("-n,--count", o.count, "Buffers per payload (1-1024)")
      ->type_name("N")
      ->capture_default_str()
      ->group(pay);
  app.add_option("--small", o.small, "Small buffer size [1 B, 1 K)")
      ->type_name("SIZE")
      ->capture_default_str()
      ->group(pay);
  app.add_option("--medium", o.medium, "Medium buffer size [1 K, 1 M)")
      ->type_name("SIZE")
      ->capture_default_str()
      ->group(pay);
  app.add_option("--large", o.large, "Large buffer size [1 M, 10 M]")
      ->type_name("SIZE")
      ->capture_default_str()
      ->group(pay);
  app.add_option("--categories", o.categories, "Categories the schemes draw from, in order")
      ->type_name("LIST")
      ->capture_default_str()
      ->group(pay);
  app.add_option("--skew-bias", o.skew_bias, "Category skew favours (60%; the others 30%/10%)")
      ->type_name("CATEGORY")
      ->capture_default_str()
      ->group(pay);
  app.add_option("--buffers", o.buffers, "Custom scheme: sizes in order, e.g. 10,64K,4M")
      ->type_name("SIZES")
      ->group(pay);
  app.add_option("--seed", o.seed, "Random scheme seed (same seed, same payload)")
      ->type_name("N")
      ->capture_default_str()
      ->group(pay);
  app.add_flag("--random-sizes", o.random_sizes, "Random scheme: draw sizes within each category's range")->group(pay);

  const std::string run = "Running";
  app.add_option("--warmup", o.warmup, "Warmup seconds before measuring")
      ->type_name("SEC")
      ->capture_default_str()
      ->group(run);
  app.add_option("-t,--time", o.time, "Measured seconds")->type_name("SEC")->capture_default_str()->group(run);
  app.add_option("-r,--repetitions", o.repetitions, "Repetitions (reports min/median/max)")
      ->type_name("N")
      ->capture_default_str()
      ->group(run);
  app.add_option("--ps", o.ps, "Parameter servers (ps-throughput)")->type_name("N")->capture_default_str()->group(run);
  app.add_option("--workers", o.workers, "Workers (ps-throughput)")->type_name("N")->capture_default_str()->group(run);
  app.add_option("--host", o.host, "Address the PSs listen on")->type_name("HOST")->capture_default_str()->group(run);
  app.add_option("--port", o.port, "First PS port; 0 lets each PS pick a free one")
      ->type_name("PORT")
      ->capture_default_str()
      ->group(run);
  app.add_flag("-q,--quiet", o.quiet, "No progress lines")->group(run);

  const std::string tr = "Transport";
  app.add_option("--reactor-mode", o.reactor_mode, "poll, adaptive or block (floor, zmq, fusewire)")
      ->type_name("MODE")
      ->capture_default_str()
      ->group(tr);
  app.add_option("--idle-poll", o.idle_poll, "Adaptive mode: microseconds to spin before sleeping")
      ->type_name("USEC")
      ->capture_default_str()
      ->group(tr);
  app.add_flag("--fusion,!--no-fusion", o.fusion, "Tensor fusion (fusewire backends)")->group(tr);
  app.add_flag("--shared-pool", o.shared_pool,
               "fusewire-shm/-auto: tensors in the transport's shared pool (a peer on this host copies them once)")
      ->group(tr);
  app.add_flag("--pin", o.pin, "Pin each process to one CPU of its cpuset")->group(tr);
  app.add_option("--grpc-threads", o.grpc_threads, "gRPC PS completion-queue threads")
      ->type_name("N")
      ->capture_default_str()
      ->group(tr);
  app.add_option("--zc-threshold", o.zc_threshold,
                 "fusewire-uring: writes of at least this size use SEND_ZC; 0 = never (default: the transport's, 64K)")
      ->type_name("SIZE")
      ->group(tr);
  app.add_option("--local-send-buffer", o.local_send_buffer,
                 "fusewire backends: SO_SNDBUF of connections to a peer on this host; 0 = the kernel's autotuning "
                 "(default: the transport's, 256K)")
      ->type_name("SIZE")
      ->group(tr);
  app.add_option("--connect-timeout", o.connect_timeout, "Seconds a worker keeps trying to reach a PS")
      ->type_name("SEC")
      ->capture_default_str()
      ->group(tr);

  const std::string out = "Output";
  app.add_option("--json", o.json, "Write every result as JSON")->type_name("FILE")->group(out);
  app.add_option("--csv", o.csv, "Write one CSV row per repetition")->type_name("FILE")->group(out);
  app.add_option("--plot", o.plot, "Draw latency/bandwidth/throughput bars (.svg or .png, gnuplot)")
      ->type_name("FILE")
      ->group(out);

  const std::string by_hand = "One process by hand";
  auto* role_opt =
      app.add_option("--role", o.role, "ps or worker: run only this process")->type_name("ROLE")->group(by_hand);
  auto* cluster_opt = app.add_option("--cluster", o.cluster, "ps=host:port,...;worker=host:port,...")
                          ->type_name("SPEC")
                          ->group(by_hand);
  app.add_option("--task", o.task, "This process's index among its role's tasks")
      ->type_name("N")
      ->capture_default_str()
      ->group(by_hand);
  app.add_flag("--managed", o.managed, "Started by the launcher (JSON lines on stdout)")->group("");

  CLI::App* compare = app.add_subcommand(
      "compare", "fusewire's best TCP transport against grpc, zmq and the floor on every benchmark and scheme");
  compare->fallthrough();
  compare->add_flag("--quick", o.quick, "Short warmup and run: the whole comparison in under 3 minutes here");
  compare
      ->add_option("--subject", o.subject,
                   "Backend whose ratios are printed ('fusewire' = its best built TCP transport)")
      ->type_name("BACKEND")
      ->capture_default_str();
  CLI::App* list = app.add_subcommand("list", "Backends fwbench knows and whether this build has them");
  list->fallthrough();
  app.require_subcommand(0, 1);

  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  parse_result result;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    std::ostringstream text;
    result.exit_now = true;
    result.exit_code = app.exit(e, text, text);
    result.output = text.str();
    return result;
  }

  auto given = [&](const std::string& name) { return app.count(name) > 0; };
  command& cmd = result.cmd;

  // Lists.
  std::vector<backend_choice> backends;
  for (const std::string& b : o.backends) {
    if (b == "all") {
      if (o.backends.size() != 1) bad("--backend all cannot be combined with other backends");
      continue;
    }
    backends.push_back(parse_backend_choice(b));
  }
  std::vector<benchmark_kind> benchmarks;
  for (const std::string& b : expand(o.benchmarks, {"p2p-latency", "p2p-bandwidth", "ps-throughput"})) {
    benchmarks.push_back(parse_benchmark(b));
  }
  std::vector<wire_mode> modes;
  for (const std::string& m : expand(o.modes, {"non-serialized", "serialized"})) modes.push_back(parse_wire_mode(m));
  std::vector<scheme> schemes;
  const bool scheme_given = given("--scheme");
  if (!scheme_given && !o.buffers.empty()) {
    schemes.push_back(scheme::custom);
  } else {
    for (const std::string& s : expand(o.schemes, {"uniform", "random", "skew"})) schemes.push_back(parse_scheme(s));
  }
  if (!o.buffers.empty() && std::find(schemes.begin(), schemes.end(), scheme::custom) == schemes.end()) {
    bad("--buffers is for --scheme custom, and --scheme does not include custom");
  }
  payload_spec payload = payload_from(o);
  check_payload(payload, schemes);
  const transport_settings transport = transport_from(o);
  const timing time = timing_from(o);
  const unsigned ps = static_cast<unsigned>(parse_bounded(o.ps, "--ps", 1, 64, "a cluster has 1 to 64 PS"));
  const unsigned workers =
      static_cast<unsigned>(parse_bounded(o.workers, "--workers", 1, 256, "a cluster has 1 to 256 workers"));
  const auto port = static_cast<std::uint16_t>(parse_bounded(o.port, "--port", 0, 65535, "a port is 0 to 65535"));
  if (port != 0 && static_cast<unsigned>(port) + ps - 1 > 65535) {
    bad("--port " + o.port + ": out of range, the " + std::to_string(ps) + " PS ports would pass 65535");
  }
  if (o.host.empty()) bad("--host is empty");

  const bool role_given = role_opt->count() > 0;
  if (role_given) {
    if (compare->parsed() || list->parsed()) bad("--role runs one process; it does not combine with compare or list");
    role_config& r = cmd.role;
    cmd.kind = command_kind::role;
    r.role = parse_role(o.role);
    if (cluster_opt->count() == 0) {
      bad("--role " + o.role + " needs --cluster ps=host:port,...;worker=host:port,...");
    }
    r.cluster = parse_cluster(o.cluster);
    r.task = static_cast<unsigned>(parse_whole(o.task, "--task"));
    const std::size_t tasks = r.role == role_kind::ps ? r.cluster.ps.size() : r.cluster.workers.size();
    if (r.task >= tasks) {
      bad("--task " + o.task + ": out of range, the cluster has " + std::to_string(tasks) + " " + o.role + " task" +
          (tasks == 1 ? "" : "s") + " (0 to " + std::to_string(tasks - 1) + ")");
    }
    if (backends.size() != 1) bad("--role " + o.role + " needs exactly one --backend");
    if (benchmarks.size() != 1) bad("--role " + o.role + " needs exactly one --benchmark");
    if (schemes.size() != 1) bad("--role " + o.role + " needs exactly one --scheme");
    if (modes.size() != 1) bad("--role " + o.role + " needs exactly one --mode");
    r.backend = backends[0];
    r.benchmark = benchmarks[0];
    r.mode = modes[0];
    if (r.benchmark != benchmark_kind::ps_throughput && (r.cluster.ps.size() != 1 || r.cluster.workers.size() != 1)) {
      bad("--benchmark " + std::string(option_name(r.benchmark)) +
          " is point to point: the cluster needs one ps and one worker task (ps-throughput takes more)");
    }
    r.managed = o.managed;
    if (!r.managed) {
      for (std::size_t i = 0; i < r.cluster.ps.size(); ++i) {
        if (r.cluster.ps[i].port == 0) {
          bad("--cluster: ps task " + std::to_string(i) + " has port 0; PSs started by hand need fixed ports");
        }
      }
    }
    r.payload = payload;
    r.payload.kind = schemes[0];
    r.transport = transport;
    r.time = time;
    return result;
  }
  if (cluster_opt->count() > 0) {
    bad("--cluster describes processes started by hand with --role; the launcher takes --host, --port, --ps and "
        "--workers");
  }
  if (o.managed) bad("--managed is for processes the launcher starts");

  run_config& rc = cmd.run;
  rc.backends = backends;
  rc.benchmarks = benchmarks;
  rc.schemes = schemes;
  rc.modes = modes;
  rc.ps = ps;
  rc.workers = workers;
  rc.host = o.host;
  rc.port = port;
  rc.payload = payload;
  rc.transport = transport;
  rc.time = time;
  rc.outputs = {o.json, o.csv, o.plot};
  rc.quiet = o.quiet;

  if (list->parsed()) {
    cmd.kind = command_kind::list;
    return result;
  }
  if (compare->parsed()) {
    cmd.kind = command_kind::compare;
    compare_config& c = cmd.compare;
    c.quick = o.quick;
    c.subject = o.subject;
    c.base = rc;
    if (!given("--warmup")) c.base.time.warmup_s = o.quick ? 0.3 : 2;
    if (!given("--time")) c.base.time.run_s = o.quick ? 1.5 : 10;
    if (!given("--ps")) c.base.ps = 2;
    if (!given("--workers")) c.base.workers = 3;
    if (!given("--json")) c.base.outputs.json = "fwbench-compare.json";
    if (!given("--plot")) {
      c.base.outputs.plot = "fwbench-compare.svg";
      c.base.outputs.plot_optional = true;
    }
    for (const char* fixed : {"--benchmark", "--scheme", "--mode", "--buffers"}) {
      if (given(fixed)) {
        bad(std::string("compare runs a fixed matrix; ") + fixed + " applies to a plain run, not to compare");
      }
    }
    return result;
  }
  cmd.kind = command_kind::run;
  return result;
}

std::vector<std::string> role_arguments(const role_config& c) {
  std::vector<std::string> a{"--role",      std::string(option_name(c.role)),
                             "--task",      std::to_string(c.task),
                             "--cluster",   c.cluster.to_string(),
                             "--backend",   c.backend.label(),
                             "--benchmark", std::string(option_name(c.benchmark)),
                             "--mode",      std::string(option_name(c.mode)),
                             "--scheme",    std::string(option_name(c.payload.kind)),
                             "--count",     std::to_string(c.payload.count),
                             "--small",     std::to_string(c.payload.size_of(category::small)),
                             "--medium",    std::to_string(c.payload.size_of(category::medium)),
                             "--large",     std::to_string(c.payload.size_of(category::large))};
  std::string cats;
  for (category cat : c.payload.categories) cats += (cats.empty() ? "" : ",") + std::string(option_name(cat));
  a.insert(a.end(), {"--categories", cats, "--skew-bias", std::string(option_name(c.payload.bias)), "--seed",
                     std::to_string(c.payload.seed)});
  if (c.payload.random_sizes) a.push_back("--random-sizes");
  if (!c.payload.custom.empty()) {
    std::string list;
    for (std::size_t s : c.payload.custom) list += (list.empty() ? "" : ",") + std::to_string(s);
    a.insert(a.end(), {"--buffers", list});
  }
  a.insert(a.end(),
           {"--warmup", number_text(c.time.warmup_s), "--time", number_text(c.time.run_s), "--repetitions",
            std::to_string(c.time.repetitions), "--reactor-mode", std::string(option_name(c.transport.mode)),
            "--idle-poll", std::to_string(c.transport.idle_poll.count()), "--grpc-threads",
            std::to_string(c.transport.grpc_threads), "--connect-timeout", number_text(c.transport.connect_timeout_s)});
  a.push_back(c.transport.fusion ? "--fusion" : "--no-fusion");
  if (c.transport.pin) a.push_back("--pin");
  if (c.transport.shared_pool) a.push_back("--shared-pool");
  if (c.transport.zc_threshold) a.insert(a.end(), {"--zc-threshold", std::to_string(*c.transport.zc_threshold)});
  if (c.transport.local_send_buffer) {
    a.insert(a.end(), {"--local-send-buffer", std::to_string(*c.transport.local_send_buffer)});
  }
  if (c.managed) a.push_back("--managed");
  return a;
}

}  // namespace fusewire::bench
