#include <fusewire/wire/meta.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

namespace wire = fusewire::wire;
using fusewire::dtype;
using fusewire::errc;
using fusewire::tensor_descriptor;
using bytes = std::vector<std::byte>;

namespace {

template <class M>
bytes enc(const M& m) {
  bytes out(wire::encoded_size(m));
  std::error_code ec;
  const std::size_t n = wire::encode_meta(m, out, ec);
  REQUIRE_MESSAGE(!ec, ec.message());
  REQUIRE(n == out.size());
  return out;
}

template <class M>
wire::frame_header header_for(const bytes& meta, std::uint64_t payload_len) {
  wire::frame_header h;
  h.type = M::type;
  h.meta_len = static_cast<std::uint32_t>(meta.size());
  h.payload_len = payload_len;
  return h;
}

template <class M>
std::error_code dec(const bytes& meta, M& out, std::uint64_t payload_len = 0, const wire::limits& lim = {}) {
  return wire::decode_meta(header_for<M>(meta, payload_len), meta, lim, out);
}

template <class M>
void check_round_trip(const M& m, std::uint64_t payload_len = 0) {
  const bytes meta = enc(m);
  M out;
  REQUIRE(dec(meta, out, payload_len) == std::error_code{});
  CHECK(out == m);
  // Decoding views the input; re-encoding reproduces it byte for byte.
  CHECK(enc(out) == meta);
  // One byte more or less is malformed.
  bytes longer = meta;
  longer.push_back(std::byte{0});
  CHECK(dec(longer, out, payload_len) == errc::malformed_frame);
  if (!meta.empty()) {
    bytes shorter(meta.begin(), meta.end() - 1);
    CHECK(dec(shorter, out, payload_len) == errc::malformed_frame);
  }
}

bytes hex(std::initializer_list<int> v) {
  bytes out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

std::string as_string(const bytes& b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

}  // namespace

TEST_CASE("hello round-trips and has a fixed layout") {
  wire::hello_meta m;
  m.lane = 3;
  m.job = "ps";
  m.task_index = 0x01020304;
  m.incarnation = 0x1112131415161718ull;
  m.features = 0x21;
  check_round_trip(m);
  CHECK(enc(m) == hex({1,    1,    3,    0, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13,
                       0x12, 0x11, 0x21, 0, 0, 0, 0, 0, 0,    0,    2,    0,    'p',  's'}));
}

TEST_CASE("hello: job names above the limit, versions the wrong way round, wrong headers") {
  wire::hello_meta m;
  std::string job(5000, 'j');
  m.job = job;
  const bytes meta = enc(m);
  wire::hello_meta out;
  CHECK(dec(meta, out) == errc::frame_too_large);
  wire::limits lim;
  lim.max_key_bytes = 5000;
  CHECK(dec(meta, out, 0, lim) == std::error_code{});
  CHECK(out.job.size() == 5000);

  m.job = "w";
  m.min_version = 2;
  m.max_version = 1;
  CHECK(dec(enc(m), out) == errc::malformed_frame);

  m.min_version = m.max_version = 1;
  const bytes good = enc(m);
  auto h = header_for<wire::hello_meta>(good, 0);
  h.type = wire::frame_type::hello_ack;
  CHECK(wire::decode_meta(h, good, {}, out) == errc::invalid_argument);
  h = header_for<wire::hello_meta>(good, 0);
  CHECK(wire::decode_meta(h, std::span(good).first(good.size() - 1), {}, out) == errc::truncated_frame);
  h.payload_len = 1;
  CHECK(wire::decode_meta(h, good, {}, out) == errc::malformed_frame);
}

TEST_CASE("encoders refuse what the format cannot carry and small buffers, writing nothing") {
  std::string job(70000, 'j');
  wire::hello_meta m;
  m.job = job;
  bytes out(wire::encoded_size(m));
  std::error_code ec;
  CHECK(wire::encode_meta(m, out, ec) == 0);
  CHECK(ec == errc::invalid_argument);

  m.job = "ok";
  bytes small(wire::encoded_size(m) - 1, std::byte{0x5a});
  CHECK(wire::encode_meta(m, small, ec) == 0);
  CHECK(ec == errc::invalid_argument);
  CHECK(small == bytes(small.size(), std::byte{0x5a}));

  CHECK(wire::encode_meta(m, out, ec) == wire::encoded_size(m));
  CHECK(!ec);
}

TEST_CASE("hello_ack round-trips and rejects a non-zero reserved byte") {
  wire::hello_ack_meta m;
  m.lane = 1;
  m.job = "worker";
  m.task_index = 7;
  m.incarnation = 99;
  m.features = 3;
  for (std::size_t i = 0; i < m.mac.size(); ++i) m.mac[i] = static_cast<std::byte>(i * 3);
  check_round_trip(m);
  bytes meta = enc(m);
  meta[1] = std::byte{1};
  wire::hello_ack_meta out;
  CHECK(dec(meta, out) == errc::malformed_frame);
}

TEST_CASE("auth frames carry exactly their fixed-size fields") {
  wire::auth_challenge_meta c;
  for (std::size_t i = 0; i < c.nonce.size(); ++i) c.nonce[i] = static_cast<std::byte>(255 - i);
  check_round_trip(c);
  CHECK(enc(c).size() == 32);

  wire::auth_response_meta r;
  for (std::size_t i = 0; i < r.mac.size(); ++i) r.mac[i] = static_cast<std::byte>(i);
  for (std::size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<std::byte>(i + 100);
  check_round_trip(r);
  const bytes meta = enc(r);
  CHECK(meta.size() == 64);
  CHECK(meta[0] == std::byte{0});
  CHECK(meta[32] == std::byte{100});
}

TEST_CASE("tensor meta: key, descriptor and segment sizes round-trip") {
  const std::uint64_t sizes[] = {16, 0, 32};
  wire::tensor_meta m;
  m.key = "w/part_0";
  m.descriptor = tensor_descriptor::make(dtype::float64, {2, 3});
  m.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
  check_round_trip(m, 48);
  CHECK(enc(m) == [] {
    bytes b = hex({8, 0});
    for (char c : std::string("w/part_0")) b.push_back(static_cast<std::byte>(c));
    for (int x : {2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0,  0, 0, 3, 0, 0, 0, 16,
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 0, 0, 0, 0}) {
      b.push_back(static_cast<std::byte>(x));
    }
    return b;
  }());

  const bytes meta = enc(m);  // `out` views it
  wire::tensor_meta out;
  REQUIRE(dec(meta, out, 48) == std::error_code{});
  CHECK(out.segments.size() == 3);
  CHECK(out.segments[2] == 32);
  CHECK(std::vector<std::uint64_t>(out.segments.begin(), out.segments.end()) == std::vector<std::uint64_t>{16, 0, 32});
}

TEST_CASE("tensor meta from scatter-gather buffers encodes their sizes") {
  std::array<std::byte, 10> a{};
  std::array<std::byte, 2> b{};
  const fusewire::const_buffer sg[] = {a, b};
  wire::tensor_meta from_buffers;
  from_buffers.key = "k";
  from_buffers.descriptor = tensor_descriptor::make(dtype::int16, {6});
  from_buffers.segments = wire::segment_list(std::span<const fusewire::const_buffer>(sg));
  const std::uint64_t sizes[] = {10, 2};
  wire::tensor_meta from_sizes = from_buffers;
  from_sizes.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
  CHECK(from_buffers == from_sizes);
  CHECK(enc(from_buffers) == enc(from_sizes));
}

TEST_CASE("tensor meta whose lengths lie is malformed_frame") {
  const std::uint64_t sizes[] = {8, 8};
  wire::tensor_meta m;
  m.key = "t";
  m.descriptor = tensor_descriptor::make(dtype::int32, {4});
  m.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
  wire::tensor_meta out;
  CHECK(dec(enc(m), out, 16) == std::error_code{});
  SUBCASE("segments add up to less or more than payload_len") {
    CHECK(dec(enc(m), out, 17) == errc::malformed_frame);
    CHECK(dec(enc(m), out, 15) == errc::malformed_frame);
  }
  SUBCASE("segments agree with payload_len but not with the descriptor") {
    m.descriptor = tensor_descriptor::make(dtype::int32, {5});
    CHECK(dec(enc(m), out, 16) == errc::malformed_frame);
  }
  SUBCASE("segment sizes whose sum overflows") {
    const std::uint64_t huge[] = {~0ull, 17};
    m.segments = wire::segment_list(std::span<const std::uint64_t>(huge));
    CHECK(dec(enc(m), out, 16) == errc::malformed_frame);
  }
  SUBCASE("a segment count larger than the meta") {
    bytes meta = enc(m);
    const std::size_t count_at = 2 + 1 + 2 + 8;
    meta[count_at] = std::byte{3};
    CHECK(dec(meta, out, 16) == errc::malformed_frame);
    meta[count_at + 3] = std::byte{0x80};
    CHECK(dec(meta, out, 16) == errc::frame_too_large);  // above max_segments before anything else
  }
}

TEST_CASE("tensor meta with bad descriptors") {
  wire::tensor_meta m;
  m.key = "t";
  m.descriptor = tensor_descriptor::make(dtype::uint8, {2, 2});
  const std::uint64_t four[] = {4};
  m.segments = wire::segment_list(std::span<const std::uint64_t>(four));
  const bytes good = enc(m);
  wire::tensor_meta out;
  const std::size_t dtype_at = 3;
  SUBCASE("unknown dtype") {
    for (int t : {0, 7, 11, 24, 255}) {
      bytes meta = good;
      meta[dtype_at] = static_cast<std::byte>(t);
      CHECK(dec(meta, out, 4) == errc::malformed_frame);
    }
  }
  SUBCASE("negative dimension") {
    bytes meta = good;
    meta[dtype_at + 2 + 7] = std::byte{0x80};
    CHECK(dec(meta, out, 4) == errc::malformed_frame);
  }
  SUBCASE("rank above the limit") {
    wire::limits lim;
    lim.max_rank = 1;
    CHECK(dec(good, out, 4, lim) == errc::frame_too_large);
    bytes meta = good;
    meta[dtype_at + 1] = std::byte{9};
    CHECK(dec(meta, out, 4) == errc::frame_too_large);
  }
  SUBCASE("element count overflow") {
    wire::tensor_meta big = m;
    big.descriptor.dims = {1ll << 40, 1ll << 40};
    std::error_code ec;
    bytes meta(wire::encoded_size(big));
    CHECK(wire::encode_meta(big, meta, ec) == 0);
    CHECK(ec == errc::invalid_argument);
  }
  SUBCASE("key above the limit") {
    wire::limits lim;
    lim.max_key_bytes = 0;
    CHECK(dec(good, out, 4, lim) == errc::frame_too_large);
  }
}

TEST_CASE("chunk meta round-trips and is checked against the header and limits") {
  wire::chunk_meta m;
  m.transfer_id = 5;
  m.total_len = 4000;
  m.offset = 3000;
  m.index = 3;
  m.count = 4;
  m.key = "emb";
  m.descriptor = tensor_descriptor::make(dtype::float32, {1000});
  check_round_trip(m, 1000);
  wire::chunk_meta out;
  CHECK(dec(enc(m), out, 1001) == errc::malformed_frame);  // runs past total_len

  auto with = [&](auto change) {
    wire::chunk_meta c = m;
    change(c);
    return dec(enc(c), out, 1000);
  };
  CHECK(with([](wire::chunk_meta& c) { c.index = 4; }) == errc::malformed_frame);
  CHECK(with([](wire::chunk_meta& c) {
          c.count = 0;
          c.index = 0;
        }) == errc::malformed_frame);
  CHECK(with([](wire::chunk_meta& c) { c.offset = 4001; }) == errc::malformed_frame);
  CHECK(with([](wire::chunk_meta& c) { c.offset = ~0ull; }) == errc::malformed_frame);
  CHECK(with([](wire::chunk_meta& c) {
          c.total_len = 4004;
          c.offset = 0;
        }) == errc::malformed_frame);
  CHECK(with([](wire::chunk_meta& c) { c.count = (1u << 20) + 1; }) == errc::frame_too_large);
  CHECK(with([](wire::chunk_meta& c) {
          c.total_len = 1ull << 40;
          c.descriptor = tensor_descriptor::make(dtype::uint8, {1ll << 40});
        }) == errc::frame_too_large);
}

TEST_CASE("recv_request round-trips; its capacity is bounded by max_transfer_bytes") {
  wire::recv_request_meta m;
  m.key = "grad";
  m.capacity = 1 << 20;
  m.rdma_address = 0x7f0000001000ull;
  m.rdma_rkey = 0xabcd;
  check_round_trip(m);
  m.capacity = (16ull << 30) + 1;
  wire::recv_request_meta out;
  CHECK(dec(enc(m), out) == errc::frame_too_large);
}

TEST_CASE("ack, ping, pong and goodbye have fixed layouts") {
  check_round_trip(wire::ack_meta{.value = 1ull << 33, .credits = 8});
  CHECK(enc(wire::ack_meta{.value = 0x0102, .credits = 3}) == hex({2, 1, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0}));
  check_round_trip(wire::ping_meta{.timestamp = 77});
  check_round_trip(wire::pong_meta{.timestamp = 77});
  check_round_trip(wire::goodbye_meta{.reason = static_cast<std::int32_t>(errc::cancelled)});
  CHECK(enc(wire::goodbye_meta{.reason = -2}) == hex({0xfe, 0xff, 0xff, 0xff}));

  wire::ping_meta ping;
  auto h = header_for<wire::ping_meta>(enc(wire::ping_meta{}), 0);
  h.type = wire::frame_type::pong;
  CHECK(wire::decode_meta(h, enc(wire::ping_meta{}), {}, ping) == errc::invalid_argument);
}

TEST_CASE("error meta carries a fusewire error code and a bounded message") {
  wire::error_meta m{.code = static_cast<std::int32_t>(errc::size_mismatch), .message = "12 bytes for 16"};
  check_round_trip(m);
  const bytes meta = enc(m);
  wire::error_meta out;
  REQUIRE(dec(meta, out) == std::error_code{});
  CHECK(out.message == "12 bytes for 16");
  CHECK(out.error() == errc::size_mismatch);
  CHECK(out.error().message() == "payload size does not match the destination");
  const std::string long_text(4097, 'x');
  m.message = long_text;
  CHECK(dec(enc(m), out) == errc::frame_too_large);
}

TEST_CASE("application meta is opaque bytes, typed in the application range") {
  const bytes payload_meta = hex({1, 2, 3});
  wire::application_meta m;
  m.type = wire::frame_type::application_last;
  m.bytes = payload_meta;
  const bytes meta = enc(m);
  CHECK(meta == payload_meta);
  wire::frame_header h;
  h.type = wire::frame_type::application_last;
  h.meta_len = 3;
  h.payload_len = 100;
  wire::application_meta out;
  REQUIRE(wire::decode_meta(h, meta, {}, out) == std::error_code{});
  CHECK(out == m);
  CHECK(out.bytes.data() == meta.data());

  m.type = wire::frame_type::tensor;
  bytes dest(3);
  std::error_code ec;
  CHECK(wire::encode_meta(m, dest, ec) == 0);
  CHECK(ec == errc::invalid_argument);
  h.type = wire::frame_type::ack;
  h.payload_len = 0;
  CHECK(wire::decode_meta(h, meta, {}, out) == errc::invalid_argument);
}

TEST_CASE("decoded strings view the input") {
  wire::recv_request_meta m;
  m.key = "view-me";
  const bytes meta = enc(m);
  wire::recv_request_meta out;
  REQUIRE(dec(meta, out) == std::error_code{});
  CHECK(reinterpret_cast<const std::byte*>(out.key.data()) == meta.data() + 22);
  CHECK(as_string(bytes(meta.begin() + 22, meta.end())) == "view-me");
}
