// fwbench's command line: defaults, lists, errors, the role round trip the
// launcher relies on, the plans it runs, and the report writers.

#include "cli.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend.hpp"
#include "driver.hpp"
#include "netstat.hpp"
#include "report.hpp"
#include "results.hpp"
#include "support/error_text.hpp"

using namespace fusewire::bench;
using fusewire::test::error_text_of;

namespace {

parse_result parse(std::vector<std::string> args) {
  args.insert(args.begin(), "fwbench");
  return parse_command_line(args);
}

std::string parse_error(std::vector<std::string> args, fusewire::errc code = fusewire::errc::invalid_argument) {
  return error_text_of([&] { parse(args); }, code);
}

const std::vector<std::string> by_hand_ps{"--role", "ps", "--cluster", "ps=127.0.0.1:50001;worker=127.0.0.1:0"};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// bench/README.md lists the paper's Table 2 next to these defaults, with the
// reason for each difference.
TEST_CASE("defaults: the paper's Table 2, but a free port per PS") {
  const parse_result r = parse({});
  REQUIRE_FALSE(r.exit_now);
  CHECK(r.cmd.kind == command_kind::run);
  const run_config& c = r.cmd.run;
  CHECK(c.backends.empty());
  CHECK(c.benchmarks == std::vector<benchmark_kind>{benchmark_kind::p2p_latency});
  CHECK(c.schemes == std::vector<scheme>{scheme::uniform});
  CHECK(c.modes == std::vector<wire_mode>{wire_mode::raw});
  CHECK(c.time.warmup_s == 2);
  CHECK(c.time.run_s == 10);
  CHECK(c.time.repetitions == 1);
  CHECK(c.ps == 1);
  CHECK(c.workers == 1);
  CHECK(c.host == "127.0.0.1");  // the paper's "localhost"
  CHECK(c.port == 0);            // the paper's 50001 with --port 50001
  CHECK(c.payload == payload_spec{});
  CHECK(c.transport.mode == wait_mode::adaptive);
  CHECK_FALSE(c.transport.fusion);
  CHECK_FALSE(c.transport.pin);
}

TEST_CASE("lists, 'all', and the custom scheme") {
  parse_result r = parse({"--backend", "grpc,floor:poll", "--benchmark", "all", "--scheme", "all", "--mode", "all"});
  CHECK(r.cmd.run.backends == std::vector<backend_choice>{{"grpc", std::nullopt}, {"floor", wait_mode::poll}});
  CHECK(r.cmd.run.benchmarks.size() == 3);
  CHECK(r.cmd.run.schemes == std::vector<scheme>{scheme::uniform, scheme::random, scheme::skew});
  CHECK(r.cmd.run.modes == std::vector<wire_mode>{wire_mode::raw, wire_mode::serialized});

  r = parse({"--buffers", "10,64K,4M"});
  CHECK(r.cmd.run.schemes == std::vector<scheme>{scheme::custom});
  CHECK(r.cmd.run.payload.custom == std::vector<std::size_t>{10, 64 * 1024, 4 * 1024 * 1024});

  r = parse({"--scheme", "skew", "--skew-bias", "medium", "--categories", "small,medium", "--count", "20", "--small",
             "100", "--medium", "2K", "--large", "8M", "--seed", "99", "--random-sizes"});
  const payload_spec& p = r.cmd.run.payload;
  CHECK(p.bias == category::medium);
  CHECK(p.categories == std::vector<category>{category::small, category::medium});
  CHECK(p.count == 20);
  CHECK(p.sizes == std::array<std::size_t, 3>{100, 2048, 8 * 1024 * 1024});
  CHECK(p.seed == 99);
  CHECK(p.random_sizes);
}

TEST_CASE("--help prints the options and exits 0; unknown options fail") {
  parse_result r = parse({"--help"});
  CHECK(r.exit_now);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("--scheme") != std::string::npos);
  CHECK(r.output.find("compare") != std::string::npos);
  r = parse({"compare", "--help"});
  CHECK(r.exit_now);
  CHECK(r.output.find("--quick") != std::string::npos);
  r = parse({"--frobnicate"});
  CHECK(r.exit_now);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--frobnicate") != std::string::npos);
}

TEST_CASE("bad values are named with what is allowed") {
  CHECK(parse_error({"--warmup", "-1"}) == "--warmup -1: out of range, the warmup is 0 to 3600 s");
  CHECK(parse_error({"--warmup", "soon"}) == "--warmup 'soon' is not a number of seconds");
  CHECK(parse_error({"--time", "0"}) == "--time 0: out of range, the run time is more than 0 s and at most 86400 s");
  CHECK(parse_error({"--repetitions", "0"}) == "--repetitions 0: out of range, a run has 1 to 100 repetitions");
  CHECK(parse_error({"--ps", "0"}) == "--ps 0: out of range, a cluster has 1 to 64 PS");
  CHECK(parse_error({"--workers", "x"}) == "--workers 'x' is not a whole number");
  CHECK(parse_error({"--port", "70000"}) == "--port 70000: out of range, a port is 0 to 65535");
  CHECK(parse_error({"--port", "65535", "--ps", "2"}) == "--port 65535: out of range, the 2 PS ports would pass 65535");
  CHECK(parse_error({"--count", "0"}) == "--count 0: out of range, a payload has 1 to 1024 buffers");
  CHECK(parse_error({"--small", "2K"}) ==
        "--small 2048: out of range, Small buffers are 1 B up to (not including) 1 KiB");
  CHECK(parse_error({"--large", "lots"}) ==
        "--large 'lots' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
  CHECK(parse_error({"--scheme", "zipf"}) == "--scheme 'zipf' is not a scheme; choose uniform, random, skew or custom");
  CHECK(parse_error({"--scheme", "custom"}) ==
        "--scheme custom needs --buffers SIZE,SIZE,... (for example --buffers 10,10K,1M)");
  CHECK(parse_error({"--scheme", "uniform", "--buffers", "10"}) ==
        "--buffers is for --scheme custom, and --scheme does not include custom");
  CHECK(parse_error({"--benchmark", "p2p"}) ==
        "--benchmark 'p2p' is not a benchmark; choose p2p-latency, p2p-bandwidth or ps-throughput");
  CHECK(parse_error({"--mode", "json"}) == "--mode 'json' is not a mode; choose non-serialized or serialized");
  CHECK(parse_error({"--reactor-mode", "spin"}) ==
        "--reactor-mode 'spin' is not a reactor mode; choose poll, adaptive or block");
  CHECK(parse_error({"--backend", "floor:spin"}) ==
        "--backend 'spin' is not a reactor mode; choose poll, adaptive or block");
  CHECK(parse_error({"--backend", "all,grpc"}) == "--backend all cannot be combined with other backends");
  CHECK(parse_error({"--grpc-threads", "0"}) == "--grpc-threads 0: out of range, gRPC takes 1 to 64 threads");
  CHECK(parse_error({"--connect-timeout", "0"}) ==
        "--connect-timeout 0: out of range, the connect timeout is more than 0 s and at most 3600 s");
  CHECK(parse_error({"--cluster", "ps=h:1;worker=h:2"}) ==
        "--cluster describes processes started by hand with --role; the launcher takes --host, --port, --ps and "
        "--workers");
  CHECK(parse_error({"compare", "--scheme", "skew"}) ==
        "compare runs a fixed matrix; --scheme applies to a plain run, not to compare");
}

TEST_CASE("one process by hand") {
  std::vector<std::string> args = by_hand_ps;
  args.insert(args.end(), {"--backend", "zmq", "--benchmark", "p2p-bandwidth"});
  const parse_result r = parse(args);
  REQUIRE(r.cmd.kind == command_kind::role);
  CHECK(r.cmd.role.role == role_kind::ps);
  CHECK(r.cmd.role.task == 0);
  CHECK(r.cmd.role.cluster.ps[0].port == 50001);
  CHECK(r.cmd.role.backend.name == "zmq");
  CHECK(r.cmd.role.benchmark == benchmark_kind::p2p_bandwidth);
  CHECK_FALSE(r.cmd.role.managed);

  CHECK(parse_error({"--role", "ps", "--backend", "zmq"}) ==
        "--role ps needs --cluster ps=host:port,...;worker=host:port,...");
  CHECK(parse_error({"--role", "chief"}) == "--role 'chief' is not a role; choose ps or worker");
  args = by_hand_ps;
  args.insert(args.end(), {"--backend", "zmq", "--task", "1"});
  CHECK(parse_error(args) == "--task 1: out of range, the cluster has 1 ps task (0 to 0)");
  args = by_hand_ps;
  args.insert(args.end(), {"--backend", "zmq,grpc"});
  CHECK(parse_error(args) == "--role ps needs exactly one --backend");
  args = by_hand_ps;
  args.insert(args.end(), {"--backend", "zmq", "--scheme", "all"});
  CHECK(parse_error(args) == "--role ps needs exactly one --scheme");
  CHECK(parse_error({"--role", "ps", "--backend", "zmq", "--cluster", "ps=h:1,h:2;worker=h:0"}) ==
        "--benchmark p2p-latency is point to point: the cluster needs one ps and one worker task (ps-throughput takes "
        "more)");
  CHECK(parse_error({"--role", "ps", "--backend", "zmq", "--cluster", "ps=h:0;worker=h:0"}) ==
        "--cluster: ps task 0 has port 0; PSs started by hand need fixed ports");
  CHECK(parse_error({"--role", "worker", "--backend", "zmq", "--benchmark", "ps-throughput", "--cluster",
                     "ps=h:1,h:2;worker=h:0,h:0", "--task", "2"}) ==
        "--task 2: out of range, the cluster has 2 worker tasks (0 to 1)");
  CHECK(parse_error({"compare", "--role", "ps", "--cluster", "ps=h:1;worker=h:0"}) ==
        "--role runs one process; it does not combine with compare or list");
}

TEST_CASE("the launcher's arguments parse back to the same role") {
  role_config c;
  c.role = role_kind::worker;
  c.task = 2;
  c.cluster = parse_cluster("ps=127.0.0.1:4000,127.0.0.1:4001;worker=127.0.0.1:0,127.0.0.1:0,127.0.0.1:0");
  c.backend = {"floor", wait_mode::poll};
  c.benchmark = benchmark_kind::ps_throughput;
  c.mode = wire_mode::serialized;
  c.payload.kind = scheme::random;
  c.payload.count = 17;
  c.payload.sizes = {100, 3000, 2 * 1024 * 1024};
  c.payload.categories = {category::large, category::small};
  c.payload.seed = 12345;
  c.payload.random_sizes = true;
  c.transport.mode = wait_mode::block;
  c.transport.idle_poll = std::chrono::microseconds(75);
  c.transport.fusion = true;
  c.transport.pin = true;
  c.transport.grpc_threads = 3;
  c.transport.connect_timeout_s = 2.5;
  c.transport.zc_threshold = 0;
  c.transport.local_send_buffer = 131072;
  c.time.warmup_s = 0.3;
  c.time.run_s = 1.7;
  c.managed = true;
  std::vector<std::string> args = role_arguments(c);
  parse_result r = parse(args);
  REQUIRE(r.cmd.kind == command_kind::role);
  CHECK(r.cmd.role == c);

  role_config d;
  d.role = role_kind::ps;
  d.cluster = parse_cluster("ps=[::1]:0;worker=[::1]:0");
  d.backend = {"grpc", std::nullopt};
  d.payload.kind = scheme::custom;
  d.payload.custom = {10, 65536};
  d.managed = true;
  r = parse(role_arguments(d));
  REQUIRE(r.cmd.kind == command_kind::role);
  CHECK(r.cmd.role == d);
  CHECK_FALSE(r.cmd.role.transport.zc_threshold.has_value());
  CHECK_FALSE(r.cmd.role.transport.local_send_buffer.has_value());
}

TEST_CASE("--zc-threshold: unset by default, a size, or 0 for never") {
  CHECK_FALSE(parse({"--backend", "floor"}).cmd.run.transport.zc_threshold.has_value());
  CHECK(parse({"--zc-threshold", "0"}).cmd.run.transport.zc_threshold == std::size_t{0});
  CHECK(parse({"--zc-threshold", "64K"}).cmd.run.transport.zc_threshold == std::size_t{65536});
  CHECK(parse_error({"--zc-threshold", "lots"}) ==
        "--zc-threshold 'lots' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
}

TEST_CASE("--local-send-buffer: unset by default, a size from 4K to 1024M, or 0 for the kernel's autotuning") {
  CHECK_FALSE(parse({"--backend", "floor"}).cmd.run.transport.local_send_buffer.has_value());
  CHECK(parse({"--local-send-buffer", "0"}).cmd.run.transport.local_send_buffer == std::size_t{0});
  CHECK(parse({"--local-send-buffer", "256K"}).cmd.run.transport.local_send_buffer == std::size_t{262144});
  CHECK(parse_error({"--local-send-buffer", "100"}) ==
        "--local-send-buffer 100: must be 0 (the kernel's autotuning) or 4K to 1024M");
  CHECK(parse_error({"--local-send-buffer", "2048M"}) ==
        "--local-send-buffer 2048M: must be 0 (the kernel's autotuning) or 4K to 1024M");
  CHECK(parse_error({"--local-send-buffer", "big"}) ==
        "--local-send-buffer 'big' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
}

TEST_CASE("compare: the quick defaults and its matrix") {
  const parse_result r = parse({"compare", "--quick"});
  REQUIRE(r.cmd.kind == command_kind::compare);
  const compare_config& c = r.cmd.compare;
  CHECK(c.quick);
  CHECK(c.subject == "fusewire");
  CHECK(c.base.time.warmup_s == doctest::Approx(0.3));
  CHECK(c.base.time.run_s == doctest::Approx(1.5));
  CHECK(c.base.ps == 2);
  CHECK(c.base.workers == 3);
  CHECK(c.base.outputs.json == "fwbench-compare.json");
  CHECK(c.base.outputs.plot == "fwbench-compare.svg");
  CHECK(c.base.outputs.plot_optional);
  CHECK_FALSE(parse({"compare", "--plot", "x.png"}).cmd.compare.base.outputs.plot_optional);
  CHECK(parse({"compare", "--time", "4"}).cmd.compare.base.time.run_s == 4);

  // 11 rows (3 benchmarks x 3 schemes, and 10 B / 64 KiB latency), each with
  // the subject and grpc, zmq:block, floor:poll, floor:block.
  const std::vector<cell> cells = plan_compare(c);
  bool any_fusewire_built = false;
  for (const backend_info& b : backends()) any_fusewire_built = any_fusewire_built || (b.fusewire && b.available);
  std::size_t per_row = 5;
  if (!any_fusewire_built) {
    CHECK(cells.size() == 55);
    CHECK(cells[0].backend.label() == "fusewire");
    CHECK(cells[0].skipped == "fusewire: not built yet");
  } else {
    // fusewire's best TCP transport (io_uring when built), in the default mode and in block mode.
    per_row = 6;
    CHECK(cells.size() == 66);
    const std::string best = find_backend("fusewire-uring")->available ? "fusewire-uring" : "fusewire-asio";
    CHECK(cells[0].backend.label() == best);
    CHECK(cells[1].backend.label() == best + ":block");
    CHECK(cells[2].backend.label() == "grpc");
    CHECK(cells[0].skipped.empty());
  }
  std::vector<std::string> rows;
  for (const cell& x : cells) {
    const std::string row = std::string(option_name(x.benchmark)) + "/" + x.payload_label;
    if (rows.empty() || rows.back() != row) rows.push_back(row);
    CHECK(x.mode == wire_mode::raw);
    CHECK(x.ps == (x.benchmark == benchmark_kind::ps_throughput ? 2u : 1u));
    CHECK(x.workers == (x.benchmark == benchmark_kind::ps_throughput ? 3u : 1u));
  }
  CHECK(rows == std::vector<std::string>{"p2p-latency/uniform", "p2p-latency/random", "p2p-latency/skew",
                                         "p2p-latency/10 B", "p2p-latency/64 KiB", "p2p-bandwidth/uniform",
                                         "p2p-bandwidth/random", "p2p-bandwidth/skew", "ps-throughput/uniform",
                                         "ps-throughput/random", "ps-throughput/skew"});
  CHECK(cells[4 * per_row].payload_bytes == 65536);
  CHECK(cells[3 * per_row].payload_bytes == 10);

  compare_config zmq = c;
  zmq.subject = "zmq:block";
  const std::vector<cell> zmq_cells = plan_compare(zmq);
  CHECK(zmq_cells.size() == 44);
  CHECK(zmq_cells[0].backend.label() == "zmq:block");
  CHECK(zmq_cells[1].backend.label() == "grpc");
}

TEST_CASE("backend names are checked against what is built") {
  run_config rc;
  rc.backends = {{"tcp", std::nullopt}};
  std::string known;
  for (const backend_info& b : backends()) known += (known.empty() ? "" : ", ") + b.name;
  CHECK(error_text_of([&] { plan_cells(rc); }) == "--backend 'tcp' is not a backend; known: " + known);
  rc.backends = {{"fusewire-uring", std::nullopt}};
  if (!find_backend("fusewire-uring")->available) {
    CHECK(error_text_of([&] { plan_cells(rc); }, fusewire::errc::not_supported) ==
          "--backend fusewire-uring: fusewire-uring: not built (liburing >= 2.2 was not found; Debian: liburing-dev)");
  } else {
    rc.backends = {{"fusewire-uring", wait_mode::poll}};
    CHECK(plan_cells(rc).size() == 1);
  }
  rc.backends = {{"fusewire-asio", wait_mode::block}};
  CHECK(plan_cells(rc).size() == 1);
  rc.backends = {{"floor", wait_mode::poll}};
  CHECK(plan_cells(rc).size() == 1);
  if (find_backend("grpc")->available) {
    rc.backends = {{"grpc", wait_mode::poll}};
    CHECK(error_text_of([&] { plan_cells(rc); }) == "--backend grpc:poll: grpc has no reactor mode; use plain 'grpc'");
  }
}

TEST_CASE("plans: p2p runs one PS and one worker; ps-throughput takes --ps and --workers") {
  const parse_result r = parse({"--backend", "floor", "--benchmark", "all", "--scheme", "uniform,skew", "--mode", "all",
                                "--ps", "2", "--workers", "3"});
  const std::vector<cell> cells = plan_cells(r.cmd.run);
  REQUIRE(cells.size() == 3 * 2 * 2);
  for (const cell& c : cells) {
    const bool tp = c.benchmark == benchmark_kind::ps_throughput;
    CHECK(c.ps == (tp ? 2u : 1u));
    CHECK(c.workers == (tp ? 3u : 1u));
    CHECK(c.payload_bytes == (c.payload.kind == scheme::skew ? 6322186u : 3176488u));
    CHECK(c.buffers == 10);
  }
}

TEST_CASE("reports: table, CSV, JSON and the gnuplot script") {
  cell a;
  a.backend = {"grpc", std::nullopt};
  a.benchmark = benchmark_kind::p2p_latency;
  a.payload_label = "skew";
  a.payload.kind = scheme::skew;
  a.payload_bytes = 6322186;
  a.buffers = 10;
  repetition rep;
  rep.seconds = 1;
  rep.calls = 100;
  rep.rpc_per_s = 100;
  rep.mb_per_s = 632.2;
  rep.latency = {10000, 9000, 15000, 8000, 20000};
  rep.usage = {{role_kind::ps, 0, 0.5, 0.25, 1.0, 2048}, {role_kind::worker, 0, 0.1, 0.2, 1.0, 4096}};
  a.reps = {rep, rep};
  a.reps[1].latency.p50_us = 11000;
  cell b = a;
  b.backend = {"fusewire", std::nullopt};
  b.reps.clear();
  b.skipped = "fusewire: not built yet";
  cell failed = a;
  failed.backend = {"zmq", std::nullopt};
  repetition bad;
  bad.ok = false;
  bad.error = "worker 0 ended early, \"oops\"";
  failed.reps = {bad};
  const std::vector<cell> cells{a, b, failed};

  char path[] = "/tmp/fwbench-report-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::FILE* out = std::fopen(path, "w");
  print_table(out, cells);
  std::fclose(out);
  const std::string table = read_file(path);
  CHECK(table.find("p50 us") != std::string::npos);
  CHECK(table.find("10000.0") == std::string::npos);
  CHECK(table.find("10000") != std::string::npos);  // median p50 of 9000 and 11000
  CHECK(table.find("fusewire: not built yet") != std::string::npos);
  CHECK(table.find("FAILED: worker 0 ended early") != std::string::npos);
  CHECK(table.find("p50 us over 2 repetitions: min 9000, median 10000, max 11000") != std::string::npos);
  CHECK(table.find("   75 ") != std::string::npos);  // PS cpu%: 0.75 s of 1 s

  write_csv(path, cells);
  const std::string csv = read_file(path);
  CHECK(csv.rfind("backend,benchmark,payload,scheme,mode,payload_bytes,", 0) == 0);
  CHECK(csv.find("grpc,p2p-latency,skew,skew,non-serialized,6322186,10,1,1,1,true,") != std::string::npos);
  CHECK(csv.find("grpc,p2p-latency,skew,skew,non-serialized,6322186,10,1,1,2,true,") != std::string::npos);
  CHECK(csv.find("\"worker 0 ended early, \"\"oops\"\"\"") != std::string::npos);

  write_json(path, cells, {{"extra", 1}});
  const nlohmann::json doc = nlohmann::json::parse(read_file(path));
  CHECK(doc["extra"] == 1);
  REQUIRE(doc["results"].size() == 3);
  CHECK(doc["results"][0]["headline"]["median"] == 10000);
  CHECK(doc["results"][0]["repetitions"][0]["usage"][0]["max_rss_kib"] == 2048);
  CHECK(doc["results"][1]["skipped"] == "fusewire: not built yet");
  CHECK(doc["results"][2]["repetitions"][0]["error"] == "worker 0 ended early, \"oops\"");
  std::remove(path);

  const std::string script = plot_script("out.svg", cells, "title");
  CHECK(script.find("set terminal svg") != std::string::npos);
  CHECK(script.find("payload \"grpc\"\n\"skew\" 10000\n") != std::string::npos);
  CHECK(script.find("title \"title\\nnot shown: fusewire (fusewire: not built yet), zmq (failed)\"") !=
        std::string::npos);
  CHECK(plot_script("out.png", cells, "t").find("set terminal pngcairo") != std::string::npos);
  CHECK(error_text_of([&] { plot_script("out.pdf", cells, "t"); }) ==
        "--plot 'out.pdf': the file must end in .svg or .png");
}

TEST_CASE("system_error text loses only the category suffix") {
  const std::system_error e(fusewire::make_error_code(fusewire::errc::invalid_argument), "--x 1: bad");
  CHECK(error_text(e) == "--x 1: bad");
}

TEST_CASE("network bytes: each host's interface counts once, hosts add up") {
  auto worker = [](unsigned task, const char* host, const char* iface, std::uint64_t tx, std::uint64_t rx) {
    worker_result w;
    w.task = task;
    w.calls = 10;
    w.exchanges = 10;
    w.seconds = 1;
    w.usage.wall_s = 2;
    w.hostname = host;
    w.net_interface = iface;
    w.net_tx_bytes = tx;
    w.net_rx_bytes = rx;
    return w;
  };
  // Two workers on host a see the same lo counters (the larger reading
  // counts); the one on host b adds its own interface.
  const repetition r = combine({worker(0, "a", "lo", 8'000'000, 8'000'000), worker(1, "a", "lo", 6'000'000, 6'000'000),
                                worker(2, "b", "eth0", 2'000'000, 4'000'000)});
  CHECK(r.net_tx_mb_per_s == doctest::Approx(4.0 + 1.0));
  CHECK(r.net_rx_mb_per_s == doctest::Approx(4.0 + 2.0));
  CHECK(r.net_interfaces == "lo,eth0");
  // Not measured: no interface, no figure.
  const repetition none = combine({worker(0, "a", "", 0, 0)});
  CHECK(none.net_tx_mb_per_s == 0);
  CHECK(none.net_interfaces.empty());

  CHECK(interface_towards("127.0.0.1") == "lo");
  CHECK(interface_towards("no-such-host.invalid").empty());
  const net_counters lo = read_net_counters("lo");
  CHECK(lo.interface == "lo");
  CHECK(read_net_counters("../../etc").interface.empty());
  CHECK(read_net_counters("").interface.empty());
}
