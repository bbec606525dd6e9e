#pragma once
/// The metadata of the frames that carry tensor bytes (tensor, chunk): the
/// structs, their encoders and their decoders. Layouts in meta.hpp.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/wire/descriptor.hpp>
#include <fusewire/wire/detail/meta_codec.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>
#include <fusewire/wire/segment_list.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// One keyed tensor. The payload is the tensor's bytes (its descriptor's
/// `byte_size` for fixed-size dtypes), sent as `segments` consecutive pieces
/// whose sizes add up to the frame's payload_len.
struct tensor_meta {
  static constexpr frame_type type = frame_type::tensor;
  std::string_view key;  ///< the rendezvous key
  tensor_descriptor descriptor;
  segment_list segments;

  friend bool operator==(const tensor_meta&, const tensor_meta&) = default;
};

/// One piece of a tensor too large for one frame. Every chunk carries the key
/// and descriptor, so whichever chunk arrives first tells the receiver what to
/// allocate (`total_len` bytes, bounded by limits::max_transfer_bytes); the
/// payload goes to [offset, offset + payload_len) of that tensor.
struct chunk_meta {
  static constexpr frame_type type = frame_type::chunk;
  std::uint64_t transfer_id = 0;  ///< the same in every chunk of one transfer; chosen by the sender
  std::uint64_t total_len = 0;    ///< bytes of the whole tensor
  std::uint64_t offset = 0;       ///< where this chunk's payload goes in the tensor
  std::uint32_t index = 0;        ///< this chunk's number, < count
  std::uint32_t count = 1;        ///< chunks in the transfer
  std::string_view key;
  tensor_descriptor descriptor;

  friend bool operator==(const chunk_meta&, const chunk_meta&) = default;
};

// ---- tensor -------------------------------------------------------------------

[[nodiscard]] inline std::size_t encoded_size(const tensor_meta& m) noexcept {
  return detail::string_size(m.key) + descriptor_size(m.descriptor) + 4 + 8 * m.segments.size();
}

inline std::size_t encode_meta(const tensor_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  const bool valid =
      detail::string_fits(m.key) && descriptor_encodable(m.descriptor) && m.segments.size() <= 0xffffffffu;
  return detail::encode_checked(valid, encoded_size(m), out, ec, [&](byte_writer& w) {
    detail::write_string(w, m.key);
    write_descriptor(w, m.descriptor);
    w.u32(static_cast<std::uint32_t>(m.segments.size()));
    for (std::uint64_t s : m.segments) w.u64(s);
  });
}

/// Decodes a tensor frame's meta and checks it against the header: the segment
/// sizes add up to h.payload_len, which equals the descriptor's byte size when
/// its dtype has a fixed size (errc::malformed_frame otherwise); key, rank and
/// segment count within `lim` (errc::frame_too_large otherwise).
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 tensor_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == tensor_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  tensor_meta m;
  if (auto ec = detail::read_string(r, lim.max_key_bytes, m.key)) return ec;
  if (auto ec = read_descriptor(r, lim, m.descriptor)) return ec;
  const std::uint32_t count = r.u32();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (count > lim.max_segments) return make_error_code(errc::frame_too_large);
  if (count > r.remaining() / 8) return make_error_code(errc::malformed_frame);
  m.segments = segment_list::from_wire(r.bytes(std::size_t{count} * 8));
  if (auto ec = detail::finish(r)) return ec;
  std::uint64_t sum = 0;
  for (std::uint64_t s : m.segments) {
    if (s > h.payload_len - sum) return make_error_code(errc::malformed_frame);
    sum += s;
  }
  if (sum != h.payload_len) return make_error_code(errc::malformed_frame);
  if (auto ec = check_payload_size(m.descriptor, h.payload_len)) return ec;
  out = m;
  return {};
}

// ---- chunk --------------------------------------------------------------------

[[nodiscard]] inline std::size_t encoded_size(const chunk_meta& m) noexcept {
  return 8 + 8 + 8 + 4 + 4 + detail::string_size(m.key) + descriptor_size(m.descriptor);
}

inline std::size_t encode_meta(const chunk_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  const bool valid = detail::string_fits(m.key) && descriptor_encodable(m.descriptor);
  return detail::encode_checked(valid, encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u64(m.transfer_id);
    w.u64(m.total_len);
    w.u64(m.offset);
    w.u32(m.index);
    w.u32(m.count);
    detail::write_string(w, m.key);
    write_descriptor(w, m.descriptor);
  });
}

/// Decodes a chunk frame's meta: total_len and count within `lim`
/// (errc::frame_too_large), index < count and the payload inside
/// [0, total_len) (errc::malformed_frame), total_len equal to the descriptor's
/// byte size for fixed-size dtypes (errc::malformed_frame).
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 chunk_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == chunk_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  chunk_meta m;
  m.transfer_id = r.u64();
  m.total_len = r.u64();
  m.offset = r.u64();
  m.index = r.u32();
  m.count = r.u32();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (m.total_len > lim.max_transfer_bytes || m.count > lim.max_chunks) {
    return make_error_code(errc::frame_too_large);
  }
  if (auto ec = detail::read_string(r, lim.max_key_bytes, m.key)) return ec;
  if (auto ec = read_descriptor(r, lim, m.descriptor)) return ec;
  if (auto ec = detail::finish(r)) return ec;
  if (m.index >= m.count || m.offset > m.total_len || h.payload_len > m.total_len - m.offset) {
    return make_error_code(errc::malformed_frame);
  }
  if (auto ec = check_payload_size(m.descriptor, m.total_len)) return ec;
  out = m;
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
