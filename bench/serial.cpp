#include "serial.hpp"

#include <cstring>

#if FWBENCH_HAS_PROTOBUF
#include "fwbench.pb.h"
#endif

namespace fusewire::bench {

#if FWBENCH_HAS_PROTOBUF

struct payload_codec::impl {
  fwbench::Payload message;
  fwbench::Ack ack;
  std::string wire;
};

payload_codec::payload_codec() : impl_(std::make_unique<impl>()) {}
payload_codec::~payload_codec() = default;

const std::string& payload_codec::encode(std::span<const const_buffer> buffers) {
  impl_->message.Clear();
  for (const_buffer b : buffers) impl_->message.add_buffers(reinterpret_cast<const char*>(b.data()), b.size());
  impl_->wire.clear();
  impl_->message.SerializeToString(&impl_->wire);
  return impl_->wire;
}

bool payload_codec::decode(const_buffer wire) {
  return impl_->message.ParseFromArray(wire.data(), static_cast<int>(wire.size()));
}

const std::string& payload_codec::encode_decoded() {
  impl_->wire.clear();
  impl_->message.SerializeToString(&impl_->wire);
  return impl_->wire;
}

std::size_t payload_codec::decoded_bytes() const {
  std::size_t sum = 0;
  for (const std::string& b : impl_->message.buffers()) sum += b.size();
  return sum;
}

std::size_t payload_codec::decoded_count() const { return static_cast<std::size_t>(impl_->message.buffers_size()); }

const_buffer payload_codec::decoded(std::size_t index) const {
  const std::string& b = impl_->message.buffers(static_cast<int>(index));
  return {reinterpret_cast<const std::byte*>(b.data()), b.size()};
}

const std::string& payload_codec::encode_ack(std::uint64_t bytes) {
  impl_->ack.set_bytes(bytes);
  impl_->wire.clear();
  impl_->ack.SerializeToString(&impl_->wire);
  return impl_->wire;
}

bool payload_codec::decode_ack(const_buffer wire, std::uint64_t& bytes) {
  if (!impl_->ack.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return false;
  bytes = impl_->ack.bytes();
  return true;
}

#else

// Built without protobuf: serialized mode is refused before anything runs
// (backend_info::serialized is false); these only keep the linker happy.
struct payload_codec::impl {};
payload_codec::payload_codec() : impl_(std::make_unique<impl>()) {}
payload_codec::~payload_codec() = default;
namespace {
[[noreturn]] void no_protobuf() {
  throw_error(errc::not_supported, "serialized mode needs protobuf, which this build lacks");
}
}  // namespace
const std::string& payload_codec::encode(std::span<const const_buffer>) { no_protobuf(); }
bool payload_codec::decode(const_buffer) { no_protobuf(); }
const std::string& payload_codec::encode_decoded() { no_protobuf(); }
std::size_t payload_codec::decoded_bytes() const { return 0; }
std::size_t payload_codec::decoded_count() const { return 0; }
const_buffer payload_codec::decoded(std::size_t) const { return {}; }
const std::string& payload_codec::encode_ack(std::uint64_t) { no_protobuf(); }
bool payload_codec::decode_ack(const_buffer, std::uint64_t&) { no_protobuf(); }

#endif

bool same_buffers(const payload_codec& decoded, std::span<const const_buffer> expected) {
  if (decoded.decoded_count() != expected.size()) return false;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const const_buffer got = decoded.decoded(i);
    if (got.size() != expected[i].size()) return false;
    if (got.size() != 0 && std::memcmp(got.data(), expected[i].data(), got.size()) != 0) return false;
  }
  return true;
}

}  // namespace fusewire::bench
