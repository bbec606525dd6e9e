// libFuzzer target for the PS message codec (include/fusewire/ps/message.hpp).
//
// Each input is used three ways:
//  1. as a request for decode_request: what decodes has as many entries as its
//     header says, whose ids and values alias the input in order and cover it
//     exactly; rebuilt with request_builder it gives the very same bytes (the
//     format is canonical), and the input minus its last byte does not decode;
//  2. as a reply for decode_reply, likewise, rebuilt with reply_builder and,
//     for a successful reply, with reply_encoder (also sharing the values of
//     every other entry, as a PS sends large slices);
//  3. as the recipe of a request and a reply (header fields, a few entries of
//     a few ids and values), encoded with the builders and decoded back to the
//     same fields.
// A decoder that fails reports one of its documented errors and says why.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <fusewire/ps/message.hpp>

#include "fuzz_support.hpp"

namespace {

namespace ps = fusewire::ps;
using fusewire::const_buffer;
using fusewire::errc;

bool same_bytes(const_buffer a, const_buffer b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

bool within(const std::byte* p, std::size_t n, const_buffer in) {
  return p >= in.data() && p <= in.data() + in.size() && n <= static_cast<std::size_t>(in.data() + in.size() - p);
}

void check_error(const std::error_code& ec, const std::string& why) {
  FUZZ_CHECK(ec.category() == fusewire::error_category());
  const auto e = static_cast<errc>(ec.value());
  FUZZ_CHECK(e == errc::malformed_frame || e == errc::truncated_frame || e == errc::bad_magic ||
             e == errc::unsupported_version);
  FUZZ_CHECK(!why.empty());
}

std::vector<std::int64_t> ids_of(const ps::entry_view& e) {
  std::vector<std::int64_t> ids(e.id_count);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = e.id(i);
  return ids;
}

template <class Entry>
std::vector<float> values_of(const Entry& e) {
  std::vector<float> values(e.value_count);
  e.copy_values(values.data(), 0, values.size());
  return values;
}

void fuzz_request(const_buffer in) {
  ps::request_view v;
  std::error_code ec;
  std::string why;
  ps::decode_request(in, v, ec, why);
  if (ec) {
    check_error(ec, why);
    return;
  }
  FUZZ_CHECK(why.empty());
  FUZZ_CHECK(v.entries.size() == ps::detail::get<std::uint32_t>(in.data() + 52));
  FUZZ_CHECK((v.flags & ~ps::request_flags::all) == 0);
  // Entries follow each other: header, ids, values, next header... to the last byte.
  const std::byte* next = in.data() + ps::request_header_bytes;
  for (const auto& e : v.entries) {
    FUZZ_CHECK(e.kind >= ps::op::pull_dense && e.kind <= ps::op::push_rows);
    FUZZ_CHECK(ps::is_rows(e.kind) || e.id_count == 0);
    FUZZ_CHECK(ps::is_push(e.kind) || e.value_count == 0);
    FUZZ_CHECK(e.ids == next + ps::entry_header_bytes);
    FUZZ_CHECK(within(e.ids, e.id_count * 8, in));
    FUZZ_CHECK(e.values == e.ids + e.id_count * 8);
    FUZZ_CHECK(within(e.values, e.value_count * 4, in));
    next = e.values + e.value_count * 4;
  }
  FUZZ_CHECK(next == in.data() + in.size());

  // Rebuilt, it is the same bytes.
  std::vector<std::vector<std::int64_t>> ids;
  std::vector<std::vector<float>> values;
  ids.reserve(v.entries.size());
  values.reserve(v.entries.size());
  ps::request_builder b;
  b.set_header(v.incarnation, v.seq, v.fingerprint, v.push_step, v.min_step, v.flags);
  for (const auto& e : v.entries) {
    ids.push_back(ids_of(e));
    values.push_back(values_of(e));
    switch (e.kind) {
      case ps::op::pull_dense:
        b.pull_dense(e.var, e.slice);
        break;
      case ps::op::push_dense:
        b.push_dense(e.var, e.slice, values.back());
        break;
      case ps::op::pull_rows:
        b.pull_rows(e.var, ids.back());
        break;
      case ps::op::push_rows:
        b.push_rows(e.var, ids.back(), values.back());
        break;
    }
  }
  FUZZ_CHECK(b.bytes() == in.size());
  const fusewire::tensor_buffer out = b.finish();
  FUZZ_CHECK(same_bytes(out.bytes(), in));

  ps::request_view cut;
  ps::decode_request(in.first(in.size() - 1), cut, ec, why);
  FUZZ_CHECK(static_cast<bool>(ec));
  check_error(ec, why);
}

void fuzz_reply(const_buffer in) {
  ps::reply_view v;
  std::error_code ec;
  std::string why;
  ps::decode_reply(in, v, ec, why);
  if (ec) {
    check_error(ec, why);
    return;
  }
  FUZZ_CHECK(why.empty());
  FUZZ_CHECK(v.entries.size() == ps::detail::get<std::uint32_t>(in.data() + 44));
  FUZZ_CHECK(v.message.size() == ps::detail::get<std::uint32_t>(in.data() + 40));
  FUZZ_CHECK(same_bytes({reinterpret_cast<const std::byte*>(v.message.data()), v.message.size()},
                        in.subspan(ps::reply_header_bytes, v.message.size())));
  const std::byte* next = in.data() + ps::reply_header_bytes + v.message.size();
  std::size_t total_values = 0;
  for (const auto& e : v.entries) {
    FUZZ_CHECK(e.kind >= ps::op::pull_dense && e.kind <= ps::op::push_rows);
    FUZZ_CHECK(e.values == next + ps::reply_entry_header_bytes);
    FUZZ_CHECK(within(e.values, e.value_count * 4, in));
    next = e.values + e.value_count * 4;
    total_values += e.value_count;
  }
  FUZZ_CHECK(next == in.data() + in.size());

  // Rebuilt with reply_builder (set_error before the entries: it drops them).
  ps::reply_builder b(v.seq, v.step, v.incarnation);
  b.set_flags(v.flags);
  if (v.status != 0 || !v.message.empty()) b.set_error(static_cast<errc>(v.status), v.message);
  for (const auto& e : v.entries) {
    const std::span<float> dst = b.add(e.kind, e.var, e.slice, e.value_count);
    e.copy_values(dst.data(), 0, dst.size());
  }
  FUZZ_CHECK(b.failed() == (v.status != 0));
  FUZZ_CHECK(same_bytes(b.finish().bytes(), in));

  // A successful reply the way a PS sends pulls: reply_encoder.
  if (v.status == 0 && v.message.empty()) {
    ps::reply_encoder enc(v.seq, v.step, v.incarnation, v.flags, static_cast<std::uint32_t>(v.entries.size()),
                          total_values);
    for (const auto& e : v.entries) {
      enc.begin(e.kind, e.var, e.slice, e.value_count);
      enc.append(values_of(e));
    }
    FUZZ_CHECK(same_bytes(enc.finish().bytes(), in));
    // And the way a PS sends large slices: every other entry's values from
    // their own buffer (the wire's bytes are the host's on little-endian only).
    if constexpr (std::endian::native == std::endian::little) {
      std::size_t copied = 0;
      for (std::size_t i = 0; i < v.entries.size(); i += 2) copied += v.entries[i].value_count;
      ps::reply_encoder sg(v.seq, v.step, v.incarnation, v.flags, static_cast<std::uint32_t>(v.entries.size()), copied);
      for (std::size_t i = 0; i < v.entries.size(); ++i) {
        const auto& e = v.entries[i];
        sg.begin(e.kind, e.var, e.slice, e.value_count);
        if (i % 2 == 0) {
          sg.append(values_of(e));
        } else {
          sg.share(fusewire::tensor_buffer::copy_of({e.values, static_cast<std::size_t>(e.value_count) * 4}));
        }
      }
      const ps::reply_message m = sg.finish_message();
      FUZZ_CHECK(m.size() == in.size());
      FUZZ_CHECK(same_bytes(m.gather().bytes(), in));
    }
  }

  ps::reply_view cut;
  ps::decode_reply(in.first(in.size() - 1), cut, ec, why);
  FUZZ_CHECK(static_cast<bool>(ec));
  check_error(ec, why);
}

// ---- structured: a request and a reply described by the input ------------------

struct recipe_entry {
  ps::op kind;
  std::uint32_t var;
  std::uint32_t slice;
  std::vector<std::int64_t> ids;
  std::vector<float> values;
};

std::vector<recipe_entry> read_entries(fusewire::test::input_reader& r, bool reply) {
  std::vector<recipe_entry> entries(r.below_or(6));
  for (auto& e : entries) {
    e.kind = static_cast<ps::op>(1 + r.u8() % 4);
    e.var = r.u32();
    e.slice = ps::is_rows(e.kind) && !reply ? 0 : r.u32();
    if (!reply && ps::is_rows(e.kind)) e.ids.resize(r.below_or(9));
    if (reply || ps::is_push(e.kind)) e.values.resize(r.below_or(9));
    for (auto& id : e.ids) id = static_cast<std::int64_t>(r.u64());
    for (auto& x : e.values) {
      const std::uint32_t bits = r.u32();
      std::memcpy(&x, &bits, sizeof x);
    }
  }
  return entries;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void fuzz_built(const_buffer in) {
  fusewire::test::input_reader r(in);
  const std::uint64_t incarnation = r.u64(), seq = r.u64(), fingerprint = r.u64(), push_step = r.u64(),
                      min_step = r.u64();
  const std::uint32_t flags = r.u32() & ps::request_flags::all;
  const auto entries = read_entries(r, false);

  ps::request_builder b;
  b.set_header(incarnation, seq, fingerprint, push_step, min_step, flags);
  for (const auto& e : entries) {
    switch (e.kind) {
      case ps::op::pull_dense:
        b.pull_dense(e.var, e.slice);
        break;
      case ps::op::push_dense:
        b.push_dense(e.var, e.slice, e.values);
        break;
      case ps::op::pull_rows:
        b.pull_rows(e.var, e.ids);
        break;
      case ps::op::push_rows:
        b.push_rows(e.var, e.ids, e.values);
        break;
    }
  }
  const fusewire::tensor_buffer request = b.finish();
  FUZZ_CHECK(request.size() == b.bytes());
  ps::request_view v;
  std::error_code ec;
  std::string why;
  ps::decode_request(request.bytes(), v, ec, why);
  FUZZ_CHECK(!ec);
  FUZZ_CHECK(v.incarnation == incarnation && v.seq == seq && v.fingerprint == fingerprint);
  FUZZ_CHECK(v.push_step == push_step && v.min_step == min_step && v.flags == flags);
  FUZZ_CHECK(v.entries.size() == entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& got = v.entries[i];
    const auto& want = entries[i];
    FUZZ_CHECK(got.kind == want.kind && got.var == want.var && got.slice == want.slice);
    FUZZ_CHECK(ids_of(got) == want.ids);
    FUZZ_CHECK(same_floats(values_of(got), want.values));
  }

  // A reply to it: header fields, maybe a failure, then entries.
  const std::uint64_t step = r.u64(), ps_incarnation = r.u64();
  const std::uint32_t reply_flags = r.u32();
  const std::uint32_t status = r.u8() % 4 == 0 ? r.u32() : 0;
  std::string message(r.below_or(40), '\0');
  r.bytes(std::as_writable_bytes(std::span(message)));
  const auto reply_entries = read_entries(r, true);
  ps::reply_builder rb(seq, 0, ps_incarnation);
  rb.set_step(step);
  rb.set_flags(reply_flags);
  if (status != 0 || !message.empty()) rb.set_error(static_cast<errc>(status), message);
  for (const auto& e : reply_entries) {
    const std::span<float> dst = rb.add(e.kind, e.var, e.slice, e.values.size());
    if (!e.values.empty()) std::memcpy(dst.data(), e.values.data(), e.values.size() * sizeof(float));
  }
  const fusewire::tensor_buffer reply = rb.finish();
  ps::reply_view rv;
  ps::decode_reply(reply.bytes(), rv, ec, why);
  FUZZ_CHECK(!ec);
  FUZZ_CHECK(rv.seq == seq && rv.step == step && rv.incarnation == ps_incarnation);
  FUZZ_CHECK(rv.status == status && rv.flags == reply_flags && rv.message == message);
  FUZZ_CHECK(rv.entries.size() == reply_entries.size());
  for (std::size_t i = 0; i < reply_entries.size(); ++i) {
    const auto& got = rv.entries[i];
    const auto& want = reply_entries[i];
    FUZZ_CHECK(got.kind == want.kind && got.var == want.var && got.slice == want.slice);
    FUZZ_CHECK(same_floats(values_of(got), want.values));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const const_buffer in(reinterpret_cast<const std::byte*>(data), size);
  fuzz_request(in);
  fuzz_reply(in);
  fuzz_built(in);
  return 0;
}
