#pragma once
/// TensorFlow device names ("/job:ps/replica:0/task:1/device:CPU:0", the
/// legacy "/job:ps/task:1/cpu:0", partial names and '*' wildcards), parsed
/// by the grammar TensorFlow's DeviceNameUtils uses, and mapped onto the
/// task (process) that owns the device.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace tf {

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

  /// The process owning this device; throws std::system_error(errc::invalid_argument)
  /// if the job or task is missing or the replica is not 0.
  graph::task_id task_id() const {
    if (!job || !task)
      throw_error(errc::invalid_argument, "device " + graph::detail::quoted(to_string()) + " names no " +
                                              (job ? "task" : "job") + "; a task needs /job:<name> and /task:<index>");
    if (replica.value_or(0) != 0)
      throw_error(errc::invalid_argument, "device " + graph::detail::quoted(to_string()) + ": replica " +
                                              std::to_string(*replica) + " is not supported (only replica 0)");
    return graph::task_id{*job, *task};
  }

  friend bool operator==(const device_name&, const device_name&) = default;
};

namespace detail {

/// Parses `text` into `out`; returns what is wrong with it, or nullopt.
inline std::optional<std::string> parse_device_into(std::string_view text, device_name& out) {
  using graph::detail::quoted;
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
    while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
    if (n == 0) return std::string(what) + " " + quoted(word(false)) + " is not a number";
    auto v = graph::detail::parse_decimal<std::uint32_t>(s.substr(0, n));
    if (!v || *v > 0x7fffffffu) return std::string(what) + " " + quoted(s.substr(0, n)) + " is out of range";
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
      if (!graph::detail::is_job_name(j))
        return "job name " + quoted(j) + " must be a letter followed by letters, digits or '_'";
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
        bool ok = !t.empty() && graph::detail::is_alpha(t[0]);
        for (char c : t) ok = ok && (graph::detail::is_alpha(c) || graph::detail::is_digit(c) || c == '_');
        if (!ok) return "device type " + quoted(t) + " must be a letter followed by letters, digits or '_'";
        out.type = std::string(t);
      }
      if (take(":"))
        if (auto e = number("device id", out.id)) return e;
    } else if (const bool cpu = take("/cpu:") || take("/CPU:"); cpu || take("/gpu:") || take("/GPU:")) {
      if (out.type) return twice("device");
      out.type = cpu ? "CPU" : "GPU";
      if (auto e = number("device id", out.id)) return e;
    } else {
      return "unexpected " + quoted(s) + " (expected /job:, /replica:, /task:, /device:, /cpu: or /gpu:)";
    }
  }
  return std::nullopt;
}

}  // namespace detail

/// Parses a TensorFlow device name; throws std::system_error(errc::invalid_argument)
/// whose what() quotes the name and says which part is wrong.
inline device_name parse_device_name(std::string_view text) {
  device_name out;
  if (auto why = detail::parse_device_into(text, out))
    throw_error(errc::invalid_argument, "bad device name " + graph::detail::quoted(text) + ": " + *why);
  return out;
}

/// Non-throwing parse_device_name: sets `ec` (errc::invalid_argument) on failure.
inline std::optional<device_name> parse_device_name(std::string_view text, std::error_code& ec) {
  device_name out;
  if (detail::parse_device_into(text, out)) {
    ec = make_error_code(errc::invalid_argument);
    return std::nullopt;
  }
  ec.clear();
  return out;
}

}  // namespace tf
}  // namespace v0
}  // namespace fusewire
