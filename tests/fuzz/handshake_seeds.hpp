#pragma once
/// Seeds of the handshake fuzz target: a mode byte (which side runs, with or
/// without the token; see handshake_fuzz.cpp) and the peer's frames, for the
/// paths that succeed and the ways a peer is refused.

#include <cstdint>
#include <string>
#include <vector>

#include <fusewire/protocol/handshake.hpp>
#include <fusewire/wire/wire.hpp>

#include "support/seed_frames.hpp"

namespace fusewire::test {

inline std::vector<seed_frame> handshake_seeds() {
  namespace wire = fusewire::wire;
  namespace protocol = fusewire::protocol;
  // Mode bits, as handshake_fuzz.cpp reads them.
  constexpr std::uint8_t token = 1, deferred = 2, helpful = 4, readahead = 8, connector = 16, reverse = 32;
  std::vector<seed_frame> seeds;
  auto add = [&](std::string name, std::uint8_t mode, std::initializer_list<bytes> frames) {
    bytes input{static_cast<std::byte>(mode)};
    for (const bytes& f : frames) input.insert(input.end(), f.begin(), f.end());
    seeds.push_back({std::move(name), std::move(input)});
  };

  auto hello = [](std::string_view job, std::uint32_t index, std::uint64_t features) {
    wire::hello_meta m;
    m.job = job;
    m.task_index = index;
    m.incarnation = 0x1122334455667788ull;
    m.features = features;
    return encode_whole(m, 0);
  };
  wire::hello_meta old_peer;
  old_peer.job = "worker";
  old_peer.min_version = 0;
  old_peer.max_version = 0;
  wire::auth_response_meta response;
  for (std::size_t i = 0; i < response.mac.size(); ++i) response.mac[i] = static_cast<std::byte>(i * 3);
  for (std::size_t i = 0; i < response.nonce.size(); ++i) response.nonce[i] = static_cast<std::byte>(0x40 + i);
  wire::auth_challenge_meta challenge;
  for (std::size_t i = 0; i < challenge.nonce.size(); ++i) challenge.nonce[i] = static_cast<std::byte>(0xc0 ^ i);
  wire::hello_ack_meta ack;
  ack.job = "ps";
  ack.incarnation = 9;
  ack.features = protocol::feature_reverse;
  wire::hello_ack_meta wrong_ack = ack;
  wrong_ack.job = "worker";
  const bytes refusal = encode_whole(
      wire::error_meta{.code = static_cast<std::int32_t>(fusewire::errc::auth_failed), .message = "wrong token"}, 0);

  // The acceptor.
  add("accept_hello", 0, {hello("worker", 0, 0)});
  add("accept_hello_reverse_readahead", readahead, {hello("worker", 1, protocol::feature_reverse)});
  add("accept_deferred", deferred, {hello("ps", 0, 0)});
  add("accept_token_proven", token | helpful, {hello("worker", 1, protocol::feature_token)});
  add("accept_token_proven_deferred", token | helpful | deferred | readahead, {hello("worker", 0, 1)});
  add("accept_token_wrong_mac", token, {hello("worker", 0, 1), encode_whole(response, 0)});
  add("accept_token_no_answer", token, {hello("worker", 0, 0), encode_whole(wire::ping_meta{.timestamp = 1}, 0)});
  add("accept_unknown_task", 0, {hello("worker", 7, 0)});
  add("accept_no_common_version", 0, {encode_whole(old_peer, 0)});
  add("accept_not_a_hello", 0, {encode_whole(challenge, 0)});

  // The connector.
  add("connect_ack", connector, {encode_whole(ack, 0)});
  add("connect_ack_readahead_reverse", connector | readahead | reverse, {encode_whole(ack, 0)});
  add("connect_wrong_peer", connector, {encode_whole(wrong_ack, 0)});
  add("connect_token_proven", connector | token | helpful, {encode_whole(challenge, 0)});
  add("connect_token_unproven", connector | token, {encode_whole(challenge, 0), encode_whole(ack, 0)});
  add("connect_challenge_without_token", connector, {encode_whole(challenge, 0)});
  add("connect_refused", connector | token, {refusal});
  return seeds;
}

}  // namespace fusewire::test
