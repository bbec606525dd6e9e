// libFuzzer target for the graph payload codec (include/fusewire/graph/payload_codec.hpp).
//
// Each input is used twice:
//  1. as a payload's byte form for decode_payload: a failure reports one of its
//     documented errors and leaves the output alone; a success passes
//     check_payload, its live entries alias the input, and encode_payload
//     writes the input back (except the reserved and padding bytes, which the
//     decoder does not read and the encoder zeroes), as do the header and
//     scatter-gather segments; the input minus its last byte does not decode;
//  2. as the recipe of a payload (a few entries: live tensors of any dtype and
//     a small shape, dead values, control tokens), encoded and decoded back to
//     the same entries.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <vector>

#include <fusewire/graph/payload_codec.hpp>

#include "fuzz_support.hpp"

namespace {

namespace graph = fusewire::graph;
using fusewire::const_buffer;
using fusewire::errc;
using fusewire::tensor_buffer;

bool same_entry(const graph::message_entry& a, const graph::message_entry& b) {
  return a.descriptor == b.descriptor && a.dead == b.dead && a.bytes.size() == b.bytes.size() &&
         (a.bytes.empty() || std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0);
}

bool same_payload(const graph::payload& a, const graph::payload& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_entry(a[i], b[i])) return false;
  }
  return true;
}

// Which bytes of `p`'s byte form the decoder ignores: the reserved prefix
// bytes and every padding byte (the encoder writes zeros there).
std::vector<bool> ignored_bytes(const graph::payload& p, std::size_t size) {
  std::vector<bool> ignored(size, false);
  for (std::size_t i = 5; i < 8; ++i) ignored[i] = true;
  const std::size_t header = graph::detail::payload_header_bytes(p);
  std::size_t pos = graph::detail::pad8(header);
  for (std::size_t i = header; i < pos; ++i) ignored[i] = true;
  for (const auto& e : p) {
    const std::size_t n = e.bytes.size();
    for (std::size_t i = pos + n; i < pos + graph::detail::pad8(n); ++i) ignored[i] = true;
    pos += graph::detail::pad8(n);
  }
  return ignored;
}

void fuzz_decode(const_buffer in) {
  // A view: the decoder reads the fuzzer's exact buffer, so ASan sees any read past it.
  const tensor_buffer bytes = tensor_buffer::view(const_cast<std::byte*>(in.data()), in.size());
  graph::payload out;
  out.push_back(graph::message_entry::token(true));
  const std::error_code ec = graph::decode_payload(bytes, out);
  if (ec) {
    FUZZ_CHECK(ec.category() == fusewire::error_category());
    const auto e = static_cast<errc>(ec.value());
    FUZZ_CHECK(e == errc::bad_magic || e == errc::unsupported_version || e == errc::frame_too_large ||
               e == errc::malformed_frame);
    FUZZ_CHECK(out.size() == 1 && out[0].dead && out[0].bytes.empty());
    return;
  }
  FUZZ_CHECK(!graph::check_payload(out));
  FUZZ_CHECK(out.size() == fusewire::wire::load_le<std::uint32_t>(in.data() + 8));
  FUZZ_CHECK(in.size() % 8 == 0);
  for (const auto& e : out) {
    if (e.bytes.empty()) continue;
    FUZZ_CHECK(!e.dead);
    FUZZ_CHECK(e.bytes.data() >= in.data() && e.bytes.data() + e.bytes.size() <= in.data() + in.size());
  }

  FUZZ_CHECK(graph::encoded_size(out) == in.size());
  const tensor_buffer again = graph::encode_payload(out);
  FUZZ_CHECK(again.size() == in.size());
  const std::vector<bool> ignored = ignored_bytes(out, in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    FUZZ_CHECK(ignored[i] ? again.data()[i] == std::byte{0} : again.data()[i] == in[i]);
  }
  const tensor_buffer header = graph::encode_payload_header(out);
  std::size_t at = 0;
  for (const_buffer s : graph::payload_segments(header, out)) {
    FUZZ_CHECK(at + s.size() <= again.size());
    FUZZ_CHECK(s.empty() || std::memcmp(s.data(), again.data() + at, s.size()) == 0);
    at += s.size();
  }
  FUZZ_CHECK(at == again.size());

  graph::payload back;
  FUZZ_CHECK(!graph::decode_payload(again, back));
  FUZZ_CHECK(same_payload(back, out));

  graph::payload cut;
  FUZZ_CHECK(graph::decode_payload(bytes.share(0, in.size() - 1), cut) == errc::malformed_frame);
}

void fuzz_built(const_buffer in) {
  fusewire::test::input_reader r(in);
  graph::payload p(r.below_or(8));
  for (auto& e : p) {
    const std::uint8_t kind = r.u8();
    if (kind % 4 == 0) {
      e = graph::message_entry::token(kind & 4);
      continue;
    }
    const auto type = fusewire::all_dtypes[r.u8() % fusewire::all_dtypes.size()];
    std::int64_t dims[3] = {};
    const std::size_t rank = r.below_or(3);
    for (std::size_t d = 0; d < rank; ++d) dims[d] = r.below_or(4);
    e.descriptor = fusewire::tensor_descriptor::make(type, std::span<const std::int64_t>(dims, rank));
    e.dead = kind % 4 == 3;
    if (!e.dead) {
      e.bytes = tensor_buffer::allocate(e.descriptor.byte_size());
      r.bytes(e.bytes.bytes());
    }
  }
  FUZZ_CHECK(!graph::check_payload(p));
  const tensor_buffer bytes = graph::encode_payload(p);
  FUZZ_CHECK(bytes.size() == graph::encoded_size(p) && bytes.size() % 8 == 0);
  graph::payload back;
  FUZZ_CHECK(!graph::decode_payload(bytes, back));
  FUZZ_CHECK(same_payload(back, p));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const const_buffer in(reinterpret_cast<const std::byte*>(data), size);
  fuzz_decode(in);
  fuzz_built(in);
  return 0;
}
