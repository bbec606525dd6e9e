#pragma once
/// Explicit little-endian integers and bounds-checked byte cursors: the only
/// way fusewire turns integers into wire bytes and back (never a struct cast).

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

namespace fusewire {
inline namespace v0 {
namespace wire {

/// Writes `value` into `out[0..sizeof(T))`, least significant byte first.
template <std::unsigned_integral T>
constexpr void store_le(std::byte* out, T value) noexcept {
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    // One store (the byte loop below compiled to a load, shift and store per byte).
    std::memcpy(out, &value, sizeof(T));
    return;
  }
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::byte>(static_cast<unsigned char>(value >> (8 * i)));
  }
}

/// Reads a `T` stored least significant byte first at `in[0..sizeof(T))`.
template <std::unsigned_integral T>
[[nodiscard]] constexpr T load_le(const std::byte* in) noexcept {
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    // One load: GCC does not merge the byte loop below into one, and the loop
    // makes the reader's read() too big to inline.
    T value;
    std::memcpy(&value, in, sizeof(T));
    return value;
  }
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value = static_cast<T>(value | static_cast<T>(static_cast<T>(in[i]) << (8 * i)));
  }
  return value;
}

/// Reads little-endian fields from a byte span. A read past the end yields
/// zero / an empty view and makes `ok()` false for good (check once at the end).
class byte_reader {
 public:
  /// Reads from `in`, which must outlive the reader and every view it returns.
  constexpr explicit byte_reader(std::span<const std::byte> in) noexcept : in_(in) {}

  /// The next `T`, or 0 if fewer than `sizeof(T)` bytes are left.
  template <std::unsigned_integral T>
  [[nodiscard]] constexpr T read() noexcept {
    if (!take(sizeof(T))) return 0;
    return load_le<T>(in_.data() + pos_ - sizeof(T));
  }
  [[nodiscard]] constexpr std::uint8_t u8() noexcept { return read<std::uint8_t>(); }
  [[nodiscard]] constexpr std::uint16_t u16() noexcept { return read<std::uint16_t>(); }
  [[nodiscard]] constexpr std::uint32_t u32() noexcept { return read<std::uint32_t>(); }
  [[nodiscard]] constexpr std::uint64_t u64() noexcept { return read<std::uint64_t>(); }
  /// A two's-complement signed 64-bit value.
  [[nodiscard]] constexpr std::int64_t i64() noexcept { return static_cast<std::int64_t>(u64()); }
  /// A two's-complement signed 32-bit value.
  [[nodiscard]] constexpr std::int32_t i32() noexcept { return static_cast<std::int32_t>(u32()); }

  /// A view of the next `n` bytes (no copy), or an empty view if fewer are left.
  [[nodiscard]] constexpr std::span<const std::byte> bytes(std::size_t n) noexcept {
    if (!take(n)) return {};
    return in_.subspan(pos_ - n, n);
  }
  /// The next `n` bytes viewed as characters (no copy).
  [[nodiscard]] std::string_view chars(std::size_t n) noexcept {
    auto b = bytes(n);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  /// Copies the next `out.size()` bytes into `out` (zeroes it if too few are left).
  void copy_to(std::span<std::byte> out) noexcept {
    if (out.empty()) return;
    auto b = bytes(out.size());
    if (b.empty()) {
      std::memset(out.data(), 0, out.size());
    } else {
      std::memcpy(out.data(), b.data(), out.size());
    }
  }

  /// False once any read ran past the end.
  [[nodiscard]] constexpr bool ok() const noexcept { return ok_; }
  /// True when every read succeeded and the whole input was consumed.
  [[nodiscard]] constexpr bool at_end() const noexcept { return ok_ && pos_ == in_.size(); }
  [[nodiscard]] constexpr std::size_t remaining() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] constexpr std::size_t position() const noexcept { return pos_; }

 private:
  constexpr bool take(std::size_t n) noexcept {
    if (!ok_ || n > in_.size() - pos_) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

/// Writes little-endian fields into a caller's buffer; never allocates. A write
/// that does not fit writes nothing and makes `ok()` false for good.
class byte_writer {
 public:
  /// Writes into `out`, which the caller owns.
  constexpr explicit byte_writer(std::span<std::byte> out) noexcept : out_(out) {}

  template <std::unsigned_integral T>
  constexpr void write(T value) noexcept {
    if (take(sizeof(T))) store_le<T>(out_.data() + pos_ - sizeof(T), value);
  }
  constexpr void u8(std::uint8_t v) noexcept { write(v); }
  constexpr void u16(std::uint16_t v) noexcept { write(v); }
  constexpr void u32(std::uint32_t v) noexcept { write(v); }
  constexpr void u64(std::uint64_t v) noexcept { write(v); }
  /// Writes a signed value as its two's complement.
  constexpr void i64(std::int64_t v) noexcept { write(static_cast<std::uint64_t>(v)); }
  constexpr void i32(std::int32_t v) noexcept { write(static_cast<std::uint32_t>(v)); }

  /// Copies `b` verbatim.
  void bytes(std::span<const std::byte> b) noexcept {
    if (take(b.size()) && !b.empty()) std::memcpy(out_.data() + pos_ - b.size(), b.data(), b.size());
  }
  /// Copies the characters of `s` verbatim (no terminator, no length).
  void chars(std::string_view s) noexcept { bytes(std::as_bytes(std::span<const char>(s.data(), s.size()))); }

  /// False once any write did not fit.
  [[nodiscard]] constexpr bool ok() const noexcept { return ok_; }
  /// Bytes written so far.
  [[nodiscard]] constexpr std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] constexpr std::size_t remaining() const noexcept { return out_.size() - pos_; }

 private:
  constexpr bool take(std::size_t n) noexcept {
    if (!ok_ || n > out_.size() - pos_) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }

  std::span<std::byte> out_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace wire
}  // namespace v0
}  // namespace fusewire
