#include <fusewire/core/tensor_descriptor.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

using fusewire::dtype;
using fusewire::errc;
using fusewire::tensor_descriptor;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_argument);
    return e.what();
  }
  return "no exception";
}

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

}  // namespace

TEST_CASE("dtype values are TensorFlow's DataType numbers") {
  CHECK(static_cast<int>(dtype::float32) == 1);
  CHECK(static_cast<int>(dtype::float64) == 2);
  CHECK(static_cast<int>(dtype::int32) == 3);
  CHECK(static_cast<int>(dtype::int64) == 9);
  CHECK(static_cast<int>(dtype::boolean) == 10);
  CHECK(static_cast<int>(dtype::bfloat16) == 14);
  CHECK(static_cast<int>(dtype::float16) == 19);
  CHECK(static_cast<int>(dtype::uint64) == 23);
}

TEST_CASE("dtype sizes, names and round trips") {
  CHECK(fusewire::dtype_size(dtype::float16) == 2);
  CHECK(fusewire::dtype_size(dtype::bfloat16) == 2);
  CHECK(fusewire::dtype_size(dtype::float32) == 4);
  CHECK(fusewire::dtype_size(dtype::float64) == 8);
  CHECK(fusewire::dtype_size(dtype::int8) == 1);
  CHECK(fusewire::dtype_size(dtype::int16) == 2);
  CHECK(fusewire::dtype_size(dtype::int32) == 4);
  CHECK(fusewire::dtype_size(dtype::int64) == 8);
  CHECK(fusewire::dtype_size(dtype::uint8) == 1);
  CHECK(fusewire::dtype_size(dtype::uint16) == 2);
  CHECK(fusewire::dtype_size(dtype::uint32) == 4);
  CHECK(fusewire::dtype_size(dtype::uint64) == 8);
  CHECK(fusewire::dtype_size(dtype::boolean) == 1);
  CHECK(fusewire::dtype_size(dtype::complex64) == 8);
  CHECK(fusewire::dtype_size(dtype::complex128) == 16);
  CHECK(fusewire::dtype_size(dtype::invalid) == 0);
  CHECK(fusewire::to_string(dtype::boolean) == "bool");
  CHECK(fusewire::to_string(dtype::bfloat16) == "bfloat16");
  std::set<std::string_view> names;
  for (dtype t : fusewire::all_dtypes) {
    CAPTURE(static_cast<int>(t));
    CHECK(fusewire::is_valid(t));
    CHECK(fusewire::dtype_from_string(fusewire::to_string(t)) == t);
    names.insert(fusewire::to_string(t));
  }
  CHECK(names.size() == fusewire::all_dtypes.size());
  CHECK_FALSE(fusewire::dtype_from_string("string").has_value());
  CHECK_FALSE(fusewire::dtype_from_string("invalid").has_value());
}

TEST_CASE("every byte a decoder may see is either a listed dtype or invalid") {
  int valid = 0;
  for (int v = 0; v < 256; ++v) {
    const auto t = static_cast<dtype>(v);
    if (fusewire::is_valid(t)) {
      ++valid;
    } else {
      CHECK(fusewire::to_string(t) == "invalid");
    }
  }
  CHECK(valid == static_cast<int>(fusewire::all_dtypes.size()));
}

TEST_CASE("make, shape, num_elements and byte_size") {
  const tensor_descriptor d = tensor_descriptor::make(dtype::float32, {2, 3, 4});
  CHECK(d.rank == 3);
  CHECK(d.shape().size() == 3);
  CHECK(d.shape()[2] == 4);
  CHECK(d.num_elements() == 24);
  CHECK(d.byte_size() == 96);
  CHECK(fusewire::to_string(d) == "float32[2,3,4]");
  CHECK_FALSE(d.validate());

  const tensor_descriptor scalar = tensor_descriptor::make(dtype::int64, {});
  CHECK(scalar.num_elements() == 1);
  CHECK(scalar.byte_size() == 8);
  CHECK(fusewire::to_string(scalar) == "int64[]");

  const tensor_descriptor zero = tensor_descriptor::make(dtype::float64, {3, 0, 5});
  CHECK(zero.num_elements() == 0);
  CHECK(zero.byte_size() == 0);

  const std::vector<std::int64_t> dims(fusewire::max_rank, 2);
  CHECK(tensor_descriptor::make(dtype::uint8, dims).num_elements() == 256);
}

TEST_CASE("make rejects bad dtypes, ranks and dimensions with a message") {
  const std::vector<std::int64_t> nine(9, 1);
  CHECK(error_of([&] { (void)tensor_descriptor::make(dtype::float32, nine); }) ==
        "tensor rank 9 exceeds the maximum of 8: invalid argument");
  CHECK(error_of([] {
          (void)tensor_descriptor::make(dtype::float32, {4, -1});
        }) == "tensor dimension 1 is -1: dimensions must be non-negative: invalid argument");
  CHECK(error_of([] { (void)tensor_descriptor::make(dtype::invalid, {1}); }) ==
        "tensor dtype 0 is not a known dtype: invalid argument");
  CHECK(error_of([] { (void)tensor_descriptor::make(static_cast<dtype>(7), {1}); }) ==
        "tensor dtype 7 is not a known dtype: invalid argument");
}

TEST_CASE("overflow is detected, not wrapped") {
  std::error_code ec;
  tensor_descriptor d = tensor_descriptor::make(dtype::float32, {int64_max, 2});
  CHECK(d.num_elements(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  CHECK(d.byte_size(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  CHECK(d.validate() == errc::invalid_argument);
  CHECK(error_of([&] { (void)d.num_elements(); }) ==
        "tensor float32[9223372036854775807,2]: element count overflows int64: invalid argument");

  // The element count fits, the byte size does not.
  d = tensor_descriptor::make(dtype::float64, {int64_max / 4});
  CHECK(d.num_elements(ec) == int64_max / 4);
  CHECK_FALSE(ec);
  CHECK(d.byte_size(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  CHECK(error_of([&] { (void)d.byte_size(); }) ==
        "tensor float64[2305843009213693951]: byte size overflows int64: invalid argument");

  // Largest that fits.
  d = tensor_descriptor::make(dtype::uint8, {int64_max});
  CHECK(d.byte_size(ec) == static_cast<std::size_t>(int64_max));
  CHECK_FALSE(ec);

  // A zero dimension wins over an overflowing product.
  d = tensor_descriptor::make(dtype::int32, {int64_max, int64_max, 0});
  CHECK(d.byte_size(ec) == 0);
  CHECK_FALSE(ec);

  // Products that overflow only in the last step.
  d = tensor_descriptor::make(dtype::int8, {std::int64_t{1} << 31, std::int64_t{1} << 31, 1});
  CHECK(d.num_elements(ec) == std::int64_t{1} << 62);
  CHECK_FALSE(ec);
  d.dims[2] = 2;  // 2^63: one past int64's maximum
  CHECK(d.num_elements(ec) == 0);
  CHECK(ec == errc::invalid_argument);
}

TEST_CASE("descriptors decoded off the wire are validated, garbage included") {
  tensor_descriptor d;  // dtype::invalid
  CHECK(d.validate() == errc::invalid_argument);
  std::error_code ec;
  CHECK(d.byte_size(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  CHECK(error_of([&] { (void)d.byte_size(); }) == "tensor invalid[]: dtype 0 is not a known dtype: invalid argument");

  d.type = dtype::float32;
  d.rank = 200;
  CHECK(d.validate() == errc::invalid_argument);
  CHECK(d.shape().size() == fusewire::max_rank);
  CHECK(error_of([&] { (void)d.num_elements(); }) ==
        "tensor float32[0,0,0,0,0,0,0,0,...]: rank 200 exceeds the maximum of 8: invalid argument");

  d.rank = 2;
  d.dims = {3, -5};
  CHECK(d.validate() == errc::invalid_argument);
  CHECK(error_of([&] { (void)d.byte_size(); }) ==
        "tensor float32[3,-5]: dimension 1 is -5 (dimensions must be non-negative): invalid argument");

  // Rank 1 (checked without the general loops): the same rules.
  d.rank = 1;
  d.dims = {-1};
  CHECK(d.validate() == errc::invalid_argument);
  CHECK(d.num_elements(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  CHECK(d.byte_size(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  d.dims = {std::int64_t{1} << 62};  // 2^62 float32s: 2^64 bytes
  CHECK(d.num_elements(ec) == std::int64_t{1} << 62);
  CHECK(!ec);
  CHECK(d.byte_size(ec) == 0);
  CHECK(ec == errc::invalid_argument);
  d.dims = {0};
  CHECK(d.byte_size(ec) == 0);
  CHECK(!ec);
  d.dims = {5};
  CHECK(d.byte_size(ec) == 20);
  CHECK(!ec);
}

TEST_CASE("equality compares dtype, rank and the dimensions in use") {
  tensor_descriptor a = tensor_descriptor::make(dtype::int32, {2, 3});
  tensor_descriptor b = a;
  b.dims[5] = 99;  // past the rank: ignored
  CHECK(a == b);
  b.dims[1] = 4;
  CHECK(a != b);
  CHECK(a != tensor_descriptor::make(dtype::float32, {2, 3}));
  CHECK(a != tensor_descriptor::make(dtype::int32, {2, 3, 1}));
  CHECK(tensor_descriptor::make(dtype::int32, {}) == tensor_descriptor::make(dtype::int32, {}));
}
