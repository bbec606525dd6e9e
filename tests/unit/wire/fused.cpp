#include <fusewire/wire/fused.hpp>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <iterator>
#include <ranges>
#include <string>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

namespace wire = fusewire::wire;
using fusewire::dtype;
using fusewire::errc;
using fusewire::tensor_descriptor;
using bytes = std::vector<std::byte>;

static_assert(std::forward_iterator<wire::fused_meta::iterator>);
static_assert(std::ranges::forward_range<wire::fused_meta>);
static_assert(std::forward_iterator<wire::segment_list::iterator>);

namespace {

bytes hex(std::initializer_list<int> v) {
  bytes out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

std::error_code decode(const bytes& meta, std::uint64_t payload_len, wire::fused_meta& out,
                       const wire::limits& lim = {}) {
  wire::frame_header h;
  h.type = wire::frame_type::fused;
  h.meta_len = static_cast<std::uint32_t>(meta.size());
  h.payload_len = payload_len;
  return wire::decode_meta(h, meta, lim, out);
}

bytes copy(const wire::fused_meta& m) { return {m.bytes().begin(), m.bytes().end()}; }

// A fused meta with entries "a" float32[2] (8 bytes) and "bc" int8[3] (3 bytes).
bytes two_entries() {
  return hex({2, 0, 0,   0,                                  // count
              1, 0, 'a', 1,   1, 2, 0, 0, 0, 0, 0, 0, 0,     // key, float32, rank 1, dim 2
              8, 0, 0,   0,   0, 0, 0, 0,                    // size 8
              2, 0, 'b', 'c', 6, 1, 3, 0, 0, 0, 0, 0, 0, 0,  // key, int8, rank 1, dim 3
              3, 0, 0,   0,   0, 0, 0, 0});                  // size 3
}

}  // namespace

TEST_CASE("fused_builder writes the documented layout and keeps the count current") {
  bytes buffer(256);
  wire::fused_builder builder(buffer);
  CHECK(builder.empty());
  REQUIRE(builder.append("a", tensor_descriptor::make(dtype::float32, {2})) == std::error_code{});
  CHECK(builder.size() == 1);
  CHECK(copy(builder.meta()).size() ==
        4 + wire::fused_builder::entry_size("a", tensor_descriptor::make(dtype::float32, {2})));
  REQUIRE(builder.append("bc", tensor_descriptor::make(dtype::int8, {3})) == std::error_code{});
  CHECK(copy(builder.meta()) == two_entries());
  CHECK(builder.payload_size() == 11);
  const wire::frame_header h = builder.header(42, wire::response_flag);
  CHECK(h == wire::frame_header{wire::frame_type::fused, wire::response_flag, 42, 47, 11});
}

TEST_CASE("a decoded fused meta iterates its entries with their payload offsets") {
  const bytes meta = two_entries();
  wire::fused_meta m;
  REQUIRE(decode(meta, 11, m) == std::error_code{});
  CHECK(m.size() == 2);
  CHECK(m.payload_size() == 11);
  CHECK(m.bytes().data() == meta.data());

  const bytes payload = hex({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  std::vector<wire::fused_entry> entries(m.begin(), m.end());
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].key == "a");
  CHECK(entries[0].descriptor == tensor_descriptor::make(dtype::float32, {2}));
  CHECK(entries[0].offset == 0);
  CHECK(entries[0].size == 8);
  CHECK(entries[1].key == "bc");
  CHECK(entries[1].descriptor == tensor_descriptor::make(dtype::int8, {3}));
  CHECK(entries[1].offset == 8);
  CHECK(entries[1].size == 3);
  const auto second = entries[1].bytes_in(payload);
  CHECK(bytes(second.begin(), second.end()) == hex({9, 10, 11}));
  CHECK(reinterpret_cast<const char*>(entries[1].key.data()) == reinterpret_cast<const char*>(meta.data()) + 27);

  // Two passes see the same entries; post-increment works.
  auto it = m.begin();
  auto first = it++;
  CHECK(first->key == "a");
  CHECK(it->key == "bc");
  CHECK(++it == m.end());
  CHECK(std::ranges::distance(m) == 2);
}

TEST_CASE("a fused frame with lying lengths is malformed_frame") {
  wire::fused_meta m;
  SUBCASE("payload_len differs from the sum of the entries") {
    CHECK(decode(two_entries(), 10, m) == errc::malformed_frame);
    CHECK(decode(two_entries(), 12, m) == errc::malformed_frame);
    CHECK(decode(two_entries(), 0, m) == errc::malformed_frame);
  }
  SUBCASE("an entry's size differs from its descriptor's") {
    bytes meta = two_entries();
    meta[17] = std::byte{9};  // first entry claims 9 bytes for float32[2]
    CHECK(decode(meta, 12, m) == errc::malformed_frame);
    meta[17] = std::byte{8};
    meta[24] = std::byte{1};  // a size with a high byte set
    CHECK(decode(meta, 11, m) == errc::malformed_frame);
  }
  SUBCASE("the count claims more entries than the meta holds") {
    bytes meta = two_entries();
    meta[0] = std::byte{3};
    CHECK(decode(meta, 11, m) == errc::malformed_frame);
  }
  SUBCASE("the count claims fewer entries than the meta holds") {
    bytes meta = two_entries();
    meta[0] = std::byte{1};
    CHECK(decode(meta, 8, m) == errc::malformed_frame);
  }
  SUBCASE("a key length running past the meta") {
    bytes meta = two_entries();
    meta[25] = std::byte{0xff};
    CHECK(decode(meta, 11, m) == errc::malformed_frame);
  }
  SUBCASE("no entries at all") {
    CHECK(decode(hex({0, 0, 0, 0}), 0, m) == errc::malformed_frame);
    CHECK(decode(hex({}), 0, m) == errc::malformed_frame);
  }
  SUBCASE("sizes whose running sum passes payload_len") {
    bytes buffer(1024);
    wire::limits lim;
    lim.max_payload_bytes = wire::limits::bytes_capacity;
    wire::fused_builder builder(buffer, lim);
    const auto big = tensor_descriptor::make(dtype::uint8, {(1ll << 62) - 1});
    REQUIRE(builder.append("x", big) == std::error_code{});
    bytes meta = copy(builder.meta());
    // Three copies of a (2^62 - 1)-byte entry: the sum passes 2^62, then wraps if unchecked.
    meta[0] = std::byte{3};
    const bytes entry(meta.begin() + 4, meta.end());
    meta.insert(meta.end(), entry.begin(), entry.end());
    meta.insert(meta.end(), entry.begin(), entry.end());
    CHECK(decode(meta, (1ull << 62) - 1, m, lim) == errc::malformed_frame);
  }
  CHECK(m.empty());
}

TEST_CASE("a fused entry with a bad descriptor is malformed_frame, rank 1 and higher alike") {
  wire::fused_meta m;
  // One entry "k" with a descriptor (dtype, rank, dims) and a size.
  const auto one = [](int type, std::initializer_list<std::int64_t> dims, std::uint64_t size) {
    bytes meta = hex({1, 0, 0, 0, 1, 0, 'k', type, static_cast<int>(dims.size())});
    for (std::int64_t d : dims) {
      for (int i = 0; i < 8; ++i) meta.push_back(static_cast<std::byte>(static_cast<std::uint64_t>(d) >> (8 * i)));
    }
    for (int i = 0; i < 8; ++i) meta.push_back(static_cast<std::byte>(size >> (8 * i)));
    return meta;
  };
  // float32 = 1, int8 = 6; 0 and 0x7f are no dtype.
  CHECK(decode(one(1, {3}, 12), 12, m) == std::error_code{});
  CHECK(decode(one(1, {0}, 0), 0, m) == std::error_code{});
  CHECK(decode(one(1, {2, 3}, 24), 24, m) == std::error_code{});
  CHECK(decode(one(6, {}, 1), 1, m) == std::error_code{});
  for (auto dims : {std::initializer_list<std::int64_t>{3}, std::initializer_list<std::int64_t>{1, 3}}) {
    CAPTURE(dims.size());
    CHECK(decode(one(0, dims, 12), 12, m) == errc::malformed_frame);     // no dtype
    CHECK(decode(one(0x7f, dims, 12), 12, m) == errc::malformed_frame);  // no dtype
    CHECK(decode(one(0, dims, 0), 0, m) == errc::malformed_frame);       // no dtype, whose size would be 0
    CHECK(decode(one(1, dims, 13), 13, m) == errc::malformed_frame);     // size is not 4 x 3
    CHECK(decode(one(1, dims, 0), 0, m) == errc::malformed_frame);
  }
  CHECK(decode(one(1, {-3}, 0), 0, m) == errc::malformed_frame);  // negative
  {
    // A negative dimension whose byte size, read as unsigned, is the claimed
    // size (decode_meta's payload limit would refuse that size later anyway):
    // the entry check alone refuses it.
    const auto as_size = static_cast<std::uint64_t>(std::int64_t{-12});
    const bytes meta = one(1, {-3}, as_size);
    wire::byte_reader r(std::span<const std::byte>(meta).subspan(4));
    std::uint64_t size = 0;
    CHECK(wire::detail::read_checked_fused_size(r, wire::limits{}, size) == errc::malformed_frame);
  }
  CHECK(decode(one(1, {1, -3}, 0), 0, m) == errc::malformed_frame);
  // 2^64 bytes, which a wrapping product would make 0, the claimed size: overflow, not a match.
  CHECK(decode(one(1, {std::int64_t{1} << 62}, 0), 0, m) == errc::malformed_frame);  // float32
  CHECK(decode(one(2, {std::int64_t{1} << 61}, 0), 0, m) == errc::malformed_frame);  // float64
  CHECK(decode(one(1, {4, std::int64_t{1} << 60}, 0), 0, m) == errc::malformed_frame);
}

TEST_CASE("fused decoding enforces the limits") {
  wire::fused_meta m;
  wire::limits lim;
  lim.max_entries = 1;
  CHECK(decode(two_entries(), 11, m, lim) == errc::frame_too_large);
  lim = {};
  lim.max_key_bytes = 1;
  CHECK(decode(two_entries(), 11, m, lim) == errc::frame_too_large);
  lim = {};
  lim.max_rank = 0;
  CHECK(decode(two_entries(), 11, m, lim) == errc::frame_too_large);
  lim = {};
  lim.max_meta_bytes = 42;
  CHECK(decode(two_entries(), 11, m, lim) == errc::frame_too_large);
  lim = {};
  lim.max_payload_bytes = 10;
  CHECK(decode(two_entries(), 11, m, lim) == errc::frame_too_large);
  CHECK(decode(two_entries(), 11, m) == std::error_code{});
}

TEST_CASE("fused_builder says frame_too_large when the frame is full and invalid_argument when an entry never fits") {
  const auto f4 = tensor_descriptor::make(dtype::float32, {4});
  bytes buffer(1024);
  wire::limits lim;
  lim.max_entries = 2;
  lim.max_payload_bytes = 40;
  lim.max_key_bytes = 8;
  wire::fused_builder builder(buffer, lim);

  REQUIRE(builder.append("one", f4) == std::error_code{});
  REQUIRE(builder.append("two", f4) == std::error_code{});
  CHECK_FALSE(builder.fits("three", f4));
  CHECK(builder.append("three", f4) == errc::frame_too_large);  // max_entries
  CHECK(builder.size() == 2);
  const bytes before = copy(builder.meta());
  builder.clear();
  CHECK(builder.empty());
  CHECK(builder.payload_size() == 0);
  REQUIRE(builder.append("three", f4) == std::error_code{});
  CHECK(builder.size() == 1);

  CHECK(builder.append("big", tensor_descriptor::make(dtype::float32, {8})) == errc::frame_too_large);  // 16 + 32 > 40
  CHECK(builder.append("huge", tensor_descriptor::make(dtype::float32, {11})) ==
        errc::invalid_argument);  // 44 > 40 alone
  CHECK(builder.append("a-very-long-key", f4) == errc::invalid_argument);
  tensor_descriptor bad;
  CHECK(builder.append("bad", bad) == errc::invalid_argument);
  CHECK(builder.size() == 1);
  CHECK(before.size() > copy(builder.meta()).size());

  // Meta capacity: a 40-byte buffer holds the count and one 23-byte entry.
  bytes small(40);
  wire::fused_builder tight(small);
  const auto s = tensor_descriptor::make(dtype::int8, {1});
  REQUIRE(tight.append("abcd", s) == std::error_code{});  // 2 + 4 + 10 + 8 = 24
  CHECK(tight.append("abcd", s) == errc::frame_too_large);
  CHECK(tight.append(std::string(30, 'k'), s) == errc::invalid_argument);
  bytes tiny(3);
  wire::fused_builder useless(tiny);
  CHECK(useless.append("", s) == errc::invalid_argument);
}

TEST_CASE("what the builder builds decodes to the same entries") {
  bytes buffer(64 * 1024);
  wire::fused_builder builder(buffer);
  std::vector<std::string> keys;
  for (int i = 0; i < 500; ++i) keys.push_back("/job:worker/task:1/edge_" + std::to_string(i));
  std::uint64_t expected_payload = 0;
  for (int i = 0; i < 500; ++i) {
    const auto d = tensor_descriptor::make(dtype::float32, {i % 7, 3});
    REQUIRE(builder.append(keys[static_cast<std::size_t>(i)], d) == std::error_code{});
    expected_payload += d.byte_size();
  }
  const bytes meta = copy(builder.meta());
  wire::fused_meta m;
  REQUIRE(decode(meta, expected_payload, m) == std::error_code{});
  CHECK(m == builder.meta());
  std::uint64_t offset = 0;
  int i = 0;
  for (const auto& e : m) {
    CHECK(e.key == keys[static_cast<std::size_t>(i)]);
    CHECK(e.descriptor == tensor_descriptor::make(dtype::float32, {i % 7, 3}));
    CHECK(e.offset == offset);
    offset += e.size;
    ++i;
  }
  CHECK(i == 500);
  CHECK(offset == expected_payload);

  bytes out(wire::encoded_size(m));
  std::error_code ec;
  CHECK(wire::encode_meta(m, out, ec) == meta.size());
  CHECK(out == meta);
  CHECK(wire::encode_meta(wire::fused_meta{}, out, ec) == 0);
  CHECK(ec == errc::invalid_argument);
}
