#pragma once
/// provide_local_token(): for a program that starts a whole job on this
/// machine (a launcher of PS and worker processes), a random cluster token
/// that its children inherit through the environment, so that a local job is
/// authenticated too (and its tasks may share connections, which needs a
/// token) without anyone choosing a secret.

#include <cstddef>
#include <cstdlib>
#include <string>

#include <fusewire/protocol/detail/hmac.hpp>

namespace fusewire {
inline namespace v0 {
namespace protocol {

/// When neither FUSEWIRE_CLUSTER_TOKEN nor FUSEWIRE_CLUSTER_TOKEN_FILE is set
/// and this build can authenticate, sets FUSEWIRE_CLUSTER_TOKEN in this
/// process's environment to 32 random bytes in hex, for the child processes
/// it starts next, and returns true. Returns false, changing nothing, when a
/// token is already configured, without libcrypto, or if no random bytes can
/// be had. Call it before the program starts threads (setenv is not
/// thread-safe) and only when every task runs on this machine.
inline bool provide_local_token() {
  auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
  if (set("FUSEWIRE_CLUSTER_TOKEN") || set("FUSEWIRE_CLUSTER_TOKEN_FILE") || !detail::has_crypto) return false;
  std::byte raw[32];
  if (detail::random_bytes(raw)) return false;
  static constexpr char hex[] = "0123456789abcdef";
  std::string token;
  for (std::byte b : raw) {
    token += hex[static_cast<unsigned>(b) >> 4];
    token += hex[static_cast<unsigned>(b) & 15];
  }
  return ::setenv("FUSEWIRE_CLUSTER_TOKEN", token.c_str(), 1) == 0;
}

}  // namespace protocol
}  // namespace v0
}  // namespace fusewire
