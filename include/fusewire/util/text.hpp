#pragma once
/// Small text helpers for parsers and error messages (options, cluster spec, graph, tf).

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace fusewire {
inline namespace v0 {
namespace util {

constexpr char ascii_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

inline std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

constexpr bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

/// Outcome of parsing a plain decimal unsigned integer.
enum class uint_parse : std::uint8_t { ok, not_a_number, out_of_range };

/// Parses `s` as decimal digits only: no sign, no spaces, no suffix.
inline uint_parse parse_uint(std::string_view s, std::uint64_t& out) noexcept {
  if (s.empty()) return uint_parse::not_a_number;
  for (char c : s) {
    if (!is_digit(c)) return uint_parse::not_a_number;
  }
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc::result_out_of_range) return uint_parse::out_of_range;
  if (ec != std::errc{} || end != s.data() + s.size()) return uint_parse::not_a_number;
  out = value;
  return uint_parse::ok;
}

/// true/false, 1/0, yes/no, on/off, in any letter case; nullopt otherwise.
inline std::optional<bool> parse_bool(std::string_view s) noexcept {
  for (std::string_view t : {"true", "1", "yes", "on"}) {
    if (iequals(s, t)) return true;
  }
  for (std::string_view f : {"false", "0", "no", "off"}) {
    if (iequals(s, f)) return false;
  }
  return std::nullopt;
}

/// `s` in single quotes, for error messages.
inline std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

/// `s` made safe for one log line: printable ASCII is kept, a backslash and
/// every other byte (newline, escape sequences, UTF-8) become \\ and \xNN, and
/// text past `max_bytes` input bytes is cut with "...". For strings a peer
/// supplied (job names, keys, error texts), so that no peer can forge a log
/// line or flood one.
inline std::string printable(std::string_view s, std::size_t max_bytes = 128) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  const std::size_t n = s.size() < max_bytes ? s.size() : max_bytes;
  out.reserve(n + 8);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (n < s.size()) out += "...";
  return out;
}

}  // namespace util
}  // namespace v0
}  // namespace fusewire
