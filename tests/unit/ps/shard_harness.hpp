#pragma once
/// A ps::shard driven in-process by the ps unit tests: requests go in by
/// hand, the replies it sends are flattened into one buffer (flatten()),
/// decoded and kept.
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

/// A reply's bytes in one buffer, for decode_reply (a copy: the reply's
/// shared slices are released when `reply` is).
inline fusewire::tensor_buffer flatten(const ps::reply_message& reply) { return reply.gather(); }

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

/// A shard whose replies land in `replies`; with `hold` set, each reply as
/// the shard made it is also kept in `held` (as a transport sending it
/// would), so that it keeps the dense slices it shares.
struct shard_harness {
  std::vector<captured> replies;
  bool hold = false;
  std::vector<ps::reply_message> held;
  ps::shard shard;

  shard_harness(ps::model_spec model, std::uint32_t index, std::size_t num_ps, ps::server_options opts = {},
                std::size_t workers = 2, ps::shard::value_allocator allocate_values = {})
      : shard(
            std::move(model), index, num_ps, std::move(opts), workers,
            [this](std::uint32_t w, ps::reply_message m) {
              captured c;
              c.worker = w;
              c.bytes = flatten(m);
              std::string why;
              ps::decode_reply(c.bytes.bytes(), c.reply, c.ec, why);
              replies.push_back(std::move(c));
              if (hold) held.push_back(std::move(m));
            },
            42, std::move(allocate_values)) {}

  /// Handles `rb` (header filled in with the right fingerprint) from `worker`; returns the replies it caused.
  std::vector<captured> send(std::uint32_t worker, ps::request_builder rb) {
    replies.clear();
    shard.handle(worker, rb.finish());
    return std::move(replies);
  }
};

}  // namespace fusewire::test
