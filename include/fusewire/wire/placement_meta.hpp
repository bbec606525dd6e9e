#pragma once
/// The metadata of receiver-driven placement (recv_request, placed): a
/// receiver offers room, possibly an RDMA region, and the sender says whether
/// it wrote there. The structs, their encoders and their decoders; layouts in
/// meta.hpp.

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

/// A receiver announces it waits for `key` and has room for `capacity` bytes.
/// With RDMA, `rdma_address`/`rdma_rkey` name where in a region the receiver
/// registered for remote writes the sender may write the tensor; that is the
/// only address fusewire ever puts on the wire, and only the NIC uses it.
/// Zero means "no RDMA: send a tensor frame".
struct recv_request_meta {
  static constexpr frame_type type = frame_type::recv_request;
  std::string_view key;
  std::uint64_t capacity = 0;
  std::uint64_t rdma_address = 0;
  std::uint32_t rdma_rkey = 0;

  friend bool operator==(const recv_request_meta&, const recv_request_meta&) = default;
};

/// Answers the recv_request with the header's request_id (and `key`): either the
/// sender wrote the tensor's `size` bytes into the advertised region (`written`
/// = 1; sent after the write on the same connection, so it arrives once the
/// bytes are in place), or it will never write there (`written` = 0, size 0):
/// the tensor comes, or came, in a frame of its own.
struct placed_meta {
  static constexpr frame_type type = frame_type::placed;
  std::string_view key;
  std::uint64_t size = 0;
  std::uint8_t written = 0;

  friend bool operator==(const placed_meta&, const placed_meta&) = default;
};

// ---- recv_request ---------------------------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const recv_request_meta& m) noexcept {
  return 8 + 8 + 4 + detail::string_size(m.key);
}

inline std::size_t encode_meta(const recv_request_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(detail::string_fits(m.key), encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u64(m.capacity);
    w.u64(m.rdma_address);
    w.u32(m.rdma_rkey);
    detail::write_string(w, m.key);
  });
}

/// Decodes a recv_request; errc::frame_too_large if capacity exceeds
/// limits::max_transfer_bytes or the key exceeds limits::max_key_bytes.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 recv_request_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == recv_request_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  recv_request_meta m;
  m.capacity = r.u64();
  m.rdma_address = r.u64();
  m.rdma_rkey = r.u32();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (m.capacity > lim.max_transfer_bytes) return make_error_code(errc::frame_too_large);
  if (auto ec = detail::read_string(r, lim.max_key_bytes, m.key)) return ec;
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

// ---- placed ---------------------------------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const placed_meta& m) noexcept {
  return 8 + 1 + detail::string_size(m.key);
}

inline std::size_t encode_meta(const placed_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(detail::string_fits(m.key), encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u64(m.size);
    w.u8(m.written);
    detail::write_string(w, m.key);
  });
}

/// Decodes a placed frame; errc::malformed_frame if `written` is not 0 or 1 or
/// a declined region names a size, errc::frame_too_large if size exceeds
/// limits::max_transfer_bytes or the key exceeds limits::max_key_bytes.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 placed_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == placed_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  placed_meta m;
  m.size = r.u64();
  m.written = r.u8();
  if (!r.ok() || m.written > 1 || (m.written == 0 && m.size != 0)) return make_error_code(errc::malformed_frame);
  if (m.size > lim.max_transfer_bytes) return make_error_code(errc::frame_too_large);
  if (auto ec = detail::read_string(r, lim.max_key_bytes, m.key)) return ec;
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
