#pragma once
/// The handshake frames' metadata (hello, hello_ack, auth_challenge,
/// auth_response): the structs, their encoders and their decoders. Layouts in
/// meta.hpp.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/wire/detail/meta_codec.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// Bytes of a handshake nonce.
inline constexpr std::size_t nonce_size = 32;
/// Bytes of a handshake MAC (HMAC-SHA256).
inline constexpr std::size_t mac_size = 32;
/// A handshake nonce: random bytes chosen by one side.
using nonce_bytes = std::array<std::byte, nonce_size>;
/// A handshake MAC over the handshake transcript, keyed by the cluster token.
using mac_bytes = std::array<std::byte, mac_size>;

/// Handshake step 1, sent by the connecting side: who it is and what it speaks.
struct hello_meta {
  static constexpr frame_type type = frame_type::hello;
  std::uint8_t min_version = version;  ///< oldest wire version the sender reads
  std::uint8_t max_version = version;  ///< newest wire version the sender reads
  std::uint16_t lane = 0;              ///< which of several connections between the same two tasks
  std::string_view job;                ///< the sender's job name ("worker", "ps")
  std::uint32_t task_index = 0;        ///< the sender's task index within its job
  std::uint64_t incarnation = 0;       ///< random per process start; a new value means the peer restarted
  std::uint64_t features = 0;          ///< optional capabilities the sender offers (bit set)

  friend bool operator==(const hello_meta&, const hello_meta&) = default;
};

/// Last handshake step, sent by the accepting side: who it is and the version
/// both will speak. `mac` proves the acceptor knows the cluster token (zero without auth).
struct hello_ack_meta {
  static constexpr frame_type type = frame_type::hello_ack;
  std::uint8_t version = wire::version;  ///< the version chosen for this connection
  std::uint16_t lane = 0;
  std::string_view job;
  std::uint32_t task_index = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t features = 0;  ///< the subset of offered features both sides use
  mac_bytes mac{};

  friend bool operator==(const hello_ack_meta&, const hello_ack_meta&) = default;
};

/// The acceptor's challenge: the connector must answer with a MAC over it.
struct auth_challenge_meta {
  static constexpr frame_type type = frame_type::auth_challenge;
  nonce_bytes nonce{};

  friend bool operator==(const auth_challenge_meta&, const auth_challenge_meta&) = default;
};

/// The connector's answer, plus its own nonce so the acceptor proves itself too.
struct auth_response_meta {
  static constexpr frame_type type = frame_type::auth_response;
  mac_bytes mac{};
  nonce_bytes nonce{};

  friend bool operator==(const auth_response_meta&, const auth_response_meta&) = default;
};

// ---- hello ------------------------------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const hello_meta& m) noexcept {
  return 1 + 1 + 2 + 4 + 8 + 8 + detail::string_size(m.job);
}

/// Writes `m` into `out`; returns the bytes written (encoded_size(m)), or 0 with
/// errc::invalid_argument if a field cannot be encoded or `out` is too small.
inline std::size_t encode_meta(const hello_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(detail::string_fits(m.job), encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u8(m.min_version);
    w.u8(m.max_version);
    w.u16(m.lane);
    w.u32(m.task_index);
    w.u64(m.incarnation);
    w.u64(m.features);
    detail::write_string(w, m.job);
  });
}

/// Decodes the meta of hello frame `h` from `meta` (at least h.meta_len bytes).
/// errc::malformed_frame if it contradicts its length or min_version > max_version,
/// frame_too_large if the job name exceeds `lim`, invalid_argument if `h` is no hello.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 hello_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == hello_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  hello_meta m;
  m.min_version = r.u8();
  m.max_version = r.u8();
  m.lane = r.u16();
  m.task_index = r.u32();
  m.incarnation = r.u64();
  m.features = r.u64();
  if (auto ec = detail::read_string(r, lim.max_key_bytes, m.job)) return ec;
  if (auto ec = detail::finish(r)) return ec;
  if (m.min_version > m.max_version) return make_error_code(errc::malformed_frame);
  out = m;
  return {};
}

// ---- hello_ack --------------------------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const hello_ack_meta& m) noexcept {
  return 1 + 1 + 2 + 4 + 8 + 8 + mac_size + detail::string_size(m.job);
}

inline std::size_t encode_meta(const hello_ack_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(detail::string_fits(m.job), encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u8(m.version);
    w.u8(0);
    w.u16(m.lane);
    w.u32(m.task_index);
    w.u64(m.incarnation);
    w.u64(m.features);
    w.bytes(m.mac);
    detail::write_string(w, m.job);
  });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 hello_ack_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == hello_ack_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  hello_ack_meta m;
  m.version = r.u8();
  const std::uint8_t reserved = r.u8();
  m.lane = r.u16();
  m.task_index = r.u32();
  m.incarnation = r.u64();
  m.features = r.u64();
  r.copy_to(m.mac);
  if (auto ec = detail::read_string(r, lim.max_key_bytes, m.job)) return ec;
  if (auto ec = detail::finish(r)) return ec;
  if (reserved != 0) return make_error_code(errc::malformed_frame);
  out = m;
  return {};
}

// ---- auth_challenge / auth_response -----------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const auth_challenge_meta&) noexcept { return nonce_size; }

inline std::size_t encode_meta(const auth_challenge_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, encoded_size(m), out, ec, [&](byte_writer& w) { w.bytes(m.nonce); });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 auth_challenge_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == auth_challenge_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  auth_challenge_meta m;
  r.copy_to(m.nonce);
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

[[nodiscard]] constexpr std::size_t encoded_size(const auth_response_meta&) noexcept { return mac_size + nonce_size; }

inline std::size_t encode_meta(const auth_response_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, encoded_size(m), out, ec, [&](byte_writer& w) {
    w.bytes(m.mac);
    w.bytes(m.nonce);
  });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 auth_response_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == auth_response_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  auth_response_meta m;
  r.copy_to(m.mac);
  r.copy_to(m.nonce);
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
