#include "netstat.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fusewire::bench {

namespace {

bool resolve_ipv4(const std::string& host, in_addr& out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  out = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return true;
}

/// The interface holding IPv4 address `a`, or "".
std::string interface_with(const in_addr& a) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string name;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == a.s_addr) {
      name = i->ifa_name;
      break;
    }
  }
  ::freeifaddrs(list);
  return name;
}

std::uint64_t read_u64(const std::string& path) {
  std::ifstream in(path);
  std::uint64_t v = 0;
  in >> v;
  return in ? v : 0;
}

}  // namespace

std::string interface_towards(const std::string& host) {
  in_addr dst{};
  if (!resolve_ipv4(host, dst)) return {};
  // Traffic to one of this host's own addresses (or 127/8) goes over lo.
  if ((ntohl(dst.s_addr) >> 24) == 127 || !interface_with(dst).empty()) return "lo";
  // Otherwise: the interface that owns the source address the kernel routes from.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr = dst;
  to.sin_port = htons(9);  // connect() on UDP only picks a route; nothing is sent
  sockaddr_in from{};
  socklen_t len = sizeof from;
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&from), &len) == 0;
  ::close(fd);
  return ok ? interface_with(from.sin_addr) : std::string();
}

net_counters read_net_counters(const std::string& interface) {
  net_counters c;
  if (interface.empty() || interface.find('/') != std::string::npos) return c;
  const std::string dir = "/sys/class/net/" + interface + "/statistics/";
  std::ifstream probe(dir + "tx_bytes");
  if (!probe) return c;
  c.interface = interface;
  c.tx_bytes = read_u64(dir + "tx_bytes");
  c.rx_bytes = read_u64(dir + "rx_bytes");
  return c;
}

net_counters read_rdma_counters(const std::string& device) {
  namespace fs = std::filesystem;
  net_counters c;
  const fs::path root = "/sys/class/infiniband";
  std::error_code ec;
  std::string dev = device;
  if (dev.empty() || dev.find('/') != std::string::npos || !fs::exists(root / dev, ec)) {
    dev.clear();
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      dev = entry.path().filename().string();
      break;
    }
  }
  if (dev.empty()) return c;
  const fs::path counters = root / dev / "ports" / "1" / "counters";
  if (!fs::exists(counters / "port_xmit_data", ec)) return c;
  c.interface = dev + "/1";
  c.tx_bytes = 4 * read_u64((counters / "port_xmit_data").string());
  c.rx_bytes = 4 * read_u64((counters / "port_rcv_data").string());
  return c;
}

}  // namespace fusewire::bench
