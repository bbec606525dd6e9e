#pragma once
/// What the fuzz targets share: FUZZ_CHECK (a violated property aborts, which
/// libFuzzer reports with the input) and a reader that turns the fuzzer's
/// bytes into the fields of a structured input.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

namespace fusewire::test {

[[noreturn]] inline void fail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: property violated: %s\n", file, line, what);
  std::abort();
}

/// Reads fixed-size fields front to back; past the end every field reads as zero,
/// so any input describes some structured value.
class input_reader {
 public:
  explicit input_reader(std::span<const std::byte> in) noexcept : in_(in) {}

  std::uint8_t u8() noexcept { return static_cast<std::uint8_t>(take(1)); }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(take(2)); }
  std::uint32_t u32() noexcept { return static_cast<std::uint32_t>(take(4)); }
  std::uint64_t u64() noexcept { return take(8); }
  /// A value in [0, bound] (bound < 256).
  std::uint8_t below_or(std::uint8_t bound) noexcept { return static_cast<std::uint8_t>(u8() % (bound + 1u)); }
  /// Copies up to `out.size()` bytes; the rest of `out` is zero.
  void bytes(std::span<std::byte> out) noexcept {
    const std::size_t n = std::min(out.size(), in_.size() - pos_);
    if (n != 0) std::memcpy(out.data(), in_.data() + pos_, n);
    if (n != out.size()) std::memset(out.data() + n, 0, out.size() - n);
    pos_ += n;
  }
  std::size_t left() const noexcept { return in_.size() - pos_; }

 private:
  std::uint64_t take(std::size_t n) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n && pos_ < in_.size(); ++i, ++pos_)
      v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(in_[pos_])) << (8 * i);
    return v;
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

}  // namespace fusewire::test

#define FUZZ_CHECK(cond)                                           \
  do {                                                             \
    if (!(cond)) ::fusewire::test::fail(__FILE__, __LINE__, #cond); \
  } while (0)
