// The TCP transport an example runs on, chosen by name: "uring" (io_uring,
// when this build has liburing) or "asio" (Boost.Asio, always built). The one
// place in the examples that knows which transports a build has.
#pragma once

#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace example {

/// uring where this build has it: it is the faster of the two.
#if FUSEWIRE_HAS_URING
inline constexpr const char* default_transport = "uring";
#else
inline constexpr const char* default_transport = "asio";
#endif

/// The transport names this build can run, for a command line's list of choices.
inline std::vector<std::string> transport_names() {
#if FUSEWIRE_HAS_URING
  return {"uring", "asio"};
#else
  return {"asio"};
#endif
}

/// Why the transport named `name` cannot be used in this build; nullopt if it can.
inline std::optional<std::string> transport_problem(std::string_view name) {
  if (name == "asio") return std::nullopt;
#if FUSEWIRE_HAS_URING
  if (name == "uring") return std::nullopt;
#else
  if (name == "uring") return "this build has no io_uring transport (liburing not found); use asio";
#endif
  return "expected asio or uring";
}

/// Calls `f.template operator()<Transport>()` for the transport named `name`
/// and returns what it returns; throws std::invalid_argument with
/// transport_problem()'s reason when `name` cannot be used.
template <class F>
decltype(auto) with_transport(std::string_view name, F&& f) {
  if (auto problem = transport_problem(name)) {
    throw std::invalid_argument("transport '" + std::string(name) + "': " + *problem);
  }
#if FUSEWIRE_HAS_URING
  if (name == "uring") return f.template operator()<fusewire::uring_tcp>();
#endif
  return f.template operator()<fusewire::asio_tcp>();
}

}  // namespace example
