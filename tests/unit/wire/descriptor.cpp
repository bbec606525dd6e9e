#include <fusewire/wire/descriptor.hpp>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

namespace wire = fusewire::wire;
using fusewire::dtype;
using fusewire::errc;
using fusewire::tensor_descriptor;
using bytes = std::vector<std::byte>;

namespace {

bytes write(const tensor_descriptor& d) {
  bytes out(wire::descriptor_size(d));
  wire::byte_writer w(out);
  wire::write_descriptor(w, d);
  REQUIRE(w.ok());
  REQUIRE(w.position() == out.size());
  return out;
}

std::error_code read(const bytes& in, tensor_descriptor& out, const wire::limits& lim = {}) {
  wire::byte_reader r(in);
  const auto ec = wire::read_descriptor(r, lim, out);
  if (!ec) CHECK(r.at_end());
  return ec;
}

bytes hex(std::initializer_list<int> v) {
  bytes out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

}  // namespace

TEST_CASE("a descriptor is dtype, rank and little-endian int64 dimensions") {
  const auto d = tensor_descriptor::make(dtype::bfloat16, {0x0102, 7});
  CHECK(write(d) == hex({14, 2, 0x02, 0x01, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0}));
  CHECK(write(tensor_descriptor::make(dtype::boolean, {})) == hex({10, 0}));
}

TEST_CASE("every dtype and every rank up to 8 round-trips") {
  for (dtype t : fusewire::all_dtypes) {
    for (std::size_t rank = 0; rank <= fusewire::max_rank; ++rank) {
      std::vector<std::int64_t> shape;
      for (std::size_t i = 0; i < rank; ++i) shape.push_back(static_cast<std::int64_t>(i % 3 + 1));
      const auto d = tensor_descriptor::make(t, shape);
      CAPTURE(fusewire::to_string(d));
      tensor_descriptor out;
      REQUIRE(read(write(d), out) == std::error_code{});
      CHECK(out == d);
      CHECK(wire::descriptor_size(d) == 2 + 8 * rank);
    }
  }
}

TEST_CASE("read_descriptor rejects what the core would not accept, and leaves the output alone") {
  const tensor_descriptor sentinel = tensor_descriptor::make(dtype::int8, {5});
  tensor_descriptor out = sentinel;
  CHECK(read(hex({0, 0}), out) == errc::malformed_frame);   // dtype::invalid
  CHECK(read(hex({12, 0}), out) == errc::malformed_frame);  // no such dtype
  CHECK(read(hex({1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), out) == errc::malformed_frame);  // -1
  CHECK(read(hex({1, 2, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0x40}), out) ==
        errc::malformed_frame);                                     // 2^62 * 2^62 elements
  CHECK(read(hex({1, 1, 0, 0, 0}), out) == errc::malformed_frame);  // ends inside a dimension
  CHECK(read(hex({1}), out) == errc::malformed_frame);              // ends before the rank
  CHECK(read(hex({1, 9}), out) == errc::frame_too_large);           // rank above 8
  wire::limits lim;
  lim.max_rank = 1;
  CHECK(read(write(tensor_descriptor::make(dtype::int8, {1, 1})), out, lim) == errc::frame_too_large);
  lim.max_rank = 200;  // an unvalidated limit still cannot overrun the 8 dimensions
  CHECK(read(hex({1, 9}), out, lim) == errc::frame_too_large);
  CHECK(out == sentinel);
}

TEST_CASE("descriptor_encodable and check_payload_size") {
  CHECK(wire::descriptor_encodable(tensor_descriptor::make(dtype::float32, {2, 2})));
  CHECK_FALSE(wire::descriptor_encodable(tensor_descriptor{}));
  tensor_descriptor negative = tensor_descriptor::make(dtype::float32, {2});
  negative.dims[0] = -2;
  CHECK_FALSE(wire::descriptor_encodable(negative));
  const auto d = tensor_descriptor::make(dtype::complex64, {3});
  CHECK(wire::check_payload_size(d, 24) == std::error_code{});
  CHECK(wire::check_payload_size(d, 23) == errc::malformed_frame);
  CHECK(wire::check_payload_size(tensor_descriptor{}, 0) == errc::malformed_frame);
}
