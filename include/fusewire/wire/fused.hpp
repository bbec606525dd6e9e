#pragma once
/// Fused frames: N keyed tensors in one frame, so many small sends to the same
/// peer cost one header and one send.
///
/// Meta: u32 entry count (>= 1), then per entry a u16-length key, a tensor
/// descriptor and the u64 byte size of its payload (equal to the descriptor's
/// byte size). The payloads follow the meta, concatenated in entry order.
/// `fused_builder` appends entries into a caller's buffer; decoding yields a
/// `fused_meta` view whose entries are parsed while iterating, so neither
/// side allocates.

#include <algorithm>
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
#include <fusewire/wire/meta.hpp>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// One tensor of a fused frame: its key and descriptor, and where its bytes
/// are in the frame's payload.
struct fused_entry {
  std::string_view key;
  tensor_descriptor descriptor;
  std::uint64_t offset = 0;  ///< of its bytes within the frame's payload
  std::uint64_t size = 0;    ///< bytes (the descriptor's byte size)

  /// This entry's bytes within `payload`, the payload of the frame it came
  /// from (which decode_meta checked to be exactly the sum of the sizes).
  [[nodiscard]] const_buffer bytes_in(const_buffer payload) const noexcept {
    return payload.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(size));
  }

  friend bool operator==(const fused_entry&, const fused_entry&) = default;
};

namespace detail {

/// Reads one entry of a meta that decode_meta (or fused_builder) already
/// validated: no limit or descriptor checks, only the reader's bounds.
inline void read_trusted_fused_entry(byte_reader& r, fused_entry& out) noexcept {
  out.key = r.chars(r.u16());
  out.descriptor.type = static_cast<dtype>(r.u8());
  out.descriptor.rank = r.u8();
  const std::size_t rank = std::min<std::size_t>(out.descriptor.rank, max_rank);
  for (std::size_t i = 0; i < rank; ++i) out.descriptor.dims[i] = r.i64();
  out.size = r.u64();
}

/// Reads and validates one entry (key within `lim`, a valid descriptor whose
/// byte size is the entry's size) and yields its size, with the errors of
/// read_descriptor + check_payload_size. The common rank-1 descriptor is
/// checked in place, without building a tensor_descriptor (zeroing its 8
/// dimensions and walking them again cost more than the rest of the entry).
inline std::error_code read_checked_fused_size(byte_reader& r, const limits& lim, std::uint64_t& size) noexcept {
  std::string_view key;
  if (auto ec = read_string(r, lim.max_key_bytes, key)) return ec;
  if (r.remaining() >= 2 + 8 + 8) {
    byte_reader peek = r;
    const auto type = static_cast<dtype>(peek.u8());
    if (peek.u8() == 1 && lim.max_rank >= 1) {
      const std::int64_t dim = peek.i64();
      size = peek.u64();
      std::error_code ec;
      if (byte_size_of(type, dim, ec) != size || ec) return make_error_code(errc::malformed_frame);
      r = peek;
      return {};
    }
  }
  tensor_descriptor d;
  if (auto ec = read_descriptor(r, lim, d)) return ec;
  size = r.u64();
  if (!r.ok()) return make_error_code(errc::malformed_frame);
  if (check_payload_size(d, size)) return make_error_code(errc::malformed_frame);
  return {};
}

}  // namespace detail

/// The validated meta of a fused frame, as a forward range of `fused_entry`.
/// A view over the decoded (or built) bytes, which must outlive it.
class fused_meta {
 public:
  static constexpr frame_type type = frame_type::fused;

  /// Parses entries one at a time from the meta bytes; never allocates.
  class iterator {
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;
    using value_type = fused_entry;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    const fused_entry& operator*() const noexcept { return entry_; }
    const fused_entry* operator->() const noexcept { return &entry_; }
    iterator& operator++() noexcept {
      ++index_;
      next_offset_ = entry_.offset + entry_.size;
      load();
      return *this;
    }
    iterator operator++(int) noexcept {
      auto copy = *this;
      ++*this;
      return copy;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.index_ == b.index_; }

   private:
    friend class fused_meta;
    iterator(const_buffer entries, std::uint32_t index, std::uint32_t count) noexcept
        : rest_(entries), index_(index), count_(count) {
      load();
    }
    void load() noexcept {
      if (index_ >= count_) return;
      byte_reader r(rest_);
      detail::read_trusted_fused_entry(r, entry_);
      entry_.offset = next_offset_;
      rest_ = rest_.subspan(r.position());
    }

    const_buffer rest_;
    std::uint32_t index_ = 0;
    std::uint32_t count_ = 0;
    std::uint64_t next_offset_ = 0;
    fused_entry entry_;
  };

  /// No entries (not a valid frame by itself).
  fused_meta() = default;

  /// Entries in the frame.
  [[nodiscard]] std::uint32_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  /// Sum of the entries' sizes: the frame's payload_len.
  [[nodiscard]] std::uint64_t payload_size() const noexcept { return payload_size_; }
  /// The encoded meta.
  [[nodiscard]] const_buffer bytes() const noexcept { return bytes_; }

  [[nodiscard]] iterator begin() const noexcept { return {bytes_.size() >= 4 ? bytes_.subspan(4) : bytes_, 0, count_}; }
  [[nodiscard]] iterator end() const noexcept { return {{}, count_, count_}; }

  /// Same encoded entries.
  friend bool operator==(const fused_meta& a, const fused_meta& b) noexcept {
    return std::ranges::equal(a.bytes_, b.bytes_);
  }

 private:
  friend class fused_builder;
  friend std::error_code decode_meta(const frame_header&, const_buffer, const limits&, fused_meta&) noexcept;
  fused_meta(const_buffer bytes, std::uint32_t count, std::uint64_t payload_size) noexcept
      : bytes_(bytes), count_(count), payload_size_(payload_size) {}

  const_buffer bytes_;
  std::uint32_t count_ = 0;
  std::uint64_t payload_size_ = 0;
};

/// Bytes of the encoded meta.
[[nodiscard]] inline std::size_t encoded_size(const fused_meta& m) noexcept { return m.bytes().size(); }

/// Copies the encoded meta of `m` into `out`; errc::invalid_argument if `m` has
/// no entries or `out` is too small.
inline std::size_t encode_meta(const fused_meta& m, mutable_buffer out, std::error_code& ec) noexcept {
  return detail::encode_checked(!m.empty(), encoded_size(m), out, ec, [&](byte_writer& w) { w.bytes(m.bytes()); });
}

/// Decodes and validates a fused frame's meta, walking every entry once:
/// errc::frame_too_large if the count, a key or a rank exceeds `lim`;
/// errc::malformed_frame if the count is zero, the entries overrun or underrun
/// the meta, an entry's size differs from its descriptor's byte size, or the
/// sizes do not add up to h.payload_len. Allocates nothing.
[[nodiscard]] inline std::error_code decode_meta(const frame_header& h, const_buffer meta, const limits& lim,
                                                 fused_meta& out) noexcept {
  if (auto ec = detail::check_meta(h, h.type == fused_meta::type, meta, lim)) return ec;
  const auto bytes = meta.first(h.meta_len);
  byte_reader r(bytes);
  const std::uint32_t count = r.u32();
  if (!r.ok() || count == 0) return make_error_code(errc::malformed_frame);
  if (count > lim.max_entries) return make_error_code(errc::frame_too_large);
  std::uint64_t sum = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint64_t size = 0;
    if (auto ec = detail::read_checked_fused_size(r, lim, size)) return ec;
    if (size > h.payload_len - sum) return make_error_code(errc::malformed_frame);
    sum += size;
  }
  if (auto ec = detail::finish(r)) return ec;
  if (sum != h.payload_len) return make_error_code(errc::malformed_frame);
  out = fused_meta(bytes, count, sum);
  return {};
}

/// Builds the meta of one fused frame in a caller's buffer, entry by entry
/// (the fusion layer appends each small send to its peer's builder, then sends
/// header + meta + the payloads in the same order). Never allocates. Not
/// thread-safe: one builder belongs to one reactor.
class fused_builder {
 public:
  /// Builds into `meta_buffer` (the caller owns it; it must outlive the
  /// builder and the views it returns). The meta stays within `lim`.
  explicit fused_builder(mutable_buffer meta_buffer, const limits& lim = {}) noexcept
      : buffer_(meta_buffer), capacity_(std::min<std::size_t>(meta_buffer.size(), lim.max_meta_bytes)), lim_(lim) {
    clear();
  }

  /// Meta bytes one entry takes.
  [[nodiscard]] static std::size_t entry_size(std::string_view key, const tensor_descriptor& d) noexcept {
    return 2 + key.size() + descriptor_size(d) + 8;
  }

  /// Appends an entry for a tensor of `d` under `key`; the caller sends its
  /// bytes in this position of the payload. Errors (nothing appended):
  /// errc::invalid_argument if the entry could never be fused under these
  /// limits (bad descriptor, key or rank above the limit, tensor or entry
  /// larger than a frame allows); errc::frame_too_large if it does not fit in
  /// this frame any more (send it, clear(), append again).
  [[nodiscard]] std::error_code append(std::string_view key, const tensor_descriptor& d) noexcept {
    std::uint64_t size = 0;
    if (auto ec = check(key, d, size)) return ec;
    byte_writer w(buffer_.subspan(used_, capacity_ - used_));
    detail::write_string(w, key);
    write_descriptor(w, d);
    w.u64(size);
    used_ += w.position();
    ++count_;
    payload_size_ += size;
    store_le<std::uint32_t>(buffer_.data(), count_);
    return {};
  }

  /// True if append(key, d) would succeed now.
  [[nodiscard]] bool fits(std::string_view key, const tensor_descriptor& d) const noexcept {
    std::uint64_t size = 0;
    return !check(key, d, size);
  }

  /// Entries appended so far.
  [[nodiscard]] std::uint32_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  /// Payload bytes of the entries so far.
  [[nodiscard]] std::uint64_t payload_size() const noexcept { return payload_size_; }
  /// The meta built so far, ready to send once it has an entry.
  [[nodiscard]] fused_meta meta() const noexcept { return {buffer_.first(used_), count_, payload_size_}; }
  /// The header of the frame built so far.
  [[nodiscard]] frame_header header(std::uint64_t request_id, std::uint16_t flags = 0) const noexcept {
    return {frame_type::fused, flags, request_id, static_cast<std::uint32_t>(used_), payload_size_};
  }

  /// Forgets every entry; the buffer is reused for the next frame.
  void clear() noexcept {
    count_ = 0;
    payload_size_ = 0;
    used_ = capacity_ >= 4 ? 4 : 0;
    if (used_ != 0) store_le<std::uint32_t>(buffer_.data(), 0);
  }

 private:
  std::error_code check(std::string_view key, const tensor_descriptor& d, std::uint64_t& size) const noexcept {
    if (!is_valid(d.type) || key.size() > lim_.max_key_bytes || d.rank > lim_.max_rank) {
      return make_error_code(errc::invalid_argument);
    }
    std::error_code ec;
    size = d.byte_size(ec);  // with the dtype check above: descriptor_encodable(d), its size computed once
    if (ec) return make_error_code(errc::invalid_argument);
    const std::size_t entry = entry_size(key, d);
    if (capacity_ < 4 || entry > capacity_ - 4 || size > lim_.max_payload_bytes) {
      return make_error_code(errc::invalid_argument);
    }
    if (count_ >= lim_.max_entries || entry > capacity_ - used_ || size > lim_.max_payload_bytes - payload_size_) {
      return make_error_code(errc::frame_too_large);
    }
    return {};
  }

  mutable_buffer buffer_;
  std::size_t capacity_ = 0;
  limits lim_;
  std::size_t used_ = 0;
  std::uint32_t count_ = 0;
  std::uint64_t payload_size_ = 0;
};

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
