// Every environment knob does something, and every variable fusewire reads is
// documented. Walks the knob table of docs/configuration.md and
// fusewire::env_knobs, and fails on:
// - a knob in one of them but not the other;
// - a knob options::from_env does not read, or a variable it reads that is no knob;
// - a knob whose options field no code outside options.hpp reads (the
//   `consumers` table below names the line that does; it must be in the header);
// - a variable that a header reads (getenv, an env_lookup, from_env's readers)
//   that docs/configuration.md does not name.
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/transport/verbs/config.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read_source(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string read_repo(const std::string& path) { return read_source(fs::path(FUSEWIRE_SOURCE_DIR) / path); }

/// Runs of white space as one space, so a snippet matches however clang-format wraps it.
std::string squeeze(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

struct doc_row {
  std::string name;
  std::string field;
};

/// The rows of the table under "## Environment knobs" in docs/configuration.md.
std::vector<doc_row> knob_table() {
  const std::string doc = read_repo("docs/configuration.md");
  const auto start = doc.find("\n## Environment knobs");
  REQUIRE_MESSAGE(start != std::string::npos, "docs/configuration.md has no '## Environment knobs' section");
  const auto end = doc.find("\n## ", start + 1);
  std::istringstream lines(doc.substr(start, end - start));
  std::vector<doc_row> rows;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::size_t at = 1;
    while (at < line.size()) {
      const auto bar = line.find('|', at);
      if (bar == std::string::npos) break;
      std::string cell = line.substr(at, bar - at);
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
      at = bar + 1;
    }
    REQUIRE_MESSAGE(cells.size() >= 4, "docs/configuration.md: a knob row with fewer than 4 cells: " << line);
    auto unquote = [](std::string s) {
      if (s.size() >= 2 && s.front() == '`' && s.back() == '`') s = s.substr(1, s.size() - 2);
      return s;
    };
    rows.push_back({unquote(cells[0]), unquote(cells[2])});
  }
  return rows;
}

std::set<std::string> code_knobs() {
  std::set<std::string> out;
  for (const auto& k : fusewire::env_knobs) out.emplace(k.name);
  return out;
}

/// An env_lookup that finds only `set` and records every name asked for.
struct recording_env {
  std::map<std::string, std::string, std::less<>> set;
  std::set<std::string> asked;
  fusewire::env_lookup lookup() {
    return [this](std::string_view name) -> std::optional<std::string> {
      asked.emplace(name);
      auto it = set.find(name);
      if (it == set.end()) return std::nullopt;
      return it->second;
    };
  }
};

/// Which code reads each knob's options field (outside options.hpp, which
/// only parses it). A new knob needs a line here: the header and a piece of
/// the code that acts on the field (white space does not matter).
struct consumer {
  std::string_view knob;
  std::string_view header;
  std::string_view code;
};

constexpr std::string_view reactor_cfg = "include/fusewire/reactor/reactor_config.hpp";
constexpr std::string_view send_path = "include/fusewire/rendezvous/detail/send_path.hpp";
constexpr std::string_view recv_budget = "include/fusewire/rendezvous/detail/recv_budget.hpp";
constexpr std::string_view accept = "include/fusewire/rendezvous/detail/accept.hpp";
constexpr std::string_view shard = "include/fusewire/rendezvous/detail/shard.hpp";
constexpr std::string_view verbs_cfg = "include/fusewire/transport/verbs/config.hpp";
constexpr std::string_view observe = "include/fusewire/rendezvous/detail/observe.hpp";

constexpr consumer consumers[] = {
    {"WORKER_ENABLE_POLLING", reactor_cfg, "cfg.mode = o.mode;"},
    {"PS_ENABLE_POLLING", reactor_cfg, "cfg.mode = o.mode;"},
    {"FUSEWIRE_REACTOR_MODE", reactor_cfg, "cfg.mode = o.mode;"},
    {"FUSEWIRE_IDLE_POLL_US", reactor_cfg, "cfg.idle_poll = o.idle_poll;"},
    {"NETWORK_WORKER_CORE_NUMBER", "include/fusewire/rendezvous/detail/dispatch.hpp", "std::max(1u, opts_.cores)"},
    {"NETWORK_PS_CORE_NUMBER", "include/fusewire/rendezvous/detail/dispatch.hpp", "std::max(1u, opts_.cores)"},
    {"WORKER_DISABLE_PIN_CORES", reactor_cfg, "cfg.pin_cores = o.pin_cores;"},
    {"PS_DISABLE_PIN_CORES", reactor_cfg, "cfg.pin_cores = o.pin_cores;"},
    {"TENSOR_FUSE", "include/fusewire/graph/partition_plan.hpp", "p.tensor_fuse = o.tensor_fuse;"},
    {"TF_RDMA_ENABLED", "include/fusewire/transport/select.hpp", "if (o.rdma_enabled) {"},
    {"TF_RDMA_DEV_NAME", verbs_cfg, "c.device = o.rdma_device;"},
    {"TF_RDMA_CHUNK_SIZE", send_path, "ep_.opts_.chunking && n > ep_.opts_.chunk_size"},
    {"TF_RDMA_ACC_SIZE", send_path, "ep_.opts_.coalesce && n <= ep_.opts_.acc_size"},
    {"TF_RDMA_BUF_SIZE", verbs_cfg, "c.registered_limit = o.rdma_buf_size;"},
    {"FUSEWIRE_POOL_SIZE", shard, "o.pool_size / shards"},
    {"FUSEWIRE_POOL_BLOCK_SIZE", "include/fusewire/core/buffer_pool.hpp", "c.block_size = o.pool_block_size;"},
    {"FUSEWIRE_COALESCE", send_path, "ep_.opts_.coalesce && n <= ep_.opts_.acc_size"},
    {"FUSEWIRE_FUSE_DELAY_US", send_path, "reactor_->run_after(ep_.opts_.fuse_delay"},
    {"FUSEWIRE_CHUNKING", send_path, "ep_.opts_.chunking && n > ep_.opts_.chunk_size"},
    {"FUSEWIRE_CONNECT_TIMEOUT_MS", "include/fusewire/rendezvous/detail/connect.hpp",
     "const auto limit = ep_.opts_.connect_timeout;"},
    {"FUSEWIRE_KEEPALIVE_MS", "include/fusewire/rendezvous/detail/keepalive.hpp",
     "const auto k = ep_.opts_.keepalive;"},
    {"FUSEWIRE_CLUSTER_TOKEN", shard, "identity_.token = ep.opts_.cluster_token;"},
    {"FUSEWIRE_CLUSTER_TOKEN_FILE", shard, "identity_.token = ep.opts_.cluster_token;"},
    {"FUSEWIRE_INSECURE", "include/fusewire/core/security.hpp", "if (!o.insecure) {"},
    {"FUSEWIRE_HANDSHAKE_TIMEOUT_MS", "include/fusewire/rendezvous/detail/connect.hpp",
     "ep_.opts_.handshake_timeout, [this"},
    {"FUSEWIRE_MAX_PENDING_HANDSHAKES", accept, "handshaking_.size() >= o.max_pending_handshakes"},
    {"FUSEWIRE_MAX_PENDING_PER_SOURCE", accept, "from_source >= o.max_pending_per_source"},
    {"FUSEWIRE_MAX_FRAME_BYTES", shard, "protocol::limits_for(ep.opts_.max_frame_bytes, ep.opts_.max_transfer_bytes)"},
    {"FUSEWIRE_MAX_TRANSFER_BYTES", shard,
     "protocol::limits_for(ep.opts_.max_frame_bytes, ep.opts_.max_transfer_bytes)"},
    {"FUSEWIRE_RECV_BUDGET_BYTES", recv_budget, "total + n <= o.recv_budget"},
    {"FUSEWIRE_RECV_PEER_BUDGET_BYTES", recv_budget, "a.held + n > o.recv_peer_budget"},
    {"FUSEWIRE_TRANSFER_IDLE_MS", recv_budget, "if (o.transfer_idle.count() != 0)"},
    {"FUSEWIRE_UNMATCHED_MAX_AGE_MS", recv_budget, "const auto age = ep_.opts_.unmatched_max_age;"},
    {"FUSEWIRE_STALL_MS", observe, "const auto threshold = ep_.opts_.stall_report;"},
    {"FUSEWIRE_STATS_FILE", "include/fusewire/rendezvous/endpoint.hpp", "if (!opts_.stats_file.empty())"},
    {"FUSEWIRE_STATS_INTERVAL_MS", observe, "reactor_->run_after(ep_.opts_.stats_interval,"},
    {"FUSEWIRE_STATS_FORMAT", observe, "if (opts_.stats_format == \"prometheus\") {"},
    {"FUSEWIRE_TRACE", shard, "tracing_(observe_enabled && !ep.opts_.trace_file.empty())"},
    {"FUSEWIRE_TRACE_EVENTS", shard, "ep.opts_.trace_events / ep.shards_"},
};

}  // namespace

TEST_CASE("the knob table of docs/configuration.md and env_knobs name the same variables") {
  const std::set<std::string> code = code_knobs();
  std::set<std::string> doc;
  for (const doc_row& r : knob_table()) {
    CAPTURE(r.name);
    CHECK_MESSAGE(doc.insert(r.name).second, "docs/configuration.md lists " << r.name << " twice");
    CHECK_MESSAGE(code.count(r.name) == 1,
                  "docs/configuration.md documents " << r.name << ", which fusewire::env_knobs does not list");
  }
  for (const std::string& name : code) {
    CHECK_MESSAGE(doc.count(name) == 1, "env_knobs lists " << name << ", which docs/configuration.md's table lacks");
  }
}

TEST_CASE("options::from_env reads every knob, and only knobs") {
  recording_env env;
  (void)fusewire::options::from_env(fusewire::role::worker, env.lookup());
  (void)fusewire::options::from_env(fusewire::role::ps, env.lookup());
  const std::set<std::string> code = code_knobs();
  for (const std::string& name : code) {
    CHECK_MESSAGE(env.asked.count(name) == 1, name << " is in env_knobs but options::from_env never reads it");
  }
  for (const std::string& name : env.asked) {
    CHECK_MESSAGE(code.count(name) == 1, "options::from_env reads " << name << ", which env_knobs does not list");
  }
}

TEST_CASE("every knob's options field is read by code that acts on it") {
  std::map<std::string, std::string> field_of;
  for (const doc_row& r : knob_table()) field_of[r.name] = r.field;
  std::map<std::string, std::string> texts;
  for (const auto& k : fusewire::env_knobs) {
    const std::string name(k.name);
    CAPTURE(name);
    const consumer* c = nullptr;
    for (const consumer& each : consumers) {
      if (each.knob == k.name) c = &each;
    }
    REQUIRE_MESSAGE(c != nullptr, name << ": no code is known to read it; add the line that acts on options::"
                                       << field_of[name] << " to `consumers` in tests/unit/docs/knobs.cpp "
                                       << "(or remove the knob)");
    CHECK_MESSAGE(c->header != "include/fusewire/core/options.hpp",
                  name << ": options.hpp only parses the knob; name the code that uses it");
    const std::string header(c->header);
    if (!texts.count(header)) texts[header] = squeeze(read_repo(header));
    const std::string code = squeeze(c->code);
    CHECK_MESSAGE(texts[header].find(code) != std::string::npos,
                  name << ": " << header << " no longer contains `" << code << "`");
    // The table's field column names the field that code reads.
    REQUIRE_MESSAGE(field_of.count(name) == 1, name << " has no row in docs/configuration.md");
    CHECK_MESSAGE(code.find("." + field_of[name]) != std::string::npos,
                  name << ": docs/configuration.md says it sets options::" << field_of[name] << ", but `" << code
                       << "` does not read that field");
  }
}

TEST_CASE("every variable fusewire reads is documented in docs/configuration.md") {
  const std::string doc = read_repo("docs/configuration.md");
  auto documented = [&](const std::string& name) { return doc.find("`" + name + "`") != std::string::npos; };

  // What the configuration entry points ask for, at run time.
  recording_env env;
  env.set["TF_CONFIG"] = R"({"cluster": {"worker": ["localhost:2222"]}})";
  (void)fusewire::options::from_env(fusewire::role::worker, env.lookup());
  (void)fusewire::options::from_env(fusewire::role::ps, env.lookup());
  (void)fusewire::cluster_spec::from_env(env.lookup());
  (void)fusewire::cluster_spec::from_string_or_env("worker=localhost:2222", env.lookup());
  (void)fusewire::verbs_config::from_env(env.lookup());
  CHECK(env.asked.count("TF_SEASTAR_ENDPOINT_MAP_PATH") == 1);
  for (const std::string& name : env.asked) {
    CHECK_MESSAGE(documented(name), "fusewire reads " << name << " but docs/configuration.md does not name it");
  }

  // What any header reads: getenv("X") and the env readers' literal names.
  const std::regex read_call(
      R"re(\b(getenv|lookup|get|set|read_bool|read_size|read_millis|is_set)\("([A-Z][A-Z0-9_]+)")re");
  std::set<std::string> in_headers;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(FUSEWIRE_SOURCE_DIR) / "include")) {
    if (!entry.is_regular_file() || entry.path().extension() != ".hpp") continue;
    const std::string text = read_source(entry.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), read_call); it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[2];
      CHECK_MESSAGE(documented(name), entry.path().string()
                                          << " reads " << name << ", which docs/configuration.md does not name");
      in_headers.insert(name);
    }
  }
  CHECK(in_headers.count("TF_CONFIG") == 1);  // the scan finds what it should
  CHECK(in_headers.count("TENSOR_FUSE") == 1);
}
