#pragma once
/// Seeds of the PS message fuzz target: requests of every op and flag, and
/// replies (pulls answered, a failure with its message), built with the
/// public builders.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fusewire/ps/message.hpp>

#include "support/seed_frames.hpp"

namespace fusewire::test {

inline bytes bytes_of(const fusewire::tensor_buffer& b) { return bytes(b.data(), b.data() + b.size()); }

inline std::vector<seed_frame> ps_message_seeds() {
  namespace ps = fusewire::ps;
  std::vector<seed_frame> seeds;
  auto add = [&](std::string name, const fusewire::tensor_buffer& b) {
    seeds.push_back({std::move(name), bytes_of(b)});
  };

  const std::vector<float> grad = {0.5f, -1.25f, 3.0f, 1e-3f};
  const std::vector<std::int64_t> ids = {0, 7, -1, 1ll << 40};
  const std::vector<float> row_grads = {1, 2, 3, 4, 5, 6, 7, 8};

  {
    ps::request_builder b;
    b.set_header(0x1122334455667788ull, 1, 0xfeedfacecafebeefull, 0, 0, 0);
    add("request_empty", b.finish());
  }
  {
    ps::request_builder b;
    b.set_header(42, 2, 99, 0, 0, 0);
    b.pull_dense(0, 0);
    b.pull_dense(3, 1);
    add("request_pull_dense", b.finish());
  }
  {
    ps::request_builder b;
    b.set_header(42, 3, 99, 5, 4, ps::request_flags::sync | ps::request_flags::contributes);
    b.push_dense(1, 0, grad);
    b.pull_dense(1, 0);
    add("request_push_pull_sync", b.finish());
  }
  {
    ps::request_builder b;
    b.set_header(42, 4, 99, 0, 0, 0);
    b.pull_rows(2, std::span(ids).first(3));
    b.push_rows(2, std::span(ids).first(2), row_grads);
    add("request_rows", b.finish());
  }
  {
    ps::request_builder b;
    b.set_header(42, 5, 99, 7, 0, ps::request_flags::barrier | ps::request_flags::save | ps::request_flags::shutdown);
    add("request_barrier_save_shutdown", b.finish());
  }
  {
    ps::request_builder b;
    b.set_header(42, 6, 99, 0, 0, 0);
    b.pull_dense(0, 0);
    b.push_dense(0, 1, grad);
    b.pull_rows(4, ids);
    b.push_rows(4, std::span(ids).first(1), std::span(row_grads).first(2));
    add("request_every_op", b.finish());
  }
  {
    // A rows op that names a slice (the format says 0): the decoder must refuse it.
    ps::request_builder b;
    b.set_header(42, 7, 99, 0, 0, 0);
    b.pull_rows(2, std::span(ids).first(1));
    fusewire::tensor_buffer out = b.finish();
    out.data()[ps::request_header_bytes + 8] = std::byte{7};
    add("regress_rows_slice", out);
  }

  {
    ps::reply_builder b(3, 17, 0xabcdef);
    auto v = b.add(ps::op::pull_dense, 1, 0, 4);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f;
    add("reply_pull_dense", b.finish());
  }
  {
    ps::reply_builder b(4, 18, 0xabcdef);
    b.set_flags(ps::reply_flags::fresh);
    auto v = b.add(ps::op::pull_rows, 2, 0, 6);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = -static_cast<float>(i);
    b.add(ps::op::pull_dense, 0, 2, 0);
    add("reply_rows_fresh", b.finish());
  }
  {
    ps::reply_builder b(5, 18, 0xabcdef);
    b.set_flags(ps::reply_flags::stale);
    add("reply_stale_empty", b.finish());
  }
  {
    ps::reply_builder b(6, 18, 0xabcdef);
    b.set_error(fusewire::errc::invalid_argument, "entry 0 (pull): variable index 9 out of range (model has 2)");
    add("reply_error", b.finish());
  }
  {
    ps::reply_encoder enc(7, 19, 0xabcdef, 0, 2, 5);
    enc.begin(ps::op::pull_dense, 0, 0, 2);
    enc.append(std::span(grad).first(2));
    enc.begin(ps::op::pull_rows, 3, 0, 3);
    enc.append(std::span(grad).subspan(1, 3));
    add("reply_encoder", enc.finish());
  }
  return seeds;
}

}  // namespace fusewire::test
