#pragma once
/// The verbs transport's tiny message header (credits, stream length, window
/// flags) and the hello exchanged in rdmacm's private data. Private to the
/// transport layer.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <fusewire/wire/endian.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// The first bytes of every message the transport SENDs: returned credits,
/// the number of stream bytes that follow, and flags: RTS (the sender has
/// bulk bytes and asks for a window of grants), GRANT (the sender may
/// RDMA-write up to `grant_len` bytes at grant_addr/grant_rkey), REVOKE
/// (hand back the grants not yet written), RELEASE (`released` grants handed
/// back). Little-endian.
struct verbs_header {
  static constexpr std::size_t size = 40;
  static constexpr std::uint32_t magic = 0x46575652;  // "RVWF"
  static constexpr std::uint32_t flag_rts = 1;
  static constexpr std::uint32_t flag_grant = 2;
  static constexpr std::uint32_t flag_revoke = 4;
  static constexpr std::uint32_t flag_release = 8;

  std::uint32_t credits = 0;
  std::uint32_t data_len = 0;
  std::uint32_t flags = 0;
  std::uint32_t released = 0;
  std::uint64_t grant_addr = 0;
  std::uint32_t grant_rkey = 0;
  std::uint32_t grant_len = 0;

  void store(std::byte* out) const noexcept {
    wire::store_le<std::uint32_t>(out, magic);
    wire::store_le<std::uint32_t>(out + 4, credits);
    wire::store_le<std::uint32_t>(out + 8, data_len);
    wire::store_le<std::uint32_t>(out + 12, flags);
    wire::store_le<std::uint32_t>(out + 16, released);
    wire::store_le<std::uint32_t>(out + 20, 0);
    wire::store_le<std::uint64_t>(out + 24, grant_addr);
    wire::store_le<std::uint32_t>(out + 32, grant_rkey);
    wire::store_le<std::uint32_t>(out + 36, grant_len);
  }
  /// False for a message too short or without the magic.
  bool load(const std::byte* in, std::size_t len) noexcept {
    if (len < size || wire::load_le<std::uint32_t>(in) != magic) return false;
    credits = wire::load_le<std::uint32_t>(in + 4);
    data_len = wire::load_le<std::uint32_t>(in + 8);
    flags = wire::load_le<std::uint32_t>(in + 12);
    released = wire::load_le<std::uint32_t>(in + 16);
    grant_addr = wire::load_le<std::uint64_t>(in + 24);
    grant_rkey = wire::load_le<std::uint32_t>(in + 32);
    grant_len = wire::load_le<std::uint32_t>(in + 36);
    return data_len <= len - size;
  }
};

/// What each side puts in rdmacm's private data: its protocol version, the
/// receive credits it grants and the message size it accepts.
struct verbs_hello {
  static constexpr std::size_t size = 12;
  static constexpr std::uint32_t version = 2;  // 2: windows of grants (RTS once, REVOKE/RELEASE)
  std::uint32_t credits = 0;
  std::uint32_t message_size = 0;

  void store(std::byte* out) const noexcept {
    wire::store_le<std::uint32_t>(out, version);
    wire::store_le<std::uint32_t>(out + 4, credits);
    wire::store_le<std::uint32_t>(out + 8, message_size);
  }
  bool load(const void* in, std::size_t len) noexcept {
    if (in == nullptr || len < size) return false;
    const auto* p = static_cast<const std::byte*>(in);
    if (wire::load_le<std::uint32_t>(p) != version) return false;
    credits = wire::load_le<std::uint32_t>(p + 4);
    message_size = wire::load_le<std::uint32_t>(p + 8);
    return credits >= 2 && message_size > verbs_header::size;
  }
};

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
