#pragma once
/// Whether a host, as a cluster spec names it, is this machine: a loopback
/// address, this host's name, or an address of one of its interfaces. Shared
/// by per_host's default host test and the choice "auto" (select.hpp).
/// Private to the transport layer.

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <vector>

#include <fusewire/core/security.hpp>
#include <fusewire/util/text.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// `host` in the canonical text of its address, or itself when it is not numeric.
inline std::string canonical_address(std::string_view host) {
  if (host.size() >= 64) return std::string(host);
  char text[64];
  host.copy(text, host.size());
  text[host.size()] = '\0';
  unsigned char bytes[16];
  char out[INET6_ADDRSTRLEN];
  if (::inet_pton(AF_INET, text, bytes) == 1 && ::inet_ntop(AF_INET, bytes, out, sizeof out) != nullptr) return out;
  if (::inet_pton(AF_INET6, text, bytes) == 1 && ::inet_ntop(AF_INET6, bytes, out, sizeof out) != nullptr) return out;
  return std::string(host);
}

inline std::vector<std::string> interface_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN];
    const void* bytes = nullptr;
    if (a->ifa_addr->sa_family == AF_INET) {
      bytes = &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      bytes = &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr;
    }
    if (bytes != nullptr && ::inet_ntop(a->ifa_addr->sa_family, bytes, text, sizeof text) != nullptr) {
      out.emplace_back(text);
    }
  }
  ::freeifaddrs(list);
  return out;
}

inline std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

/// True if `host` is the machine named `hostname` with interface addresses
/// `addresses`. A name other than `hostname` is not resolved (a lookup could
/// block): it counts as another host.
inline bool is_host(std::string_view host, std::string_view hostname, const std::vector<std::string>& addresses) {
  if (is_loopback_host(host)) return true;
  if (!hostname.empty() && util::iequals(host, hostname)) return true;
  const std::string canonical = canonical_address(host);
  for (const std::string& a : addresses) {
    if (util::iequals(canonical, a)) return true;
  }
  return false;
}

/// is_host() for this machine, its name and addresses read once per process.
inline bool is_this_host(std::string_view host) {
  static const std::string name = host_name();
  static const std::vector<std::string> addresses = interface_addresses();
  return is_host(host, name, addresses);
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
