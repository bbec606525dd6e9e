#include <fusewire/graph/payload_codec.hpp>

#include <doctest/doctest.h>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/wire/endian.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace payload_codec_cases {

namespace fg = fusewire::graph;
using fusewire::errc;

namespace {

fg::payload sample() {
  fg::payload p;
  p.push_back(fg::message_entry::of(fg::tensor({2, 3}, {1, 2, 3, 4, 5, 6})));
  p.push_back(fg::message_entry::token(true));   // a dead value
  p.push_back(fg::message_entry::token(false));  // a control token
  p.push_back(fg::message_entry::of(fg::tensor::scalar(-0.0f)));
  p.push_back(fg::message_entry::of(fg::tensor({3}, {1.5f, -2.25f, 1e30f})));
  return p;
}

bool same_entry(const fg::message_entry& a, const fg::message_entry& b) {
  return a.descriptor == b.descriptor && a.dead == b.dead && a.bytes.size() == b.bytes.size() &&
         (a.bytes.size() == 0 || std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0);
}

fusewire::tensor_buffer copy(const fusewire::tensor_buffer& b) {
  return fusewire::tensor_buffer::copy_of(fusewire::const_buffer(b.data(), b.size()));
}

}  // namespace

TEST_CASE("a payload survives encoding bit for bit, dead bits included") {
  const auto p = sample();
  CHECK_FALSE(fg::check_payload(p));
  const auto bytes = fg::encode_payload(p);
  // prefix 12 + (1+2+16+8) + 2*(1+2+8+8) + (1+2+8) + (1+2+8+8) = 12+27+38+11+19 = 107 -> 112;
  // values 24 + 0 + 0 + 4->8 + 12->16.
  CHECK(bytes.size() == 112u + 24u + 8u + 16u);
  CHECK(fg::encoded_size(p) == bytes.size());
  CHECK(bytes.size() % 8 == 0);
  fg::payload back;
  REQUIRE_FALSE(fg::decode_payload(bytes, back));
  REQUIRE(back.size() == p.size());
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(same_entry(back[i], p[i]));
  CHECK(back[1].dead);
  CHECK_FALSE(back[2].dead);
  // Entries alias the received buffer instead of copying it.
  CHECK(bytes.use_count() == 1u + 3u);
  fg::tensor t;
  CHECK_FALSE(back[0].to_tensor(t));
  CHECK(t == fg::tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
}

TEST_CASE("the header and scatter-gather segments are the same bytes as encode_payload") {
  const auto p = sample();
  const auto header = fg::encode_payload_header(p);
  const auto segments = fg::payload_segments(header, p);
  CHECK(segments.size() == 1 + 1 + 2 + 2);  // header; 24 B; 4 B + pad; 12 B + pad
  std::vector<std::byte> gathered;
  for (auto s : segments) gathered.insert(gathered.end(), s.begin(), s.end());
  const auto whole = fg::encode_payload(p);
  REQUIRE(gathered.size() == whole.size());
  CHECK(std::memcmp(gathered.data(), whole.data(), whole.size()) == 0);
}

TEST_CASE("an empty payload encodes to its prefix") {
  const auto bytes = fg::encode_payload({});
  CHECK(bytes.size() == 16u);
  fg::payload back;
  back.push_back(fg::message_entry::token(true));
  CHECK_FALSE(fg::decode_payload(bytes, back));
  CHECK(back.empty());
}

TEST_CASE("payloads that cannot be encoded are refused") {
  fg::payload dead_with_bytes;
  dead_with_bytes.push_back(fg::message_entry::of(fg::tensor({1}, {1})));
  dead_with_bytes[0].dead = true;
  CHECK(fg::check_payload(dead_with_bytes) == errc::invalid_argument);
  fg::payload short_bytes;
  short_bytes.push_back(fg::message_entry::of(fg::tensor({2}, {1, 2})));
  short_bytes[0].bytes = short_bytes[0].bytes.share(0, 4);
  CHECK(fg::check_payload(short_bytes) == errc::invalid_argument);
  try {
    (void)fg::encode_payload(short_bytes);
    FAIL("encode_payload accepted a short entry");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()) ==
          "payload cannot be encoded: an entry's bytes do not match its descriptor (a dead entry carries none), "
          "or it has more than 65536 entries: invalid argument");
  }
}

TEST_CASE("bad bytes are refused with the reason, never trusted") {
  const auto good = fg::encode_payload(sample());
  fg::payload out;
  out.push_back(fg::message_entry::token(true));
  auto decode = [&](const fusewire::tensor_buffer& b) { return fg::decode_payload(b, out); };

  CHECK(decode(good.share(0, 7)) == errc::malformed_frame);  // shorter than the prefix
  auto bad_magic = copy(good);
  bad_magic.data()[0] = std::byte{'X'};
  CHECK(decode(bad_magic) == errc::bad_magic);
  auto bad_version = copy(good);
  bad_version.data()[4] = std::byte{9};
  CHECK(decode(bad_version) == errc::unsupported_version);
  auto huge_count = copy(good);
  fusewire::wire::store_le<std::uint32_t>(huge_count.data() + 8, 70000);
  CHECK(decode(huge_count) == errc::frame_too_large);
  auto more_than_fits = copy(good);
  fusewire::wire::store_le<std::uint32_t>(more_than_fits.data() + 8, 60000);
  CHECK(decode(more_than_fits) == errc::malformed_frame);
  auto unknown_flag = copy(good);
  unknown_flag.data()[12] = std::byte{2};
  CHECK(decode(unknown_flag) == errc::malformed_frame);
  auto bad_dtype = copy(good);
  bad_dtype.data()[13] = std::byte{0};
  CHECK(decode(bad_dtype) == errc::malformed_frame);
  auto wrong_size = copy(good);
  fusewire::wire::store_le<std::uint64_t>(wrong_size.data() + 12 + 1 + 2 + 16, 20);  // first entry says 20 B
  CHECK(decode(wrong_size) == errc::malformed_frame);
  auto dead_with_bytes = copy(good);
  dead_with_bytes.data()[12] = std::byte{1};  // the first entry (24 B) marked dead
  CHECK(decode(dead_with_bytes) == errc::malformed_frame);
  CHECK(decode(good.share(0, good.size() - 8)) == errc::malformed_frame);  // truncated values
  auto longer = fusewire::tensor_buffer::allocate(good.size() + 8);
  std::memset(longer.data(), 0, longer.size());
  std::memcpy(longer.data(), good.data(), good.size());
  CHECK(decode(longer) == errc::malformed_frame);  // trailing bytes
  CHECK(out.size() == 1);                          // untouched on failure
  CHECK(out[0].dead);
}

}  // namespace payload_codec_cases
