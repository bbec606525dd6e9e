#include <fusewire/core/options.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

using fusewire::errc;
using fusewire::options;
using fusewire::reactor_mode;
using fusewire::role;
using namespace std::chrono_literals;

namespace {

using env_map = std::map<std::string, std::string, std::less<>>;

fusewire::env_lookup lookup_in(env_map env) {
  return [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

options from(env_map env, role r = role::worker) { return options::from_env(r, lookup_in(std::move(env))); }

std::string env_error(env_map env, role r = role::worker) {
  try {
    (void)from(std::move(env), r);
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_config);
    return e.what();
  }
  return "no exception";
}

std::string validate_error(const options& o) {
  try {
    o.validate();
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_config);
    return e.what();
  }
  return "no exception";
}

constexpr std::string_view suffix = ": invalid configuration";

}  // namespace

TEST_CASE("defaults") {
  const options o;
  CHECK(o.mode == reactor_mode::adaptive);  // busy polling by default would starve oversubscribed hosts
  CHECK(o.idle_poll == 200us);
  CHECK(o.cores == 0);
  CHECK_FALSE(o.pin_cores);
  CHECK_FALSE(o.tensor_fuse);
  CHECK(o.coalesce);
  CHECK(o.acc_size == 8192);
  CHECK(o.fuse_delay == 0us);
  CHECK(o.chunking);
  CHECK(o.chunk_size == 4194304);
  CHECK(o.rdma_enabled);
  CHECK(o.rdma_device == "mlx5_0");
  CHECK(o.rdma_buf_size == 1073741824);
  CHECK(o.pool_size == 67108864);
  CHECK(o.pool_block_size == 65536);
  CHECK(o.connect_timeout == 60000ms);
  CHECK(o.keepalive == 10000ms);
  CHECK(o.cluster_token.empty());
  CHECK(o.max_frame_bytes == 268435456);
  CHECK_NOTHROW(o.validate());
  // Nothing set: the defaults, for both roles.
  CHECK(from({}) == o);
  CHECK(from({}, role::ps) == o);
  CHECK(fusewire::to_string(from({})) == fusewire::to_string(o));
}

TEST_CASE("the knob table lists exactly the variables from_env reads") {
  std::set<std::string> table;
  for (const fusewire::knob& k : fusewire::env_knobs) {
    CHECK(table.insert(std::string(k.name)).second);
    CHECK_FALSE(k.meaning.empty());
  }
  std::map<role, std::set<std::string>> asked;
  for (role r : {role::worker, role::ps}) {
    (void)options::from_env(r, [&](std::string_view name) -> std::optional<std::string> {
      asked[r].insert(std::string(name));
      return std::nullopt;
    });
  }
  std::set<std::string> all = asked[role::worker];
  all.insert(asked[role::ps].begin(), asked[role::ps].end());
  CHECK(all == table);
  for (const std::string& name : asked[role::worker]) CHECK(name.rfind("PS_", 0) != 0);
  for (const std::string& name : asked[role::ps]) CHECK(name.rfind("WORKER_", 0) != 0);
  CHECK(asked[role::worker].count("NETWORK_PS_CORE_NUMBER") == 0);
  CHECK(asked[role::ps].count("NETWORK_WORKER_CORE_NUMBER") == 0);
}

TEST_CASE("each knob's table default, when set explicitly, gives the struct default") {
  for (role r : {role::worker, role::ps}) {
    env_map env;
    for (const fusewire::knob& k : fusewire::env_knobs) {
      if (!k.default_value.empty()) env.emplace(std::string(k.name), std::string(k.default_value));
    }
    CHECK(from(env, r) == options{});
  }
}

TEST_CASE("polling knobs: true polls, false blocks, unset adapts; the role picks the variable") {
  CHECK(from({{"WORKER_ENABLE_POLLING", "True"}}).mode == reactor_mode::poll);
  CHECK(from({{"WORKER_ENABLE_POLLING", "False"}}).mode == reactor_mode::block);
  CHECK(from({{"WORKER_ENABLE_POLLING", "True"}}, role::ps).mode == reactor_mode::adaptive);
  CHECK(from({{"PS_ENABLE_POLLING", "true"}}, role::ps).mode == reactor_mode::poll);
  CHECK(from({{"PS_ENABLE_POLLING", "0"}}, role::ps).mode == reactor_mode::block);
  CHECK(from({{"PS_ENABLE_POLLING", "true"}}).mode == reactor_mode::adaptive);
  // An empty value counts as unset.
  CHECK(from({{"WORKER_ENABLE_POLLING", ""}}).mode == reactor_mode::adaptive);
  // A knob for the other role is not even read, so a bad value there is not our business.
  CHECK(from({{"PS_ENABLE_POLLING", "maybe"}}).mode == reactor_mode::adaptive);
}

TEST_CASE("FUSEWIRE_REACTOR_MODE overrides *_ENABLE_POLLING, in any letter case") {
  CHECK(from({{"WORKER_ENABLE_POLLING", "true"}, {"FUSEWIRE_REACTOR_MODE", "block"}}).mode == reactor_mode::block);
  CHECK(from({{"PS_ENABLE_POLLING", "false"}, {"FUSEWIRE_REACTOR_MODE", "Poll"}}, role::ps).mode == reactor_mode::poll);
  CHECK(from({{"FUSEWIRE_REACTOR_MODE", "ADAPTIVE"}}).mode == reactor_mode::adaptive);
  // The overridden knob is still checked.
  CHECK(env_error({{"WORKER_ENABLE_POLLING", "sure"}, {"FUSEWIRE_REACTOR_MODE", "poll"}}) ==
        std::string("WORKER_ENABLE_POLLING='sure': expected a boolean (true/false, 1/0, yes/no, on/off)") +
            std::string(suffix));
}

TEST_CASE("booleans accept true/false, 1/0, yes/no, on/off in any case") {
  for (const char* t : {"true", "True", "TRUE", "1", "yes", "Yes", "on", "ON"}) {
    CAPTURE(t);
    CHECK(from({{"TENSOR_FUSE", t}}).tensor_fuse);
  }
  for (const char* f : {"false", "False", "FALSE", "0", "no", "NO", "off", "Off"}) {
    CAPTURE(f);
    CHECK_FALSE(from({{"TF_RDMA_ENABLED", f}}).rdma_enabled);
  }
}

TEST_CASE("reactor counts: NETWORK_*_CORE_NUMBER, else min(16, connections), at least 1") {
  const options automatic = from({});
  CHECK(automatic.cores == 0);
  CHECK(automatic.reactor_count(0) == 1);
  CHECK(automatic.reactor_count(1) == 1);
  CHECK(automatic.reactor_count(5) == 5);
  CHECK(automatic.reactor_count(16) == 16);
  CHECK(automatic.reactor_count(1000) == 16);

  const options worker = from({{"NETWORK_WORKER_CORE_NUMBER", "2"}, {"NETWORK_PS_CORE_NUMBER", "8"}});
  CHECK(worker.cores == 2);
  CHECK(worker.reactor_count(100) == 2);
  CHECK(worker.reactor_count(1) == 1);
  const options ps = from({{"NETWORK_WORKER_CORE_NUMBER", "2"}, {"NETWORK_PS_CORE_NUMBER", "8"}}, role::ps);
  CHECK(ps.cores == 8);
  CHECK(ps.reactor_count(100) == 8);
  CHECK(ps.reactor_count(3) == 3);
  CHECK(from({{"NETWORK_PS_CORE_NUMBER", "32"}}, role::ps).reactor_count(64) == 32);
}

TEST_CASE("pinning is off unless *_DISABLE_PIN_CORES is false") {
  CHECK_FALSE(from({}).pin_cores);
  CHECK_FALSE(from({{"WORKER_DISABLE_PIN_CORES", "True"}}).pin_cores);
  CHECK(from({{"WORKER_DISABLE_PIN_CORES", "False"}}).pin_cores);
  CHECK_FALSE(from({{"WORKER_DISABLE_PIN_CORES", "False"}}, role::ps).pin_cores);
  CHECK(from({{"PS_DISABLE_PIN_CORES", "false"}}, role::ps).pin_cores);
}

TEST_CASE("every knob reaches its field") {
  const options o = from({
      {"TENSOR_FUSE", "True"},
      {"TF_RDMA_ENABLED", "false"},
      {"TF_RDMA_DEV_NAME", "mlx4_0"},
      {"TF_RDMA_CHUNK_SIZE", "2097152"},
      {"TF_RDMA_ACC_SIZE", "16384"},
      {"TF_RDMA_BUF_SIZE", "10737418240"},
      {"FUSEWIRE_IDLE_POLL_US", "2000"},
      {"FUSEWIRE_POOL_SIZE", "1048576"},
      {"FUSEWIRE_POOL_BLOCK_SIZE", "4096"},
      {"FUSEWIRE_COALESCE", "off"},
      {"FUSEWIRE_FUSE_DELAY_US", "50"},
      {"FUSEWIRE_CHUNKING", "no"},
      {"FUSEWIRE_CONNECT_TIMEOUT_MS", "0"},
      {"FUSEWIRE_KEEPALIVE_MS", "250"},
      {"FUSEWIRE_CLUSTER_TOKEN", "s3cret token"},
      {"FUSEWIRE_MAX_FRAME_BYTES", "4096"},
      {"FUSEWIRE_INSECURE", "yes"},
      {"FUSEWIRE_HANDSHAKE_TIMEOUT_MS", "1500"},
      {"FUSEWIRE_MAX_PENDING_HANDSHAKES", "64"},
      {"FUSEWIRE_MAX_PENDING_PER_SOURCE", "4"},
      {"FUSEWIRE_MAX_TRANSFER_BYTES", "1048576"},
      {"FUSEWIRE_RECV_BUDGET_BYTES", "8388608"},
      {"FUSEWIRE_RECV_PEER_BUDGET_BYTES", "4194304"},
      {"FUSEWIRE_TRANSFER_IDLE_MS", "2000"},
      {"FUSEWIRE_UNMATCHED_MAX_AGE_MS", "0"},
  });
  CHECK(o.tensor_fuse);
  CHECK_FALSE(o.rdma_enabled);
  CHECK(o.rdma_device == "mlx4_0");
  CHECK(o.chunk_size == 2097152);
  CHECK(o.acc_size == 16384);
  CHECK(o.rdma_buf_size == 10737418240ull);
  CHECK(o.idle_poll == 2000us);
  CHECK(o.pool_size == 1048576);
  CHECK(o.pool_block_size == 4096);
  CHECK_FALSE(o.coalesce);
  CHECK(o.fuse_delay == 50us);
  CHECK_FALSE(o.chunking);
  CHECK(o.connect_timeout == 0ms);
  CHECK(o.keepalive == 250ms);
  CHECK(o.cluster_token == "s3cret token");
  CHECK(o.max_frame_bytes == 4096);
  CHECK(o.insecure);
  CHECK(o.handshake_timeout == 1500ms);
  CHECK(o.max_pending_handshakes == 64);
  CHECK(o.max_pending_per_source == 4);
  CHECK(o.max_transfer_bytes == 1048576);
  CHECK(o.recv_budget == 8388608);
  CHECK(o.recv_peer_budget == 4194304);
  CHECK(o.transfer_idle == 2000ms);
  CHECK(o.unmatched_max_age == 0ms);
  CHECK(fusewire::to_string(o) ==
        "mode=adaptive idle_poll_us=2000 cores=auto pin_cores=false tensor_fuse=true coalesce=false acc_size=16384 "
        "fuse_delay_us=50 chunking=false chunk_size=2097152 rdma=false rdma_device=mlx4_0 "
        "rdma_buf_size=10737418240 pool_size=1048576 pool_block_size=4096 connect_timeout_ms=0 keepalive_ms=250 "
        "cluster_token=set max_frame_bytes=4096 insecure=true handshake_timeout_ms=1500 max_pending_handshakes=64 "
        "max_pending_per_source=4 max_transfer_bytes=1048576 recv_budget=8388608 recv_peer_budget=4194304 "
        "transfer_idle_ms=2000 unmatched_max_age_ms=0 stall_ms=5000 stats_file=unset stats_interval_ms=10000 "
        "stats_format=json trace=unset trace_events=1000000");
}

TEST_CASE("bad environment values: exact messages naming the variable, the value and what is allowed") {
  const std::vector<std::pair<env_map, std::string>> cases = {
      {{{"WORKER_ENABLE_POLLING", "yes please"}},
       "WORKER_ENABLE_POLLING='yes please': expected a boolean (true/false, 1/0, yes/no, on/off)"},
      {{{"TENSOR_FUSE", "2"}}, "TENSOR_FUSE='2': expected a boolean (true/false, 1/0, yes/no, on/off)"},
      {{{"WORKER_DISABLE_PIN_CORES", " true"}},
       "WORKER_DISABLE_PIN_CORES=' true': expected a boolean (true/false, 1/0, yes/no, on/off)"},
      {{{"NETWORK_WORKER_CORE_NUMBER", "-3"}},
       "NETWORK_WORKER_CORE_NUMBER='-3': expected a number of cores (an integer from 1 to 1024)"},
      {{{"NETWORK_WORKER_CORE_NUMBER", "0"}},
       "NETWORK_WORKER_CORE_NUMBER='0': expected a number of cores (an integer from 1 to 1024)"},
      {{{"NETWORK_WORKER_CORE_NUMBER", "4096"}},
       "NETWORK_WORKER_CORE_NUMBER='4096': expected a number of cores (an integer from 1 to 1024)"},
      {{{"NETWORK_WORKER_CORE_NUMBER", "99999999999999999999999"}},
       "NETWORK_WORKER_CORE_NUMBER='99999999999999999999999': expected a number of cores (an integer from 1 to "
       "1024)"},
      {{{"TF_RDMA_CHUNK_SIZE", "4MB"}},
       "TF_RDMA_CHUNK_SIZE='4MB': expected a size in bytes (a positive integer such as 4194304)"},
      {{{"TF_RDMA_CHUNK_SIZE", "0"}},
       "TF_RDMA_CHUNK_SIZE='0': expected a size in bytes (a positive integer such as 4194304)"},
      {{{"TF_RDMA_CHUNK_SIZE", "-3"}},
       "TF_RDMA_CHUNK_SIZE='-3': expected a size in bytes (a positive integer such as 4194304)"},
      {{{"TF_RDMA_CHUNK_SIZE", "+4194304"}},
       "TF_RDMA_CHUNK_SIZE='+4194304': expected a size in bytes (a positive integer such as 4194304)"},
      {{{"TF_RDMA_CHUNK_SIZE", "18446744073709551616"}},
       "TF_RDMA_CHUNK_SIZE='18446744073709551616': too large (at most 18446744073709551615)"},
      {{{"TF_RDMA_ACC_SIZE", "8 KB"}},
       "TF_RDMA_ACC_SIZE='8 KB': expected a size in bytes (a positive integer such as 8192)"},
      {{{"TF_RDMA_BUF_SIZE", "1000000000"}},
       "TF_RDMA_BUF_SIZE='1000000000': expected a positive multiple of 1 GiB in bytes (such as 1073741824 or "
       "10737418240)"},
      {{{"TF_RDMA_BUF_SIZE", "1610612736"}},
       "TF_RDMA_BUF_SIZE='1610612736': expected a positive multiple of 1 GiB in bytes (such as 1073741824 or "
       "10737418240)"},
      {{{"TF_RDMA_BUF_SIZE", "0"}},
       "TF_RDMA_BUF_SIZE='0': expected a positive multiple of 1 GiB in bytes (such as 1073741824 or 10737418240)"},
      {{{"TF_RDMA_BUF_SIZE", "10GB"}},
       "TF_RDMA_BUF_SIZE='10GB': expected a positive multiple of 1 GiB in bytes (such as 1073741824 or 10737418240)"},
      {{{"FUSEWIRE_REACTOR_MODE", "fast"}}, "FUSEWIRE_REACTOR_MODE='fast': expected poll, adaptive or block"},
      {{{"FUSEWIRE_IDLE_POLL_US", "2s"}},
       "FUSEWIRE_IDLE_POLL_US='2s': expected microseconds (an integer from 0 to 1000000)"},
      {{{"FUSEWIRE_IDLE_POLL_US", "1000001"}},
       "FUSEWIRE_IDLE_POLL_US='1000001': expected microseconds (an integer from 0 to 1000000)"},
      {{{"FUSEWIRE_FUSE_DELAY_US", "-1"}},
       "FUSEWIRE_FUSE_DELAY_US='-1': expected microseconds (an integer from 0 to 1000000)"},
      {{{"FUSEWIRE_POOL_SIZE", "64MiB"}},
       "FUSEWIRE_POOL_SIZE='64MiB': expected a size in bytes (a positive integer such as 67108864)"},
      {{{"FUSEWIRE_POOL_BLOCK_SIZE", "3000"}},
       "FUSEWIRE_POOL_BLOCK_SIZE='3000': expected a power of two in bytes from 64 to 1073741824 (such as 65536)"},
      {{{"FUSEWIRE_POOL_BLOCK_SIZE", "32"}},
       "FUSEWIRE_POOL_BLOCK_SIZE='32': expected a power of two in bytes from 64 to 1073741824 (such as 65536)"},
      {{{"FUSEWIRE_POOL_BLOCK_SIZE", "2147483648"}},
       "FUSEWIRE_POOL_BLOCK_SIZE='2147483648': expected a power of two in bytes from 64 to 1073741824 (such as "
       "65536)"},
      {{{"FUSEWIRE_COALESCE", "enabled"}},
       "FUSEWIRE_COALESCE='enabled': expected a boolean (true/false, 1/0, yes/no, on/off)"},
      {{{"FUSEWIRE_CHUNKING", "nope"}},
       "FUSEWIRE_CHUNKING='nope': expected a boolean (true/false, 1/0, yes/no, on/off)"},
      {{{"FUSEWIRE_CONNECT_TIMEOUT_MS", "1e3"}},
       "FUSEWIRE_CONNECT_TIMEOUT_MS='1e3': expected milliseconds (an integer from 0 to 86400000)"},
      {{{"FUSEWIRE_KEEPALIVE_MS", "86400001"}},
       "FUSEWIRE_KEEPALIVE_MS='86400001': expected milliseconds (an integer from 0 to 86400000)"},
      {{{"FUSEWIRE_MAX_FRAME_BYTES", "1024"}},
       "FUSEWIRE_MAX_FRAME_BYTES='1024': expected a size in bytes (an integer of at least 4096, such as 268435456)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.second);
    CHECK(env_error(c.first) == c.second + std::string(suffix));
  }
  CHECK(env_error({{"PS_ENABLE_POLLING", "yes please"}}, role::ps) ==
        "PS_ENABLE_POLLING='yes please': expected a boolean (true/false, 1/0, yes/no, on/off)" + std::string(suffix));
  CHECK(env_error({{"NETWORK_PS_CORE_NUMBER", "eight"}}, role::ps) ==
        "NETWORK_PS_CORE_NUMBER='eight': expected a number of cores (an integer from 1 to 1024)" + std::string(suffix));
}

TEST_CASE("knobs that only make sense together are checked together") {
  CHECK(env_error({{"FUSEWIRE_POOL_SIZE", "100000"}}) ==
        "options.pool_size = 100000 (FUSEWIRE_POOL_SIZE) is not a multiple of options.pool_block_size = 65536 "
        "(FUSEWIRE_POOL_BLOCK_SIZE)" +
            std::string(suffix));
  CHECK(env_error({{"FUSEWIRE_POOL_BLOCK_SIZE", "1073741824"}}) ==
        "options.pool_size = 67108864 (FUSEWIRE_POOL_SIZE) is not a multiple of options.pool_block_size = "
        "1073741824 (FUSEWIRE_POOL_BLOCK_SIZE)" +
            std::string(suffix));
  CHECK(env_error({{"FUSEWIRE_MAX_FRAME_BYTES", "1048576"}}) ==
        "options.chunk_size = 4194304 (TF_RDMA_CHUNK_SIZE) exceeds options.max_frame_bytes = 1048576 "
        "(FUSEWIRE_MAX_FRAME_BYTES): a chunk must fit in one frame" +
            std::string(suffix));
  // Without chunking, the chunk size does not matter.
  CHECK(from({{"FUSEWIRE_MAX_FRAME_BYTES", "1048576"}, {"FUSEWIRE_CHUNKING", "false"}}).max_frame_bytes == 1048576);
  CHECK(
      env_error({{"FUSEWIRE_MAX_FRAME_BYTES", "4096"}, {"FUSEWIRE_CHUNKING", "false"}, {"TF_RDMA_ACC_SIZE", "8192"}}) ==
      "options.acc_size = 8192 (TF_RDMA_ACC_SIZE) exceeds options.max_frame_bytes = 4096 "
      "(FUSEWIRE_MAX_FRAME_BYTES): a coalesced batch must fit in one frame" +
          std::string(suffix));
}

TEST_CASE("validate() names the field, its value and its variable") {
  options o;
  o.chunk_size = 0;
  CHECK(validate_error(o) ==
        "options.chunk_size = 0 (TF_RDMA_CHUNK_SIZE): expected a size in bytes (a positive "
        "integer such as 4194304)" +
            std::string(suffix));
  o = options{};
  o.rdma_buf_size = 3ull << 29;
  CHECK(validate_error(o) ==
        "options.rdma_buf_size = 1610612736 (TF_RDMA_BUF_SIZE): expected a positive multiple "
        "of 1 GiB in bytes (such as 1073741824 or 10737418240)" +
            std::string(suffix));
  o = options{};
  o.cores = 5000;
  CHECK(validate_error(o) ==
        "options.cores = 5000 (NETWORK_WORKER_CORE_NUMBER or NETWORK_PS_CORE_NUMBER): "
        "expected 0 (automatic) or a number of cores from 1 to 1024" +
            std::string(suffix));
  o = options{};
  o.idle_poll = -1us;
  CHECK(validate_error(o) ==
        "options.idle_poll = -1 (FUSEWIRE_IDLE_POLL_US): expected microseconds (an integer "
        "from 0 to 1000000)" +
            std::string(suffix));
  o = options{};
  o.keepalive = -5ms;
  CHECK(validate_error(o) ==
        "options.keepalive = -5 (FUSEWIRE_KEEPALIVE_MS): expected milliseconds (an integer "
        "from 0 to 86400000)" +
            std::string(suffix));
  o = options{};
  o.rdma_device.clear();
  CHECK(validate_error(o) ==
        "options.rdma_device = '' (TF_RDMA_DEV_NAME): expected an RDMA device name such as "
        "mlx5_0" +
            std::string(suffix));
  o = options{};
  o.mode = static_cast<reactor_mode>(9);
  CHECK(validate_error(o) ==
        "options.mode = 9 (FUSEWIRE_REACTOR_MODE): expected poll, adaptive or block" + std::string(suffix));
  o = options{};
  o.pool_block_size = 100;
  CHECK(validate_error(o) ==
        "options.pool_block_size = 100 (FUSEWIRE_POOL_BLOCK_SIZE): expected a power of two "
        "in bytes from 64 to 1073741824 (such as 65536)" +
            std::string(suffix));
}

TEST_CASE("names of roles and modes") {
  CHECK(fusewire::to_string(role::ps) == "ps");
  CHECK(fusewire::to_string(role::worker) == "worker");
  CHECK(fusewire::to_string(reactor_mode::poll) == "poll");
  CHECK(fusewire::reactor_mode_from_string("Block") == reactor_mode::block);
  CHECK_FALSE(fusewire::reactor_mode_from_string("spin").has_value());
  CHECK(fusewire::to_string(options{}).find("cluster_token=unset") != std::string::npos);
}

TEST_CASE("from_env(role) reads the process environment") {
  ::setenv("FUSEWIRE_KEEPALIVE_MS", "1234", 1);
  const options o = options::from_env(role::worker);
  ::unsetenv("FUSEWIRE_KEEPALIVE_MS");
  CHECK(o.keepalive == 1234ms);
}

TEST_CASE("observability knobs: stall threshold and counter dumps reach their fields and are checked") {
  const options o = from({{"FUSEWIRE_STALL_MS", "0"},
                          {"FUSEWIRE_STATS_FILE", "/tmp/fw.prom"},
                          {"FUSEWIRE_STATS_INTERVAL_MS", "100"},
                          {"FUSEWIRE_STATS_FORMAT", "prometheus"},
                          {"FUSEWIRE_TRACE", "/tmp/{task}.json"},
                          {"FUSEWIRE_TRACE_EVENTS", "5000"}});
  CHECK(o.stall_report == 0ms);
  CHECK(o.stats_file == "/tmp/fw.prom");
  CHECK(o.stats_interval == 100ms);
  CHECK(o.stats_format == "prometheus");
  CHECK(o.trace_file == "/tmp/{task}.json");
  CHECK(o.trace_events == 5000);
  CHECK(fusewire::to_string(o).ends_with(
      "stall_ms=0 stats_file=/tmp/fw.prom stats_interval_ms=100 stats_format=prometheus trace=/tmp/{task}.json "
      "trace_events=5000"));
  CHECK(env_error({{"FUSEWIRE_STALL_MS", "5s"}}) ==
        "FUSEWIRE_STALL_MS='5s': expected milliseconds (an integer from 0 to 86400000)" + std::string(suffix));
  CHECK(env_error({{"FUSEWIRE_STATS_INTERVAL_MS", "10"}}) ==
        "FUSEWIRE_STATS_INTERVAL_MS='10': expected milliseconds (an integer from 100 to 86400000)" +
            std::string(suffix));
  CHECK(env_error({{"FUSEWIRE_TRACE_EVENTS", "10"}}) ==
        "FUSEWIRE_TRACE_EVENTS='10': expected a number of spans (an integer from 1000 to 100000000)" +
            std::string(suffix));
  CHECK(env_error({{"FUSEWIRE_STATS_FORMAT", "csv"}}) ==
        "FUSEWIRE_STATS_FORMAT='csv': expected json or prometheus" + std::string(suffix));
  options bad;
  bad.stats_format = "xml";
  CHECK(validate_error(bad) ==
        "options.stats_format = 'xml' (FUSEWIRE_STATS_FORMAT): expected json or prometheus" + std::string(suffix));
  bad = options{};
  bad.stall_report = -1ms;
  CHECK(validate_error(bad) ==
        "options.stall_report = -1 (FUSEWIRE_STALL_MS): expected milliseconds (an integer "
        "from 0 to 86400000)" +
            std::string(suffix));
}
