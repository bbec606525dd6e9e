#pragma once
/// The communication settings a TensorFlow fork passes down: the protocol
/// name from its server definition or RunConfig ("grpc", "grpc++",
/// "star_server", "star_server_lite") and ConfigProto's tensor_fuse flag,
/// and the graph-partition plan they call for.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/util/text.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/graph/partition.hpp>

namespace fusewire {
inline namespace v0 {
namespace tf {

/// A protocol name TensorFlow forks accept.
enum class protocol {
  grpc,              ///< "grpc": send/recv, one RecvTensor per cross-task tensor
  grpc_plus_plus,    ///< "grpc++": DeepRec's seastar send/recv
  star_server,       ///< "star_server": pull/push calls, topological rounds
  star_server_lite,  ///< "star_server_lite": the aggressive merge (no loops)
};

/// Every protocol, in the order error messages list them.
inline constexpr std::array<protocol, 4> all_protocols{protocol::grpc, protocol::grpc_plus_plus, protocol::star_server,
                                                       protocol::star_server_lite};

/// The name as configurations spell it.
constexpr std::string_view to_string(protocol p) noexcept {
  switch (p) {
    case protocol::grpc:
      return "grpc";
    case protocol::grpc_plus_plus:
      return "grpc++";
    case protocol::star_server:
      return "star_server";
    case protocol::star_server_lite:
      return "star_server_lite";
  }
  return "?";
}

namespace detail {
inline std::optional<protocol> find_protocol(std::string_view name) noexcept {
  for (auto p : all_protocols)
    if (to_string(p) == name) return p;
  return std::nullopt;
}
}  // namespace detail

/// Parses a protocol name (exact, case-sensitive, as TensorFlow compares it);
/// throws std::system_error(errc::invalid_config) naming the value and the
/// allowed names.
inline protocol parse_protocol(std::string_view name) {
  if (auto p = detail::find_protocol(name)) return *p;
  std::string allowed;
  for (auto p : all_protocols) allowed += (allowed.empty() ? "" : ", ") + std::string(to_string(p));
  throw_error(errc::invalid_config, "unknown protocol " + fusewire::util::quoted(name) + " (allowed: " + allowed + ")");
}

/// Non-throwing parse_protocol: sets `ec` (errc::invalid_config) on failure.
inline std::optional<protocol> parse_protocol(std::string_view name, std::error_code& ec) noexcept {
  auto p = detail::find_protocol(name);
  if (p)
    ec.clear();
  else
    ec = make_error_code(errc::invalid_config);
  return p;
}

/// The partition mode a protocol calls for (grpc and grpc++ both send/recv).
constexpr graph::partition_mode partition_mode_for(protocol p) noexcept {
  switch (p) {
    case protocol::star_server:
      return graph::partition_mode::star_server;
    case protocol::star_server_lite:
      return graph::partition_mode::star_server_lite;
    case protocol::grpc:
    case protocol::grpc_plus_plus:
      break;
  }
  return graph::partition_mode::send_recv;
}

/// Parses a boolean flag as fusewire reads its environment knobs (TENSOR_FUSE
/// among them): true/false, 1/0, yes/no, on/off in any letter case, so Python's
/// "True"/"False" too; throws std::system_error(errc::invalid_config) naming
/// the flag, the value and what is allowed.
inline bool parse_flag(std::string_view flag, std::string_view value) {
  return fusewire::detail::env_bool(flag, value);
}

/// What a TensorFlow session configures about tensor traffic.
struct session_config {
  protocol proto = protocol::grpc;
  bool tensor_fuse = false;  ///< ConfigProto.tensor_fuse: fuse send/recv per ready-wave

  /// From the protocol name and the tensor_fuse flag's text; throws like
  /// parse_protocol and parse_flag.
  static session_config parse(std::string_view protocol_name, std::string_view tensor_fuse = "false") {
    return session_config{parse_protocol(protocol_name), parse_flag("tensor_fuse", tensor_fuse)};
  }

  /// From the protocol name, with tensor_fuse from fusewire's options
  /// (options::from_env reads it from TENSOR_FUSE): for a session whose
  /// ConfigProto does not say.
  static session_config from(std::string_view protocol_name, const options& o) {
    return session_config{parse_protocol(protocol_name), o.tensor_fuse};
  }

  /// The partition options these settings mean; PS tasks are those of `server_job`.
  graph::partition_options partition_options(std::string server_job = "ps") const {
    graph::partition_options o;
    o.mode = partition_mode_for(proto);
    o.tensor_fuse = tensor_fuse;
    o.server_job = std::move(server_job);
    return o;
  }
};

}  // namespace tf
}  // namespace v0
}  // namespace fusewire
