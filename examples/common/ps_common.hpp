// What both PS examples (ps_worker, embedding) do the same way: pick the
// transport and build fusewire options from the command line.
#pragma once

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/ps/ps.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace example {

namespace ps = fusewire::ps;

#if FUSEWIRE_HAS_URING
inline constexpr const char* default_transport = "uring";
#else
inline constexpr const char* default_transport = "asio";
#endif

/// Transports this build can use, for --transport.
inline std::vector<std::string> transport_names() {
#if FUSEWIRE_HAS_URING
  return {"uring", "asio"};
#else
  return {"asio"};
#endif
}

/// Calls `f.template operator()<Transport>()` for the transport named `name`.
template <class F>
decltype(auto) with_transport(const std::string& name, F&& f) {
#if FUSEWIRE_HAS_URING
  if (name == "uring") return f.template operator()<fusewire::uring_tcp>();
#endif
  if (name != "asio") throw std::invalid_argument("--transport '" + name + "' is not available in this build");
  return f.template operator()<fusewire::asio_tcp>();
}

/// fusewire options for reactor mode `mode` ("poll", "adaptive", "block") and fusion on/off.
inline fusewire::options net_options(const std::string& mode, bool fusion) {
  fusewire::options o;
  o.mode = *fusewire::reactor_mode_from_string(mode);
  o.coalesce = fusion;
  o.tensor_fuse = fusion;
  o.connect_timeout = std::chrono::seconds(60);
  return o;
}

/// PS-side training mode for --sync/--async.
inline ps::training_mode training_mode(bool sync) { return sync ? ps::training_mode::sync : ps::training_mode::async; }

}  // namespace example
