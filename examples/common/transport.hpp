// The transport an example runs on, chosen by name through the library's
// fusewire::with_transport (transport/select.hpp): "auto" (the default: shm
// when every task is on this host, verbs when RDMA is enabled and works,
// shm+uring when the job spans hosts, else uring or asio), "uring", "asio",
// "shm", "shm+asio", "shm+uring" or "verbs" (it needs an RDMA device and a cluster on the
// device's IP address, see --host).
#pragma once

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/transport/select.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace example {

inline constexpr const char* default_transport = "auto";

/// The transport names for a command line's list of choices: "auto" and
/// those this build and machine can run. Verbs is offered only by the
/// examples that can place their cluster on an RDMA interface (`with_verbs`);
/// the others run on loopback, which rdmacm cannot route.
inline std::vector<std::string> transport_names(bool with_verbs = false) {
  std::vector<std::string> names{"auto"};
  for (std::string& n : fusewire::available_transports()) {
    if (n != "verbs" || with_verbs) names.push_back(std::move(n));
  }
  return names;
}

/// Why the transport named `name` cannot be used here; nullopt if it can.
inline std::optional<std::string> transport_problem(std::string_view name, bool with_verbs = false) {
  if (name == "verbs" && !with_verbs) {
    std::string names;
    for (const auto& n : transport_names(false)) names += (names.empty() ? "" : ", ") + n;
    return "this program runs its cluster on loopback, which RDMA cannot route; expected one of " + names;
  }
  return fusewire::transport_problem(name);
}

/// The transport object a task uses, from its options: verbs takes its device,
/// chunk size, write threshold and registered memory from the TF_RDMA_* knobs
/// (verbs_config::from); the others need nothing from them.
template <class Transport>
Transport make_transport([[maybe_unused]] const fusewire::options& o) {
#if FUSEWIRE_HAS_RDMA
  if constexpr (std::is_same_v<Transport, fusewire::verbs>) return fusewire::verbs(fusewire::verbs_config::from(o));
#endif
  return Transport{};
}

/// Calls `f.template operator()<Transport>()` for the transport named `name`
/// ("auto" decides from `o` and `spec`, see fusewire::auto_transport) and
/// returns what it returns; throws std::invalid_argument with
/// transport_problem()'s reason when `name` cannot be used.
template <bool WithVerbs = false, class F>
decltype(auto) with_transport(std::string_view name, const fusewire::options& o, const fusewire::cluster_spec& spec,
                              F&& f) {
  if (auto problem = transport_problem(name, WithVerbs)) {
    throw std::invalid_argument("transport '" + std::string(name) + "': " + *problem);
  }
  return fusewire::with_transport(name, o, spec, [&]<class T>(T) { return f.template operator()<T>(); });
}

}  // namespace example
