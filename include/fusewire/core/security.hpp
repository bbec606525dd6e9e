#pragma once
/// Whether a cluster may run without a cluster token: only when every address
/// it names is loopback, or when the operator opted out (options::insecure).
/// The threat model is in docs/security.md.

#include <arpa/inet.h>

#include <optional>
#include <string>
#include <string_view>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/util/text.hpp>

namespace fusewire {
inline namespace v0 {

/// True for a host that can only be this machine: "localhost" (and its
/// ".localhost" names), 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. Any other
/// name counts as reachable from the network, whatever it resolves to today.
inline bool is_loopback_host(std::string_view host) noexcept {
  if (util::iequals(host, "localhost") || util::iequals(host, "ip6-localhost")) return true;
  if (host.size() > 10 && util::iequals(host.substr(host.size() - 10), ".localhost")) return true;
  if (host.size() >= 64) return false;
  char text[64];
  host.copy(text, host.size());
  text[host.size()] = '\0';
  unsigned char a[16];
  if (::inet_pton(AF_INET, text, a) == 1) return a[0] == 127;
  if (::inet_pton(AF_INET6, text, a) == 1) {
    bool zero10 = true;
    for (int i = 0; i < 10; ++i) zero10 = zero10 && a[i] == 0;
    if (!zero10) return false;
    bool ones = a[10] == 0xff && a[11] == 0xff;
    if (ones) return a[12] == 127;  // ::ffff:127.x.y.z
    for (int i = 10; i < 15; ++i) {
      if (a[i] != 0) return false;
    }
    return a[15] == 1;  // ::1
  }
  return false;
}

/// The first address of `spec` (control or fast path) that is not loopback, as
/// "task at host:port"; nullopt when every one is.
inline std::optional<std::string> first_network_address(const cluster_spec& spec) {
  for (const task_id& t : spec.tasks()) {
    const net_address& control = spec.control_endpoint(t);
    if (!is_loopback_host(control.host)) return t.to_string() + " at " + control.to_string();
    if (spec.has_endpoint_map()) {
      const net_address fast = spec.fast_path_endpoint(t);
      if (!is_loopback_host(fast.host)) return t.to_string() + " at " + fast.to_string();
    }
  }
  return std::nullopt;
}

/// Enforces "a token unless loopback": throws system_error(errc::invalid_config)
/// when `o` has no cluster token, `spec` names a network address and `o.insecure`
/// is false. Returns the warning to log once at start-up when it runs insecure
/// on a network address; nullopt when there is nothing to say.
inline std::optional<std::string> check_cluster_security(const options& o, const cluster_spec& spec) {
  if (!o.cluster_token.empty()) return std::nullopt;
  const std::optional<std::string> where = first_network_address(spec);
  if (!where) return std::nullopt;
  if (!o.insecure) {
    throw_error(errc::invalid_config,
                "the cluster has a network address (" + *where +
                    ") and no cluster token: set FUSEWIRE_CLUSTER_TOKEN_FILE (or FUSEWIRE_CLUSTER_TOKEN) on every "
                    "task, or FUSEWIRE_INSECURE=1 to run without authentication (see docs/security.md)");
  }
  return "WARNING: running without a cluster token on a network address (" + *where +
         ", FUSEWIRE_INSECURE): any host that reaches this port can act as any task";
}

}  // namespace v0
}  // namespace fusewire
