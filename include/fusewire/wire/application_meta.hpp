#pragma once
/// The metadata of an upper layer's frame (types 0x40..0x7f): opaque bytes
/// whose lengths alone the wire layer checks.

#include <algorithm>
#include <cstddef>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/wire/detail/meta_codec.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// An upper layer's frame (types application_first..application_last): the
/// wire layer checks only its lengths; `bytes` is the meta, verbatim.
struct application_meta {
  frame_type type = frame_type::application_first;
  const_buffer bytes;

  friend bool operator==(const application_meta& a, const application_meta& b) noexcept {
    return a.type == b.type && std::ranges::equal(a.bytes, b.bytes);
  }
};

[[nodiscard]] constexpr std::size_t encoded_size(const application_meta& m) noexcept { return m.bytes.size(); }

/// Copies `m.bytes`; errc::invalid_argument if `m.type` is outside the application range.
inline std::size_t encode_meta(const application_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(is_application(m.type), encoded_size(m), out, ec,
                                [&](byte_writer& w) { w.bytes(m.bytes); });
}

/// Views the meta of an application frame (its length was checked by decode_header).
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 application_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, is_application(h.type), meta, lim)) return ec;
  out.type = h.type;
  out.bytes = meta.first(h.meta_len);
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
