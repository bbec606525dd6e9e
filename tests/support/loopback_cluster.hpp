#pragma once
/// A cluster_spec whose tasks all listen on loopback, each on its own fresh port.
#include <fusewire/core/cluster_spec.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/ports.hpp"

namespace fusewire::test {

/// "ps=127.0.0.1:p;worker=127.0.0.1:p,..." with fresh ports.
inline fusewire::cluster_spec loopback_cluster(unsigned ps, unsigned workers) {
  // free_port() closes its probe socket, so two calls can name the same port:
  // draw until every task has its own.
  std::vector<std::uint16_t> ports;
  while (ports.size() < ps + workers) {
    const std::uint16_t p = free_port();
    if (std::find(ports.begin(), ports.end(), p) == ports.end()) ports.push_back(p);
  }
  std::string text = "ps=";
  for (unsigned i = 0; i < ps; ++i) text += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(ports[i]);
  text += ";worker=";
  for (unsigned i = 0; i < workers; ++i) {
    text += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(ports[ps + i]);
  }
  return fusewire::cluster_spec::from_string(text);
}

}  // namespace fusewire::test
