#pragma once
/// A ps::shard driven in-process by the ps unit tests: requests go in by
/// hand, the replies it sends are decoded and kept.
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/shard.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace fusewire::test {

/// A reply a shard sent, decoded.
struct captured {
  std::uint32_t worker = 0;
  fusewire::tensor_buffer bytes;
  ps::reply_view reply;
  std::error_code ec;

  std::vector<float> values(std::size_t entry) const {
    const auto& e = reply.entries.at(entry);
    std::vector<float> out(e.value_count);
    e.copy_values(out.data(), 0, out.size());
    return out;
  }
};

/// A shard whose replies land in `replies`.
struct shard_harness {
  std::vector<captured> replies;
  ps::shard shard;

  shard_harness(ps::model_spec model, std::uint32_t index, std::size_t num_ps, ps::server_options opts = {},
                std::size_t workers = 2)
      : shard(
            std::move(model), index, num_ps, std::move(opts), workers,
            [this](std::uint32_t w, fusewire::tensor_buffer b) {
              captured c;
              c.worker = w;
              c.bytes = std::move(b);
              std::string why;
              ps::decode_reply(c.bytes.bytes(), c.reply, c.ec, why);
              replies.push_back(std::move(c));
            },
            42) {}

  /// Handles `rb` (header filled in with the right fingerprint) from `worker`; returns the replies it caused.
  std::vector<captured> send(std::uint32_t worker, ps::request_builder rb) {
    replies.clear();
    shard.handle(worker, rb.finish());
    return std::move(replies);
  }
};

}  // namespace fusewire::test
