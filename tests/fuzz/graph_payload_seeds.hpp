#pragma once
/// Seeds of the graph payload fuzz target: payloads of live tensors (several
/// dtypes, ranks and paddings), dead values and control tokens, encoded with
/// encode_payload.

#include <cstdint>
#include <string>
#include <vector>

#include <fusewire/graph/payload_codec.hpp>

#include "support/seed_frames.hpp"

namespace fusewire::test {

inline std::vector<seed_frame> graph_payload_seeds() {
  namespace graph = fusewire::graph;
  using fusewire::dtype;
  using fusewire::tensor_descriptor;
  std::vector<seed_frame> seeds;
  auto add = [&](std::string name, const graph::payload& p) {
    const fusewire::tensor_buffer b = graph::encode_payload(p);
    seeds.push_back({std::move(name), bytes(b.data(), b.data() + b.size())});
  };
  auto live = [](dtype t, std::initializer_list<std::int64_t> shape, unsigned seed) {
    graph::message_entry e;
    e.descriptor = tensor_descriptor::make(t, shape);
    const bytes values = pattern_bytes(e.descriptor.byte_size(), seed);
    e.bytes = fusewire::tensor_buffer::copy_of(values);
    return e;
  };

  add("empty", {});
  {
    graph::payload p;
    p.push_back(graph::message_entry::of(graph::tensor({2, 3}, {1, 2, 3, 4, 5, 6})));
    p.push_back(graph::message_entry::token(true));
    p.push_back(graph::message_entry::token(false));
    p.push_back(graph::message_entry::of(graph::tensor::scalar(-0.0f)));
    add("float_dead_token", p);
  }
  {
    graph::payload p;
    p.push_back(live(dtype::int8, {3}, 1));  // 3 bytes, 5 of padding
    p.push_back(live(dtype::float16, {1, 5}, 2));
    p.push_back(live(dtype::complex128, {}, 3));
    p.push_back(live(dtype::int64, {2, 0, 4}, 4));  // a live entry of no bytes
    add("mixed_dtypes", p);
  }
  {
    graph::payload p;
    graph::message_entry dead;
    dead.descriptor = tensor_descriptor::make(dtype::float64, {4, 4});
    dead.dead = true;
    p.push_back(std::move(dead));
    p.push_back(live(dtype::uint8, {1, 1, 1, 1, 1, 1, 1, 7}, 5));  // the largest rank
    add("dead_shaped_rank8", p);
  }
  {
    graph::payload p;
    for (int i = 0; i < 12; ++i) p.push_back(graph::message_entry::token(i % 3 == 0));
    add("tokens", p);
  }
  return seeds;
}

}  // namespace fusewire::test
