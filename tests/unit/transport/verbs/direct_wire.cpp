// Host-side checks of the `placed` frame that RDMA direct placement adds
// (wire/meta.hpp placed_meta): exact layout, round trip, and what a decoder refuses.
#include <fusewire/wire/codec.hpp>
#include <fusewire/wire/frame.hpp>
#include <fusewire/wire/meta.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <system_error>
#include <variant>
#include <vector>

namespace fw = fusewire;
namespace wire = fusewire::wire;

namespace {

std::vector<std::byte> encode(const wire::placed_meta& m) {
  std::vector<std::byte> out(wire::encoded_size(m));
  std::error_code ec;
  REQUIRE(wire::encode_meta(m, fw::mutable_buffer(out), ec) == out.size());
  REQUIRE(!ec);
  return out;
}

wire::frame_header header_for(const std::vector<std::byte>& meta) {
  wire::frame_header h;
  h.type = wire::frame_type::placed;
  h.meta_len = static_cast<std::uint32_t>(meta.size());
  h.request_id = 41;
  return h;
}

std::error_code decode(const std::vector<std::byte>& meta, wire::placed_meta& out, wire::limits lim = {}) {
  return wire::decode_meta(header_for(meta), fw::const_buffer(meta), lim, out);
}

}  // namespace

TEST_CASE("placed is a known frame type without payload, named in logs") {
  CHECK(static_cast<int>(wire::frame_type::placed) == 0x14);
  CHECK(wire::is_known_frame_type(0x14));
  CHECK_FALSE(wire::carries_payload(wire::frame_type::placed));
  CHECK(wire::frame_type_name(wire::frame_type::placed) == "placed");
}

TEST_CASE("placed meta: size u64, written u8, key; round-trips and dispatches through frame_body") {
  wire::placed_meta m;
  m.key = "w/a";
  m.size = 0x0102030405ull;
  m.written = 1;
  const auto bytes = encode(m);
  const std::vector<std::byte> expect = {std::byte{5}, std::byte{4},   std::byte{3},   std::byte{2},  std::byte{1},
                                         std::byte{0}, std::byte{0},   std::byte{0},   std::byte{1},  std::byte{3},
                                         std::byte{0}, std::byte{'w'}, std::byte{'/'}, std::byte{'a'}};
  CHECK(bytes == expect);
  wire::placed_meta out;
  REQUIRE(!decode(bytes, out));
  CHECK(out == m);
  wire::frame_body body;
  REQUIRE(!wire::decode_meta(header_for(bytes), fw::const_buffer(bytes), {}, body));
  REQUIRE(std::holds_alternative<wire::placed_meta>(body));
  CHECK(std::get<wire::placed_meta>(body) == m);

  wire::placed_meta declined;
  declined.key = "w/a";
  REQUIRE(!decode(encode(declined), out));
  CHECK(out.written == 0);
  CHECK(out.size == 0);
}

TEST_CASE("placed meta: a decoder refuses bad flags, a size for a declined region, and oversize values") {
  wire::placed_meta m;
  m.key = "k";
  m.size = 8;
  m.written = 1;
  auto bytes = encode(m);
  wire::placed_meta out;
  bytes[8] = std::byte{2};  // written must be 0 or 1
  CHECK((decode(bytes, out) == fw::errc::malformed_frame));
  bytes[8] = std::byte{0};  // declined, yet a size
  CHECK((decode(bytes, out) == fw::errc::malformed_frame));
  m.size = (16ull << 30) + 1;
  CHECK((decode(encode(m), out) == fw::errc::frame_too_large));
  m.size = 8;
  wire::limits lim;
  lim.max_key_bytes = 0;
  CHECK((decode(encode(m), out, lim) == fw::errc::frame_too_large));
  auto truncated = encode(m);
  truncated.resize(5);
  CHECK((decode(truncated, out) == fw::errc::malformed_frame));
}
