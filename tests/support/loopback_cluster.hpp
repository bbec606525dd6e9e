#pragma once
/// A cluster_spec whose tasks all listen on one address (loopback, or the test
/// guest's RDMA interface), each on its own fresh port.
#include <fusewire/core/cluster_spec.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/ports.hpp"

namespace fusewire::test {

/// "ps=HOST:p;worker=HOST:p,..." with fresh ports.
inline fusewire::cluster_spec cluster_on(const std::string& host, unsigned ps, unsigned workers) {
  // free_port() closes its probe socket, so two calls can name the same port:
  // draw until every task has its own.
  std::vector<std::uint16_t> ports;
  while (ports.size() < ps + workers) {
    const std::uint16_t p = free_port();
    if (std::find(ports.begin(), ports.end(), p) == ports.end()) ports.push_back(p);
  }
  std::string text = "ps=";
  for (unsigned i = 0; i < ps; ++i) text += (i ? "," : "") + host + ":" + std::to_string(ports[i]);
  text += ";worker=";
  for (unsigned i = 0; i < workers; ++i) {
    text += (i ? "," : "") + host + ":" + std::to_string(ports[ps + i]);
  }
  return fusewire::cluster_spec::from_string(text);
}

/// "ps=127.0.0.1:p;worker=127.0.0.1:p,..." with fresh ports.
inline fusewire::cluster_spec loopback_cluster(unsigned ps, unsigned workers) {
  return cluster_on("127.0.0.1", ps, workers);
}

}  // namespace fusewire::test
