#pragma once
/// TensorFlow rendezvous keys, exactly as Rendezvous::CreateKey writes them:
///
///     src_device;src_incarnation;dst_device;tensor_name;frame_id:iter_id
///
/// src_incarnation is 16 lower-case hex digits (it changes when the sending
/// process restarts); frame_id (uint64) and iter_id (int64) are decimal and
/// name the loop-frame instance and iteration ("0:0" outside loops). Parsing
/// accepts what TensorFlow's ParseKey accepts, and additionally requires the
/// frame part to be two numbers, which every key TensorFlow writes is.

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/util/text.hpp>

namespace fusewire {
inline namespace v0 {
namespace tf {

// A key's devices are read by the graph layer's device-name grammar, the one
// the partitioner places nodes with; the adapter spells its names as tf::.
using graph::device_name;
using graph::parse_device_name;
using graph::parse_task;
using graph::task_name;

/// The five parts of a rendezvous key.
struct rendezvous_key {
  std::string src_device;
  std::uint64_t src_incarnation = 0;
  std::string dst_device;
  std::string tensor_name;
  std::uint64_t frame_id = 0;
  std::int64_t iter_id = 0;

  /// The key text, byte for byte as TensorFlow builds it.
  std::string to_string() const {
    static constexpr char hex[] = "0123456789abcdef";
    std::string inc(16, '0');
    for (int i = 15, shift = 0; i >= 0; --i, shift += 4)
      inc[static_cast<std::size_t>(i)] = hex[(src_incarnation >> shift) & 0xf];
    return src_device + ";" + inc + ";" + dst_device + ";" + tensor_name + ";" + std::to_string(frame_id) + ":" +
           std::to_string(iter_id);
  }
  /// The parsed source and destination devices (the key was validated on parse).
  device_name src() const { return parse_device_name(src_device); }
  device_name dst() const { return parse_device_name(dst_device); }
  /// The sending and receiving processes; throw if a device names no task.
  task_id src_task() const { return src().task_id(); }
  task_id dst_task() const { return dst().task_id(); }

  friend bool operator==(const rendezvous_key&, const rendezvous_key&) = default;
};

/// Builds a key the way Rendezvous::CreateKey does.
inline std::string make_rendezvous_key(std::string_view src_device, std::uint64_t src_incarnation,
                                       std::string_view dst_device, std::string_view tensor_name,
                                       std::uint64_t frame_id = 0, std::int64_t iter_id = 0) {
  return rendezvous_key{std::string(src_device),  src_incarnation, std::string(dst_device),
                        std::string(tensor_name), frame_id,        iter_id}
      .to_string();
}

/// Where a key's tensor travels through fusewire: between two tasks (their
/// endpoints come from a cluster_spec) under a channel key, the key in its
/// canonical form so that sender and receiver agree byte for byte.
struct rendezvous_route {
  task_id src;
  task_id dst;
  std::string channel_key;

  friend bool operator==(const rendezvous_route&, const rendezvous_route&) = default;
};

/// The route of `key`; throws std::system_error(errc::invalid_argument) if
/// either device names no task (see device_name::task_id()).
inline rendezvous_route route(const rendezvous_key& key) { return {key.src_task(), key.dst_task(), key.to_string()}; }

namespace detail {

using fusewire::util::parse_uint;
using fusewire::util::quoted;
using fusewire::util::uint_parse;

/// Splits and checks `key`; returns what is wrong with it, or nullopt.
inline std::optional<std::string> parse_key_into(std::string_view key, rendezvous_key& out) {
  std::string_view parts[5];
  std::string_view rest = key;
  for (int i = 0; i < 5; ++i) {
    auto semi = rest.find(';');
    if (semi == std::string_view::npos) {
      if (i < 4)
        return "it has " + std::to_string(i + 1) +
               " part(s); a key is src_device;src_incarnation;dst_device;tensor_name;frame_id:iter_id";
      parts[i] = rest;
      rest = {};
    } else {
      parts[i] = rest.substr(0, semi);
      rest.remove_prefix(semi + 1);
      if (i == 4)
        return "it has more than 5 parts (unexpected " + util::quoted(std::string(";") + std::string(rest)) + ")";
    }
  }
  std::error_code device_ec;
  std::string why;
  if (parts[0].empty()) return std::string("src_device is empty");
  if (!parse_device_name(parts[0], device_ec, &why)) return "src_device " + util::quoted(parts[0]) + ": " + why;
  const auto inc = parts[1];
  if (inc.empty() || inc.size() > 16) return "src_incarnation " + util::quoted(inc) + " is not 1 to 16 hex digits";
  std::uint64_t incarnation = 0;
  for (char c : inc) {
    int d = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (d < 0) return "src_incarnation " + util::quoted(inc) + " is not 1 to 16 hex digits";
    incarnation = (incarnation << 4) | static_cast<std::uint64_t>(d);
  }
  if (parts[2].empty()) return std::string("dst_device is empty");
  if (!parse_device_name(parts[2], device_ec, &why)) return "dst_device " + util::quoted(parts[2]) + ": " + why;
  if (parts[3].empty()) return std::string("tensor_name is empty");
  const auto frame = parts[4];
  const auto colon = frame.find(':');
  if (frame.empty() || colon == std::string_view::npos)
    return "frame_id:iter_id " + util::quoted(frame) + " is not two numbers joined by ':'";
  std::uint64_t frame_id = 0;
  if (parse_uint(frame.substr(0, colon), frame_id) != uint_parse::ok)
    return "frame_id " + util::quoted(frame.substr(0, colon)) + " is not an unsigned 64-bit number";
  const auto iter_text = frame.substr(colon + 1);
  std::int64_t iter_id = 0;
  auto [end, ec] = std::from_chars(iter_text.data(), iter_text.data() + iter_text.size(), iter_id);
  if (iter_text.empty() || ec != std::errc{} || end != iter_text.data() + iter_text.size())
    return "iter_id " + util::quoted(iter_text) + " is not a signed 64-bit number";
  out.src_device = std::string(parts[0]);
  out.src_incarnation = incarnation;
  out.dst_device = std::string(parts[2]);
  out.tensor_name = std::string(parts[3]);
  out.frame_id = frame_id;
  out.iter_id = iter_id;
  return std::nullopt;
}

}  // namespace detail

/// Parses a rendezvous key; throws std::system_error(errc::invalid_argument)
/// whose what() quotes the key and names the bad part.
inline rendezvous_key parse_rendezvous_key(std::string_view key) {
  rendezvous_key out;
  if (auto why = detail::parse_key_into(key, out))
    throw_error(errc::invalid_argument, "bad rendezvous key " + util::quoted(key) + ": " + *why);
  return out;
}

/// Non-throwing parse_rendezvous_key: sets `ec` (errc::invalid_argument) on failure.
inline std::optional<rendezvous_key> parse_rendezvous_key(std::string_view key, std::error_code& ec) {
  rendezvous_key out;
  if (detail::parse_key_into(key, out)) {
    ec = make_error_code(errc::invalid_argument);
    return std::nullopt;
  }
  ec.clear();
  return out;
}

}  // namespace tf
}  // namespace v0
}  // namespace fusewire
