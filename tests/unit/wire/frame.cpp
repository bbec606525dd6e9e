#include <fusewire/wire/frame.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

namespace wire = fusewire::wire;
using fusewire::errc;

namespace {

using header_bytes = std::array<std::byte, wire::header_size>;

header_bytes hex(std::initializer_list<int> v) {
  header_bytes out{};
  std::size_t i = 0;
  for (int x : v) out.at(i++) = static_cast<std::byte>(x);
  return out;
}

wire::frame_header sample_header() {
  wire::frame_header h;
  h.type = wire::frame_type::tensor;
  h.flags = wire::response_flag | 0x0100;
  h.request_id = 0x0102030405060708ull;
  h.meta_len = 0x0a0b0c0du;
  h.payload_len = 0x1112131415161718ull;
  return h;
}

std::error_code decode(const header_bytes& bytes, wire::frame_header& out, const wire::limits& lim = {}) {
  return wire::decode_header(bytes, lim, out);
}

wire::limits roomy() {
  wire::limits lim;
  lim.max_meta_bytes = 0xffffffffu;
  lim.max_payload_bytes = wire::limits::bytes_capacity;
  return lim;
}

}  // namespace

TEST_CASE("the header has one fixed little-endian layout") {
  static_assert(wire::header_size == 32);
  const header_bytes encoded = wire::encode_header(sample_header());
  CHECK(encoded == hex({'F',  'W',  'I',  'R',                              // magic
                        0x01,                                               // version
                        0x10,                                               // type: tensor
                        0x01, 0x01,                                         // flags
                        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,     // request id
                        0x0d, 0x0c, 0x0b, 0x0a,                             // meta_len
                        0x00, 0x00, 0x00, 0x00,                             // reserved
                        0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11}));  // payload_len
}

TEST_CASE("a header decodes to what was encoded") {
  wire::frame_header out;
  const auto h = sample_header();
  REQUIRE(decode(wire::encode_header(h), out, roomy()) == std::error_code{});
  CHECK(out == h);
  CHECK(wire::frame_size(out) == 32 + 0x0a0b0c0dull + 0x1112131415161718ull);
}

TEST_CASE("encode_header into a dynamic span checks its size") {
  std::vector<std::byte> small(31);
  CHECK(wire::encode_header(sample_header(), small) == errc::invalid_argument);
  std::vector<std::byte> big(40, std::byte{0xee});
  CHECK(wire::encode_header(sample_header(), big) == std::error_code{});
  CHECK(big[0] == std::byte{'F'});
  CHECK(big[32] == std::byte{0xee});
}

TEST_CASE("exactly the documented frame types are known") {
  const std::vector<int> builtin = {0x01, 0x02, 0x03, 0x04, 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x21, 0x22, 0x23, 0x24};
  for (int raw = 0; raw < 256; ++raw) {
    const bool is_builtin = std::find(builtin.begin(), builtin.end(), raw) != builtin.end();
    const bool is_app = raw >= 0x40 && raw <= 0x7f;
    CAPTURE(raw);
    CHECK(wire::is_known_frame_type(static_cast<std::uint8_t>(raw)) == (is_builtin || is_app));
    CHECK(wire::is_application(static_cast<wire::frame_type>(raw)) == is_app);
  }
  CHECK(wire::frame_type_name(wire::frame_type::fused) == "fused");
  CHECK(wire::frame_type_name(static_cast<wire::frame_type>(0x55)) == "application");
  CHECK(wire::frame_type_name(static_cast<wire::frame_type>(0x99)) == "unknown");
}

TEST_CASE("every known type decodes; only tensor, fused, chunk and application frames carry payloads") {
  for (int raw = 0; raw < 256; ++raw) {
    if (!wire::is_known_frame_type(static_cast<std::uint8_t>(raw))) continue;
    CAPTURE(raw);
    wire::frame_header h;
    h.type = static_cast<wire::frame_type>(raw);
    h.payload_len = 1;
    wire::frame_header out;
    const auto ec = decode(wire::encode_header(h), out);
    const bool payload_ok = raw == 0x10 || raw == 0x11 || raw == 0x12 || (raw >= 0x40 && raw <= 0x7f);
    CHECK(wire::carries_payload(h.type) == payload_ok);
    CHECK(ec == (payload_ok ? std::error_code{} : make_error_code(errc::malformed_frame)));
    h.payload_len = 0;
    CHECK(decode(wire::encode_header(h), out) == std::error_code{});
    CHECK(out.type == h.type);
  }
}

TEST_CASE("decode_header reports each defect with its own error and leaves the output alone") {
  const header_bytes good = wire::encode_header(wire::frame_header{});
  const wire::frame_header sentinel{wire::frame_type::goodbye, 0, 99, 0, 0};
  wire::frame_header out = sentinel;

  SUBCASE("fewer than 32 bytes is truncated_frame") {
    for (std::size_t n = 0; n < wire::header_size; ++n) {
      CAPTURE(n);
      CHECK(wire::decode_header(std::span(good).first(n), {}, out) == errc::truncated_frame);
    }
  }
  SUBCASE("any wrong magic byte is bad_magic") {
    for (std::size_t i = 0; i < 4; ++i) {
      header_bytes bad = good;
      bad[i] ^= std::byte{0x20};
      CHECK(decode(bad, out) == errc::bad_magic);
    }
  }
  SUBCASE("versions other than 1 are unsupported_version") {
    for (int v : {0, 2, 0x81, 0xff}) {
      header_bytes bad = good;
      bad[4] = static_cast<std::byte>(v);
      CHECK(decode(bad, out) == errc::unsupported_version);
    }
  }
  SUBCASE("unknown types are unknown_frame_type") {
    for (int t : {0x00, 0x05, 0x15, 0x25, 0x3f, 0x80, 0xff}) {
      header_bytes bad = good;
      bad[5] = static_cast<std::byte>(t);
      CHECK(decode(bad, out) == errc::unknown_frame_type);
    }
  }
  SUBCASE("reserved flag bits are malformed_frame; application bits pass") {
    for (int bit = 1; bit < 8; ++bit) {
      header_bytes bad = good;
      bad[6] = static_cast<std::byte>(1 << bit);
      CHECK(decode(bad, out) == errc::malformed_frame);
    }
    header_bytes app = good;
    app[7] = std::byte{0xff};
    app[6] = std::byte{0x01};
    CHECK(decode(app, out) == std::error_code{});
    CHECK(out.flags == 0xff01);
    out = sentinel;
  }
  SUBCASE("a non-zero reserved field is malformed_frame") {
    for (std::size_t i = 20; i < 24; ++i) {
      header_bytes bad = good;
      bad[i] = std::byte{1};
      CHECK(decode(bad, out) == errc::malformed_frame);
    }
  }
  SUBCASE("the checks run in order: magic, version, type") {
    header_bytes bad = good;
    bad[0] = std::byte{0};
    bad[4] = std::byte{9};
    bad[5] = std::byte{0};
    CHECK(decode(bad, out) == errc::bad_magic);
    bad[0] = good[0];
    CHECK(decode(bad, out) == errc::unsupported_version);
    bad[4] = good[4];
    CHECK(decode(bad, out) == errc::unknown_frame_type);
  }
  CHECK(out == sentinel);
}

TEST_CASE("lengths above the limits are frame_too_large; at the limit they pass") {
  wire::limits lim;
  lim.max_meta_bytes = 100;
  lim.max_payload_bytes = 1000;
  wire::frame_header h;
  h.type = wire::frame_type::tensor;
  wire::frame_header out;

  h.meta_len = 100;
  h.payload_len = 1000;
  CHECK(decode(wire::encode_header(h), out, lim) == std::error_code{});
  h.meta_len = 101;
  CHECK(decode(wire::encode_header(h), out, lim) == errc::frame_too_large);
  h.meta_len = 100;
  h.payload_len = 1001;
  CHECK(decode(wire::encode_header(h), out, lim) == errc::frame_too_large);
  h.meta_len = 0xffffffffu;
  h.payload_len = ~0ull;
  CHECK(decode(wire::encode_header(h), out, lim) == errc::frame_too_large);
}

TEST_CASE("a header claiming a 1 TB payload is frame_too_large under the default limits") {
  wire::frame_header h;
  h.type = wire::frame_type::tensor;
  h.meta_len = 16;
  h.payload_len = 1ull << 40;
  wire::frame_header out;
  const auto ec = decode(wire::encode_header(h), out);
  CHECK(ec == errc::frame_too_large);
  CHECK(ec.message() == "frame length exceeds the configured limit");
  CHECK(ec == std::errc::message_size);
}

TEST_CASE("check_header applies the field rules to a hand-made header") {
  wire::frame_header h;
  h.type = wire::frame_type::ack;
  CHECK(wire::check_header(h, {}) == std::error_code{});
  h.payload_len = 3;
  CHECK(wire::check_header(h, {}) == errc::malformed_frame);
  h.payload_len = 0;
  h.flags = 0x0002;
  CHECK(wire::check_header(h, {}) == errc::malformed_frame);
  h.flags = 0;
  h.meta_len = 64 * 1024 + 1;
  CHECK(wire::check_header(h, {}) == errc::frame_too_large);
}

TEST_CASE("limits::validate names the bad field and what is allowed") {
  CHECK_NOTHROW(wire::limits{}.validate());
  auto message = [](wire::limits lim) -> std::string {
    try {
      lim.validate();
    } catch (const std::system_error& e) {
      CHECK(e.code() == errc::invalid_argument);
      return e.what();
    }
    return "no exception";
  };
  wire::limits lim;
  lim.max_key_bytes = 70000;
  CHECK(message(lim) == "wire::limits::max_key_bytes = 70000 is not allowed; at most 65535: invalid argument");
  lim = {};
  lim.max_rank = 9;
  CHECK(message(lim) == "wire::limits::max_rank = 9 is not allowed; at most 8: invalid argument");
  lim = {};
  lim.max_payload_bytes = ~0ull;
  CHECK(message(lim) ==
        "wire::limits::max_payload_bytes = 18446744073709551615 is not allowed; at most 2^62: invalid argument");
  lim = {};
  lim.max_entries = 0;
  CHECK(message(lim) == "wire::limits::max_entries = 0 is not allowed; at least 1: invalid argument");
  lim = {};
  lim.max_message_bytes = 65536;
  CHECK(message(lim) == "wire::limits::max_message_bytes = 65536 is not allowed; at most 65535: invalid argument");
}
