// libFuzzer target for the wire decoders (also linked into the unit test
// wire_fuzz_replay, which calls it on seeds and their mutations).
//
// Each input is used twice:
//  1. as a whole frame for decode_frame, under default and under tight limits;
//  2. as [type u8][payload_len u64][meta...] for the per-type meta decoders.
// Whatever decodes must satisfy the format's invariants and re-encode to the
// very bytes it came from (the format is canonical), and decode again to the
// same value. A violated property aborts, which the fuzzer reports.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <type_traits>
#include <variant>
#include <vector>

#include <fusewire/wire/wire.hpp>

namespace {

namespace wire = fusewire::wire;
using fusewire::const_buffer;

[[noreturn]] void fail(const char* what, int line) {
  std::fprintf(stderr, "wire_decode_fuzz: property violated at line %d: %s\n", line, what);
  std::abort();
}

#define FUZZ_CHECK(cond)                \
  do {                                  \
    if (!(cond)) fail(#cond, __LINE__); \
  } while (0)

bool same_bytes(const_buffer a, const_buffer b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// Every error a decoder reports is one of the wire errors (or invalid_argument
// for a header/decoder type mismatch, which only the direct calls can cause).
void check_error(const std::error_code& ec, bool allow_invalid_argument) {
  FUZZ_CHECK(ec.category() == fusewire::error_category());
  const auto e = static_cast<fusewire::errc>(ec.value());
  FUZZ_CHECK(e == fusewire::errc::bad_magic || e == fusewire::errc::unsupported_version ||
             e == fusewire::errc::unknown_frame_type || e == fusewire::errc::frame_too_large ||
             e == fusewire::errc::malformed_frame || e == fusewire::errc::truncated_frame ||
             (allow_invalid_argument && e == fusewire::errc::invalid_argument));
}

// Per-type invariants of a decoded body against its header.
void check_body(const wire::frame_header& h, const wire::frame_body& body, const wire::limits& lim) {
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        FUZZ_CHECK(m.type == h.type);
        if constexpr (std::is_same_v<M, wire::tensor_meta>) {
          std::uint64_t sum = 0;
          for (std::uint64_t s : m.segments) sum += s;
          FUZZ_CHECK(sum == h.payload_len);
          FUZZ_CHECK(m.segments.size() <= lim.max_segments);
          FUZZ_CHECK(m.key.size() <= lim.max_key_bytes);
          FUZZ_CHECK(m.descriptor.byte_size() == h.payload_len);
        } else if constexpr (std::is_same_v<M, wire::fused_meta>) {
          std::uint64_t next = 0;
          std::uint32_t n = 0;
          for (const wire::fused_entry& e : m) {
            FUZZ_CHECK(e.offset == next);
            FUZZ_CHECK(e.size == e.descriptor.byte_size());
            FUZZ_CHECK(e.key.size() <= lim.max_key_bytes);
            next += e.size;
            ++n;
          }
          FUZZ_CHECK(n == m.size() && n >= 1 && n <= lim.max_entries);
          FUZZ_CHECK(next == h.payload_len && next == m.payload_size());
          // Rebuilding it entry by entry gives the same bytes.
          std::vector<std::byte> buffer(m.bytes().size());
          wire::fused_builder builder(buffer, lim);
          for (const wire::fused_entry& e : m) FUZZ_CHECK(!builder.append(e.key, e.descriptor));
          FUZZ_CHECK(builder.meta() == m);
          FUZZ_CHECK(builder.header(h.request_id, h.flags) == h);
        } else if constexpr (std::is_same_v<M, wire::chunk_meta>) {
          FUZZ_CHECK(m.index < m.count && m.count <= lim.max_chunks);
          FUZZ_CHECK(m.total_len <= lim.max_transfer_bytes);
          FUZZ_CHECK(m.offset <= m.total_len && h.payload_len <= m.total_len - m.offset);
          FUZZ_CHECK(m.descriptor.byte_size() == m.total_len);
        } else if constexpr (std::is_same_v<M, wire::hello_meta>) {
          FUZZ_CHECK(m.min_version <= m.max_version);
          FUZZ_CHECK(m.job.size() <= lim.max_key_bytes);
        } else if constexpr (std::is_same_v<M, wire::error_meta>) {
          FUZZ_CHECK(m.message.size() <= lim.max_message_bytes);
        } else if constexpr (std::is_same_v<M, wire::recv_request_meta>) {
          FUZZ_CHECK(m.capacity <= lim.max_transfer_bytes);
        }
      },
      body);
}

// Re-encodes a decoded header + body and checks it reproduces `original`
// (header followed by meta) and decodes to the same value again.
void check_round_trip(const wire::frame_header& h, const wire::frame_body& body, const_buffer original,
                      const wire::limits& lim) {
  const std::size_t size = wire::prefix_size(body);
  FUZZ_CHECK(size == wire::header_size + h.meta_len);
  std::vector<std::byte> out(size);
  std::error_code ec;
  FUZZ_CHECK(wire::encode_prefix(body, h, out, ec) == size);
  FUZZ_CHECK(!ec);
  FUZZ_CHECK(same_bytes(out, original));

  wire::frame_header again;
  FUZZ_CHECK(!wire::decode_header(out, lim, again));
  FUZZ_CHECK(again == h);
  wire::frame_body body_again;
  FUZZ_CHECK(!wire::decode_meta(again, const_buffer(out).subspan(wire::header_size), lim, body_again));
  FUZZ_CHECK(body_again == body);
}

void fuzz_whole_frame(const_buffer in, const wire::limits& lim) {
  wire::decoded_frame f;
  const std::error_code ec = wire::decode_frame(in, lim, f);
  if (ec) {
    check_error(ec, false);
    return;
  }
  FUZZ_CHECK(f.size() <= in.size());
  FUZZ_CHECK(f.meta.size() == f.header.meta_len && f.payload.size() == f.header.payload_len);
  FUZZ_CHECK(f.meta.data() == in.data() + wire::header_size);
  FUZZ_CHECK(f.header.meta_len <= lim.max_meta_bytes && f.header.payload_len <= lim.max_payload_bytes);
  FUZZ_CHECK(f.header.payload_len == 0 || wire::carries_payload(f.header.type));
  check_body(f.header, f.body, lim);
  check_round_trip(f.header, f.body, in.first(wire::header_size + f.meta.size()), lim);

  // decode_header alone agrees, and the frame minus its last byte is truncated.
  wire::frame_header h;
  FUZZ_CHECK(!wire::decode_header(in, lim, h) && h == f.header);
  wire::decoded_frame cut;
  FUZZ_CHECK(wire::decode_frame(in.first(f.size() - 1), lim, cut) == fusewire::errc::truncated_frame);
}

void fuzz_meta_decoders(const_buffer in, const wire::limits& lim) {
  if (in.size() < 9) return;
  wire::byte_reader r(in);
  const auto raw_type = r.u8();
  const std::uint64_t payload_len = r.u64();
  const const_buffer meta = in.subspan(9);
  if (!wire::is_known_frame_type(raw_type) || meta.size() > 0xffffffffu) return;
  wire::frame_header h;
  h.type = static_cast<wire::frame_type>(raw_type);
  h.meta_len = static_cast<std::uint32_t>(meta.size());
  h.payload_len = payload_len;
  wire::frame_body body;
  const std::error_code ec = wire::decode_meta(h, meta, lim, body);
  if (ec) {
    check_error(ec, false);
    return;
  }
  check_body(h, body, lim);
  std::vector<std::byte> out(wire::prefix_size(body));
  std::error_code enc;
  const std::size_t n = wire::encode_prefix(body, h, out, enc);
  FUZZ_CHECK(!enc && n == out.size());
  FUZZ_CHECK(same_bytes(const_buffer(out).subspan(wire::header_size), meta));
}

wire::limits tight_limits() {
  wire::limits lim;
  lim.max_meta_bytes = 256;
  lim.max_payload_bytes = 512;
  lim.max_transfer_bytes = 4096;
  lim.max_entries = 3;
  lim.max_segments = 3;
  lim.max_chunks = 8;
  lim.max_key_bytes = 8;
  lim.max_message_bytes = 16;
  lim.max_rank = 2;
  return lim;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const const_buffer in(reinterpret_cast<const std::byte*>(data), size);
  static const wire::limits defaults{};
  static const wire::limits tight = tight_limits();
  fuzz_whole_frame(in, defaults);
  fuzz_whole_frame(in, tight);
  fuzz_meta_decoders(in, defaults);
  fuzz_meta_decoders(in, tight);
  return 0;
}
