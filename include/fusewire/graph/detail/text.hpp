#pragma once
/// Small text helpers shared by the graph layer: number parsing, name
/// checks, and the parts of a "node:port" / "^node" input reference.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace fusewire {
inline namespace v0 {
namespace graph::detail {

/// Parses a whole decimal string (no sign, no spaces) into an unsigned value.
template <class Unsigned>
std::optional<Unsigned> parse_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (char c : text)
    if (c < '0' || c > '9') return std::nullopt;
  Unsigned value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// TensorFlow's job-name rule: a letter, then letters, digits or '_'.
inline bool is_job_name(std::string_view s) {
  if (s.empty() || !is_alpha(s[0])) return false;
  for (char c : s.substr(1))
    if (!(is_alpha(c) || is_digit(c) || c == '_')) return false;
  return true;
}

/// Node names: a letter, digit or '.', then letters, digits and "_.-/>".
/// (TensorFlow's rule, minus a leading '_' which fusewire reserves.)
inline bool is_node_name(std::string_view s) {
  if (s.empty()) return false;
  auto first_ok = [](char c) { return is_alpha(c) || is_digit(c) || c == '.'; };
  if (!first_ok(s[0]) && s[0] != '_') return false;
  for (char c : s.substr(1))
    if (!(first_ok(c) || c == '_' || c == '-' || c == '/' || c == '>')) return false;
  return true;
}

/// One entry of node_def::inputs, split: "^x" (control), "x" or "x:3".
struct input_text {
  std::string_view node;
  int port = 0;
  bool control = false;
};

/// Splits an input reference; nullopt when it is not of one of the three forms.
inline std::optional<input_text> split_input(std::string_view text) {
  input_text out;
  if (!text.empty() && text[0] == '^') {
    out.control = true;
    out.port = -1;
    text.remove_prefix(1);
    if (text.empty() || text.find(':') != std::string_view::npos) return std::nullopt;
    out.node = text;
    return out;
  }
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    if (text.empty()) return std::nullopt;
    out.node = text;
    return out;
  }
  auto port = parse_decimal<unsigned>(text.substr(colon + 1));
  if (!port || *port > 1'000'000 || colon == 0) return std::nullopt;
  out.node = text.substr(0, colon);
  out.port = static_cast<int>(*port);
  return out;
}

inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

inline std::string quoted(std::string_view s) {
  std::string out = "'";
  out += s;
  out += "'";
  return out;
}

}  // namespace graph::detail
}  // namespace v0
}  // namespace fusewire
