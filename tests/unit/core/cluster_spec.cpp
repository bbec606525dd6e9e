#include <fusewire/core/cluster_spec.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

using fusewire::cluster_spec;
using fusewire::errc;
using fusewire::net_address;
using fusewire::task_id;

namespace {

namespace fs = std::filesystem;

constexpr std::string_view suffix = ": invalid configuration";

/// A fresh directory, removed with everything in it at the end of the test.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string pattern = (fs::temp_directory_path() / "fusewire-core-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& content) const {
    const fs::path file = path / name;
    std::ofstream(file) << content;
    return file;
  }
};

/// Runs the test body in another working directory, then goes back.
struct scoped_cwd {
  fs::path old = fs::current_path();
  explicit scoped_cwd(const fs::path& dir) { fs::current_path(dir); }
  ~scoped_cwd() { fs::current_path(old); }
};

fusewire::env_lookup lookup_in(std::map<std::string, std::string, std::less<>> env) {
  return [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

template <class F>
std::string error_of(F&& f, errc expected = errc::invalid_config) {
  try {
    f();
  } catch (const std::system_error& e) {
    CHECK(e.code() == expected);
    return e.what();
  }
  return "no exception";
}

std::string tf_config_error(const std::string& json) {
  return error_of([&] { (void)cluster_spec::from_tf_config(json); });
}

std::string with_suffix(std::string s) { return s + std::string(suffix); }

const std::string two_by_two = R"({"cluster": {"ps": ["localhost:2222", "localhost:2224"],
                                                "worker": ["localhost:2223", "localhost:2225"]},
                                    "task": {"type": "worker", "index": 1}})";

const std::string two_by_two_map =
    "# control=fast path\n"
    "localhost:2222=localhost:5222\n"
    "\n"
    "  localhost:2223 = localhost:5223   # worker 0\n"
    "LOCALHOST:2224=127.0.0.1:5224\r\n"
    "localhost:2225=[::1]:5225\n"
    "otherhost:1=otherhost:2\n";

}  // namespace

TEST_CASE("endpoints: host:port and [v6]:port, printed back the same way") {
  net_address e = net_address::parse("localhost:2222");
  CHECK(e.host == "localhost");
  CHECK(e.port == 2222);
  CHECK(e.to_string() == "localhost:2222");
  e = net_address::parse("[::1]:65535");
  CHECK(e.host == "::1");
  CHECK(e.port == 65535);
  CHECK(e.to_string() == "[::1]:65535");
  CHECK(net_address::parse("10.0.0.1:1").to_string() == "10.0.0.1:1");
  CHECK(net_address::parse("[fe80::1%eth0]:80").host == "fe80::1%eth0");
  CHECK(net_address::parse("Host-A.example.com:8080") == net_address{"host-a.EXAMPLE.com", 8080});
  CHECK(net_address::parse("a:1") != net_address{"a", 2});
}

TEST_CASE("bad endpoints say what was expected") {
  auto parse_error = [](std::string_view s) { return error_of([&] { (void)net_address::parse(s); }); };
  CHECK(parse_error("localhost") == with_suffix("expected host:port, got 'localhost'"));
  CHECK(parse_error("") == with_suffix("expected host:port, got ''"));
  CHECK(parse_error(":2222") == with_suffix("expected host:port, got ':2222'"));
  CHECK(parse_error("localhost:") == with_suffix("expected host:port, got 'localhost:'"));
  CHECK(parse_error("::1:2222") ==
        with_suffix("expected host:port with an IPv6 host in brackets (such as [::1]:2222), got '::1:2222'"));
  CHECK(parse_error("[::1]2222") == with_suffix("expected host:port, got '[::1]2222'"));
  CHECK(parse_error("[::1:2222") == with_suffix("expected host:port, got '[::1:2222'"));
  CHECK(parse_error("[]:2222") == with_suffix("expected host:port, got '[]:2222'"));
  CHECK(parse_error("my host:1") == with_suffix("expected host:port, got 'my host:1'"));
  CHECK(parse_error("localhost:0") ==
        with_suffix("bad port '0' in 'localhost:0' (expected an integer from 1 to 65535)"));
  CHECK(parse_error("localhost:65536") ==
        with_suffix("bad port '65536' in 'localhost:65536' (expected an integer from 1 to 65535)"));
  CHECK(parse_error("localhost:http") ==
        with_suffix("bad port 'http' in 'localhost:http' (expected an integer from 1 to 65535)"));
  CHECK(parse_error("[::1]:-1") == with_suffix("bad port '-1' in '[::1]:-1' (expected an integer from 1 to 65535)"));
  std::error_code ec;
  CHECK(net_address::parse("nope", ec).port == 0);
  CHECK(ec == errc::invalid_config);
  CHECK(net_address::parse("h:9", ec).port == 9);
  CHECK_FALSE(ec);
}

TEST_CASE("task ids print and parse as job:index") {
  const task_id t{"worker", 1};
  CHECK(t.to_string() == "worker:1");
  CHECK(task_id::parse("worker:1") == t);
  CHECK(task_id::parse("ps:0") < task_id::parse("worker:0"));
  CHECK(task_id::parse("worker:2") < task_id::parse("worker:10"));
  CHECK(std::hash<task_id>{}(t) == std::hash<task_id>{}(task_id::parse("worker:1")));
  std::unordered_map<task_id, int> by_task{{t, 1}, {{"ps", 1}, 2}};
  CHECK(by_task.at({"ps", 1}) == 2);
  for (const char* bad : {"worker", "worker:", ":1", "worker:-1", "worker:x", "my job:1", "worker:4294967296"}) {
    CAPTURE(bad);
    CHECK(error_of([&] { (void)task_id::parse(bad); }) ==
          with_suffix("task id '" + std::string(bad) + "': expected job:index (such as worker:0)"));
  }
}

TEST_CASE("TF_CONFIG: jobs, tasks and which task this is") {
  const cluster_spec spec = cluster_spec::from_tf_config(R"({
      "cluster": {"chief": ["host0:2222"], "ps": ["host1:2222", "[::1]:2223"], "worker": ["host2:2222"]},
      "task": {"type": "ps", "index": 1},
      "environment": "cloud"})");
  CHECK(spec.job_names() == std::vector<std::string>{"chief", "ps", "worker"});
  CHECK(spec.size() == 4);
  CHECK(spec.job("ps").size() == 2);
  CHECK(spec.job("ps")[1] == net_address{"::1", 2223});
  CHECK(spec.job("evaluator").empty());
  REQUIRE(spec.self().has_value());
  CHECK(*spec.self() == task_id{"ps", 1});
  CHECK(spec.control_endpoint({"chief", 0}).to_string() == "host0:2222");
  CHECK(spec.tasks() == std::vector<task_id>{{"chief", 0}, {"ps", 0}, {"ps", 1}, {"worker", 0}});
  CHECK(spec.contains({"worker", 0}));
  CHECK_FALSE(spec.contains({"worker", 1}));
  CHECK(spec.to_string() == "chief=host0:2222;ps=host1:2222,[::1]:2223;worker=host2:2222");
  CHECK_FALSE(spec.has_endpoint_map());
  // Without a map the fast path is the control endpoint.
  CHECK(spec.fast_path_endpoint({"ps", 1}) == net_address{"::1", 2223});

  const cluster_spec no_task = cluster_spec::from_tf_config(R"({"cluster": {"worker": ["a:1"]}})");
  CHECK_FALSE(no_task.self().has_value());
  const cluster_spec no_index =
      cluster_spec::from_tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})");
  CHECK(*no_index.self() == task_id{"worker", 0});
}

TEST_CASE("TF_CONFIG errors name what is wrong") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"cluster\": ", "TF_CONFIG: not valid JSON (syntax error at byte 13)"},
      {"[]", "TF_CONFIG: expected a JSON object like {\"cluster\": {...}, \"task\": {...}}, got array"},
      {R"({"task": {"type": "worker", "index": 0}})", "TF_CONFIG: missing \"cluster\""},
      {R"({"cluster": ["localhost:2222"]})",
       "TF_CONFIG: \"cluster\" must be an object mapping job names to lists of \"host:port\", got array"},
      {R"({"cluster": {"ps": "localhost:2222"}})",
       "TF_CONFIG: cluster.ps must be a list of \"host:port\" strings, got string"},
      {R"({"cluster": {"worker": ["localhost:2222", 2223]}})",
       "TF_CONFIG: cluster.worker[1] must be a \"host:port\" string, got 2223"},
      {R"({"cluster": {"worker": ["localhost:2222", null]}})",
       "TF_CONFIG: cluster.worker[1] must be a \"host:port\" string, got null"},
      {R"({"cluster": {"worker": ["localhost"]}})",
       "TF_CONFIG: cluster.worker[0]: expected host:port, got 'localhost'"},
      {R"({"cluster": {"worker": ["localhost:99999"]}})",
       "TF_CONFIG: cluster.worker[0]: bad port '99999' in 'localhost:99999' (expected an integer from 1 to 65535)"},
      {R"({"cluster": {"my job": ["a:1"]}})",
       "TF_CONFIG: job name 'my job' must be one or more letters, digits, '_' or '-'"},
      {R"({"cluster": {"ps": ["localhost:2222"], "worker": ["localhost:2223", "LocalHost:2222"]}})",
       "TF_CONFIG: ps 0 and worker 1 both use LocalHost:2222"},
      {R"({"cluster": {"worker": ["a:1", "a:1"]}})", "TF_CONFIG: worker 0 and worker 1 both use a:1"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": "worker:0"})",
       "TF_CONFIG: \"task\" must be an object like {\"type\": \"worker\", \"index\": 0}, got string"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})",
       "TF_CONFIG: task.type must be a string naming a job in \"cluster\""},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["a:2"]}, "task": {"type": "evaluator", "index": 0}})",
       "TF_CONFIG: task.type 'evaluator' is not a job in \"cluster\" (jobs: ps, worker)"},
      {R"({"cluster": {"worker": ["a:1", "a:2"]}, "task": {"type": "worker", "index": 2}})",
       "TF_CONFIG: task.index 2 is out of range: job 'worker' has 2 tasks"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}})",
       "TF_CONFIG: task.index 1 is out of range: job 'worker' has 1 task"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})",
       "TF_CONFIG: task.index must be a non-negative integer, got -1"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}})",
       "TF_CONFIG: task.index must be a non-negative integer, got \"0\""},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0.5}})",
       "TF_CONFIG: task.index must be a non-negative integer, got 0.5"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.first);
    CHECK(tf_config_error(c.first) == with_suffix(c.second));
  }
}

TEST_CASE("from_env reads TF_CONFIG and the endpoint map it points to") {
  CHECK(error_of([] { (void)cluster_spec::from_env(lookup_in({})); }) ==
        with_suffix("TF_CONFIG is not set (expected JSON like {\"cluster\": {\"worker\": [\"host:port\"]}, "
                    "\"task\": {\"type\": \"worker\", \"index\": 0}})"));
  CHECK(error_of([] {
          (void)cluster_spec::from_env(lookup_in({{"TF_CONFIG", ""}}));
        }).rfind("TF_CONFIG is not set", 0) == 0);

  temp_dir dir;
  dir.write(".endpoint_map", two_by_two_map);
  const cluster_spec spec = cluster_spec::from_env(
      lookup_in({{"TF_CONFIG", two_by_two}, {"TF_SEASTAR_ENDPOINT_MAP_PATH", dir.path.string()}}));
  CHECK(*spec.self() == task_id{"worker", 1});
  REQUIRE(spec.has_endpoint_map());
  CHECK(*spec.endpoint_map_file() == (dir.path / ".endpoint_map").string());
  CHECK(spec.fast_path_endpoint({"worker", 1}).to_string() == "[::1]:5225");

  temp_dir empty;
  const std::string expected_file = (empty.path / ".endpoint_map").string();
  CHECK(error_of([&] {
          (void)cluster_spec::from_env(
              lookup_in({{"TF_CONFIG", two_by_two}, {"TF_SEASTAR_ENDPOINT_MAP_PATH", empty.path.string()}}));
        }) == with_suffix("cannot read endpoint map '" + expected_file +
                          "' (from TF_SEASTAR_ENDPOINT_MAP_PATH): No such file or directory"));

  // Unset path, and no .endpoint_map in the working directory: no map, no error.
  scoped_cwd cwd(empty.path);
  const cluster_spec plain = cluster_spec::from_env(lookup_in({{"TF_CONFIG", two_by_two}}));
  CHECK_FALSE(plain.has_endpoint_map());
  CHECK(plain.fast_path_endpoint({"ps", 0}).to_string() == "localhost:2222");
}

TEST_CASE("the .endpoint_map in the working directory is used when no path is set") {
  temp_dir dir;
  dir.write(".endpoint_map",
            "localhost:2222=localhost:5222\nlocalhost:2224=localhost:5224\n"
            "localhost:2223=localhost:5223\n");
  scoped_cwd cwd(dir.path);
  CHECK(cluster_spec::endpoint_map_path(lookup_in({})) == fs::path(".endpoint_map"));
  CHECK(error_of([] {
          (void)cluster_spec::from_env(lookup_in({{"TF_CONFIG", two_by_two}}));
        }) == with_suffix(".endpoint_map has no entry for worker 1 (localhost:2225)"));
}

TEST_CASE("from_string_or_env: a --cluster string gets the environment's endpoint map too") {
  const std::string text = "ps=localhost:2222,localhost:2224;worker=localhost:2223,localhost:2225";
  temp_dir dir;
  dir.write(".endpoint_map", two_by_two_map);
  const auto env = lookup_in({{"TF_SEASTAR_ENDPOINT_MAP_PATH", dir.path.string()}});

  // from_string only parses; from_string_or_env applies the map as from_env does.
  CHECK_FALSE(cluster_spec::from_string(text).has_endpoint_map());
  const cluster_spec spec = cluster_spec::from_string_or_env(text, env);
  REQUIRE(spec.has_endpoint_map());
  CHECK(spec.fast_path_endpoint({"worker", 1}).to_string() == "[::1]:5225");
  CHECK(spec.control_endpoint({"worker", 1}).to_string() == "localhost:2225");
  CHECK_FALSE(spec.self());

  // No text: TF_CONFIG, with self, and the map.
  const cluster_spec from_config = cluster_spec::from_string_or_env(
      "  ", lookup_in({{"TF_CONFIG", two_by_two}, {"TF_SEASTAR_ENDPOINT_MAP_PATH", dir.path.string()}}));
  CHECK(*from_config.self() == task_id{"worker", 1});
  CHECK(from_config.fast_path_endpoint({"worker", 1}).to_string() == "[::1]:5225");
  CHECK(error_of([&] { (void)cluster_spec::from_string_or_env("", env); }).rfind("TF_CONFIG is not set", 0) == 0);

  // A map that lacks a task of the --cluster string is an error naming it.
  temp_dir partial;
  partial.write(".endpoint_map", "localhost:2222=localhost:5222\n");
  CHECK(error_of([&] {
          (void)cluster_spec::from_string_or_env(text,
                                                 lookup_in({{"TF_SEASTAR_ENDPOINT_MAP_PATH", partial.path.string()}}));
        }) == with_suffix((partial.path / ".endpoint_map").string() + " has no entry for ps 1 (localhost:2224)"));

  // The working directory's .endpoint_map when no path is set.
  scoped_cwd cwd(dir.path);
  CHECK(cluster_spec::from_string_or_env(text, lookup_in({})).fast_path_endpoint({"ps", 0}).to_string() ==
        "localhost:5222");
}

TEST_CASE("an endpoint map gives every task its fast-path endpoint") {
  temp_dir dir;
  const fs::path file = dir.write(".endpoint_map", two_by_two_map);
  cluster_spec spec = cluster_spec::from_tf_config(two_by_two);
  spec.load_endpoint_map(file);
  CHECK(spec.fast_path_endpoint({"ps", 0}).to_string() == "localhost:5222");
  CHECK(spec.fast_path_endpoint({"worker", 0}).to_string() == "localhost:5223");
  CHECK(spec.fast_path_endpoint({"ps", 1}).to_string() == "127.0.0.1:5224");  // host matched in any case
  CHECK(spec.fast_path_endpoint({"worker", 1}).to_string() == "[::1]:5225");
  CHECK(spec.control_endpoint({"worker", 1}).to_string() == "localhost:2225");
  CHECK(error_of(
            [&] {
              (void)spec.fast_path_endpoint({"worker", 2});
            },
            errc::invalid_argument) ==
        "cluster spec has no task worker:2 (job 'worker' has 2 tasks): invalid argument");
  CHECK(error_of(
            [&] {
              (void)spec.fast_path_endpoint({"chief", 0});
            },
            errc::invalid_argument) == "cluster spec has no job 'chief' (jobs: ps, worker): invalid argument");

  // A job added after the map was loaded has no entry; it is named when asked for.
  spec.add_job("chief", {net_address{"localhost", 2226}});
  CHECK(error_of([&] {
          (void)spec.fast_path_endpoint({"chief", 0});
        }) == with_suffix(file.string() + " has no entry for chief 0 (localhost:2226)"));
}

TEST_CASE("endpoint map errors name the file and line, or the task without an entry") {
  temp_dir dir;
  const cluster_spec base = cluster_spec::from_tf_config(two_by_two);
  auto load_error = [&](const std::string& content) {
    const fs::path file = dir.write(".endpoint_map", content);
    cluster_spec spec = base;
    return error_of([&] { spec.load_endpoint_map(file); });
  };
  const std::string f = (dir.path / ".endpoint_map").string();
  CHECK(load_error("localhost:2222=localhost:5222\n\nfoo\n") ==
        with_suffix(f + ":3: expected host:port=host:port, got 'foo'"));
  CHECK(load_error("localhost:2222 localhost:5222\n") ==
        with_suffix(f + ":1: expected host:port=host:port, got 'localhost:2222 localhost:5222'"));
  CHECK(load_error("localhost:2222=localhost:5222=x\n") ==
        with_suffix(f + ":1: expected host:port=host:port, got 'localhost:2222=localhost:5222=x'"));
  CHECK(load_error("# comment\nlocalhost:2222=\n") ==
        with_suffix(f + ":2: expected host:port=host:port, got 'localhost:2222='"));
  CHECK(load_error("localhost=localhost:5222 # no port\n") ==
        with_suffix(f + ":1: expected host:port=host:port, got 'localhost=localhost:5222'"));
  CHECK(load_error("localhost:2222=localhost:70000\n") ==
        with_suffix(f + ":1: bad port '70000' in 'localhost:70000' (expected an integer from 1 to 65535)"));
  CHECK(load_error("localhost:2222=localhost:5222\nlocalhost:2222=localhost:6222\n") ==
        with_suffix(f + ":2: localhost:2222 is mapped twice (first on line 1)"));
  CHECK(load_error("localhost:2222=localhost:5222\nlocalhost:2224=localhost:5224\nlocalhost:2225=localhost:5225\n") ==
        with_suffix(f + " has no entry for worker 0 (localhost:2223)"));
  CHECK(load_error("") == with_suffix(f + " has no entry for ps 0 (localhost:2222)"));

  const std::string missing = (dir.path / "nowhere" / ".endpoint_map").string();
  cluster_spec spec = base;
  CHECK(error_of([&] { spec.load_endpoint_map(missing); }) ==
        with_suffix("cannot read endpoint map '" + missing + "': No such file or directory"));
  CHECK_FALSE(spec.has_endpoint_map());  // a failed load leaves the spec as it was
}

TEST_CASE("cluster spec strings: ps=h:p,h:p;worker=h:p") {
  const cluster_spec spec = cluster_spec::from_string(" ps = a:1, [::1]:2 ; worker=b:3;");
  CHECK(spec.job_names() == std::vector<std::string>{"ps", "worker"});
  CHECK(spec.job("ps")[1] == net_address{"::1", 2});
  CHECK(spec.to_string() == "ps=a:1,[::1]:2;worker=b:3");
  CHECK(cluster_spec::from_string(spec.to_string()).to_string() == spec.to_string());
  CHECK_FALSE(spec.self().has_value());

  auto string_error = [](std::string_view s) { return error_of([&] { (void)cluster_spec::from_string(s); }); };
  CHECK(string_error("") ==
        with_suffix("cluster spec: expected job=host:port[,host:port...] (jobs separated by ';'), got ''"));
  CHECK(string_error("ps=a:1;worker") ==
        with_suffix("cluster spec: expected job=host:port[,host:port...] (jobs separated by ';'), got 'worker'"));
  CHECK(string_error("ps=a:1,,a:2") == with_suffix("cluster spec: ps[1]: expected host:port, got ''"));
  CHECK(string_error("ps=a:x") ==
        with_suffix("cluster spec: ps[0]: bad port 'x' in 'a:x' (expected an integer from 1 to 65535)"));
  CHECK(string_error("ps=a:1;ps=a:2") == with_suffix("cluster spec: job 'ps' is listed twice"));
  CHECK(string_error("=a:1") ==
        with_suffix("cluster spec: job name '' must be one or more letters, digits, '_' or '-'"));
  CHECK(string_error("ps=a:1;worker=a:1") == with_suffix("cluster spec: ps 0 and worker 0 both use a:1"));
}

TEST_CASE("add_job and set_self check what they are given") {
  cluster_spec spec;
  CHECK(spec.empty());
  spec.add_job("worker", {net_address{"a", 1}, net_address{"b", 1}});
  CHECK(spec.size() == 2);
  CHECK(error_of([&] {
          spec.add_job("worker", {net_address{"c", 1}});
        }) == with_suffix("job 'worker' is listed twice"));
  CHECK(error_of([&] {
          spec.add_job("ps", {net_address{"c", 0}});
        }) == with_suffix("ps 0 has no valid address (got 'c:0')"));
  CHECK(error_of([&] {
          spec.add_job("ps", {net_address{"", 5}});
        }) == with_suffix("ps 0 has no valid address (got ':5')"));
  CHECK(error_of([&] { spec.add_job("ps", {net_address{"B", 1}}); }) == with_suffix("worker 1 and ps 0 both use B:1"));
  CHECK(spec.job_names() == std::vector<std::string>{"worker"});  // failed adds change nothing

  spec.set_self({"worker", 1});
  CHECK(*spec.self() == task_id{"worker", 1});
  CHECK(error_of(
            [&] {
              spec.set_self({"worker", 2});
            },
            errc::invalid_argument) ==
        "cluster spec has no task worker:2 (job 'worker' has 2 tasks): invalid argument");
  CHECK(*spec.self() == task_id{"worker", 1});
  CHECK(error_of(
            [] {
              (void)cluster_spec().control_endpoint({"ps", 0});
            },
            errc::invalid_argument) == "cluster spec has no job 'ps' (jobs: none): invalid argument");
}
