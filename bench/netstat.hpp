#pragma once
/// Network bytes as the host's interface counters see them: what fwbench
/// reports beside CPU and RSS. A worker reads the counters of the interface
/// that carries its traffic to the first PS before and after its measured
/// window (loopback when the PS is on this host, since Linux routes traffic
/// to its own addresses over lo).

#include <cstdint>
#include <string>

namespace fusewire::bench {

/// Bytes an interface has sent and received since it came up.
struct net_counters {
  std::string interface;  ///< empty when it could not be found
  std::uint64_t tx_bytes = 0;
  std::uint64_t rx_bytes = 0;
};

/// The interface that carries IPv4 traffic from here to `host` ("lo" for one
/// of this host's own addresses); empty when `host` does not resolve or no
/// interface owns the source address the kernel picks.
std::string interface_towards(const std::string& host);

/// The counters of `interface` now (/sys/class/net/NAME/statistics); zeros
/// and an empty name when they cannot be read.
net_counters read_net_counters(const std::string& interface);

/// RDMA traffic bypasses the kernel's interface counters: the data counters
/// of port 1 of RDMA device `device` (/sys/class/infiniband/DEV/ports/1/
/// counters/port_{xmit,rcv}_data, in units of 4 bytes), named "DEV/1"; the
/// first device when `device` is empty or absent. Empty name where the device
/// has no such counters (soft-RoCE has none).
net_counters read_rdma_counters(const std::string& device);

}  // namespace fusewire::bench
