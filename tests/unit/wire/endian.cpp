#include <fusewire/wire/endian.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include <doctest/doctest.h>

namespace wire = fusewire::wire;

namespace {

std::vector<std::byte> b(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

}  // namespace

TEST_CASE("store_le writes the least significant byte first, whatever the host") {
  std::array<std::byte, 8> buf{};
  wire::store_le<std::uint16_t>(buf.data(), 0x0102);
  CHECK(std::vector<std::byte>(buf.begin(), buf.begin() + 2) == b({0x02, 0x01}));
  wire::store_le<std::uint32_t>(buf.data(), 0x01020304u);
  CHECK(std::vector<std::byte>(buf.begin(), buf.begin() + 4) == b({0x04, 0x03, 0x02, 0x01}));
  wire::store_le<std::uint64_t>(buf.data(), 0x0102030405060708ull);
  CHECK(std::vector<std::byte>(buf.begin(), buf.end()) == b({8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST_CASE("load_le reads what store_le wrote, including high bits") {
  const auto bytes = b({0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12});
  CHECK(wire::load_le<std::uint64_t>(bytes.data()) == 0x123456789abcdef0ull);
  CHECK(wire::load_le<std::uint32_t>(bytes.data()) == 0x9abcdef0u);
  CHECK(wire::load_le<std::uint16_t>(bytes.data()) == 0xdef0u);
  CHECK(wire::load_le<std::uint8_t>(bytes.data()) == 0xf0u);
  static_assert([] {
    std::array<std::byte, 8> a{};
    wire::store_le<std::uint64_t>(a.data(), 0xfedcba9876543210ull);
    return wire::load_le<std::uint64_t>(a.data()) == 0xfedcba9876543210ull;
  }());
}

TEST_CASE("byte_reader reads fields in order and views bytes without copying") {
  const auto in = b({1, 0x34, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'k', 'e', 'y'});
  wire::byte_reader r(in);
  CHECK(r.u8() == 1);
  CHECK(r.u16() == 0x1234);
  CHECK(r.i64() == -1);
  const auto key = r.chars(3);
  CHECK(key == "key");
  CHECK(reinterpret_cast<const std::byte*>(key.data()) == in.data() + 11);
  CHECK(r.ok());
  CHECK(r.at_end());
}

TEST_CASE("byte_reader fails for good after reading past the end") {
  const auto in = b({1, 2, 3});
  wire::byte_reader r(in);
  CHECK(r.u16() == 0x0201);
  CHECK(r.u32() == 0);  // only one byte left
  CHECK_FALSE(r.ok());
  CHECK(r.position() == 2);
  CHECK(r.u8() == 0);  // stays failed although one byte is left
  CHECK(r.bytes(1).empty());
  CHECK_FALSE(r.at_end());

  wire::byte_reader huge(in);
  CHECK(huge.bytes(static_cast<std::size_t>(-1)).empty());
  CHECK_FALSE(huge.ok());

  std::array<std::byte, 4> dest{std::byte{9}, std::byte{9}, std::byte{9}, std::byte{9}};
  wire::byte_reader short_reader(in);
  short_reader.copy_to(dest);
  CHECK_FALSE(short_reader.ok());
  CHECK(dest == std::array<std::byte, 4>{});
}

TEST_CASE("byte_writer writes little-endian and refuses what does not fit") {
  std::array<std::byte, 7> out{};
  wire::byte_writer w(out);
  w.u16(0xbeef);
  w.i32(-2);
  CHECK(w.ok());
  CHECK(w.position() == 6);
  w.u16(1);  // one byte left: nothing written
  CHECK_FALSE(w.ok());
  CHECK(w.position() == 6);
  w.u8(5);  // sticky
  CHECK(w.position() == 6);
  CHECK(std::vector<std::byte>(out.begin(), out.end()) == b({0xef, 0xbe, 0xfe, 0xff, 0xff, 0xff, 0}));
}

TEST_CASE("byte_writer copies characters verbatim, without length or terminator") {
  std::array<std::byte, 3> out{};
  wire::byte_writer w(out);
  w.chars("abc");
  CHECK(w.ok());
  CHECK(std::vector<std::byte>(out.begin(), out.end()) == b({'a', 'b', 'c'}));
  w.chars("");
  CHECK(w.ok());
}
