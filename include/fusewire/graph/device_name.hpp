#pragma once
/// TensorFlow device names ("/job:ps/replica:0/task:1/device:CPU:0", the
/// legacy "/job:ps/task:1/cpu:0", partial names and '*' wildcards), parsed by
/// the grammar TensorFlow's DeviceNameUtils uses, and the task (core's
/// `task_id`) that owns a device. Graphs place their nodes with these names;
/// the tf adapter reads rendezvous keys with them and spells them `tf::`.

#include <concepts>
#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/graph/detail/text.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// How TensorFlow writes a task inside device names: "/job:ps/replica:0/task:1".
inline std::string task_name(const task_id& t) {
  return "/job:" + t.job + "/replica:0/task:" + std::to_string(t.index);
}

/// A parsed device name. A part that is absent or '*' is nullopt.
struct device_name {
  std::optional<std::string> job;
  std::optional<int> replica;
  std::optional<int> task;
  std::optional<std::string> type;  ///< "CPU", "GPU", ... (legacy "/cpu:" reads as "CPU")
  std::optional<int> id;

  /// True when job, replica, task, type and id are all given.
  bool fully_specified() const noexcept { return job && replica && task && type && id; }

  /// The canonical form TensorFlow prints: present parts only, "/device:T:*" for a type without id.
  std::string to_string() const {
    std::string out;
    if (job) out += "/job:" + *job;
    if (replica) out += "/replica:" + std::to_string(*replica);
    if (task) out += "/task:" + std::to_string(*task);
    if (type) out += "/device:" + *type + ":" + (id ? std::to_string(*id) : std::string("*"));
    return out;
  }

  /// The process owning this device. Throws std::system_error(errc::invalid_argument)
  /// if the job or task is missing, or the replica is not 0 (a task_id has no
  /// replica: fusewire runs one replica of the graph).
  fusewire::task_id task_id() const;

  friend bool operator==(const device_name&, const device_name&) = default;
};

namespace detail {

/// Parsers that say why text is bad: `parse(text, out)` returns the reason or nullopt.
template <class Parse, class T>
concept explaining_parser =
    std::invocable<Parse&, std::string_view, T&> &&
    std::same_as<std::invoke_result_t<Parse&, std::string_view, T&>, std::optional<std::string>>;

/// Runs `parse`; throws std::system_error(errc::invalid_argument) "bad <what> '<text>': <why>".
template <class T, explaining_parser<T> Parse>
T parse_or_throw(std::string_view what, std::string_view text, Parse parse) {
  T out{};
  if (auto why = parse(text, out))
    throw_error(errc::invalid_argument, "bad " + std::string(what) + " " + util::quoted(text) + ": " + *why);
  return out;
}

/// Runs `parse`; sets `ec` (errc::invalid_argument, or errc::out_of_memory)
/// and `*why` (if given) instead of throwing.
template <class T, explaining_parser<T> Parse>
std::optional<T> parse_or_set(std::string_view text, std::error_code& ec, std::string* why, Parse parse) noexcept {
  try {
    T out{};
    if (auto problem = parse(text, out)) {
      ec = make_error_code(errc::invalid_argument);
      if (why) *why = std::move(*problem);
      return std::nullopt;
    }
    ec.clear();
    return out;
  } catch (const std::bad_alloc&) {
    ec = make_error_code(errc::out_of_memory);
    return std::nullopt;
  }
}

/// TensorFlow's job-name rule: a letter, then letters, digits or '_'.
inline bool is_job_name(std::string_view s) {
  if (s.empty() || !is_alpha(s[0])) return false;
  for (char c : s.substr(1))
    if (!(is_alpha(c) || is_digit(c) || c == '_')) return false;
  return true;
}

inline std::string bad_job_name(std::string_view job) {
  return "job name " + util::quoted(job) + " must be a letter followed by letters, digits or '_'";
}

/// Parses `text` into `out`; returns what is wrong with it, or nullopt.
inline std::optional<std::string> parse_device_into(std::string_view text, device_name& out) {
  out = device_name{};
  if (text == "/") return std::nullopt;
  std::string_view s = text;
  auto take = [&](std::string_view prefix) {
    if (s.substr(0, prefix.size()) != prefix) return false;
    s.remove_prefix(prefix.size());
    return true;
  };
  auto wildcard = [&] { return take("*"); };
  auto word = [&](bool stop_at_colon) {
    std::size_t n = 0;
    while (n < s.size() && s[n] != '/' && !(stop_at_colon && s[n] == ':')) ++n;
    auto w = s.substr(0, n);
    s.remove_prefix(n);
    return w;
  };
  auto number = [&](std::string_view what, std::optional<int>& value) -> std::optional<std::string> {
    if (wildcard()) return std::nullopt;
    std::size_t n = 0;
    while (n < s.size() && is_digit(s[n])) ++n;
    if (n == 0) return std::string(what) + " " + util::quoted(word(false)) + " is not a number";
    auto v = parse_bounded(s.substr(0, n), 0x7fffffff);
    if (!v) return std::string(what) + " " + util::quoted(s.substr(0, n)) + " is out of range";
    value = static_cast<int>(*v);
    s.remove_prefix(n);
    return std::nullopt;
  };
  auto twice = [](std::string_view part) { return "it names the " + std::string(part) + " twice"; };
  while (!s.empty()) {
    if (take("/job:")) {
      if (out.job) return twice("job");
      if (wildcard()) continue;
      auto j = word(false);
      if (!is_job_name(j)) return bad_job_name(j);
      out.job = std::string(j);
    } else if (take("/replica:")) {
      if (out.replica) return twice("replica");
      if (auto e = number("replica", out.replica)) return e;
    } else if (take("/task:")) {
      if (out.task) return twice("task");
      if (auto e = number("task", out.task)) return e;
    } else if (take("/device:")) {
      if (out.type) return twice("device");
      if (!wildcard()) {
        auto t = word(true);
        bool ok = !t.empty() && is_alpha(t[0]);
        for (char c : t) ok = ok && (is_alpha(c) || is_digit(c) || c == '_');
        if (!ok) return "device type " + util::quoted(t) + " must be a letter followed by letters, digits or '_'";
        out.type = std::string(t);
      }
      if (take(":"))
        if (auto e = number("device id", out.id)) return e;
    } else if (const bool cpu = take("/cpu:") || take("/CPU:"); cpu || take("/gpu:") || take("/GPU:")) {
      if (out.type) return twice("device");
      out.type = cpu ? "CPU" : "GPU";
      if (auto e = number("device id", out.id)) return e;
    } else {
      return "unexpected " + util::quoted(s) + " (expected /job:, /replica:, /task:, /device:, /cpu: or /gpu:)";
    }
  }
  return std::nullopt;
}

/// Why `d` names no single task, or nullopt.
inline std::optional<std::string> task_problem(const device_name& d) {
  if (!d.job || !d.task)
    return std::string("it names no ") + (d.job ? "task" : "job") + "; a task needs /job:<name> and /task:<index>";
  if (d.replica.value_or(0) != 0) return "replica " + std::to_string(*d.replica) + " is not supported (only replica 0)";
  return std::nullopt;
}

/// Parses a device name that must name a task; returns why not, or nullopt.
inline std::optional<std::string> parse_task_into(std::string_view text, task_id& out) {
  device_name d;
  if (auto why = parse_device_into(text, d)) return why;
  if (auto why = task_problem(d)) return why;
  out = task_id{*d.job, static_cast<std::uint32_t>(*d.task)};
  return std::nullopt;
}

}  // namespace detail

inline fusewire::task_id device_name::task_id() const {
  if (auto why = detail::task_problem(*this))
    throw_error(errc::invalid_argument, "device " + util::quoted(to_string()) + ": " + *why);
  return fusewire::task_id{*job, static_cast<std::uint32_t>(*task)};
}

/// Parses a TensorFlow device name; throws std::system_error(errc::invalid_argument)
/// whose what() quotes the name and says which part is wrong.
inline device_name parse_device_name(std::string_view text) {
  return detail::parse_or_throw<device_name>("device name", text, detail::parse_device_into);
}

/// Non-throwing parse_device_name: on failure sets `ec` (errc::invalid_argument)
/// and, if given, `*why` (which part is wrong, as the throwing form says it).
inline std::optional<device_name> parse_device_name(std::string_view text, std::error_code& ec,
                                                    std::string* why = nullptr) noexcept {
  return detail::parse_or_set<device_name>(text, ec, why, detail::parse_device_into);
}

/// The task that owns device `text` ("/job:ps/replica:0/task:1", with or
/// without a device part); throws std::system_error(errc::invalid_argument)
/// naming the bad part, or saying the name lacks a job or task.
inline task_id parse_task(std::string_view text) {
  return detail::parse_or_throw<task_id>("task", text, detail::parse_task_into);
}

/// Non-throwing parse_task: on failure sets `ec` (errc::invalid_argument) and, if given, `*why`.
inline std::optional<task_id> parse_task(std::string_view text, std::error_code& ec,
                                         std::string* why = nullptr) noexcept {
  return detail::parse_or_set<task_id>(text, ec, why, detail::parse_task_into);
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
