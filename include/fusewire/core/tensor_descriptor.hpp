#pragma once
/// tensor_descriptor: what a tensor is (element type and shape), without its bytes.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {

/// Element types. The values are TensorFlow's DataType numbers, so the tf
/// layer converts by cast; strings and quantized types are not carried.
enum class dtype : std::uint8_t {
  invalid = 0,
  float32 = 1,
  float64 = 2,
  int32 = 3,
  uint8 = 4,
  int16 = 5,
  int8 = 6,
  complex64 = 8,
  int64 = 9,
  boolean = 10,
  bfloat16 = 14,
  uint16 = 17,
  complex128 = 18,
  float16 = 19,
  uint32 = 22,
  uint64 = 23,
};

/// Every valid dtype, in numeric order.
inline constexpr std::array<dtype, 15> all_dtypes{
    dtype::float32, dtype::float64,    dtype::int32,   dtype::uint8,   dtype::int16,
    dtype::int8,    dtype::complex64,  dtype::int64,   dtype::boolean, dtype::bfloat16,
    dtype::uint16,  dtype::complex128, dtype::float16, dtype::uint32,  dtype::uint64,
};

/// Bytes per element; 0 for dtype::invalid and for values that name no dtype.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::boolean:
    case dtype::int8:
    case dtype::uint8:
      return 1;
    case dtype::int16:
    case dtype::uint16:
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
    case dtype::int32:
    case dtype::uint32:
    case dtype::float32:
      return 4;
    case dtype::int64:
    case dtype::uint64:
    case dtype::float64:
    case dtype::complex64:
      return 8;
    case dtype::complex128:
      return 16;
    case dtype::invalid:
      return 0;
  }
  return 0;
}

/// True if `t` names an element type (decoders cast a wire byte and check here).
constexpr bool is_valid(dtype t) noexcept { return dtype_size(t) != 0; }

/// "float32", "bool", ...; "invalid" for values that name no dtype.
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
    case dtype::int32:
      return "int32";
    case dtype::uint8:
      return "uint8";
    case dtype::int16:
      return "int16";
    case dtype::int8:
      return "int8";
    case dtype::complex64:
      return "complex64";
    case dtype::int64:
      return "int64";
    case dtype::boolean:
      return "bool";
    case dtype::bfloat16:
      return "bfloat16";
    case dtype::uint16:
      return "uint16";
    case dtype::complex128:
      return "complex128";
    case dtype::float16:
      return "float16";
    case dtype::uint32:
      return "uint32";
    case dtype::uint64:
      return "uint64";
    case dtype::invalid:
      break;
  }
  return "invalid";
}

/// The dtype whose to_string() is `name`, or nullopt.
constexpr std::optional<dtype> dtype_from_string(std::string_view name) noexcept {
  for (dtype t : all_dtypes) {
    if (to_string(t) == name) return t;
  }
  return std::nullopt;
}

/// Largest rank a descriptor carries.
inline constexpr std::size_t max_rank = 8;

/// Bytes of `elements` values of `t`; sets errc::invalid_argument and returns
/// 0 if `t` is not valid, `elements` is negative or the size exceeds int64. What
/// tensor_descriptor::byte_size computes once it has the element count (a
/// decoder that has only a type and a count uses it without a descriptor).
inline std::size_t byte_size_of(dtype t, std::int64_t elements, std::error_code& ec) noexcept {
  ec.clear();
  const auto elem = static_cast<std::int64_t>(dtype_size(t));
  std::int64_t bytes = 0;
  if (elem == 0 || elements < 0 || __builtin_mul_overflow(elements, elem, &bytes)) {
    ec = errc::invalid_argument;
    return 0;
  }
  return static_cast<std::size_t>(bytes);
}

/// Element type and shape of a tensor. A plain aggregate so decoders can fill
/// it; validate() before trusting one that came off the wire. Dimensions past
/// `rank` are ignored (and compare equal whatever they hold).
struct tensor_descriptor {
  dtype type = dtype::invalid;
  std::uint8_t rank = 0;
  std::array<std::int64_t, max_rank> dims{};

  /// A descriptor of `t` with `shape`; throws system_error(errc::invalid_argument)
  /// if `t` is not valid, the rank exceeds max_rank or a dimension is negative.
  static tensor_descriptor make(dtype t, std::span<const std::int64_t> shape) {
    if (!is_valid(t)) {
      throw_error(errc::invalid_argument,
                  "tensor dtype " + std::to_string(static_cast<int>(t)) + " is not a known dtype");
    }
    if (shape.size() > max_rank) {
      throw_error(errc::invalid_argument, "tensor rank " + std::to_string(shape.size()) + " exceeds the maximum of " +
                                              std::to_string(max_rank));
    }
    tensor_descriptor d;
    d.type = t;
    d.rank = static_cast<std::uint8_t>(shape.size());
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] < 0) {
        throw_error(errc::invalid_argument, "tensor dimension " + std::to_string(i) + " is " +
                                                std::to_string(shape[i]) + ": dimensions must be non-negative");
      }
      d.dims[i] = shape[i];
    }
    return d;
  }

  static tensor_descriptor make(dtype t, std::initializer_list<std::int64_t> shape) {
    return make(t, std::span<const std::int64_t>(shape.begin(), shape.size()));
  }

  /// The first `rank` dimensions (at most max_rank of them).
  std::span<const std::int64_t> shape() const noexcept { return {dims.data(), std::min<std::size_t>(rank, max_rank)}; }

  /// errc::invalid_argument unless the dtype is valid, rank <= max_rank, every
  /// dimension is non-negative and the byte size fits in an int64.
  std::error_code validate() const noexcept {
    std::error_code ec;
    if (!is_valid(type)) return errc::invalid_argument;
    (void)byte_size(ec);
    return ec;
  }

  /// Product of the dimensions (1 for a scalar); sets errc::invalid_argument
  /// and returns 0 if rank > max_rank, a dimension is negative, or the product
  /// exceeds int64.
  std::int64_t num_elements(std::error_code& ec) const noexcept {
    ec.clear();
    if (rank == 1) {  // the common case (every fused entry, on both sides): no loops
      if (dims[0] < 0) {
        ec = errc::invalid_argument;
        return 0;
      }
      return dims[0];
    }
    if (rank > max_rank) {
      ec = errc::invalid_argument;
      return 0;
    }
    const auto s = shape();
    for (std::int64_t d : s) {
      if (d < 0) {
        ec = errc::invalid_argument;
        return 0;
      }
    }
    if (std::find(s.begin(), s.end(), std::int64_t{0}) != s.end()) return 0;
    // Overflow-checked products, not `max / d` tests: a 64-bit division is
    // slow, and every fused entry's size is checked on both sides.
    std::int64_t n = 1;
    for (std::int64_t d : s) {
      if (__builtin_mul_overflow(n, d, &n)) {
        ec = errc::invalid_argument;
        return 0;
      }
    }
    return n;
  }

  /// num_elements() that throws system_error(errc::invalid_argument) naming the descriptor.
  std::int64_t num_elements() const;

  /// num_elements() * dtype_size(type); sets errc::invalid_argument and returns
  /// 0 if the descriptor is invalid or the size exceeds int64.
  std::size_t byte_size(std::error_code& ec) const noexcept {
    const std::int64_t n = num_elements(ec);
    if (ec) return 0;
    return byte_size_of(type, n, ec);
  }

  /// byte_size() that throws system_error(errc::invalid_argument) naming the descriptor.
  std::size_t byte_size() const;

  friend bool operator==(const tensor_descriptor& a, const tensor_descriptor& b) noexcept {
    if (a.type != b.type || a.rank != b.rank) return false;
    const auto sa = a.shape();
    const auto sb = b.shape();
    return std::equal(sa.begin(), sa.end(), sb.begin(), sb.end());
  }
};

/// "float32[2,3]"; a scalar is "float32[]".
inline std::string to_string(const tensor_descriptor& d) {
  std::string out(to_string(d.type));
  out += '[';
  bool first = true;
  for (std::int64_t dim : d.shape()) {
    if (!first) out += ',';
    out += std::to_string(dim);
    first = false;
  }
  if (d.rank > max_rank) out += ",...";
  out += ']';
  return out;
}

namespace detail {

/// What is wrong with `d` (starting with ": "), or "" if nothing is.
inline std::string descriptor_problem(const tensor_descriptor& d) {
  if (d.rank > max_rank) {
    return ": rank " + std::to_string(d.rank) + " exceeds the maximum of " + std::to_string(max_rank);
  }
  const auto s = d.shape();
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] < 0) {
      return ": dimension " + std::to_string(i) + " is " + std::to_string(s[i]) + " (dimensions must be non-negative)";
    }
  }
  std::error_code ec;
  (void)d.num_elements(ec);
  if (ec) return ": element count overflows int64";
  if (!is_valid(d.type)) return ": dtype " + std::to_string(static_cast<int>(d.type)) + " is not a known dtype";
  (void)d.byte_size(ec);
  if (ec) return ": byte size overflows int64";
  return {};
}

}  // namespace detail

inline std::int64_t tensor_descriptor::num_elements() const {
  std::error_code ec;
  const std::int64_t n = num_elements(ec);
  if (ec) throw_error(errc::invalid_argument, "tensor " + to_string(*this) + detail::descriptor_problem(*this));
  return n;
}

inline std::size_t tensor_descriptor::byte_size() const {
  std::error_code ec;
  const std::size_t n = byte_size(ec);
  if (ec) throw_error(errc::invalid_argument, "tensor " + to_string(*this) + detail::descriptor_problem(*this));
  return n;
}

}  // namespace v0
}  // namespace fusewire
