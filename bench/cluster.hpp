#pragma once
/// fwbench cluster spec: where the parameter servers listen and how many
/// workers there are, as `ps=host:port,host:port;worker=host:port`.

#include <cstdint>
#include <fusewire/core/error.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace fusewire::bench {

/// A host and a TCP port; port 0 means "any free port" (only when fwbench
/// launches the PS itself and tells the workers which one it got).
struct endpoint {
  std::string host;
  std::uint16_t port = 0;

  /// "host:port", with brackets around an IPv6 host.
  std::string to_string() const {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  friend bool operator==(const endpoint&, const endpoint&) = default;
};

/// Every task of one benchmark cluster.
struct cluster_spec {
  std::vector<endpoint> ps;
  std::vector<endpoint> workers;

  /// The spec string `parse_cluster` reads back.
  std::string to_string() const {
    std::string out = "ps=";
    for (std::size_t i = 0; i < ps.size(); ++i) out += (i ? "," : "") + ps[i].to_string();
    out += ";worker=";
    for (std::size_t i = 0; i < workers.size(); ++i) out += (i ? "," : "") + workers[i].to_string();
    return out;
  }
  friend bool operator==(const cluster_spec&, const cluster_spec&) = default;
};

/// Parses "host:port" or "[v6]:port"; throws `system_error(errc::invalid_argument)`
/// naming `text` and `option`.
inline endpoint parse_endpoint(std::string_view text, std::string_view option) {
  auto fail = [&](const std::string& why) {
    throw_error(errc::invalid_argument, std::string(option) + " '" + std::string(text) + "': " + why);
  };
  endpoint ep;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      fail("expected [ipv6]:port");
    }
    ep.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) fail("expected host:port");
    ep.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (ep.host.empty()) fail("the host is empty");
  if (port_text.empty() || port_text.size() > 5) fail("the port must be a number from 0 to 65535");
  unsigned long port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') fail("the port must be a number from 0 to 65535");
    port = port * 10 + static_cast<unsigned long>(c - '0');
  }
  if (port > 65535) fail("the port must be a number from 0 to 65535");
  ep.port = static_cast<std::uint16_t>(port);
  return ep;
}

/// Parses "ps=h:p,h:p;worker=h:p[,h:p]" (either order; at least one of each).
inline cluster_spec parse_cluster(std::string_view text, std::string_view option = "--cluster") {
  auto fail = [&](const std::string& why) {
    throw_error(errc::invalid_argument, std::string(option) + " '" + std::string(text) + "': " + why);
  };
  cluster_spec spec;
  bool seen_ps = false;
  bool seen_worker = false;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(';', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view part = text.substr(start, end - start);
    start = end + 1;
    if (part.empty()) continue;
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) fail("expected ps=host:port,...;worker=host:port,...");
    const std::string_view job = part.substr(0, eq);
    std::vector<endpoint>* list = nullptr;
    if (job == "ps") {
      if (seen_ps) fail("'ps' is given twice");
      seen_ps = true;
      list = &spec.ps;
    } else if (job == "worker") {
      if (seen_worker) fail("'worker' is given twice");
      seen_worker = true;
      list = &spec.workers;
    } else {
      fail("unknown job '" + std::string(job) + "' (jobs are ps and worker)");
    }
    std::string_view tasks = part.substr(eq + 1);
    std::size_t at = 0;
    while (at <= tasks.size()) {
      std::size_t comma = tasks.find(',', at);
      if (comma == std::string_view::npos) comma = tasks.size();
      list->push_back(parse_endpoint(tasks.substr(at, comma - at), option));
      at = comma + 1;
    }
  }
  if (spec.ps.empty()) fail("no ps tasks (expected ps=host:port,...)");
  if (spec.workers.empty()) fail("no worker tasks (expected worker=host:port,...)");
  return spec;
}

}  // namespace fusewire::bench
