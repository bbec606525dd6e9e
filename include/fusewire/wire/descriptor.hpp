#pragma once
/// The wire form of a `tensor_descriptor`: dtype u8, rank u8, then `rank`
/// little-endian two's-complement i64 dimensions. Shared by tensor, fused and
/// chunk frames, and by upper layers that put descriptors in application frames.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// Bytes `d` takes on the wire.
[[nodiscard]] constexpr std::size_t descriptor_size(const tensor_descriptor& d) noexcept {
  return 2 + 8 * std::min<std::size_t>(d.rank, max_rank);
}

/// True if `d` may be written: a known dtype, rank <= max_rank, non-negative
/// dimensions, and a byte size that fits in an int64.
[[nodiscard]] inline bool descriptor_encodable(const tensor_descriptor& d) noexcept { return !d.validate(); }

/// Writes `d`, which must be `descriptor_encodable`.
inline void write_descriptor(byte_writer& w, const tensor_descriptor& d) noexcept {
  w.u8(static_cast<std::uint8_t>(d.type));
  w.u8(d.rank);
  for (std::int64_t dim : d.shape()) w.i64(dim);
}

/// Reads a descriptor: errc::frame_too_large if its rank exceeds `lim.max_rank`,
/// errc::malformed_frame if the input ends early, the dtype is unknown, a
/// dimension is negative or the byte size overflows. `out` is written only on success.
[[nodiscard]] inline std::error_code read_descriptor(byte_reader& r, const limits& lim,
                                                     tensor_descriptor& out) noexcept {
  tensor_descriptor d;
  d.type = static_cast<dtype>(r.u8());
  d.rank = r.u8();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (d.rank > std::min<std::size_t>(lim.max_rank, max_rank)) return make_error_code(errc::frame_too_large);
  for (std::size_t i = 0; i < d.rank; ++i) d.dims[i] = r.i64();
  if (!r.ok() || d.validate()) return make_error_code(errc::malformed_frame);
  out = d;
  return {};
}

/// errc::malformed_frame unless `bytes` is the byte size `d` describes.
[[nodiscard]] inline std::error_code check_payload_size(const tensor_descriptor& d, std::uint64_t bytes) noexcept {
  std::error_code ec;
  const std::size_t expected = d.byte_size(ec);
  if (ec || expected != bytes) return make_error_code(errc::malformed_frame);
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
