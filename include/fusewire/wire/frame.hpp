#pragma once
/// The fixed 32-byte frame header, frame types, flags and decoding limits.
///
/// Every frame is `header | meta | payload`. The header has a fixed size, so a
/// reader takes `header_size` bytes, calls `decode_header` (which rejects bad
/// magic, versions, types and any length above `limits` before the caller
/// allocates anything), then reads `meta_len` bytes of metadata and finally
/// receives `payload_len` bytes straight into their destination.
///
/// Header layout (all integers little-endian, offsets in bytes):
///
///   0  magic        u32   the bytes "FWIR"
///   4  version      u8    1
///   5  type         u8    a `frame_type`
///   6  flags        u16   `response_flag`, bits 1..7 reserved (zero), 8..15 application
///   8  request_id   u64   chosen by the requester, echoed in responses
///  16  meta_len     u32   bytes of metadata after the header
///  20  reserved     u32   zero
///  24  payload_len  u64   bytes of payload after the metadata

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/wire/endian.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// Bytes in every frame header.
inline constexpr std::size_t header_size = 32;
/// The first four bytes of every frame: "FWIR", read as a little-endian u32.
inline constexpr std::uint32_t magic = 0x52495746u;
/// The wire version this build writes and the only one it reads.
inline constexpr std::uint8_t version = 1;

/// What a frame carries; the numeric values are the wire encoding.
enum class frame_type : std::uint8_t {
  hello = 0x01,              ///< connector's identity and versions (handshake step 1)
  hello_ack = 0x02,          ///< acceptor's identity and chosen version (last handshake step)
  auth_challenge = 0x03,     ///< acceptor's nonce for the cluster-token HMAC
  auth_response = 0x04,      ///< connector's HMAC over the challenge, plus its own nonce
  tensor = 0x10,             ///< one keyed tensor; payload = its bytes, maybe in several segments
  fused = 0x11,              ///< N keyed tensors; payloads concatenated in entry order
  chunk = 0x12,              ///< one piece of a large tensor split over several frames
  recv_request = 0x13,       ///< a receiver posts a key and the room it has for it
  placed = 0x14,             ///< answers a recv_request: the tensor was written there (RDMA), or the region declined
  ack = 0x20,                ///< acknowledges `request_id`, may grant credits
  error = 0x21,              ///< request `request_id` failed: code and message
  ping = 0x22,               ///< keepalive / latency probe
  pong = 0x23,               ///< answer to a ping, echoing its timestamp
  goodbye = 0x24,            ///< orderly close, with a reason
  application_first = 0x40,  ///< first type reserved for upper layers (ps, graph)
  application_last = 0x7f,   ///< last type reserved for upper layers
};

/// True for the types in [application_first, application_last]: upper layers
/// define them; the wire layer treats their meta and payload as opaque bytes.
[[nodiscard]] constexpr bool is_application(frame_type t) noexcept {
  return t >= frame_type::application_first && t <= frame_type::application_last;
}

/// True if `raw` names a frame type this version of the wire format knows.
[[nodiscard]] constexpr bool is_known_frame_type(std::uint8_t raw) noexcept {
  switch (static_cast<frame_type>(raw)) {
    case frame_type::hello:
    case frame_type::hello_ack:
    case frame_type::auth_challenge:
    case frame_type::auth_response:
    case frame_type::tensor:
    case frame_type::fused:
    case frame_type::chunk:
    case frame_type::recv_request:
    case frame_type::placed:
    case frame_type::ack:
    case frame_type::error:
    case frame_type::ping:
    case frame_type::pong:
    case frame_type::goodbye:
      return true;
    default:
      return is_application(static_cast<frame_type>(raw));
  }
}

/// True for frame types that may have a payload; the others must have none.
[[nodiscard]] constexpr bool carries_payload(frame_type t) noexcept {
  return t == frame_type::tensor || t == frame_type::fused || t == frame_type::chunk || is_application(t);
}

/// A short lowercase name for logs ("tensor", "application"...).
[[nodiscard]] constexpr std::string_view frame_type_name(frame_type t) noexcept {
  switch (t) {
    case frame_type::hello:
      return "hello";
    case frame_type::hello_ack:
      return "hello_ack";
    case frame_type::auth_challenge:
      return "auth_challenge";
    case frame_type::auth_response:
      return "auth_response";
    case frame_type::tensor:
      return "tensor";
    case frame_type::fused:
      return "fused";
    case frame_type::chunk:
      return "chunk";
    case frame_type::recv_request:
      return "recv_request";
    case frame_type::placed:
      return "placed";
    case frame_type::ack:
      return "ack";
    case frame_type::error:
      return "error";
    case frame_type::ping:
      return "ping";
    case frame_type::pong:
      return "pong";
    case frame_type::goodbye:
      return "goodbye";
    default:
      return is_application(t) ? "application" : "unknown";
  }
}

/// Flag bit: this frame answers the request with the same `request_id`.
inline constexpr std::uint16_t response_flag = 0x0001;
/// Flag bits reserved for later wire versions; a v1 decoder rejects them.
inline constexpr std::uint16_t reserved_flags = 0x00fe;
/// Flag bits upper layers may use freely; the wire layer passes them through.
inline constexpr std::uint16_t application_flags = 0xff00;

/// The decoded fixed header. Contains no pointers; `request_id` is an opaque
/// number chosen by the requester (never an address).
struct frame_header {
  frame_type type = frame_type::ping;
  std::uint16_t flags = 0;
  std::uint64_t request_id = 0;
  std::uint32_t meta_len = 0;
  std::uint64_t payload_len = 0;

  friend constexpr bool operator==(const frame_header&, const frame_header&) = default;
};

/// Bytes of the whole frame (header, meta, payload) that `h` announces.
/// Only meaningful for a header that `decode_header` accepted.
[[nodiscard]] constexpr std::uint64_t frame_size(const frame_header& h) noexcept {
  return header_size + std::uint64_t{h.meta_len} + h.payload_len;
}

/// Upper bounds a decoder enforces before anything is allocated. One value per
/// connection or process; the defaults suit a training job on one host group.
struct limits {
  std::uint32_t max_meta_bytes = 64 * 1024;        ///< meta bytes of one frame
  std::uint64_t max_payload_bytes = 1ull << 30;    ///< payload bytes of one frame (1 GiB)
  std::uint64_t max_transfer_bytes = 16ull << 30;  ///< whole tensor of a chunked transfer or a recv_request
  std::uint32_t max_entries = 65536;               ///< entries of one fused frame
  std::uint32_t max_segments = 1024;               ///< scatter-gather segments of one tensor frame
  std::uint32_t max_chunks = 1u << 20;             ///< chunks of one chunked transfer
  std::uint32_t max_key_bytes = 4096;              ///< a rendezvous key, job name or similar string
  std::uint32_t max_message_bytes = 4096;          ///< the text of an error frame
  std::uint8_t max_rank = 8;                       ///< dimensions of a tensor descriptor

  /// Largest string length the format can carry (strings have a u16 length).
  static constexpr std::uint32_t string_capacity = 0xffff;
  /// Largest rank the format can carry.
  static constexpr std::uint8_t rank_capacity = 8;
  /// Largest byte limit accepted, so that sums of lengths cannot overflow.
  static constexpr std::uint64_t bytes_capacity = 1ull << 62;

  /// Throws `std::system_error(errc::invalid_argument)` naming the first field
  /// outside what the format can carry.
  void validate() const {
    auto fail = [](const char* field, std::uint64_t value, const char* allowed) {
      throw_error(errc::invalid_argument, std::string("wire::limits::") + field + " = " + std::to_string(value) +
                                              " is not allowed; " + allowed);
    };
    if (max_payload_bytes > bytes_capacity) fail("max_payload_bytes", max_payload_bytes, "at most 2^62");
    if (max_transfer_bytes > bytes_capacity) fail("max_transfer_bytes", max_transfer_bytes, "at most 2^62");
    if (max_entries == 0) fail("max_entries", max_entries, "at least 1");
    if (max_segments == 0) fail("max_segments", max_segments, "at least 1");
    if (max_chunks == 0) fail("max_chunks", max_chunks, "at least 1");
    if (max_key_bytes > string_capacity) fail("max_key_bytes", max_key_bytes, "at most 65535");
    if (max_message_bytes > string_capacity) fail("max_message_bytes", max_message_bytes, "at most 65535");
    if (max_rank > rank_capacity) fail("max_rank", max_rank, "at most 8");
  }
};

/// Writes `h` (with magic, version and a zero reserved field) into `out`.
constexpr void encode_header(const frame_header& h, std::span<std::byte, header_size> out) noexcept {
  store_le<std::uint32_t>(out.data() + 0, magic);
  out[4] = std::byte{version};
  out[5] = static_cast<std::byte>(h.type);
  store_le<std::uint16_t>(out.data() + 6, h.flags);
  store_le<std::uint64_t>(out.data() + 8, h.request_id);
  store_le<std::uint32_t>(out.data() + 16, h.meta_len);
  store_le<std::uint32_t>(out.data() + 20, 0);
  store_le<std::uint64_t>(out.data() + 24, h.payload_len);
}

/// Writes `h` into the first `header_size` bytes of `out`; errc::invalid_argument
/// if `out` is shorter (nothing written).
[[nodiscard]] inline std::error_code encode_header(const frame_header& h, std::span<std::byte> out) noexcept {
  if (out.size() < header_size) return make_error_code(errc::invalid_argument);
  encode_header(h, out.first<header_size>());
  return {};
}

/// The encoded header as a value (no allocation).
[[nodiscard]] constexpr std::array<std::byte, header_size> encode_header(const frame_header& h) noexcept {
  std::array<std::byte, header_size> out{};
  encode_header(h, std::span<std::byte, header_size>(out));
  return out;
}

/// The checks decode_header applies to the fields of a header (every meta
/// decoder repeats them, so a hand-made header is held to the same rules):
/// errc::malformed_frame for reserved flag bits or a payload on a frame type
/// that has none, errc::frame_too_large for meta_len or payload_len above `lim`.
[[nodiscard]] inline std::error_code check_header(const frame_header& h, const limits& lim) noexcept {
  if ((h.flags & reserved_flags) != 0) return make_error_code(errc::malformed_frame);
  if (h.meta_len > lim.max_meta_bytes || h.payload_len > lim.max_payload_bytes) {
    return make_error_code(errc::frame_too_large);
  }
  if (h.payload_len != 0 && !carries_payload(h.type)) return make_error_code(errc::malformed_frame);
  return {};
}

/// Decodes the header at the start of `in` and checks it against `lim`, in this
/// order: truncated_frame (fewer than `header_size` bytes), bad_magic,
/// unsupported_version, unknown_frame_type, malformed_frame (reserved field or
/// flag bits set), frame_too_large (meta_len or payload_len above `lim`),
/// malformed_frame (a payload on a frame type that has none). Allocates
/// nothing, never throws; `out` is written only on success.
[[nodiscard]] inline std::error_code decode_header(std::span<const std::byte> in, const limits& lim,
                                                   frame_header& out) noexcept {
  if (in.size() < header_size) return make_error_code(errc::truncated_frame);
  const std::byte* p = in.data();
  if (load_le<std::uint32_t>(p) != magic) return make_error_code(errc::bad_magic);
  if (static_cast<std::uint8_t>(p[4]) != version) return make_error_code(errc::unsupported_version);
  const auto raw_type = static_cast<std::uint8_t>(p[5]);
  if (!is_known_frame_type(raw_type)) return make_error_code(errc::unknown_frame_type);
  frame_header h;
  h.type = static_cast<frame_type>(raw_type);
  h.flags = load_le<std::uint16_t>(p + 6);
  h.request_id = load_le<std::uint64_t>(p + 8);
  h.meta_len = load_le<std::uint32_t>(p + 16);
  const auto reserved = load_le<std::uint32_t>(p + 20);
  h.payload_len = load_le<std::uint64_t>(p + 24);
  if (reserved != 0) return make_error_code(errc::malformed_frame);
  if (auto ec = check_header(h, lim)) return ec;
  out = h;
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
