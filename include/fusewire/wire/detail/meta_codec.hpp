#pragma once
/// The pieces every meta encoder and decoder shares: u16-length strings, the
/// size and argument check before encoding, and the header check and
/// no-trailing-bytes rule of decoding. Private to the wire layer.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire::detail {

inline constexpr std::size_t string_size(std::string_view s) noexcept { return 2 + s.size(); }

inline void write_string(byte_writer& w, std::string_view s) noexcept {
  w.u16(static_cast<std::uint16_t>(s.size()));
  w.chars(s);
}

/// Reads a u16-length string; frame_too_large above `max`, malformed_frame past the end.
inline std::error_code read_string(byte_reader& r, std::uint32_t max, std::string_view& out) noexcept {
  const std::uint16_t n = r.u16();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (n > max) return make_error_code(errc::frame_too_large);
  out = r.chars(n);
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  return {};
}

/// Runs `write` into the first `size` bytes of `out` once `valid` holds.
template <class Write>
std::size_t encode_checked(bool valid, std::size_t size, mutable_buffer out, std::error_code& ec,
                           Write write) noexcept {
  if (!valid || out.size() < size) {
    ec = make_error_code(errc::invalid_argument);
    return 0;
  }
  byte_writer w(out.first(size));
  write(w);
  ec = {};
  return w.position();
}

/// Common start of every decoder: the header names the decoder's type, passes
/// check_header, and `meta` holds all of its meta.
inline std::error_code check_meta(const frame_header& h, bool type_matches, const_buffer meta,
                                  const limits& lim) noexcept {
  if (!type_matches) return make_error_code(errc::invalid_argument);
  if (auto ec = check_header(h, lim)) return ec;
  if (meta.size() < h.meta_len) return make_error_code(errc::truncated_frame);
  return {};
}

/// Common end of every decoder: all reads fit and nothing is left over.
inline std::error_code finish(const byte_reader& r) noexcept {
  return r.at_end() ? std::error_code{} : make_error_code(errc::malformed_frame);
}

inline constexpr bool string_fits(std::string_view s) noexcept { return s.size() <= limits::string_capacity; }

}  // namespace wire::detail
}  // namespace v0
}  // namespace fusewire
