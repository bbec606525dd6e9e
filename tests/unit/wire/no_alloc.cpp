// Proves the decoders allocate nothing: this executable replaces the global
// operator new/delete with counting versions and checks the count does not
// move while frames (valid, oversized and lying ones) are decoded.

#include <fusewire/wire/wire.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <cstdlib>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

#include "support/seed_frames.hpp"

namespace {

std::atomic<std::size_t> allocation_count{0};

void* counted_alloc(std::size_t size, std::size_t alignment = 0) {
  allocation_count.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  void* p = nullptr;
  if (alignment > alignof(std::max_align_t)) {
    p = std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
  } else {
    p = std::malloc(size);
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// Out of line so GCC does not pair an inlined free() with a new-expression
// and warn (-Wmismatched-new-delete): these replacements are a matched pair.
[[gnu::noinline]] void counted_free(void* p) noexcept { std::free(p); }

std::size_t allocations() { return allocation_count.load(std::memory_order_relaxed); }

}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void* operator new(std::size_t size, std::align_val_t a) { return counted_alloc(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) { return counted_alloc(size, static_cast<std::size_t>(a)); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(size);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }

namespace wire = fusewire::wire;
using fusewire::dtype;
using fusewire::errc;
using fusewire::tensor_descriptor;

namespace {
void* volatile escaped = nullptr;  // keeps the compiler from eliding the control allocations
}  // namespace

TEST_CASE("the counter sees allocations (so a zero below means something)") {
  const std::size_t before = allocations();
  escaped = ::operator new(16);
  ::operator delete(escaped);
  escaped = new std::vector<int>(100);
  const std::size_t after = allocations();
  delete static_cast<std::vector<int>*>(escaped);
  CHECK(after - before == 3);
}

TEST_CASE("a frame whose length field claims 1 TB decodes to an error and allocates nothing") {
  wire::frame_header h;
  h.type = wire::frame_type::tensor;
  h.meta_len = 64;
  h.payload_len = 1ull << 40;
  const auto head = wire::encode_header(h);
  const wire::limits lim;

  const std::size_t before = allocations();
  wire::frame_header out;
  const std::error_code header_ec = wire::decode_header(head, lim, out);
  wire::decoded_frame frame;
  const std::error_code frame_ec = wire::decode_frame(head, lim, frame);
  const std::size_t after = allocations();

  CHECK(header_ec == errc::frame_too_large);
  CHECK(frame_ec == errc::frame_too_large);
  CHECK(after == before);
}

TEST_CASE("a chunk announcing a 1 TB tensor decodes to an error and allocates nothing") {
  wire::chunk_meta c;
  c.total_len = 1ull << 40;
  c.count = 1u << 18;
  c.key = "huge";
  c.descriptor = tensor_descriptor::make(dtype::uint8, {1ll << 40});
  const auto frame = fusewire::test::encode_whole(c, 1, fusewire::test::pattern_bytes(4096, 1));

  const std::size_t before = allocations();
  wire::decoded_frame f;
  const std::error_code ec = wire::decode_frame(frame, {}, f);
  const std::size_t after = allocations();

  CHECK(ec == errc::frame_too_large);
  CHECK(after == before);
}

TEST_CASE("decoding every frame type, whole or cut, allocates nothing") {
  const auto seeds = fusewire::test::seed_frames();
  std::size_t decoded = 0;
  std::size_t truncated = 0;

  const std::size_t before = allocations();
  for (const auto& seed : seeds) {
    const fusewire::const_buffer in = seed.frame;
    for (std::size_t n = 0; n <= in.size(); ++n) {
      wire::decoded_frame f;
      const std::error_code ec = wire::decode_frame(in.first(n), {}, f);
      if (!ec) ++decoded;
      if (ec == errc::truncated_frame) ++truncated;
    }
  }
  const std::size_t after = allocations();

  CHECK(after == before);
  CHECK(decoded == seeds.size());
  std::size_t cuts = 0;
  for (const auto& seed : seeds) cuts += seed.frame.size();
  CHECK(truncated == cuts);
}

TEST_CASE("building, decoding and iterating a fused frame of 2000 entries allocates nothing") {
  std::vector<std::byte> meta_buffer(256 * 1024);
  std::vector<std::string> keys;
  for (int i = 0; i < 2000; ++i) keys.push_back("edge/" + std::to_string(i));
  const auto d = tensor_descriptor::make(dtype::float32, {3});
  wire::limits lim;
  lim.max_meta_bytes = 256 * 1024;

  const std::size_t before = allocations();
  wire::fused_builder builder(meta_buffer, lim);
  bool appended = true;
  for (const auto& key : keys) appended = appended && !builder.append(key, d);
  const wire::frame_header h = builder.header(9);
  wire::fused_meta m;
  const std::error_code ec = wire::decode_meta(h, builder.meta().bytes(), lim, m);
  std::uint64_t bytes = 0;
  std::size_t entries = 0;
  for (const wire::fused_entry& e : m) {
    bytes += e.size;
    ++entries;
  }
  const std::size_t after = allocations();

  CHECK(appended);
  CHECK(!ec);
  CHECK(entries == 2000);
  CHECK(bytes == 2000 * 12);
  CHECK(after == before);
}
