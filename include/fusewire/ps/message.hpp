#pragma once
/// ps messages: the binary encoding of one fused PS request (every pull and
/// push a worker sends one PS in a step) and of its reply.
///
/// Little-endian, no padding, no alignment assumed. A request:
///
///     header (64 bytes)
///       u32 magic 'FWPS' (0x53505746)   u16 version (1)   u16 type (1 = request)
///       u64 client incarnation          u64 seq           u64 model fingerprint
///       u64 push_step (barrier: generation)  u64 min_step  u32 flags   u32 entry count  u64 reserved (0)
///     entries, each:
///       u8 op (1 pull_dense, 2 push_dense, 3 pull_rows, 4 push_rows)  u8[3] zero
///       u32 variable index              u32 slice index (dense; 0 for rows)  u32 zero
///       u64 id count (rows ops)         u64 value count (push ops)
///       i64 ids[id count]               f32 values[value count]
///
/// A reply:
///
///     header (48 bytes)
///       u32 magic   u16 version   u16 type (2 = reply)
///       u64 seq (the request's)   u64 step (the PS's global step)   u64 PS incarnation
///       u32 status (fusewire::errc value; 0 = ok)   u32 flags   u32 message bytes   u32 entry count
///     message bytes (why the request failed)
///     entries (one per pull of the request, in request order), each:
///       u8 op  u8[3] zero  u32 variable  u32 slice  u32 zero  u64 value count  f32 values[value count]
///
/// Decoding checks every count against the bytes that remain (no overflow)
/// before touching them, and names what was wrong.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline constexpr std::uint32_t message_magic = 0x53505746u;
inline constexpr std::uint16_t message_version = 1;
inline constexpr std::size_t request_header_bytes = 64;
inline constexpr std::size_t reply_header_bytes = 48;
inline constexpr std::size_t entry_header_bytes = 32;
inline constexpr std::size_t reply_entry_header_bytes = 24;

/// Rendezvous key of requests (worker -> PS).
inline constexpr std::string_view request_key = "fusewire.ps/req";
/// Rendezvous key of replies (PS -> worker).
inline constexpr std::string_view reply_key = "fusewire.ps/rep";

/// The request key of lane `lane`: request_key for lane 0, else request_key + "/" + lane.
inline std::string request_key_of(std::uint32_t lane) {
  return lane == 0 ? std::string(request_key) : std::string(request_key) + "/" + std::to_string(lane);
}
/// The reply key of lane `lane`, likewise.
inline std::string reply_key_of(std::uint32_t lane) {
  return lane == 0 ? std::string(reply_key) : std::string(reply_key) + "/" + std::to_string(lane);
}

/// What one entry of a request asks.
enum class op : std::uint8_t { pull_dense = 1, push_dense = 2, pull_rows = 3, push_rows = 4 };

constexpr bool is_push(op o) noexcept { return o == op::push_dense || o == op::push_rows; }
constexpr bool is_rows(op o) noexcept { return o == op::pull_rows || o == op::push_rows; }
constexpr std::string_view to_string(op o) noexcept {
  switch (o) {
    case op::pull_dense:
      return "pull";
    case op::push_dense:
      return "push";
    case op::pull_rows:
      return "pull_rows";
    case op::push_rows:
      return "push_rows";
  }
  return "?";
}

/// Request flags.
namespace request_flags {
inline constexpr std::uint32_t sync = 1u << 0;         ///< the client trains synchronously
inline constexpr std::uint32_t contributes = 1u << 1;  ///< counts as this worker's push for step push_step (sync)
inline constexpr std::uint32_t save = 1u << 2;         ///< write a checkpoint after applying
inline constexpr std::uint32_t shutdown = 1u << 3;     ///< stop serving after replying
/// Arrive at barrier generation push_step; PS 0 replies once every worker arrived.
inline constexpr std::uint32_t barrier = 1u << 4;
/// Ask a PS (on its first lane) how many lanes it runs; the fingerprint is the
/// model's for the PS count alone (model_spec::fingerprint(num_ps)), and the
/// request carries no entries. The reply says it in its flags (reply_flags::lanes).
inline constexpr std::uint32_t hello = 1u << 5;
/// The worker is closing its client (sent to each PS's first lane, no
/// entries, no reply): the end of its connections that follows is no loss.
inline constexpr std::uint32_t bye = 1u << 6;
inline constexpr std::uint32_t all = 0x7f;
}  // namespace request_flags

/// Reply flags.
namespace reply_flags {
inline constexpr std::uint32_t stale = 1u << 0;  ///< sync: the pushes were for a finished step and were dropped
/// The PS process did not restore a checkpoint: its values are the initial
/// ones plus what it applied since it started.
inline constexpr std::uint32_t fresh = 1u << 1;
/// A hello's reply: bits 8-15 hold the PS's lane count minus one.
inline constexpr unsigned lanes_shift = 8;
inline constexpr std::uint32_t lanes_mask = 0xffu << lanes_shift;
constexpr std::uint32_t lanes(std::uint32_t count) noexcept { return ((count - 1) << lanes_shift) & lanes_mask; }
constexpr std::uint32_t lanes_of(std::uint32_t flags) noexcept { return ((flags & lanes_mask) >> lanes_shift) + 1; }
}  // namespace reply_flags

namespace detail {

template <class T>
void put(std::byte*& p, T v) noexcept {
  using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                               std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
  U u = std::bit_cast<U>(v);
  for (std::size_t i = 0; i < sizeof(U); ++i) p[i] = static_cast<std::byte>((u >> (8 * i)) & 0xff);
  p += sizeof(U);
}

template <class T>
T get(const std::byte* p) noexcept {
  using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                               std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
  U u = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return std::bit_cast<T>(u);
}

/// Copies `n` little-endian 4/8-byte values from `src` into `dst`.
template <class T>
void get_array(const std::byte* src, T* dst, std::size_t n) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(dst, src, n * sizeof(T));
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = get<T>(src + i * sizeof(T));
  }
}

template <class T>
void put_array(std::byte*& p, const T* src, std::size_t n) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    if (n != 0) std::memcpy(p, src, n * sizeof(T));
    p += n * sizeof(T);
  } else {
    for (std::size_t i = 0; i < n; ++i) put(p, src[i]);
  }
}

}  // namespace detail

/// One decoded request entry; ids and values alias the request bytes.
struct entry_view {
  ps::op kind = op::pull_dense;
  std::uint32_t var = 0;
  std::uint32_t slice = 0;
  std::uint64_t id_count = 0;
  std::uint64_t value_count = 0;
  const std::byte* ids = nullptr;
  const std::byte* values = nullptr;

  std::int64_t id(std::size_t i) const noexcept { return detail::get<std::int64_t>(ids + 8 * i); }
  float value(std::size_t i) const noexcept { return detail::get<float>(values + 4 * i); }
  /// Copies values [first, first + n) into dst.
  void copy_values(float* dst, std::size_t first, std::size_t n) const noexcept {
    detail::get_array(values + 4 * first, dst, n);
  }
};

namespace detail {
/// Reads one PS message front to back for decode_request()/decode_reply(): every
/// check names what was wrong in `why`, sets `ec` and returns false, and every
/// count is checked against the bytes left before they are touched.
class message_reader {
 public:
  /// `tail`: the bytes after `bytes` when the message arrived in two parts
  /// (a split receive); only one run of items may start exactly at the
  /// split, everything else lies in `bytes`.
  message_reader(const_buffer bytes, std::error_code& ec, std::string& why, const_buffer tail = {}) noexcept
      : p_(bytes.data()),
        tail_(tail.data()),
        end_(bytes.size() + tail.size()),
        head_(bytes.size()),
        ec_(ec),
        why_(why) {
    ec_.clear();
    why_.clear();
  }

  bool fail(errc e, std::string w) {
    ec_ = make_error_code(e);
    why_ = std::move(w);
    return false;
  }

  /// What every PS message starts with: its `header_bytes`-byte header fits,
  /// magic 'FWPS', version 1, message type `type` (1 request, 2 reply).
  bool preamble(std::size_t header_bytes, std::uint16_t type, const char* what) {
    if (head_ < header_bytes) {
      return fail(errc::truncated_frame, std::string(what) + " of " + std::to_string(end_) +
                                             " bytes is shorter than its " + std::to_string(header_bytes) +
                                             "-byte header");
    }
    if (get<std::uint32_t>(p_) != message_magic)
      return fail(errc::bad_magic, std::string(what) + " does not start with 'FWPS'");
    if (get<std::uint16_t>(p_ + 4) != message_version) {
      return fail(errc::unsupported_version, std::string(what) + " version " +
                                                 std::to_string(get<std::uint16_t>(p_ + 4)) + " (this PS speaks " +
                                                 std::to_string(message_version) + ")");
    }
    if (get<std::uint16_t>(p_ + 6) != type)
      return fail(errc::malformed_frame, std::string("message type is not a ") + what);
    pos_ = header_bytes;
    return true;
  }

  /// The message's first byte (header fields are read at their offsets).
  const std::byte* header() const noexcept { return p_; }
  std::size_t left() const noexcept { return end_ - pos_; }

  /// `count` entries of at least `entry_bytes` each can still fit.
  bool entry_count_fits(std::uint64_t count, std::size_t entry_bytes) {
    if (count <= left() / entry_bytes) return true;
    return fail(errc::malformed_frame,
                "entry count " + std::to_string(count) + " does not fit in " + std::to_string(left()) + " bytes");
  }

  /// Takes an entry header of `bytes` bytes whose first byte is its op and
  /// whose `zero_at` bytes must be zero; `where` names the entry.
  bool entry_header(std::size_t bytes, std::initializer_list<std::size_t> zero_at, const std::string& where,
                    const std::byte*& e, op& kind) {
    if (left() < bytes) return fail(errc::truncated_frame, where + ": header truncated");
    if (pos_ + bytes > head_) return split_at(where + ": header");
    e = p_ + pos_;
    const auto raw_op = get<std::uint8_t>(e);
    if (raw_op < 1 || raw_op > 4) return fail(errc::malformed_frame, where + ": unknown op " + std::to_string(raw_op));
    kind = static_cast<op>(raw_op);
    for (std::size_t at : zero_at) {
      if (e[at] != std::byte{0}) return fail(errc::malformed_frame, where + ": reserved bytes are not zero");
    }
    pos_ += bytes;
    return true;
  }

  /// Takes `count` items of `item_bytes` each (`what`: "ids", "values").
  bool items(std::uint64_t count, std::size_t item_bytes, const std::string& where, const char* what,
             const std::byte*& out) {
    if (count > left() / item_bytes) {
      return fail(errc::truncated_frame, where + ": " + std::to_string(count) + " " + what + " do not fit in the " +
                                             std::to_string(left()) + " bytes left");
    }
    const std::size_t n = static_cast<std::size_t>(count) * item_bytes;
    if (pos_ + n > head_) {
      if (pos_ != head_) return split_at(where + ": " + what);
      out = tail_;
    } else {
      out = p_ + pos_;
    }
    pos_ += n;
    return true;
  }

  /// Nothing follows the last entry.
  bool at_end() {
    if (pos_ == end_) return true;
    return fail(errc::malformed_frame, std::to_string(left()) + " bytes after the last entry");
  }

 private:
  bool split_at(const std::string& what) {
    return fail(errc::malformed_frame, what + " crosses byte " + std::to_string(head_) +
                                           ", where the receiver split the message (its last values start there)");
  }

  const std::byte* p_;
  const std::byte* tail_;
  std::size_t pos_ = 0;
  std::size_t end_;
  std::size_t head_;  ///< bytes at p_; the rest (end_ - head_) at tail_
  std::error_code& ec_;
  std::string& why_;
};
}  // namespace detail

/// A decoded request; views into the bytes it was decoded from.
struct request_view {
  std::uint64_t incarnation = 0;
  std::uint64_t seq = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t push_step = 0;
  std::uint64_t min_step = 0;
  std::uint32_t flags = 0;
  std::vector<entry_view> entries;
};

/// Decodes `bytes`; on failure sets `ec` (errc::malformed_frame, truncated_frame,
/// bad_magic, unsupported_version) and `why`, and leaves whatever header fields
/// were readable in `out` (seq, so an error reply can name the request).
inline void decode_request(const_buffer bytes, request_view& out, std::error_code& ec, std::string& why) {
  out = {};
  detail::message_reader in(bytes, ec, why);
  if (!in.preamble(request_header_bytes, 1, "request")) return;
  const std::byte* p = in.header();
  out.incarnation = detail::get<std::uint64_t>(p + 8);
  out.seq = detail::get<std::uint64_t>(p + 16);
  out.fingerprint = detail::get<std::uint64_t>(p + 24);
  out.push_step = detail::get<std::uint64_t>(p + 32);
  out.min_step = detail::get<std::uint64_t>(p + 40);
  out.flags = detail::get<std::uint32_t>(p + 48);
  const std::uint32_t count = detail::get<std::uint32_t>(p + 52);
  if (detail::get<std::uint64_t>(p + 56) != 0)
    return (void)in.fail(errc::malformed_frame, "reserved header bytes are not zero");
  if ((out.flags & ~request_flags::all) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%x", out.flags);
    return (void)in.fail(errc::malformed_frame, std::string("unknown request flags ") + hex);
  }
  if (!in.entry_count_fits(count, entry_header_bytes)) return;
  out.entries.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::string where = "entry " + std::to_string(i);
    const std::byte* e = nullptr;
    entry_view v;
    if (!in.entry_header(entry_header_bytes, {1, 2, 3, 12, 13, 14, 15}, where, e, v.kind)) return;
    v.var = detail::get<std::uint32_t>(e + 4);
    v.slice = detail::get<std::uint32_t>(e + 8);
    v.id_count = detail::get<std::uint64_t>(e + 16);
    v.value_count = detail::get<std::uint64_t>(e + 24);
    if (!is_rows(v.kind) && v.id_count != 0)
      return (void)in.fail(errc::malformed_frame, where + ": a dense op carries ids");
    if (is_rows(v.kind) && v.slice != 0)
      return (void)in.fail(errc::malformed_frame, where + ": a rows op carries a slice");
    if (!is_push(v.kind) && v.value_count != 0)
      return (void)in.fail(errc::malformed_frame, where + ": a pull carries values");
    if (!in.items(v.id_count, 8, where, "ids", v.ids) || !in.items(v.value_count, 4, where, "values", v.values)) return;
    out.entries.push_back(v);
  }
  in.at_end();
}

/// Builds one request. Value and id spans are referenced until finish() copies
/// them, or, with finish_gathered(), until the request has been sent.
class request_builder {
 public:
  request_builder() = default;

  void set_header(std::uint64_t incarnation, std::uint64_t seq, std::uint64_t fingerprint, std::uint64_t push_step,
                  std::uint64_t min_step, std::uint32_t flags) noexcept {
    incarnation_ = incarnation;
    seq_ = seq;
    fingerprint_ = fingerprint;
    push_step_ = push_step;
    min_step_ = min_step;
    flags_ = flags;
  }
  std::uint32_t flags() const noexcept { return flags_; }
  void add_flags(std::uint32_t f) noexcept { flags_ |= f; }

  void pull_dense(std::uint32_t var, std::uint32_t slice) { entries_.push_back({op::pull_dense, var, slice, {}, {}}); }
  void push_dense(std::uint32_t var, std::uint32_t slice, std::span<const float> grad) {
    entries_.push_back({op::push_dense, var, slice, {}, grad});
  }
  void pull_rows(std::uint32_t var, std::span<const std::int64_t> ids) {
    entries_.push_back({op::pull_rows, var, 0, ids, {}});
  }
  void push_rows(std::uint32_t var, std::span<const std::int64_t> ids, std::span<const float> grads) {
    entries_.push_back({op::push_rows, var, 0, ids, grads});
  }
  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }

  /// Encoded length in bytes.
  std::size_t bytes() const noexcept {
    std::size_t n = request_header_bytes;
    for (const auto& e : entries_) n += entry_header_bytes + e.ids.size() * 8 + e.values.size() * 4;
    return n;
  }

  /// Encodes everything into a new buffer.
  tensor_buffer finish() const { return encode(0).head; }

  /// A request ready for a scatter-gather send: `segments`, in order, are its
  /// bytes. The headers, ids and small value arrays are encoded into `head`;
  /// value arrays of at least `gather_from` bytes (the largest max_gathered of
  /// them) are left where the caller's spans are, so a large gradient goes out
  /// from the caller's memory without a copy. With gather_from = 0, or on a
  /// big-endian host, everything is in `head`.
  struct encoded {
    tensor_buffer head;
    std::vector<const_buffer> segments;  ///< views of head and of the caller's values
    std::size_t bytes = 0;               ///< the request's length
  };
  /// Value arrays finish_gathered() leaves out of line at most (the send's segment count stays small).
  static constexpr std::size_t max_gathered = 32;

  encoded finish_gathered(std::size_t gather_from) const { return encode(gather_from); }

 private:
  struct entry {
    op kind;
    std::uint32_t var;
    std::uint32_t slice;
    std::span<const std::int64_t> ids;
    std::span<const float> values;
  };

  /// Which entries' values stay out of line: at least `gather_from` bytes, the largest max_gathered.
  std::vector<bool> gathered(std::size_t gather_from) const {
    std::vector<bool> out(entries_.size(), false);
    if (gather_from == 0 || std::endian::native != std::endian::little) return out;
    std::vector<std::size_t> big;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (!entries_[i].values.empty() && entries_[i].values.size_bytes() >= gather_from) big.push_back(i);
    }
    if (big.size() > max_gathered) {
      std::nth_element(big.begin(), big.begin() + max_gathered, big.end(), [this](std::size_t a, std::size_t b) {
        return entries_[a].values.size() > entries_[b].values.size();
      });
      big.resize(max_gathered);
    }
    for (std::size_t i : big) out[i] = true;
    return out;
  }

  encoded encode(std::size_t gather_from) const {
    const std::vector<bool> out_of_line = gathered(gather_from);
    std::size_t head_bytes = request_header_bytes;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const entry& e = entries_[i];
      head_bytes += entry_header_bytes + e.ids.size() * 8 + (out_of_line[i] ? 0 : e.values.size() * 4);
    }
    encoded out;
    out.head = tensor_buffer::allocate(head_bytes);
    out.bytes = bytes();
    std::byte* p = out.head.data();
    const std::byte* run = p;  // the first head byte not in a segment yet
    detail::put(p, message_magic);
    detail::put(p, message_version);
    detail::put(p, std::uint16_t{1});
    detail::put(p, incarnation_);
    detail::put(p, seq_);
    detail::put(p, fingerprint_);
    detail::put(p, push_step_);
    detail::put(p, min_step_);
    detail::put(p, flags_);
    detail::put(p, static_cast<std::uint32_t>(entries_.size()));
    detail::put(p, std::uint64_t{0});
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const entry& e = entries_[i];
      detail::put(p, static_cast<std::uint8_t>(e.kind));
      detail::put(p, std::uint8_t{0});
      detail::put(p, std::uint16_t{0});
      detail::put(p, e.var);
      detail::put(p, e.slice);
      detail::put(p, std::uint32_t{0});
      detail::put(p, static_cast<std::uint64_t>(e.ids.size()));
      detail::put(p, static_cast<std::uint64_t>(e.values.size()));
      detail::put_array(p, e.ids.data(), e.ids.size());
      if (!out_of_line[i]) {
        detail::put_array(p, e.values.data(), e.values.size());
        continue;
      }
      out.segments.push_back({run, static_cast<std::size_t>(p - run)});
      out.segments.push_back({reinterpret_cast<const std::byte*>(e.values.data()), e.values.size_bytes()});
      run = p;
    }
    if (p != run) out.segments.push_back({run, static_cast<std::size_t>(p - run)});
    return out;
  }

  std::uint64_t incarnation_ = 0, seq_ = 0, fingerprint_ = 0, push_step_ = 0, min_step_ = 0;
  std::uint32_t flags_ = 0;
  std::vector<entry> entries_;
};

/// One decoded reply entry; values alias the reply bytes.
struct reply_entry_view {
  ps::op kind = op::pull_dense;
  std::uint32_t var = 0;
  std::uint32_t slice = 0;
  std::uint64_t value_count = 0;
  const std::byte* values = nullptr;

  void copy_values(float* dst, std::size_t first, std::size_t n) const noexcept {
    detail::get_array(values + 4 * first, dst, n);
  }
};

/// A decoded reply.
struct reply_view {
  std::uint64_t seq = 0;
  std::uint64_t step = 0;
  std::uint64_t incarnation = 0;
  std::uint32_t status = 0;
  std::uint32_t flags = 0;
  std::string message;
  std::vector<reply_entry_view> entries;
};

/// Decodes a reply; on failure sets `ec` and `why` like decode_request().
/// `tail`: where the reply's last bytes landed when it was received in two
/// parts (they must be the last entry's values, starting right after `bytes`).
inline void decode_reply(const_buffer bytes, reply_view& out, std::error_code& ec, std::string& why,
                         const_buffer tail = {}) {
  out = {};
  detail::message_reader in(bytes, ec, why, tail);
  if (!in.preamble(reply_header_bytes, 2, "reply")) return;
  const std::byte* p = in.header();
  out.seq = detail::get<std::uint64_t>(p + 8);
  out.step = detail::get<std::uint64_t>(p + 16);
  out.incarnation = detail::get<std::uint64_t>(p + 24);
  out.status = detail::get<std::uint32_t>(p + 32);
  out.flags = detail::get<std::uint32_t>(p + 36);
  const std::uint32_t message_len = detail::get<std::uint32_t>(p + 40);
  const std::uint32_t count = detail::get<std::uint32_t>(p + 44);
  const std::byte* message = nullptr;
  if (!in.items(message_len, 1, "reply", "message bytes", message)) return;
  out.message.assign(reinterpret_cast<const char*>(message), message_len);
  if (!in.entry_count_fits(count, reply_entry_header_bytes)) return;
  out.entries.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::string where = "reply entry " + std::to_string(i);
    const std::byte* e = nullptr;
    reply_entry_view v;
    if (!in.entry_header(reply_entry_header_bytes, {1, 2, 3, 12, 13, 14, 15}, where, e, v.kind)) return;
    v.var = detail::get<std::uint32_t>(e + 4);
    v.slice = detail::get<std::uint32_t>(e + 8);
    v.value_count = detail::get<std::uint64_t>(e + 16);
    if (!in.items(v.value_count, 4, where, "values", v.values)) return;
    out.entries.push_back(v);
  }
  in.at_end();
}

namespace detail {

inline void put_reply_header(std::byte*& p, std::uint64_t seq, std::uint64_t step, std::uint64_t incarnation,
                             std::uint32_t status, std::uint32_t flags, std::uint32_t message_bytes,
                             std::uint32_t entries) noexcept {
  put(p, message_magic);
  put(p, message_version);
  put(p, std::uint16_t{2});
  put(p, seq);
  put(p, step);
  put(p, incarnation);
  put(p, status);
  put(p, flags);
  put(p, message_bytes);
  put(p, entries);
}

inline void put_reply_entry_header(std::byte*& p, op kind, std::uint32_t var, std::uint32_t slice,
                                   std::uint64_t count) noexcept {
  put(p, static_cast<std::uint8_t>(kind));
  put(p, std::uint8_t{0});
  put(p, std::uint16_t{0});
  put(p, var);
  put(p, slice);
  put(p, std::uint32_t{0});
  put(p, count);
}

}  // namespace detail

/// Builds a reply: reserve the values of each entry, then fill them in place.
/// finish() copies them into the message; a PS answers pulls with
/// reply_encoder instead, which writes each value at most once.
class reply_builder {
 public:
  reply_builder(std::uint64_t seq, std::uint64_t step, std::uint64_t incarnation)
      : seq_(seq), step_(step), incarnation_(incarnation) {}

  void set_step(std::uint64_t step) noexcept { step_ = step; }
  void set_flags(std::uint32_t f) noexcept { flags_ = f; }
  /// Marks the reply as failed (drops any entries).
  void set_error(errc status, std::string message) {
    status_ = static_cast<std::uint32_t>(status);
    message_ = std::move(message);
    entries_.clear();
    values_.clear();
  }
  bool failed() const noexcept { return status_ != 0; }

  /// Adds an entry of `n` values; returns where to write them (valid until the next add()).
  std::span<float> add(op kind, std::uint32_t var, std::uint32_t slice, std::size_t n) {
    entries_.push_back({kind, var, slice, values_.size(), n});
    values_.resize(values_.size() + n);
    return {values_.data() + values_.size() - n, n};
  }

  tensor_buffer finish() const {
    std::size_t n = reply_header_bytes + message_.size();
    for (const auto& e : entries_) n += reply_entry_header_bytes + e.count * 4;
    tensor_buffer out = tensor_buffer::allocate(n);
    std::byte* p = out.data();
    detail::put_reply_header(p, seq_, step_, incarnation_, status_, flags_, static_cast<std::uint32_t>(message_.size()),
                             static_cast<std::uint32_t>(entries_.size()));
    if (!message_.empty()) std::memcpy(p, message_.data(), message_.size());
    p += message_.size();
    for (const auto& e : entries_) {
      detail::put_reply_entry_header(p, e.kind, e.var, e.slice, e.count);
      detail::put_array(p, values_.data() + e.first, e.count);
    }
    return out;
  }

 private:
  struct entry {
    op kind;
    std::uint32_t var;
    std::uint32_t slice;
    std::size_t first;
    std::size_t count;
  };
  std::uint64_t seq_, step_, incarnation_;
  std::uint32_t status_ = 0, flags_ = 0;
  std::string message_;
  std::vector<entry> entries_;
  std::vector<float> values_;
};

/// A reply as a PS sends it: its bytes, in order, as a scatter-gather list
/// (`sg`), and the buffers that hold those bytes (`owners`). Keep it — it is
/// movable, and moving it keeps `sg` valid — until the bytes were sent.
struct reply_message {
  std::vector<const_buffer> sg;
  std::vector<tensor_buffer> owners;

  /// A reply held in one buffer.
  static reply_message of(tensor_buffer b) {
    reply_message m;
    m.sg.push_back(b.bytes());
    m.owners.push_back(std::move(b));
    return m;
  }
  /// Encoded length in bytes.
  std::size_t size() const noexcept { return total_size(sg); }
  /// The bytes in one new buffer (a copy).
  tensor_buffer gather() const {
    tensor_buffer out = tensor_buffer::allocate(size());
    fusewire::gather(sg, out.bytes());
    return out;
  }
};

/// Encodes a successful reply straight into the buffer that is sent: its
/// size is known before the first value (entries and values counted up
/// front), so a large pull costs one buffer and one copy of each value —
/// or no copy of the values of an entry given by share(), which are sent
/// from their own buffer (finish_message()).
class reply_encoder {
 public:
  /// A reply of `entries` entries holding `values` values in all, not
  /// counting those given by share().
  reply_encoder(std::uint64_t seq, std::uint64_t step, std::uint64_t incarnation, std::uint32_t flags,
                std::uint32_t entries, std::size_t values)
      : out_(tensor_buffer::allocate(reply_header_bytes + entries * reply_entry_header_bytes + values * 4)),
        p_(out_.data()),
        segment_(p_) {
    detail::put_reply_header(p_, seq, step, incarnation, 0, flags, 0, entries);
  }

  /// Starts an entry of `n` values; append() them, or share() them, next.
  void begin(op kind, std::uint32_t var, std::uint32_t slice, std::size_t n) noexcept {
    detail::put_reply_entry_header(p_, kind, var, slice, n);
  }
  /// Appends values of the current entry.
  void append(std::span<const float> v) noexcept { detail::put_array(p_, v.data(), v.size()); }
  /// The current entry's values, all of them: `values` holds them as the
  /// wire does (little-endian f32, so only on a little-endian host). They
  /// are sent from `values` itself; the reply keeps a handle to it.
  void share(tensor_buffer values) {
    sg_.push_back({segment_, static_cast<std::size_t>(p_ - segment_)});
    sg_.push_back(values.bytes());
    shared_.push_back(std::move(values));
    segment_ = p_;
  }

  /// The reply in one buffer; no share() was made, and every announced
  /// entry and value was written.
  tensor_buffer finish() noexcept { return std::move(out_); }

  /// The reply as a scatter-gather list: pieces of the one buffer written
  /// here, around the buffers given by share(). Every announced entry and
  /// value was written or shared.
  reply_message finish_message() {
    reply_message m;
    if (p_ != segment_) sg_.push_back({segment_, static_cast<std::size_t>(p_ - segment_)});
    m.sg = std::move(sg_);
    m.owners.reserve(1 + shared_.size());
    m.owners.push_back(std::move(out_));
    for (tensor_buffer& b : shared_) m.owners.push_back(std::move(b));
    return m;
  }

 private:
  tensor_buffer out_;
  std::byte* p_;
  std::byte* segment_;  ///< where the piece of out_ not yet in sg_ starts
  std::vector<const_buffer> sg_;
  std::vector<tensor_buffer> shared_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
