#pragma once
/// Byte patterns that tests send and check: bytes that depend on a seed and on
/// their position, so a byte lost, doubled, moved or taken from another message
/// shows. One generator, in the shapes the tests need (a span to fill, a
/// vector, a tensor_buffer).
#include <fusewire/core/tensor_buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace fusewire::test {

/// Fills `out` with the pattern of `seed`.
inline void fill_pattern(std::span<std::byte> out, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::byte& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
}

/// `n` bytes of the pattern of `seed`, in a vector.
inline std::vector<std::byte> pattern_bytes(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  fill_pattern(v, seed);
  return v;
}

/// `n` bytes of the pattern of `seed`, in a tensor_buffer.
inline fusewire::tensor_buffer pattern(std::size_t n, std::uint32_t seed) {
  auto b = fusewire::tensor_buffer::allocate(n);
  fill_pattern(std::span<std::byte>(b.data(), n), seed);
  return b;
}

/// True if `b` holds pattern(n, seed).
inline bool matches(const fusewire::tensor_buffer& b, std::size_t n, std::uint32_t seed) {
  if (b.size() != n) return false;
  const auto expect = pattern(n, seed);
  return n == 0 || std::memcmp(b.data(), expect.data(), n) == 0;
}

}  // namespace fusewire::test
