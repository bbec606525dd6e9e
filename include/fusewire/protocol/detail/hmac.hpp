#pragma once
/// HMAC-SHA256 and random nonces for the cluster-token handshake (OpenSSL
/// libcrypto when FUSEWIRE_HAS_CRYPTO; otherwise both report not_supported).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>

#if FUSEWIRE_HAS_CRYPTO
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#endif

namespace fusewire {
inline namespace v0 {
namespace protocol {
namespace detail {

/// True when this build can compute the handshake MAC.
inline constexpr bool has_crypto =
#if FUSEWIRE_HAS_CRYPTO
    true;
#else
    false;
#endif

/// Fills `out` with cryptographically random bytes; errc::not_supported without libcrypto.
inline std::error_code random_bytes(std::span<std::byte> out) noexcept {
#if FUSEWIRE_HAS_CRYPTO
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    return make_error_code(errc::auth_failed);
  }
  return {};
#else
  (void)out;
  return make_error_code(errc::not_supported);
#endif
}

/// HMAC-SHA256 keyed by `token` over `data`.
inline std::error_code hmac_sha256(std::string_view token, std::span<const std::byte> data,
                                   std::array<std::byte, 32>& out) noexcept {
#if FUSEWIRE_HAS_CRYPTO
  unsigned int len = 0;
  const unsigned char* r = HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
                                reinterpret_cast<const unsigned char*>(data.data()), data.size(),
                                reinterpret_cast<unsigned char*>(out.data()), &len);
  if (r == nullptr || len != out.size()) return make_error_code(errc::auth_failed);
  return {};
#else
  (void)token;
  (void)data;
  (void)out;
  return make_error_code(errc::not_supported);
#endif
}

/// Compares two MACs in time independent of where they differ.
inline bool equal_macs(const std::array<std::byte, 32>& a, const std::array<std::byte, 32>& b) noexcept {
  unsigned diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace detail
}  // namespace protocol
}  // namespace v0
}  // namespace fusewire
