#pragma once
/// The byte form of a graph `payload`, so that a message of the plan can
/// travel as one rendezvous tensor between processes:
///
///     u32 magic "FWGP"  u8 version (1)  u8 reserved (0)  u16 reserved (0)
///     u32 entry count
///     per entry: u8 flags (bit 0: dead), descriptor (wire form: dtype u8,
///                rank u8, rank x i64 dims), u64 byte count
///     zero padding to a multiple of 8
///     per entry: its bytes, zero padding to a multiple of 8
///
/// Integers are little-endian; tensor values are written little-endian too
/// (host order on the platforms we build for; swapped per element elsewhere).
/// A live entry carries exactly its descriptor's byte size; a dead entry (an
/// untaken branch) and a control token carry none. The dead bit lives inside
/// the payload, so it survives whatever framing carries it — a plain tensor
/// frame, or a fused frame when the endpoint coalesces small sends.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/channel.hpp>
#include <fusewire/wire/descriptor.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// Limits and constants of the payload byte form.
struct payload_format {
  static constexpr std::uint32_t magic = 0x50475746u;  ///< "FWGP" read as little-endian bytes
  static constexpr std::uint8_t version = 1;
  static constexpr std::size_t prefix_bytes = 12;      ///< magic, version, reserved, entry count
  static constexpr std::uint32_t max_entries = 65536;  ///< decoders refuse more
  static constexpr std::uint8_t dead_flag = 1;
};

namespace detail {

inline constexpr std::size_t pad8(std::size_t n) noexcept { return (n + 7) & ~std::size_t{7}; }

inline const std::byte* zero_padding() noexcept {
  static constexpr std::byte zeros[8]{};
  return zeros;
}

/// Bytes of the prefix and entry headers (before the first padding).
inline std::size_t payload_header_bytes(const payload& p) noexcept {
  std::size_t n = payload_format::prefix_bytes;
  for (const auto& e : p) n += 1 + wire::descriptor_size(e.descriptor) + 8;
  return n;
}

/// Copies `in` to `out` reversing the byte order of each `width`-byte element.
inline void swap_elements(const std::byte* in, std::byte* out, std::size_t n, std::size_t width) noexcept {
  if (width <= 1) {
    if (n) std::memcpy(out, in, n);
    return;
  }
  for (std::size_t i = 0; i + width <= n; i += width)
    for (std::size_t b = 0; b < width; ++b) out[i + b] = in[i + width - 1 - b];
}

inline constexpr bool host_is_little = std::endian::native == std::endian::little;

}  // namespace detail

/// What is wrong with `p` for encoding (a live entry whose bytes do not match
/// its descriptor, a dead entry with bytes, too many entries): errc::invalid_argument,
/// or nothing.
inline std::error_code check_payload(const payload& p) noexcept {
  if (p.size() > payload_format::max_entries) return make_error_code(errc::invalid_argument);
  for (const auto& e : p) {
    if (!wire::descriptor_encodable(e.descriptor)) return make_error_code(errc::invalid_argument);
    if (e.dead) {
      if (e.bytes.size() != 0) return make_error_code(errc::invalid_argument);
      continue;
    }
    std::error_code ec;
    if (e.descriptor.byte_size(ec) != e.bytes.size() || ec) return make_error_code(errc::invalid_argument);
  }
  return {};
}

/// Bytes encode_payload() writes for `p`.
inline std::size_t encoded_size(const payload& p) noexcept {
  std::size_t n = detail::pad8(detail::payload_header_bytes(p));
  for (const auto& e : p) n += detail::pad8(e.bytes.size());
  return n;
}

/// The header part of `p`'s byte form (prefix, entry headers, padding to 8);
/// the entries' bytes follow it, each padded to 8. `p` must pass check_payload().
inline tensor_buffer encode_payload_header(const payload& p) {
  const std::size_t header = detail::payload_header_bytes(p);
  tensor_buffer out = tensor_buffer::allocate(detail::pad8(header));
  std::memset(out.data(), 0, out.size());
  wire::byte_writer w(out.bytes());
  w.u32(payload_format::magic);
  w.u8(payload_format::version);
  w.u8(0);
  w.u16(0);
  w.u32(static_cast<std::uint32_t>(p.size()));
  for (const auto& e : p) {
    w.u8(e.dead ? payload_format::dead_flag : 0);
    wire::write_descriptor(w, e.descriptor);
    w.u64(e.bytes.size());
  }
  return out;
}

/// The scatter-gather list of `p`'s byte form: `header` (from
/// encode_payload_header), then each entry's bytes and padding. The spans
/// point into `header`, `p` and static zeros; keep both alive while they are used.
/// Big-endian hosts: use encode_payload() instead (values need swapping).
inline std::vector<const_buffer> payload_segments(const tensor_buffer& header, const payload& p) {
  std::vector<const_buffer> sg;
  sg.reserve(1 + 2 * p.size());
  sg.push_back(header.bytes());
  for (const auto& e : p) {
    if (e.bytes.size() == 0) continue;
    sg.push_back(e.bytes.bytes());
    if (auto pad = detail::pad8(e.bytes.size()) - e.bytes.size())
      sg.push_back(const_buffer(detail::zero_padding(), pad));
  }
  return sg;
}

/// `p` in its byte form, in one buffer. Throws std::system_error(errc::invalid_argument)
/// if `p` fails check_payload().
inline tensor_buffer encode_payload(const payload& p) {
  if (check_payload(p))
    throw_error(errc::invalid_argument,
                "payload cannot be encoded: an entry's bytes do not match its descriptor "
                "(a dead entry carries none), or it has more than 65536 entries");
  const tensor_buffer header = encode_payload_header(p);
  tensor_buffer out = tensor_buffer::allocate(encoded_size(p));
  std::memset(out.data(), 0, out.size());
  std::size_t pos = header.size();
  std::memcpy(out.data(), header.data(), header.size());
  for (const auto& e : p) {
    const std::size_t n = e.bytes.size();
    if (n == 0) continue;
    if (detail::host_is_little)
      std::memcpy(out.data() + pos, e.bytes.data(), n);
    else
      detail::swap_elements(e.bytes.data(), out.data() + pos, n, dtype_size(e.descriptor.type));
    pos += detail::pad8(n);
  }
  return out;
}

/// Decodes a payload from `bytes` (as encode_payload wrote it). Entries'
/// bytes alias `bytes` (no copy on little-endian hosts). Returns
/// errc::bad_magic, errc::unsupported_version, errc::frame_too_large (too many
/// entries) or errc::malformed_frame (lengths that contradict each other, a
/// bad descriptor, a dead entry with bytes, trailing bytes); `out` is
/// written only on success.
inline std::error_code decode_payload(const tensor_buffer& bytes, payload& out) {
  wire::byte_reader r(std::span<const std::byte>(bytes.data(), bytes.size()));
  const std::uint32_t magic = r.u32();
  const std::uint8_t version = r.u8();
  (void)r.u8();
  (void)r.u16();
  const std::uint32_t count = r.u32();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (magic != payload_format::magic) return make_error_code(errc::bad_magic);
  if (version != payload_format::version) return make_error_code(errc::unsupported_version);
  if (count > payload_format::max_entries) return make_error_code(errc::frame_too_large);
  // Each entry header takes at least 10 bytes: refuse counts the input cannot hold before allocating.
  if (count > (bytes.size() - payload_format::prefix_bytes) / 10) return make_error_code(errc::malformed_frame);
  struct head {
    bool dead;
    tensor_descriptor descriptor;
    std::uint64_t size;
  };
  std::vector<head> heads(count);
  const wire::limits lim{};
  for (auto& h : heads) {
    const std::uint8_t flags = r.u8();
    if (!r.ok() || (flags & ~payload_format::dead_flag) != 0) return make_error_code(errc::malformed_frame);
    h.dead = (flags & payload_format::dead_flag) != 0;
    if (auto ec = wire::read_descriptor(r, lim, h.descriptor)) return make_error_code(errc::malformed_frame);
    h.size = r.u64();
    if (!r.ok()) return make_error_code(errc::malformed_frame);
    if (h.dead ? h.size != 0 : static_cast<bool>(wire::check_payload_size(h.descriptor, h.size)))
      return make_error_code(errc::malformed_frame);
  }
  std::size_t pos = detail::pad8(r.position());
  payload result;
  result.reserve(count);
  for (const auto& h : heads) {
    message_entry e;
    e.descriptor = h.descriptor;
    e.dead = h.dead;
    if (h.size != 0) {
      if (pos > bytes.size() || h.size > bytes.size() - pos) return make_error_code(errc::malformed_frame);
      const auto n = static_cast<std::size_t>(h.size);
      if (detail::host_is_little) {
        e.bytes = bytes.share(pos, n);
      } else {
        e.bytes = tensor_buffer::allocate(n);
        detail::swap_elements(bytes.data() + pos, e.bytes.data(), n, dtype_size(h.descriptor.type));
      }
      pos += detail::pad8(n);
    }
    result.push_back(std::move(e));
  }
  if (pos != bytes.size()) return make_error_code(errc::malformed_frame);
  out = std::move(result);
  return {};
}

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
