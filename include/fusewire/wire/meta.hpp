#pragma once
/// The metadata of every built-in frame type except `fused` (see fused.hpp):
/// one struct per type, its encoder and its decoder.
///
/// Decoded structs are views: their strings and byte spans point into the
/// meta buffer that was decoded, which must outlive them. Decoders allocate
/// nothing, never throw, and accept only the canonical encoding (reserved
/// fields zero, no trailing bytes), so re-encoding a decoded meta reproduces
/// its bytes exactly.
///
/// Layouts (integers little-endian; str = u16 length + that many bytes;
/// desc = a tensor descriptor, see descriptor.hpp):
///
///   hello           min_version u8, max_version u8, lane u16, task_index u32,
///                   incarnation u64, features u64, job str
///   hello_ack       version u8, zero u8, lane u16, task_index u32,
///                   incarnation u64, features u64, mac[32], job str
///   auth_challenge  nonce[32]
///   auth_response   mac[32], nonce[32]
///   tensor          key str, desc, segment count u32, count x segment size u64
///   chunk           transfer_id u64, total_len u64, offset u64, index u32,
///                   count u32, key str, desc
///   recv_request    capacity u64, rdma_address u64, rdma_rkey u32, key str
///   placed          size u64, written u8, key str
///   ack             value u64, credits u32
///   error           code i32, message str
///   ping, pong      timestamp u64
///   goodbye         reason i32
///   application     opaque bytes (types 0x40..0x7f)
///   fused           see fused.hpp

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/wire/descriptor.hpp>
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

/// The sizes of a tensor frame's payload segments, in order. A view: over the
/// wire bytes when decoded, over the caller's sizes or buffers when encoding.
class segment_list {
  enum class source : std::uint8_t { wire, sizes, buffers };

 public:
  /// Iterates the sizes as `std::uint64_t` values.
  class iterator {
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;
    using value_type = std::uint64_t;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    std::uint64_t operator*() const noexcept { return (*list_)[index_]; }
    iterator& operator++() noexcept {
      ++index_;
      return *this;
    }
    iterator operator++(int) noexcept {
      auto copy = *this;
      ++index_;
      return copy;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.index_ == b.index_; }

   private:
    friend class segment_list;
    iterator(const segment_list* list, std::size_t index) noexcept : list_(list), index_(index) {}
    const segment_list* list_ = nullptr;
    std::size_t index_ = 0;
  };

  /// No segments.
  segment_list() = default;
  /// The caller's sizes; `sizes` must outlive the list.
  explicit segment_list(std::span<const std::uint64_t> sizes) noexcept
      : data_(sizes.data()), count_(sizes.size()), source_(source::sizes) {}
  /// The sizes of a scatter-gather payload; `buffers` must outlive the list.
  explicit segment_list(std::span<const const_buffer> buffers) noexcept
      : data_(buffers.data()), count_(buffers.size()), source_(source::buffers) {}
  /// `bytes.size() / 8` little-endian u64 values (what the decoder returns).
  [[nodiscard]] static segment_list from_wire(const_buffer bytes) noexcept {
    segment_list list;
    list.data_ = bytes.data();
    list.count_ = bytes.size() / 8;
    list.source_ = source::wire;
    return list;
  }

  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  /// The `i`-th size; `i < size()`.
  [[nodiscard]] std::uint64_t operator[](std::size_t i) const noexcept {
    switch (source_) {
      case source::wire: return load_le<std::uint64_t>(static_cast<const std::byte*>(data_) + 8 * i);
      case source::sizes: return static_cast<const std::uint64_t*>(data_)[i];
      case source::buffers: return static_cast<const const_buffer*>(data_)[i].size();
    }
    return 0;
  }
  [[nodiscard]] iterator begin() const noexcept { return {this, 0}; }
  [[nodiscard]] iterator end() const noexcept { return {this, count_}; }

  /// Same sizes in the same order, whatever each list views.
  friend bool operator==(const segment_list& a, const segment_list& b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }

 private:
  const void* data_ = nullptr;
  std::size_t count_ = 0;
  source source_ = source::sizes;
};

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

/// An upper layer's frame (types application_first..application_last): the
/// wire layer checks only its lengths; `bytes` is the meta, verbatim.
struct application_meta {
  frame_type type = frame_type::application_first;
  const_buffer bytes;

  friend bool operator==(const application_meta& a, const application_meta& b) noexcept {
    return a.type == b.type && std::ranges::equal(a.bytes, b.bytes);
  }
};

namespace detail {

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

}  // namespace detail

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
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, hello_meta& out) noexcept {
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

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, hello_ack_meta& out) noexcept {
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

inline std::size_t encode_meta(const auth_challenge_meta& m, mutable_buffer out,
                               std::error_code& ec) noexcept {
  return detail::encode_checked(true, encoded_size(m), out, ec, [&](byte_writer& w) { w.bytes(m.nonce); });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, auth_challenge_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == auth_challenge_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  auth_challenge_meta m;
  r.copy_to(m.nonce);
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

[[nodiscard]] constexpr std::size_t encoded_size(const auth_response_meta&) noexcept {
  return mac_size + nonce_size;
}

inline std::size_t encode_meta(const auth_response_meta& m, mutable_buffer out,
                               std::error_code& ec) noexcept {
  return detail::encode_checked(true, encoded_size(m), out, ec, [&](byte_writer& w) {
    w.bytes(m.mac);
    w.bytes(m.nonce);
  });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, auth_response_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == auth_response_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  auth_response_meta m;
  r.copy_to(m.mac);
  r.copy_to(m.nonce);
  if (auto ec = detail::finish(r)) return ec;
  out = m;
  return {};
}

// ---- tensor -------------------------------------------------------------------

[[nodiscard]] inline std::size_t encoded_size(const tensor_meta& m) noexcept {
  return detail::string_size(m.key) + descriptor_size(m.descriptor) + 4 + 8 * m.segments.size();
}

inline std::size_t encode_meta(const tensor_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  const bool valid = detail::string_fits(m.key) && descriptor_encodable(m.descriptor) &&
                     m.segments.size() <= 0xffffffffu;
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
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, tensor_meta& out) noexcept {
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
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, chunk_meta& out) noexcept {
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

// ---- recv_request ---------------------------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const recv_request_meta& m) noexcept {
  return 8 + 8 + 4 + detail::string_size(m.key);
}

inline std::size_t encode_meta(const recv_request_meta& m, mutable_buffer out,
                               std::error_code& ec) noexcept {
  return detail::encode_checked(detail::string_fits(m.key), encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u64(m.capacity);
    w.u64(m.rdma_address);
    w.u32(m.rdma_rkey);
    detail::write_string(w, m.key);
  });
}

/// Decodes a recv_request; errc::frame_too_large if capacity exceeds
/// limits::max_transfer_bytes or the key exceeds limits::max_key_bytes.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, recv_request_meta& out) noexcept {
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

// ---- ack, error, ping, pong, goodbye --------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const ack_meta&) noexcept { return 8 + 4; }

inline std::size_t encode_meta(const ack_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(true, encoded_size(m), out, ec, [&](byte_writer& w) {
    w.u64(m.value);
    w.u32(m.credits);
  });
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, ack_meta& out) noexcept {
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
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, error_meta& out) noexcept {
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

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, ping_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == ping_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  const std::uint64_t timestamp = r.u64();
  if (auto ec = detail::finish(r)) return ec;
  out.timestamp = timestamp;
  return {};
}

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, pong_meta& out) noexcept {
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

[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, goodbye_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == goodbye_meta::type, meta, lim)) return ec;
  byte_reader r(meta.first(h.meta_len));
  const std::int32_t reason = r.i32();
  if (auto ec = detail::finish(r)) return ec;
  out.reason = reason;
  return {};
}

// ---- application ------------------------------------------------------------------

[[nodiscard]] constexpr std::size_t encoded_size(const application_meta& m) noexcept { return m.bytes.size(); }

/// Copies `m.bytes`; errc::invalid_argument if `m.type` is outside the application range.
inline std::size_t encode_meta(const application_meta& m, mutable_buffer out,
                               std::error_code& ec) noexcept {
  return detail::encode_checked(is_application(m.type), encoded_size(m), out, ec,
                                [&](byte_writer& w) { w.bytes(m.bytes); });
}

/// Views the meta of an application frame (its length was checked by decode_header).
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta,
                                                 const limits& lim, application_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, is_application(h.type), meta, lim)) return ec;
  out.type = h.type;
  out.bytes = meta.first(h.meta_len);
  return {};
}

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
