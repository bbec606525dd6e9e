// The transport an example runs on, chosen by name: "uring" (io_uring, when
// this build has liburing), "asio" (Boost.Asio, always built) or "verbs" (RDMA
// verbs, when this build has rdma-core; it needs an RDMA device and a cluster
// on the device's IP address, see --host). The one place in the examples that
// knows which transports a build has and how each one is made.
#pragma once

#include <fusewire/core/options.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif
#if FUSEWIRE_HAS_RDMA
#include <fusewire/transport/verbs.hpp>
#endif

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace example {

/// uring where this build has it: it is the faster of the two TCP transports.
#if FUSEWIRE_HAS_URING
inline constexpr const char* default_transport = "uring";
#else
inline constexpr const char* default_transport = "asio";
#endif

/// The transport names this build can run, for a command line's list of
/// choices. Verbs is offered only by the examples that can place their cluster
/// on an RDMA interface (`with_verbs`); the others run on loopback, which
/// rdmacm cannot route.
inline std::vector<std::string> transport_names(bool with_verbs = false) {
  std::vector<std::string> names;
#if FUSEWIRE_HAS_URING
  names.push_back("uring");
#endif
  names.push_back("asio");
#if FUSEWIRE_HAS_RDMA
  if (with_verbs) names.push_back("verbs");
#else
  (void)with_verbs;
#endif
  return names;
}

/// Why the transport named `name` cannot be used in this build; nullopt if it can.
inline std::optional<std::string> transport_problem(std::string_view name, bool with_verbs = false) {
  for (const auto& n : transport_names(with_verbs)) {
    if (n == name) return std::nullopt;
  }
  if (name == "uring") return "this build has no io_uring transport (liburing not found); use asio";
  if (name == "verbs" && with_verbs) return "this build has no RDMA verbs transport (rdma-core not found)";
  // "expected asio or uring", "expected asio, uring or verbs"
  std::vector<std::string> names;
  for (const char* n : {"asio", "uring", "verbs"}) {
    for (const auto& built : transport_names(with_verbs)) {
      if (built == n) names.push_back(n);
    }
  }
  std::string allowed;
  for (std::size_t i = 0; i < names.size(); ++i) {
    allowed += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return "expected " + allowed;
}

/// The transport object a task uses, from its options: verbs takes its device,
/// chunk size, write threshold and registered memory from the TF_RDMA_* knobs
/// (verbs_config::from); the TCP transports need nothing from them.
template <class Transport>
Transport make_transport([[maybe_unused]] const fusewire::options& o) {
#if FUSEWIRE_HAS_RDMA
  if constexpr (std::is_same_v<Transport, fusewire::verbs>) return fusewire::verbs(fusewire::verbs_config::from(o));
#endif
  return Transport{};
}

/// Calls `f.template operator()<Transport>()` for the transport named `name`
/// and returns what it returns; throws std::invalid_argument with
/// transport_problem()'s reason when `name` cannot be used.
template <bool WithVerbs = false, class F>
decltype(auto) with_transport(std::string_view name, F&& f) {
  if (auto problem = transport_problem(name, WithVerbs)) {
    throw std::invalid_argument("transport '" + std::string(name) + "': " + *problem);
  }
#if FUSEWIRE_HAS_URING
  if (name == "uring") return f.template operator()<fusewire::uring_tcp>();
#endif
#if FUSEWIRE_HAS_RDMA
  if constexpr (WithVerbs) {
    if (name == "verbs") return f.template operator()<fusewire::verbs>();
  }
#endif
  return f.template operator()<fusewire::asio_tcp>();
}

}  // namespace example
