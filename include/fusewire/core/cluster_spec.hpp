#pragma once
/// cluster_spec: the tasks of a training job (by job name: "ps", "worker",
/// "chief", ...), their control endpoints, which task this process is, and the
/// optional `.endpoint_map` that gives each task a separate fast-path endpoint.
///
/// Sources: TF_CONFIG JSON, a "ps=h:p,h:p;worker=h:p" string, or add_job().
/// Every parse error throws system_error(errc::invalid_config) whose what()
/// says where the bad value is (variable, file:line, list index) and what is allowed.

#include <cerrno>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <fusewire/util/text.hpp>
#include <fusewire/core/env.hpp>
#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {

/// A host and port. An IPv6 host is stored without brackets and printed with them.
struct net_address {
  std::string host;
  std::uint16_t port = 0;

  /// Parses "host:port" or "[v6addr]:port"; throws system_error(errc::invalid_config).
  static net_address parse(std::string_view text);
  /// parse() that sets errc::invalid_config instead of throwing.
  static net_address parse(std::string_view text, std::error_code& ec) noexcept;

  /// "host:port", or "[host]:port" when the host contains ':'.
  std::string to_string() const {
    std::string out;
    if (host.find(':') != std::string::npos) {
      out += '[';
      out += host;
      out += ']';
    } else {
      out += host;
    }
    out += ':';
    out += std::to_string(port);
    return out;
  }

  /// Hosts compare without regard to letter case (DNS names are case-insensitive).
  friend bool operator==(const net_address& a, const net_address& b) noexcept {
    return a.port == b.port && util::iequals(a.host, b.host);
  }
};

/// A task of the cluster: job name and index, printed "worker:1".
struct task_id {
  std::string job;
  std::uint32_t index = 0;

  std::string to_string() const { return job + ":" + std::to_string(index); }

  /// Parses "job:index"; throws system_error(errc::invalid_config).
  static task_id parse(std::string_view text);

  friend bool operator==(const task_id&, const task_id&) = default;
  friend std::strong_ordering operator<=>(const task_id&, const task_id&) = default;
};

namespace detail {

/// Why an endpoint failed to parse: the text is not shaped like host:port, or its port is bad.
enum class endpoint_problem : std::uint8_t { none, shape, port };

struct endpoint_parse_result {
  endpoint_problem problem = endpoint_problem::none;
  std::string message;  // "expected host:port, got 'x'" / "bad port 'x' in 'h:x' (expected ...)"
};

constexpr bool is_host_char(char c) noexcept {
  return !util::is_space(c) && c != '=' && c != ',' && c != ';' && c != '#' && c != '[' && c != ']' && c != '/' &&
         c != '"' && c != '\'' && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
}

inline endpoint_parse_result parse_endpoint(std::string_view text, net_address& out) {
  auto shape = [&](std::string_view hint = {}) {
    return endpoint_parse_result{endpoint_problem::shape,
                                 "expected host:port" + std::string(hint) + ", got " + util::quoted(text)};
  };
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return shape();
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.size() < 2 || rest.front() != ':') return shape();
    port_text = rest.substr(1);
    if (host.empty() || host.find(':') == std::string_view::npos) return shape();
    for (char c : host) {
      if (!is_host_char(c)) return shape();
    }
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return shape();
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.empty() || port_text.empty()) return shape();
    if (host.find(':') != std::string_view::npos) {
      return shape(" with an IPv6 host in brackets (such as [::1]:2222)");
    }
    for (char c : host) {
      if (!is_host_char(c)) return shape();
    }
  }
  std::uint64_t port = 0;
  if (util::parse_uint(port_text, port) != util::uint_parse::ok || port == 0 || port > 65535) {
    return {endpoint_problem::port, "bad port " + util::quoted(port_text) + " in " + util::quoted(text) +
                                        " (expected an integer from 1 to 65535)"};
  }
  out.host = std::string(host);
  out.port = static_cast<std::uint16_t>(port);
  return {};
}

/// Empty if `name` can name a job; otherwise why not.
inline std::string job_name_problem(std::string_view name) {
  bool ok = !name.empty();
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || util::is_digit(c) || c == '_' || c == '-')) ok = false;
  }
  if (ok) return {};
  return "job name " + util::quoted(name) + " must be one or more letters, digits, '_' or '-'";
}

/// "worker 1", as people say it.
inline std::string spoken(const task_id& t) { return t.job + " " + std::to_string(t.index); }

/// Case-insensitive map key of an endpoint.
inline std::string endpoint_key(const net_address& e) { return util::to_lower(e.to_string()); }

}  // namespace detail

inline net_address net_address::parse(std::string_view text) {
  net_address out;
  detail::endpoint_parse_result r = detail::parse_endpoint(text, out);
  if (r.problem != detail::endpoint_problem::none) throw_error(errc::invalid_config, r.message);
  return out;
}

inline net_address net_address::parse(std::string_view text, std::error_code& ec) noexcept {
  ec.clear();
  try {
    net_address out;
    if (detail::parse_endpoint(text, out).problem == detail::endpoint_problem::none) return out;
  } catch (...) {  // std::bad_alloc building a message
  }
  ec = errc::invalid_config;
  return {};
}

inline task_id task_id::parse(std::string_view text) {
  auto fail = [&]() -> task_id {
    throw_error(errc::invalid_config, "task id " + util::quoted(text) + ": expected job:index (such as worker:0)");
  };
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return fail();
  const std::string_view job = text.substr(0, colon);
  std::uint64_t index = 0;
  if (!detail::job_name_problem(job).empty()) return fail();
  if (util::parse_uint(text.substr(colon + 1), index) != util::uint_parse::ok || index > UINT32_MAX) {
    return fail();
  }
  return {std::string(job), static_cast<std::uint32_t>(index)};
}

/// The jobs and tasks of a training cluster; see the file comment.
class cluster_spec {
 public:
  /// An empty cluster.
  cluster_spec() = default;

  /// From TF_CONFIG-style JSON:
  /// {"cluster": {"ps": ["h:p", ...], "worker": [...]}, "task": {"type": "worker", "index": 0}}.
  /// "task" is optional (then self() is empty); "index" defaults to 0; other keys are ignored.
  static cluster_spec from_tf_config(std::string_view json);

  /// from_tf_config($TF_CONFIG), then load_endpoint_map_from_env().
  /// Throws system_error(errc::invalid_config) when TF_CONFIG is unset.
  static cluster_spec from_env(const env_lookup& lookup = process_env());

  /// From "ps=h:p,h:p;worker=h:p" (jobs separated by ';', tasks by ','; spaces allowed).
  /// Parses only: no endpoint map (see from_string_or_env).
  static cluster_spec from_string(std::string_view text);

  /// The cluster a program's --cluster option gives: from_string(text), or
  /// from $TF_CONFIG as from_env() when `text` is empty; then, either way,
  /// load_endpoint_map_from_env(). What every --cluster should use, so that
  /// an .endpoint_map applies however the cluster is given.
  static cluster_spec from_string_or_env(std::string_view text, const env_lookup& lookup = process_env());

  /// Adds job `name` with `tasks` (task i at tasks[i]). Throws
  /// system_error(errc::invalid_config) for a bad or repeated job name, an
  /// empty host or port 0, or an endpoint another task already uses.
  void add_job(std::string_view name, std::vector<net_address> tasks) { add_job_checked(name, std::move(tasks), ""); }

  /// Job names, sorted.
  std::vector<std::string> job_names() const {
    std::vector<std::string> out;
    for (const auto& [name, tasks] : jobs_) out.push_back(name);
    return out;
  }

  bool has_job(std::string_view name) const { return jobs_.find(name) != jobs_.end(); }

  /// Control endpoints of job `name`'s tasks, by index; empty if there is no such job.
  std::span<const net_address> job(std::string_view name) const {
    auto it = jobs_.find(name);
    if (it == jobs_.end()) return {};
    return it->second;
  }

  bool contains(const task_id& t) const {
    auto it = jobs_.find(t.job);
    return it != jobs_.end() && t.index < it->second.size();
  }

  /// Number of tasks in all jobs; constant time (the endpoint asks on every operation).
  std::size_t size() const noexcept { return task_count_; }

  bool empty() const noexcept { return size() == 0; }

  /// Every task, by job name then index.
  std::vector<task_id> tasks() const {
    std::vector<task_id> out;
    for (const auto& [name, list] : jobs_) {
      for (std::size_t i = 0; i < list.size(); ++i) out.push_back({name, static_cast<std::uint32_t>(i)});
    }
    return out;
  }

  /// The task's control (e.g. gRPC) endpoint. Throws system_error(errc::invalid_argument)
  /// naming the task if the cluster has no such task.
  const net_address& control_endpoint(const task_id& t) const {
    auto it = jobs_.find(t.job);
    if (it == jobs_.end()) {
      throw_error(errc::invalid_argument,
                  "cluster spec has no job " + util::quoted(t.job) + " (jobs: " + job_list() + ")");
    }
    if (t.index >= it->second.size()) {
      throw_error(errc::invalid_argument, "cluster spec has no task " + t.to_string() + " (job " + util::quoted(t.job) +
                                              " has " + std::to_string(it->second.size()) + " tasks)");
    }
    return it->second[t.index];
  }

  /// Where the fast path (tensor traffic) reaches task `t`: its .endpoint_map
  /// entry if a map is loaded, else its control endpoint. Throws system_error:
  /// errc::invalid_argument if there is no such task, errc::invalid_config if
  /// the loaded map has no entry for it.
  net_address fast_path_endpoint(const task_id& t) const {
    const net_address& control = control_endpoint(t);
    if (!map_file_) return control;
    auto it = fast_path_.find(detail::endpoint_key(control));
    if (it == fast_path_.end()) throw_error(errc::invalid_config, missing_entry(t, control));
    return it->second;
  }

  /// The task this process is, if known.
  const std::optional<task_id>& self() const noexcept { return self_; }

  /// Declares which task this process is; throws system_error(errc::invalid_argument)
  /// if the cluster has no such task.
  void set_self(task_id t) {
    (void)control_endpoint(t);
    self_ = std::move(t);
  }

  /// Reads an endpoint map: lines "control_host:port=fast_host:port"; blank
  /// lines, '#' comments and spaces around the parts are fine. Every task of
  /// the cluster must have an entry (extra entries are ignored). Replaces any
  /// map loaded before. Throws system_error(errc::invalid_config) naming the
  /// file (and line, or the task without an entry).
  void load_endpoint_map(const std::filesystem::path& file) { load_map(file, ""); }

  /// Where the seeds look for the map: $TF_SEASTAR_ENDPOINT_MAP_PATH/.endpoint_map,
  /// else .endpoint_map in the working directory.
  static std::filesystem::path endpoint_map_path(const env_lookup& lookup = process_env()) {
    if (auto dir = lookup("TF_SEASTAR_ENDPOINT_MAP_PATH"); dir && !dir->empty()) {
      return std::filesystem::path(*dir) / ".endpoint_map";
    }
    return ".endpoint_map";
  }

  /// Loads endpoint_map_path(): required when TF_SEASTAR_ENDPOINT_MAP_PATH is
  /// set, optional otherwise. Returns whether a map was loaded.
  bool load_endpoint_map_from_env(const env_lookup& lookup = process_env()) {
    const std::filesystem::path file = endpoint_map_path(lookup);
    if (auto dir = lookup("TF_SEASTAR_ENDPOINT_MAP_PATH"); dir && !dir->empty()) {
      load_map(file, " (from TF_SEASTAR_ENDPOINT_MAP_PATH)");
      return true;
    }
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) return false;
    load_map(file, "");
    return true;
  }

  bool has_endpoint_map() const noexcept { return map_file_.has_value(); }

  /// The loaded map's path as given, or nullopt.
  const std::optional<std::string>& endpoint_map_file() const noexcept { return map_file_; }

  /// "ps=h:p,h:p;worker=h:p", jobs sorted; from_string() reads it back.
  std::string to_string() const {
    std::string out;
    for (const auto& [name, list] : jobs_) {
      if (!out.empty()) out += ';';
      out += name;
      out += '=';
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (i != 0) out += ',';
        out += list[i].to_string();
      }
    }
    return out;
  }

 private:
  [[noreturn]] static void fail(std::string_view prefix, const std::string& what) {
    throw_error(errc::invalid_config, std::string(prefix) + what);
  }

  std::string job_list() const {
    std::string out;
    for (const auto& [name, tasks] : jobs_) {
      if (!out.empty()) out += ", ";
      out += name;
    }
    return out.empty() ? std::string("none") : out;
  }

  std::string missing_entry(const task_id& t, const net_address& control) const {
    return *map_file_ + " has no entry for " + detail::spoken(t) + " (" + control.to_string() + ")";
  }

  void add_job_checked(std::string_view name, std::vector<net_address> list, std::string_view prefix) {
    if (std::string problem = detail::job_name_problem(name); !problem.empty()) fail(prefix, problem);
    if (has_job(name)) fail(prefix, "job " + util::quoted(name) + " is listed twice");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const task_id t{std::string(name), static_cast<std::uint32_t>(i)};
      net_address check;
      if (list[i].port == 0 ||
          detail::parse_endpoint(list[i].to_string(), check).problem != detail::endpoint_problem::none) {
        fail(prefix, detail::spoken(t) + " has no valid address (got " + util::quoted(list[i].to_string()) + ")");
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (list[j] == list[i]) {
          fail(prefix, detail::spoken({t.job, static_cast<std::uint32_t>(j)}) + " and " + detail::spoken(t) +
                           " both use " + list[i].to_string());
        }
      }
      for (const auto& [other, tasks] : jobs_) {
        for (std::size_t j = 0; j < tasks.size(); ++j) {
          if (tasks[j] == list[i]) {
            fail(prefix, detail::spoken({other, static_cast<std::uint32_t>(j)}) + " and " + detail::spoken(t) +
                             " both use " + list[i].to_string());
          }
        }
      }
    }
    const std::size_t added = list.size();
    jobs_.emplace(std::string(name), std::move(list));
    task_count_ += added;
  }

  static std::string read_file(const std::filesystem::path& file, std::string_view source) {
    const std::string shown = file.string();
    std::FILE* f = std::fopen(shown.c_str(), "rb");
    if (f == nullptr) {
      const int err = errno;
      throw_error(errc::invalid_config, "cannot read endpoint map " + util::quoted(shown) + std::string(source) + ": " +
                                            std::generic_category().message(err));
    }
    std::string content;
    char chunk[4096];
    std::size_t n = 0;
    while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) content.append(chunk, n);
    const bool failed = std::ferror(f) != 0;
    const int err = errno;
    std::fclose(f);
    if (failed) {
      throw_error(errc::invalid_config, "cannot read endpoint map " + util::quoted(shown) + std::string(source) + ": " +
                                            std::generic_category().message(err));
    }
    return content;
  }

  void load_map(const std::filesystem::path& file, std::string_view source) {
    const std::string shown = file.string();
    const std::string content = read_file(file, source);
    std::map<std::string, std::pair<net_address, std::size_t>> entries;
    std::size_t line_no = 0;
    std::string_view rest = content;
    while (!rest.empty()) {
      ++line_no;
      const std::size_t eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view{} : rest.substr(eol + 1);
      if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
      line = util::trim(line);
      if (line.empty()) continue;
      const std::string where = shown + ":" + std::to_string(line_no) + ": ";
      const std::size_t eq = line.find('=');
      const auto bad_shape = [&] {
        throw_error(errc::invalid_config, where + "expected host:port=host:port, got " + util::quoted(line));
      };
      if (eq == std::string_view::npos || line.find('=', eq + 1) != std::string_view::npos) bad_shape();
      net_address sides[2];
      const std::string_view texts[2] = {util::trim(line.substr(0, eq)), util::trim(line.substr(eq + 1))};
      for (int i = 0; i < 2; ++i) {
        detail::endpoint_parse_result r = detail::parse_endpoint(texts[i], sides[i]);
        if (r.problem == detail::endpoint_problem::shape) bad_shape();
        if (r.problem == detail::endpoint_problem::port) throw_error(errc::invalid_config, where + r.message);
      }
      auto [it, inserted] = entries.emplace(detail::endpoint_key(sides[0]), std::pair{sides[1], line_no});
      if (!inserted) {
        throw_error(errc::invalid_config, where + sides[0].to_string() + " is mapped twice (first on line " +
                                              std::to_string(it->second.second) + ")");
      }
    }
    for (const task_id& t : tasks()) {
      const net_address& control = control_endpoint(t);
      if (entries.find(detail::endpoint_key(control)) == entries.end()) {
        throw_error(errc::invalid_config,
                    shown + " has no entry for " + detail::spoken(t) + " (" + control.to_string() + ")");
      }
    }
    fast_path_.clear();
    for (auto& [key, value] : entries) fast_path_.emplace(key, std::move(value.first));
    map_file_ = shown;
  }

  std::map<std::string, std::vector<net_address>, std::less<>> jobs_;
  std::size_t task_count_ = 0;  ///< the sum of jobs_'s list sizes
  std::optional<task_id> self_;
  std::map<std::string, net_address> fast_path_;
  std::optional<std::string> map_file_;
};

inline cluster_spec cluster_spec::from_tf_config(std::string_view text) {
  using nlohmann::json;
  constexpr std::string_view p = "TF_CONFIG: ";
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    fail(p, "not valid JSON (syntax error at byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object()) {
    fail(p, "expected a JSON object like {\"cluster\": {...}, \"task\": {...}}, got " + std::string(j.type_name()));
  }
  const auto cluster = j.find("cluster");
  if (cluster == j.end()) fail(p, "missing \"cluster\"");
  if (!cluster->is_object()) {
    fail(p, "\"cluster\" must be an object mapping job names to lists of \"host:port\", got " +
                std::string(cluster->type_name()));
  }
  cluster_spec spec;
  for (const auto& [name, list] : cluster->items()) {
    if (std::string problem = detail::job_name_problem(name); !problem.empty()) fail(p, problem);
    if (!list.is_array()) {
      fail(p, "cluster." + name + " must be a list of \"host:port\" strings, got " + std::string(list.type_name()));
    }
    std::vector<net_address> tasks;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = "cluster." + name + "[" + std::to_string(i) + "]";
      if (!list[i].is_string()) fail(p, where + " must be a \"host:port\" string, got " + list[i].dump());
      net_address e;
      detail::endpoint_parse_result r = detail::parse_endpoint(list[i].get_ref<const std::string&>(), e);
      if (r.problem != detail::endpoint_problem::none) fail(p, where + ": " + r.message);
      tasks.push_back(std::move(e));
    }
    spec.add_job_checked(name, std::move(tasks), p);
  }
  const auto task = j.find("task");
  if (task == j.end() || task->is_null()) return spec;
  if (!task->is_object()) {
    fail(p,
         "\"task\" must be an object like {\"type\": \"worker\", \"index\": 0}, got " + std::string(task->type_name()));
  }
  const auto type = task->find("type");
  if (type == task->end() || !type->is_string()) fail(p, "task.type must be a string naming a job in \"cluster\"");
  const std::string& job = type->get_ref<const std::string&>();
  if (!spec.has_job(job)) {
    fail(p, "task.type " + util::quoted(job) + " is not a job in \"cluster\" (jobs: " + spec.job_list() + ")");
  }
  std::uint64_t index = 0;
  if (const auto idx = task->find("index"); idx != task->end()) {
    if (!idx->is_number_integer() || (!idx->is_number_unsigned() && idx->get<std::int64_t>() < 0)) {
      fail(p, "task.index must be a non-negative integer, got " + idx->dump());
    }
    index = idx->get<std::uint64_t>();
  }
  const std::size_t count = spec.job(job).size();
  if (index >= count) {
    fail(p, "task.index " + std::to_string(index) + " is out of range: job " + util::quoted(job) + " has " +
                std::to_string(count) + (count == 1 ? " task" : " tasks"));
  }
  spec.self_ = task_id{job, static_cast<std::uint32_t>(index)};
  return spec;
}

inline cluster_spec cluster_spec::from_env(const env_lookup& lookup) {
  std::optional<std::string> config = lookup("TF_CONFIG");
  if (!config || config->empty()) {
    throw_error(errc::invalid_config,
                "TF_CONFIG is not set (expected JSON like {\"cluster\": {\"worker\": [\"host:port\"]}, "
                "\"task\": {\"type\": \"worker\", \"index\": 0}})");
  }
  cluster_spec spec = from_tf_config(*config);
  spec.load_endpoint_map_from_env(lookup);
  return spec;
}

inline cluster_spec cluster_spec::from_string_or_env(std::string_view text, const env_lookup& lookup) {
  if (util::trim(text).empty()) return from_env(lookup);
  cluster_spec spec = from_string(text);
  spec.load_endpoint_map_from_env(lookup);
  return spec;
}

inline cluster_spec cluster_spec::from_string(std::string_view text) {
  constexpr std::string_view p = "cluster spec: ";
  cluster_spec spec;
  std::string_view rest = text;
  bool any = false;
  while (true) {
    const std::size_t semi = rest.find(';');
    const std::string_view piece = util::trim(rest.substr(0, semi));
    if (!piece.empty()) {
      any = true;
      const std::size_t eq = piece.find('=');
      if (eq == std::string_view::npos) {
        fail(p, "expected job=host:port[,host:port...] (jobs separated by ';'), got " + util::quoted(piece));
      }
      const std::string_view name = util::trim(piece.substr(0, eq));
      std::vector<net_address> tasks;
      std::string_view list = piece.substr(eq + 1);
      while (true) {
        const std::size_t comma = list.find(',');
        const std::string_view item = util::trim(list.substr(0, comma));
        const std::string where = std::string(name) + "[" + std::to_string(tasks.size()) + "]: ";
        net_address e;
        detail::endpoint_parse_result r = detail::parse_endpoint(item, e);
        if (r.problem != detail::endpoint_problem::none) fail(p, where + r.message);
        tasks.push_back(std::move(e));
        if (comma == std::string_view::npos) break;
        list = list.substr(comma + 1);
      }
      spec.add_job_checked(name, std::move(tasks), p);
    }
    if (semi == std::string_view::npos) break;
    rest = rest.substr(semi + 1);
  }
  if (!any) fail(p, "expected job=host:port[,host:port...] (jobs separated by ';'), got " + util::quoted(text));
  return spec;
}

}  // namespace v0
}  // namespace fusewire

/// Hashes a task id, so it can key an unordered_map (e.g. connections per peer).
template <>
struct std::hash<fusewire::task_id> {
  std::size_t operator()(const fusewire::task_id& t) const noexcept {
    return std::hash<std::string>{}(t.job) * 31 + t.index;
  }
};
