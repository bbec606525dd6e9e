// fusewire's own transports as fwbench backends.
//
// The transports (uring_tcp, asio_tcp, over the per-core reactor) are not in
// the tree yet, so both entries report "fusewire: not built yet" and `fwbench
// compare` prints that row instead of ratios. When a transport lands, give its
// entry a server (listen; per connection: receive a payload, send it back or
// send an 8-byte count of it, as backend.hpp says) and a client (connect to
// every PS; `exchange` sends to all, waits for all), set `available = true`,
// and compile this file with the transport's dependency in bench/meson.build.

#include "backend.hpp"

namespace fusewire::bench {

std::vector<backend_info> fusewire_backends() {
  std::vector<backend_info> out;
  for (const char* name : {"fusewire-uring", "fusewire-asio"}) {
    backend_info info;
    info.name = name;
    info.summary = std::string("fusewire ") + (name[9] == 'u' ? "io_uring" : "Boost.Asio") +
                   " TCP transport on its reactor (fusion, pinning and the reactor mode apply)";
    info.available = false;
    info.unavailable_reason = "fusewire: not built yet (the TCP transports are not in this tree)";
    info.fusewire = true;
    info.honours_wait_mode = true;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace fusewire::bench
