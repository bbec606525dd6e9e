#pragma once
/// One valid frame of every type (and a few shapes of the variable ones), built
/// with the public encoders. Seeds the fuzzer's corpus and drives the unit
/// tests that cut or corrupt whole frames.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/wire/wire.hpp>

#include "support/patterns.hpp"

namespace fusewire::test {

using bytes = std::vector<std::byte>;

// A frame named for test output.
struct seed_frame {
  std::string name;
  bytes frame;
};

template <fusewire::wire::frame_meta M>
bytes encode_whole(const M& meta, std::uint64_t request_id, fusewire::const_buffer payload = {},
                   std::uint16_t flags = 0) {
  namespace wire = fusewire::wire;
  bytes out(wire::prefix_size(meta) + payload.size());
  std::error_code ec;
  wire::frame_header h;
  h.request_id = request_id;
  h.flags = flags;
  const std::size_t n = wire::encode_frame(meta, h, payload, out, ec);
  if (ec || n != out.size()) throw std::runtime_error("seed frame did not encode: " + ec.message());
  return out;
}

inline std::vector<seed_frame> seed_frames() {
  namespace wire = fusewire::wire;
  using fusewire::dtype;
  using fusewire::tensor_descriptor;
  std::vector<seed_frame> seeds;
  auto add = [&](std::string name, bytes frame) { seeds.push_back({std::move(name), std::move(frame)}); };

  wire::hello_meta hello;
  hello.lane = 2;
  hello.job = "worker";
  hello.task_index = 3;
  hello.incarnation = 0x1122334455667788ull;
  hello.features = 0x5;
  add("hello", encode_whole(hello, 1));

  wire::hello_ack_meta ack_hello;
  ack_hello.lane = 2;
  ack_hello.job = "ps";
  ack_hello.task_index = 0;
  ack_hello.incarnation = 42;
  ack_hello.features = 0x1;
  for (std::size_t i = 0; i < ack_hello.mac.size(); ++i) ack_hello.mac[i] = static_cast<std::byte>(i);
  add("hello_ack", encode_whole(ack_hello, 1, {}, wire::response_flag));

  wire::auth_challenge_meta challenge;
  for (std::size_t i = 0; i < challenge.nonce.size(); ++i) challenge.nonce[i] = static_cast<std::byte>(0xa0 + i);
  add("auth_challenge", encode_whole(challenge, 2));

  wire::auth_response_meta response;
  for (std::size_t i = 0; i < response.mac.size(); ++i) response.mac[i] = static_cast<std::byte>(0x10 + i);
  for (std::size_t i = 0; i < response.nonce.size(); ++i) response.nonce[i] = static_cast<std::byte>(0x60 + i);
  add("auth_response", encode_whole(response, 2, {}, wire::response_flag));

  {
    static const std::uint64_t sizes[] = {8, 16, 0, 24};
    wire::tensor_meta t;
    t.key = "/job:worker/task:0;edge_1;0:0";
    t.descriptor = tensor_descriptor::make(dtype::float32, {4, 3});
    t.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
    const bytes payload = pattern_bytes(48, 1);
    add("tensor", encode_whole(t, 7, payload));
  }
  {
    wire::tensor_meta t;
    t.key = "scalar";
    t.descriptor = tensor_descriptor::make(dtype::int64, {});
    static const std::uint64_t one[] = {8};
    t.segments = wire::segment_list(std::span<const std::uint64_t>(one));
    add("tensor_scalar", encode_whole(t, 8, pattern_bytes(8, 2)));
  }
  {
    wire::tensor_meta t;
    t.key = "";
    t.descriptor = tensor_descriptor::make(dtype::uint8, {0, 5});
    add("tensor_empty", encode_whole(t, 9));
  }
  {
    std::vector<std::byte> meta_buffer(1024);
    wire::fused_builder builder(meta_buffer);
    const std::pair<const char*, tensor_descriptor> entries[] = {
        {"a", tensor_descriptor::make(dtype::float32, {2})},
        {"bb", tensor_descriptor::make(dtype::int8, {3, 1})},
        {"ccc", tensor_descriptor::make(dtype::complex128, {})},
        {"empty", tensor_descriptor::make(dtype::float64, {0})},
    };
    for (const auto& [key, d] : entries) {
      if (builder.append(key, d)) throw std::runtime_error("seed fused entry did not fit");
    }
    const bytes payload = pattern_bytes(static_cast<std::size_t>(builder.payload_size()), 3);
    add("fused", encode_whole(builder.meta(), 10, payload));
  }
  {
    wire::chunk_meta c;
    c.transfer_id = 77;
    c.total_len = 4096;
    c.offset = 1024;
    c.index = 1;
    c.count = 4;
    c.key = "big";
    c.descriptor = tensor_descriptor::make(dtype::float32, {32, 32});
    add("chunk", encode_whole(c, 11, pattern_bytes(1024, 4)));
  }
  {
    wire::recv_request_meta r;
    r.key = "edge_7";
    r.capacity = 1 << 20;
    r.rdma_address = 0x10000;
    r.rdma_rkey = 0x1234;
    add("recv_request", encode_whole(r, 12));
  }
  add("ack", encode_whole(wire::ack_meta{.value = 4096, .credits = 32}, 12, {}, wire::response_flag));
  add("error", encode_whole(wire::error_meta{.code = static_cast<std::int32_t>(fusewire::errc::size_mismatch),
                                             .message = "payload of 12 bytes for a 16-byte destination"},
                            13, {}, wire::response_flag));
  add("ping", encode_whole(wire::ping_meta{.timestamp = 123456789}, 14));
  add("pong", encode_whole(wire::pong_meta{.timestamp = 123456789}, 14, {}, wire::response_flag));
  add("goodbye", encode_whole(wire::goodbye_meta{.reason = 0}, 15));
  {
    const bytes app_meta = pattern_bytes(20, 5);
    wire::application_meta a;
    a.type = static_cast<wire::frame_type>(0x41);
    a.bytes = app_meta;
    add("application", encode_whole(a, 16, pattern_bytes(33, 6), 0x0300));
  }
  return seeds;
}

}  // namespace fusewire::test
