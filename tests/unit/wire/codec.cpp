#include <fusewire/wire/codec.hpp>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

#include <doctest/doctest.h>

#include "support/seed_frames.hpp"

namespace wire = fusewire::wire;
using fusewire::dtype;
using fusewire::errc;
using fusewire::tensor_descriptor;
using fusewire::test::bytes;
using fusewire::test::seed_frames;

static_assert(wire::frame_meta<wire::hello_meta>);
static_assert(wire::frame_meta<wire::hello_ack_meta>);
static_assert(wire::frame_meta<wire::auth_challenge_meta>);
static_assert(wire::frame_meta<wire::auth_response_meta>);
static_assert(wire::frame_meta<wire::tensor_meta>);
static_assert(wire::frame_meta<wire::fused_meta>);
static_assert(wire::frame_meta<wire::chunk_meta>);
static_assert(wire::frame_meta<wire::recv_request_meta>);
static_assert(wire::frame_meta<wire::ack_meta>);
static_assert(wire::frame_meta<wire::error_meta>);
static_assert(wire::frame_meta<wire::ping_meta>);
static_assert(wire::frame_meta<wire::pong_meta>);
static_assert(wire::frame_meta<wire::goodbye_meta>);
static_assert(wire::frame_meta<wire::application_meta>);
static_assert(!wire::frame_meta<int>);
static_assert(!wire::frame_meta<wire::frame_header>);

namespace {

bytes hex(std::initializer_list<int> v) {
  bytes out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

}  // namespace

TEST_CASE("every seed frame decodes to its type, views its input and re-encodes to the same bytes") {
  const auto seeds = seed_frames();
  CHECK(seeds.size() == 16);
  std::vector<bool> seen(256);
  for (const auto& seed : seeds) {
    CAPTURE(seed.name);
    wire::decoded_frame f;
    REQUIRE(wire::decode_frame(seed.frame, {}, f) == std::error_code{});
    seen[static_cast<std::size_t>(f.header.type)] = true;
    CHECK(f.size() == seed.frame.size());
    CHECK(f.meta.data() == seed.frame.data() + wire::header_size);
    CHECK(f.payload.data() == f.meta.data() + f.meta.size());
    CHECK(std::visit([](const auto& m) { return m.type; }, f.body) == f.header.type);
    CHECK(std::string(wire::frame_type_name(f.header.type)) ==
          (seed.name.rfind("tensor", 0) == 0 ? std::string("tensor") : seed.name));

    bytes again(wire::prefix_size(f.body));
    std::error_code ec;
    REQUIRE(wire::encode_prefix(f.body, f.header, again, ec) == again.size());
    CHECK(!ec);
    CHECK(again == bytes(seed.frame.begin(), seed.frame.begin() + static_cast<std::ptrdiff_t>(again.size())));
  }
  for (int t : {0x01, 0x02, 0x03, 0x04, 0x10, 0x11, 0x12, 0x13, 0x20, 0x21, 0x22, 0x23, 0x24, 0x41}) {
    CAPTURE(t);
    CHECK(seen[static_cast<std::size_t>(t)]);
  }
}

TEST_CASE("a seed frame cut at any point is truncated_frame") {
  for (const auto& seed : seed_frames()) {
    CAPTURE(seed.name);
    for (std::size_t n = 0; n < seed.frame.size(); ++n) {
      CAPTURE(n);
      wire::decoded_frame f;
      CHECK(wire::decode_frame(std::span(seed.frame).first(n), {}, f) == errc::truncated_frame);
    }
  }
}

TEST_CASE("frames back to back decode one after the other") {
  const auto seeds = seed_frames();
  bytes stream;
  for (const auto& seed : seeds) stream.insert(stream.end(), seed.frame.begin(), seed.frame.end());
  fusewire::const_buffer rest = stream;
  std::size_t count = 0;
  while (!rest.empty()) {
    wire::decoded_frame f;
    REQUIRE(wire::decode_frame(rest, {}, f) == std::error_code{});
    CHECK(f.size() == seeds[count].frame.size());
    rest = rest.subspan(f.size());
    ++count;
  }
  CHECK(count == seeds.size());
}

TEST_CASE("decode_frame checks the meta before waiting for the payload") {
  bytes frame;
  for (const auto& seed : seed_frames()) {
    if (seed.name == "fused") frame = seed.frame;
  }
  REQUIRE(!frame.empty());
  wire::frame_header h;
  REQUIRE(wire::decode_header(frame, {}, h) == std::error_code{});
  // Lie about the payload: the meta's entries no longer add up. Even with
  // the payload missing, the answer is malformed, not "wait for more".
  h.payload_len += 1;
  wire::encode_header(h, std::span<std::byte, wire::header_size>(frame.data(), wire::header_size));
  wire::decoded_frame f;
  CHECK(wire::decode_frame(frame, {}, f) == errc::malformed_frame);
  CHECK(wire::decode_frame(std::span(frame).first(wire::header_size + h.meta_len), {}, f) == errc::malformed_frame);
  CHECK(wire::decode_frame(std::span(frame).first(wire::header_size + h.meta_len - 1), {}, f) == errc::truncated_frame);
}

TEST_CASE("a 1 TB payload claim is frame_too_large even though no payload follows") {
  wire::frame_header h;
  h.type = wire::frame_type::application_first;
  h.payload_len = 1ull << 40;
  const auto head = wire::encode_header(h);
  wire::decoded_frame f;
  CHECK(wire::decode_frame(head, {}, f) == errc::frame_too_large);
  wire::limits lim;
  lim.max_payload_bytes = 1ull << 41;
  CHECK(wire::decode_frame(head, lim, f) == errc::truncated_frame);
}

TEST_CASE("a ping frame has exactly these bytes") {
  bytes out(wire::prefix_size(wire::ping_meta{}));
  std::error_code ec;
  wire::frame_header h;
  h.request_id = 0x0807060504030201ull;
  REQUIRE(wire::encode_prefix(wire::ping_meta{.timestamp = 0x1122}, h, out, ec) == 40);
  CHECK(out == hex({'F', 'W', 'I', 'R', 1, 0x22, 0, 0, 1, 2, 3, 4, 5,    6,    7, 8, 8, 0, 0, 0,
                    0,   0,   0,   0,   0, 0,    0, 0, 0, 0, 0, 0, 0x22, 0x11, 0, 0, 0, 0, 0, 0}));
}

TEST_CASE("encode_prefix takes type and meta_len from the meta and refuses bad headers") {
  wire::tensor_meta t;
  t.key = "k";
  t.descriptor = tensor_descriptor::make(dtype::int32, {2});
  const std::uint64_t sizes[] = {8};
  t.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
  bytes out(wire::prefix_size(t));
  std::error_code ec;
  wire::frame_header h;
  h.type = wire::frame_type::ack;  // overwritten
  h.meta_len = 999;                // overwritten
  h.payload_len = 8;
  REQUIRE(wire::encode_prefix(t, h, out, ec) == out.size());
  wire::frame_header decoded;
  REQUIRE(wire::decode_header(out, {}, decoded) == std::error_code{});
  CHECK(decoded.type == wire::frame_type::tensor);
  CHECK(decoded.meta_len == out.size() - wire::header_size);

  bytes small(out.size() - 1);
  CHECK(wire::encode_prefix(t, h, small, ec) == 0);
  CHECK(ec == errc::invalid_argument);
  bytes tiny(4);
  CHECK(wire::encode_prefix(t, h, tiny, ec) == 0);
  CHECK(ec == errc::invalid_argument);
  h.flags = 0x0004;
  CHECK(wire::encode_prefix(t, h, out, ec) == 0);
  CHECK(ec == errc::invalid_argument);
  h.flags = 0;
  bytes ack(wire::prefix_size(wire::ack_meta{}));
  CHECK(wire::encode_prefix(wire::ack_meta{}, h, ack, ec) == 0);  // an ack with a payload
  CHECK(ec == errc::invalid_argument);
  h.payload_len = 0;
  CHECK(wire::encode_prefix(wire::ack_meta{}, h, ack, ec) == ack.size());
  CHECK(!ec);
}

TEST_CASE("encode_frame copies the payload after the prefix") {
  const bytes payload = hex({9, 8, 7});
  wire::application_meta a;
  a.type = static_cast<wire::frame_type>(0x50);
  bytes out(wire::header_size + 3);
  std::error_code ec;
  REQUIRE(wire::encode_frame(a, {}, payload, out, ec) == out.size());
  wire::decoded_frame f;
  REQUIRE(wire::decode_frame(out, {}, f) == std::error_code{});
  CHECK(bytes(f.payload.begin(), f.payload.end()) == payload);
  CHECK(std::get<wire::application_meta>(f.body).type == a.type);
  bytes short_out(wire::header_size + 2);
  CHECK(wire::encode_frame(a, {}, payload, short_out, ec) == 0);
  CHECK(ec == errc::invalid_argument);
}

TEST_CASE("decode_meta into a frame_body dispatches on the header's type") {
  wire::frame_header h;
  h.type = wire::frame_type::goodbye;
  h.meta_len = 4;
  const bytes meta = hex({3, 0, 0, 0});
  wire::frame_body body;
  REQUIRE(wire::decode_meta(h, meta, {}, body) == std::error_code{});
  CHECK(std::get<wire::goodbye_meta>(body).reason == 3);
  h.type = static_cast<wire::frame_type>(0x99);
  CHECK(wire::decode_meta(h, meta, {}, body) == errc::unknown_frame_type);
}
