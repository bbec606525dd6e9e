#pragma once
/// fusewire's error vocabulary: `fusewire::errc`, its category, and helpers.
///
/// Async paths complete with a `std::error_code`; setup code (constructors,
/// configuration parsing) throws `std::system_error` whose `what()` names the
/// bad value. Nothing in fusewire aborts the process on bad input.

#include <string>
#include <system_error>

namespace fusewire {
inline namespace v0 {

/// Every error fusewire itself reports. Values are stable (they may be logged).
enum class errc : int {
  ok = 0,
  // configuration and arguments
  invalid_argument = 1,  ///< a bad argument or configuration value
  invalid_config,        ///< a bad environment knob, TF_CONFIG or endpoint map
  // wire format
  bad_magic = 20,       ///< a frame does not start with fusewire's magic
  unsupported_version,  ///< a frame's version is not one this build speaks
  unknown_frame_type,   ///< a frame's type field names no known frame
  frame_too_large,      ///< a length field exceeds the configured limit
  malformed_frame,      ///< lengths or counts contradict each other
  truncated_frame,      ///< the input ended inside a frame
  // resources
  pool_exhausted = 40,  ///< the buffer pool has no free slab of that size
  out_of_memory,        ///< allocation or registration failed
  // connections
  connection_refused = 60,  ///< the peer refused or could not be reached
  connection_closed,        ///< the connection was closed (locally or by the peer)
  connection_reset,         ///< the peer vanished mid-operation
  handshake_failed,         ///< magic, version or task identity did not match
  auth_failed,              ///< the cluster token did not match
  // operations
  timed_out = 80,  ///< the operation's deadline passed
  cancelled,       ///< the operation was cancelled or its owner shut down
  duplicate_key,   ///< a rendezvous key was sent or received twice
  size_mismatch,   ///< a payload does not fit the posted destination
  not_supported,   ///< the kernel, device or build lacks the feature
  device_error,    ///< an RDMA work completion or device failed
  state_lost,      ///< a peer restarted without the state it had (a PS without its checkpoint)
  peer_lost,       ///< a task the operation depends on died or left
  // graphs
  invalid_graph = 100,  ///< a dataflow graph is malformed
  graph_cycle,          ///< a plan would need a cycle (star_server_lite on loops)
};

namespace detail {

class fusewire_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "fusewire"; }

  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::ok:
        return "success";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::invalid_config:
        return "invalid configuration";
      case errc::bad_magic:
        return "bad frame magic";
      case errc::unsupported_version:
        return "unsupported wire version";
      case errc::unknown_frame_type:
        return "unknown frame type";
      case errc::frame_too_large:
        return "frame length exceeds the configured limit";
      case errc::malformed_frame:
        return "malformed frame";
      case errc::truncated_frame:
        return "truncated frame";
      case errc::pool_exhausted:
        return "buffer pool exhausted";
      case errc::out_of_memory:
        return "out of memory";
      case errc::connection_refused:
        return "connection refused";
      case errc::connection_closed:
        return "connection closed";
      case errc::connection_reset:
        return "connection reset by peer";
      case errc::handshake_failed:
        return "handshake failed";
      case errc::auth_failed:
        return "cluster token rejected";
      case errc::timed_out:
        return "deadline exceeded";
      case errc::cancelled:
        return "operation cancelled";
      case errc::duplicate_key:
        return "duplicate rendezvous key";
      case errc::size_mismatch:
        return "payload size does not match the destination";
      case errc::not_supported:
        return "not supported here";
      case errc::device_error:
        return "device error";
      case errc::state_lost:
        return "a peer restarted without its state";
      case errc::peer_lost:
        return "a task it depends on was lost";
      case errc::invalid_graph:
        return "invalid graph";
      case errc::graph_cycle:
        return "graph plan would contain a cycle";
    }
    return "unknown fusewire error " + std::to_string(value);
  }

  std::error_condition default_error_condition(int value) const noexcept override {
    switch (static_cast<errc>(value)) {
      case errc::invalid_argument:
      case errc::invalid_config:
        return std::errc::invalid_argument;
      case errc::frame_too_large:
        return std::errc::message_size;
      case errc::bad_magic:
      case errc::unsupported_version:
      case errc::unknown_frame_type:
      case errc::malformed_frame:
      case errc::truncated_frame:
        return std::errc::bad_message;
      case errc::pool_exhausted:
        return std::errc::no_buffer_space;
      case errc::out_of_memory:
        return std::errc::not_enough_memory;
      case errc::connection_refused:
        return std::errc::connection_refused;
      case errc::connection_closed:
        return std::errc::not_connected;
      case errc::connection_reset:
        return std::errc::connection_reset;
      case errc::handshake_failed:
      case errc::auth_failed:
        return std::errc::permission_denied;
      case errc::timed_out:
        return std::errc::timed_out;
      case errc::cancelled:
        return std::errc::operation_canceled;
      case errc::not_supported:
        return std::errc::not_supported;
      default:
        return std::error_condition(value, *this);
    }
  }
};

}  // namespace detail

/// The category of every `fusewire::errc`; its name is "fusewire".
inline const std::error_category& error_category() noexcept {
  static const detail::fusewire_category category;
  return category;
}

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

/// Throws `std::system_error` carrying `e` and a message naming what was wrong.
[[noreturn]] inline void throw_error(errc e, const std::string& what) {
  throw std::system_error(make_error_code(e), what);
}

}  // namespace v0
}  // namespace fusewire

template <>
struct std::is_error_code_enum<fusewire::errc> : std::true_type {};
