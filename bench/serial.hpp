#pragma once
/// Serialized mode for the backends that carry bytes (floor, zmq): the
/// payload is encoded into one `fwbench.Payload` protobuf message and decoded
/// on receipt, as gRPC's generated service does for the grpc backend.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "payload.hpp"

namespace fusewire::bench {

/// Reusable encoder/decoder of one `fwbench.Payload` or `fwbench.Ack`.
/// Not thread-safe: one per connection or thread.
class payload_codec {
 public:
  payload_codec();
  ~payload_codec();
  payload_codec(const payload_codec&) = delete;
  payload_codec& operator=(const payload_codec&) = delete;

  /// Copies `buffers` into the message and encodes it; the result stays valid
  /// until the next call on this codec.
  const std::string& encode(std::span<const const_buffer> buffers);
  /// Decodes a Payload; false when `wire` is not one.
  bool decode(const_buffer wire);
  /// Encodes what the last `decode` produced (the PS's echo).
  const std::string& encode_decoded();
  /// Sum of the decoded buffers' sizes.
  std::size_t decoded_bytes() const;
  std::size_t decoded_count() const;
  const_buffer decoded(std::size_t index) const;

  /// Encodes an Ack carrying `bytes`.
  const std::string& encode_ack(std::uint64_t bytes);
  /// Decodes an Ack into `bytes`; false when `wire` is not one.
  bool decode_ack(const_buffer wire, std::uint64_t& bytes);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// True when `decoded` holds exactly `expected`, buffer by buffer.
bool same_buffers(const payload_codec& decoded, std::span<const const_buffer> expected);

}  // namespace fusewire::bench
