#pragma once
/// Whole frames: decode a contiguous frame (header, meta, payload) into a
/// typed body, and encode the header + meta prefix that goes in front of a
/// payload (the payload itself is sent from the caller's buffers, uncopied).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <system_error>
#include <variant>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/wire/frame.hpp>
#include <fusewire/wire/fused.hpp>
#include <fusewire/wire/meta.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// A frame's meta of any type. Views into the decoded bytes, like each alternative.
using frame_body = std::variant<hello_meta, hello_ack_meta, auth_challenge_meta, auth_response_meta, tensor_meta,
                                fused_meta, chunk_meta, recv_request_meta, placed_meta, ack_meta, error_meta, ping_meta,
                                pong_meta, goodbye_meta, application_meta>;

/// A meta type the encoders know: it names its frame type and can be sized and written.
template <class M>
concept frame_meta = requires(const M& m, mutable_buffer out, std::error_code& ec) {
  { m.type } -> std::convertible_to<frame_type>;
  { encoded_size(m) } -> std::convertible_to<std::size_t>;
  { encode_meta(m, out, ec) } -> std::same_as<std::size_t>;
};

namespace detail {

template <class M>
std::error_code decode_body(const frame_header& h, const_buffer meta, const limits& lim, frame_body& out) noexcept {
  M m;
  if (auto ec = decode_meta(h, meta, lim, m)) return ec;
  out.template emplace<M>(m);
  return {};
}

}  // namespace detail

/// Decodes the meta of any frame type into `out` (see each type's decode_meta
/// for its checks); errc::unknown_frame_type for a type no decoder knows.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 frame_body& out) noexcept {
  switch (h.type) {
    case frame_type::hello:
      return detail::decode_body<hello_meta>(h, meta, lim, out);
    case frame_type::hello_ack:
      return detail::decode_body<hello_ack_meta>(h, meta, lim, out);
    case frame_type::auth_challenge:
      return detail::decode_body<auth_challenge_meta>(h, meta, lim, out);
    case frame_type::auth_response:
      return detail::decode_body<auth_response_meta>(h, meta, lim, out);
    case frame_type::tensor:
      return detail::decode_body<tensor_meta>(h, meta, lim, out);
    case frame_type::fused:
      return detail::decode_body<fused_meta>(h, meta, lim, out);
    case frame_type::chunk:
      return detail::decode_body<chunk_meta>(h, meta, lim, out);
    case frame_type::recv_request:
      return detail::decode_body<recv_request_meta>(h, meta, lim, out);
    case frame_type::placed:
      return detail::decode_body<placed_meta>(h, meta, lim, out);
    case frame_type::ack:
      return detail::decode_body<ack_meta>(h, meta, lim, out);
    case frame_type::error:
      return detail::decode_body<error_meta>(h, meta, lim, out);
    case frame_type::ping:
      return detail::decode_body<ping_meta>(h, meta, lim, out);
    case frame_type::pong:
      return detail::decode_body<pong_meta>(h, meta, lim, out);
    case frame_type::goodbye:
      return detail::decode_body<goodbye_meta>(h, meta, lim, out);
    default:
      if (is_application(h.type)) return detail::decode_body<application_meta>(h, meta, lim, out);
      return make_error_code(errc::unknown_frame_type);
  }
}

/// One decoded frame; `meta`, `payload` and the views in `body` point into the
/// decoded input, which must outlive them.
struct decoded_frame {
  frame_header header;
  const_buffer meta;
  const_buffer payload;
  frame_body body;

  /// Bytes of the input this frame occupies (header + meta + payload).
  [[nodiscard]] std::size_t size() const noexcept { return header_size + meta.size() + payload.size(); }
};

/// Decodes the frame at the start of `in`: the header (decode_header's checks),
/// then the meta (decode_meta's checks, including that the meta's lengths add
/// up to payload_len), then the payload. errc::truncated_frame if `in` ends
/// before the frame does; bytes after the frame are left alone (see
/// decoded_frame::size). Allocates nothing, never throws; `out` is written only
/// on success.
[[nodiscard]] inline std::error_code decode_frame(const_buffer in, const limits& lim, decoded_frame& out) noexcept {
  frame_header h;
  if (auto ec = decode_header(in, lim, h)) return ec;
  const const_buffer rest = in.subspan(header_size);
  if (h.meta_len > rest.size()) return make_error_code(errc::truncated_frame);
  const const_buffer meta = rest.first(h.meta_len);
  frame_body body;
  if (auto ec = decode_meta(h, meta, lim, body)) return ec;
  if (h.payload_len > rest.size() - meta.size()) return make_error_code(errc::truncated_frame);
  out.header = h;
  out.meta = meta;
  out.payload = rest.subspan(meta.size(), static_cast<std::size_t>(h.payload_len));
  out.body = body;
  return {};
}

/// Bytes encode_prefix writes for `m`.
template <frame_meta M>
[[nodiscard]] std::size_t prefix_size(const M& m) noexcept {
  return header_size + encoded_size(m);
}

/// Writes the header and meta of a frame carrying `m` into `out`: the header's
/// type and meta_len come from `m`, its flags, request_id and payload_len from
/// `h`. Returns the bytes written (prefix_size(m)), or 0 with
/// errc::invalid_argument if `out` is too small, `m` cannot be encoded, `h`
/// sets reserved flags, or gives a payload to a type that has none.
template <frame_meta M>
std::size_t encode_prefix(const M& m, frame_header h, mutable_buffer out, std::error_code& ec) noexcept {
  h.type = m.type;
  const std::size_t meta_len = encoded_size(m);
  if (meta_len > std::numeric_limits<std::uint32_t>::max() || out.size() < header_size ||
      out.size() - header_size < meta_len || (h.flags & reserved_flags) != 0 ||
      (h.payload_len != 0 && !carries_payload(h.type))) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  h.meta_len = static_cast<std::uint32_t>(meta_len);
  const std::size_t written = encode_meta(m, out.subspan(header_size), ec);
  if (ec) return 0;
  encode_header(h, out.first<header_size>());
  return header_size + written;
}

/// prefix_size of whichever meta `body` holds.
[[nodiscard]] inline std::size_t prefix_size(const frame_body& body) noexcept {
  return std::visit([](const auto& m) { return prefix_size(m); }, body);
}

/// encode_prefix of whichever meta `body` holds.
inline std::size_t encode_prefix(const frame_body& body, const frame_header& h, mutable_buffer out,
                                 std::error_code& ec) noexcept {
  return std::visit([&](const auto& m) { return encode_prefix(m, h, out, ec); }, body);
}

/// Writes a whole contiguous frame: the prefix for `m` (payload_len =
/// payload.size()) followed by a copy of `payload`. For control frames, tests
/// and small messages; large payloads go out from their own buffers instead.
template <frame_meta M>
std::size_t encode_frame(const M& m, frame_header h, const_buffer payload, mutable_buffer out,
                         std::error_code& ec) noexcept {
  h.payload_len = payload.size();
  const std::size_t prefix = encode_prefix(m, h, out, ec);
  if (ec) return 0;
  if (out.size() - prefix < payload.size()) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  byte_writer w(out.subspan(prefix));
  w.bytes(payload);
  return prefix + payload.size();
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
