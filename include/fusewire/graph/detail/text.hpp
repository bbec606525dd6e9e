#pragma once
/// Text helpers of the graph layer: node-name checks and the parts of a
/// "node:port" / "^node" input reference. Number parsing and quoting are
/// core's (core/detail/text.hpp), brought in by name.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fusewire/util/text.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph::detail {

using fusewire::util::is_digit;
using fusewire::util::parse_uint;
using fusewire::util::quoted;
using fusewire::util::uint_parse;

constexpr bool is_alpha(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/// Parses decimal digits into a value no larger than `max`; nullopt otherwise.
inline std::optional<std::uint64_t> parse_bounded(std::string_view text, std::uint64_t max) noexcept {
  std::uint64_t value = 0;
  if (parse_uint(text, value) != uint_parse::ok || value > max) return std::nullopt;
  return value;
}

/// Node names: a letter, digit, '.' or '_', then letters, digits and "_.-/>"
/// (TensorFlow's rule; a leading '_' is reserved for nodes the partitioner adds).
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
  auto port = parse_bounded(text.substr(colon + 1), 1'000'000);
  if (!port || colon == 0) return std::nullopt;
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

}  // namespace graph::detail
}  // namespace v0
}  // namespace fusewire
