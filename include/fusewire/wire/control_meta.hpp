#pragma once
/// The metadata of the control frames (ack, error, ping, pong, goodbye): the
/// structs, their encoders and their decoders. Layouts in meta.hpp.

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

/// Acknowledges the request in the header's request_id.
struct ack_meta {
  static constexpr frame_type type = frame_type::ack;
  std::uint64_t value = 0;    ///< what is acknowledged (bytes, entries), as the protocol defines
  std::uint32_t credits = 0;  ///< send credits granted to the peer

  friend bool operator==(const ack_meta&, const ack_meta&) = default;
};

/// The request in the header's request_id failed.
struct error_meta {
  static constexpr frame_type type = frame_type::error;
  std::int32_t code = 0;     ///< a `fusewire::errc` value
  std::string_view message;  ///< for people; at most limits::max_message_bytes

  /// `code` as an error code in fusewire's category.
  [[nodiscard]] std::error_code error() const noexcept { return {code, error_category()}; }
  friend bool operator==(const error_meta&, const error_meta&) = default;
};

/// Keepalive / latency probe; the peer answers with a pong echoing `timestamp`.
struct ping_meta {
  static constexpr frame_type type = frame_type::ping;
  std::uint64_t timestamp = 0;  ///< the sender's clock, opaque to the peer

  friend bool operator==(const ping_meta&, const ping_meta&) = default;
};

/// The answer to a ping.
struct pong_meta {
  static constexpr frame_type type = frame_type::pong;
  std::uint64_t timestamp = 0;  ///< copied from the ping

  friend bool operator==(const pong_meta&, const pong_meta&) = default;
};

/// The sender closes the connection after this frame.
struct goodbye_meta {
  static constexpr frame_type type = frame_type::goodbye;
  std::int32_t reason = 0;  ///< a `fusewire::errc` value; 0 = orderly shutdown

  friend bool operator==(const goodbye_meta&, const goodbye_meta&) = default;
};

// ---- ack, error, ping, pong, goodbye --------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const ack_meta&) noexcept { return 8 + 4; }

inline std::size_t encode_meta(const ack_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u64(m.value);
    w.u32(m.credits);
  });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 ack_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == ack_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  ack_meta m;
  m.value = r.u64();
  m.credits = r.u32();
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

[[nodiscard]] constexpr std::size_t encoded_size(const error_meta& m) noexcept {
  return 4 + detail::string_size(m.message);
}

inline std::size_t encode_meta(const error_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(detail::string_fits(m.message), encoded_size(m), out, ec, [&](byte_writer& w) {
    w.i32(m.code);
    detail::write_string(w, m.message);
  });
}

/// Decodes an error frame; errc::frame_too_large if the message exceeds
/// limits::max_message_bytes.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 error_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == error_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  error_meta m;
  m.code = r.i32();
  if (auto ec = detail::read_string(r, lim.max_message_bytes, m.message)) return ec;
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

[[nodiscard]] constexpr std::size_t encoded_size(const ping_meta&) noexcept { return 8; }
[[nodiscard]] constexpr std::size_t encoded_size(const pong_meta&) noexcept { return 8; }

inline std::size_t encode_meta(const ping_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, 8, out, ec, [&](byte_writer& w) { w.u64(m.timestamp); });
}
inline std::size_t encode_meta(const pong_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, 8, out, ec, [&](byte_writer& w) { w.u64(m.timestamp); });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 ping_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == ping_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  const std::uint64_t timestamp = r.u64();
  if (auto ec = detail::finish(r)) return ec;
  out.timestamp = timestamp;
  return {};
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 pong_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == pong_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  const std::uint64_t timestamp = r.u64();
  if (auto ec = detail::finish(r)) return ec;
  out.timestamp = timestamp;
  return {};
}

[[nodiscard]] constexpr std::size_t encoded_size(const goodbye_meta&) noexcept { return 4; }

inline std::size_t encode_meta(const goodbye_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, 4, out, ec, [&](byte_writer& w) { w.i32(m.reason); });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 goodbye_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == goodbye_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  const std::int32_t reason = r.i32();
  if (auto ec = detail::finish(r)) return ec;
  out.reason = reason;
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
