// Unit tests of the ps layer without a network: model/placement, initializers,
// optimizer math, the request/reply encoding, and a shard driven in-process.
#include <fusewire/ps/ps.hpp>
#include <fusewire/wire/frame.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "shard_harness.hpp"
#include "support/reference_optimizer.hpp"

namespace ps_unit_cases {

namespace fw = fusewire;
namespace ps = fusewire::ps;
using fusewire::test::shard_harness;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::system_error& e) {
    return e.what();
  }
  return "(no exception)";
}

ps::model_spec small_model() {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.5f);
  m.min_slice_bytes = 16;                                     // 4 floats: small vars still get sliced
  m.add_dense("w", {4, 2}, ps::initializer::constant(1.0f));  // 32 bytes -> 2 slices on 2 PS
  m.add_dense("b", {2});                                      // 8 bytes -> 1 slice
  m.add_embedding("emb", 3, ps::initializer::uniform(-1.0f, 1.0f, 9), 100);
  return m;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("fusewire_ps_unit_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

ps::request_builder request(const ps::model_spec& m, std::size_t num_ps, std::uint64_t seq, std::uint32_t flags = 0,
                            std::uint64_t push_step = 0, std::uint64_t min_step = 0, std::uint64_t incarnation = 7) {
  ps::request_builder rb;
  rb.set_header(incarnation, seq, m.fingerprint(num_ps), push_step, min_step, flags);
  return rb;
}

/// The first `count` embedding ids (of the 100 in small_model) that `place` puts on PS `ps`.
std::vector<std::int64_t> ids_on(const ps::placement& place, std::uint32_t ps, std::size_t count) {
  std::vector<std::int64_t> ids;
  for (std::int64_t id = 0; id < 100 && ids.size() < count; ++id) {
    if (place.ps_of_id(id) == ps) ids.push_back(id);
  }
  return ids;
}

}  // namespace

TEST_CASE("hash_id is splitmix64's finaliser") {
  CHECK(ps::hash_id(0) == 0xe220a8397b1dcdafull);
  CHECK(ps::hash_id(1) == 0x910a2dec89025cc1ull);
}

TEST_CASE("model_spec validation names the bad variable") {
  ps::model_spec m;
  m.add_dense("a", {3});
  CHECK(error_of([&] { m.add_dense("a", {2}); }) == "variable 'a' is declared twice: invalid argument");
  CHECK(error_of([&] { m.add_dense("z", {3, 0}); }) == "variable 'z': dimension 0 (allowed: >= 1): invalid argument");
  CHECK(error_of([&] { m.add_embedding("e", 0); }) ==
        "variable 'e': an embedding needs shape {num_ids >= 0, 1 <= dim <= 2^20}: invalid argument");
  CHECK(error_of([&] { m.add_dense("o", {1}, {}, ps::optimizer_config::sgd(-1.0f)); }) ==
        "optimizer of 'o': learning_rate = -1.000000 (allowed: > 0): invalid argument");
  CHECK(m.variables.size() == 1);  // failed adds leave nothing behind
  CHECK(error_of([&] { (void)m.index_of("nope"); }) == "unknown variable 'nope' (model has: a): invalid argument");
  CHECK(error_of([&] { ps::placement(m, 0); }) == "placement: num_ps = 0 (allowed: >= 1): invalid argument");
}

TEST_CASE("placement with lanes: a variable's slices go to different tasks before two share one") {
  ps::model_spec m;
  m.min_slice_bytes = 4096;
  m.add_dense("two", {2, 1024});   // 8 KiB: 2 slices
  m.add_dense("four", {4, 1024});  // 16 KiB: 4 slices
  const ps::placement p(m, 6, 3);  // 2 tasks x 3 lanes: places 0-2 on task 0, 3-5 on task 1
  const auto two = p.slices(0);
  REQUIRE(two.size() == 2);
  CHECK(two[0].ps / 3 != two[1].ps / 3);
  const auto four = p.slices(1);
  REQUIRE(four.size() == 4);
  int per_task[2] = {0, 0};
  for (const auto& s : four) ++per_task[s.ps / 3];
  CHECK(per_task[0] == 2);
  CHECK(per_task[1] == 2);
  CHECK(error_of([&] { ps::placement(m, 5, 3); }) ==
        "placement: 5 places are not a whole number of 3-lane PS tasks: invalid argument");
}

TEST_CASE("placement: min-slice partitioning, least-loaded PS, rows split evenly") {
  ps::model_spec m;
  m.min_slice_bytes = 256 * 1024;
  m.add_dense("big", {256, 1024});  // 1 MiB: 4 min-slices, capped at num_ps = 3 -> 3 slices
  m.add_dense("small", {10});       // 40 bytes: one slice, on the least-loaded PS
  m.add_dense("mid", {100, 1024});  // 400 KiB: 1 slice
  m.add_embedding("e", 8);
  const ps::placement p(m, 3);
  auto big = p.slices(0);
  REQUIRE(big.size() == 3);
  CHECK(big[0].ps == 0);
  CHECK(big[0].row_begin == 0);
  CHECK(big[0].row_count == 86);  // 256 = 86 + 85 + 85
  CHECK(big[1].ps == 1);
  CHECK(big[1].row_begin == 86);
  CHECK(big[1].row_count == 85);
  CHECK(big[2].ps == 2);
  CHECK(big[2].row_count == 85);
  CHECK(big[2].element_begin == 171 * 1024);
  CHECK(big[2].element_count == 85 * 1024);
  // ps 1 and 2 hold 85 rows, ps 0 holds 86: small goes to ps 1 (lowest of the least loaded).
  REQUIRE(p.slices(1).size() == 1);
  CHECK(p.slices(1)[0].ps == 1);
  // now ps 2 is the least loaded
  REQUIRE(p.slices(2).size() == 1);
  CHECK(p.slices(2)[0].ps == 2);
  CHECK(p.slices(3).empty());
  CHECK(p.ps_of_id(0) == ps::hash_id(0) % 3);
  CHECK(p.ps_of_id(-5) == ps::hash_id(static_cast<std::uint64_t>(-5)) % 3);

  ps::model_spec tiny;
  tiny.min_slice_bytes = 4;
  tiny.add_dense("v", {5, 1});  // 5 one-float rows over 3 PS: 2, 2, 1
  const ps::placement q(tiny, 3);
  REQUIRE(q.slices(0).size() == 3);
  CHECK(q.slices(0)[0].row_count == 2);
  CHECK(q.slices(0)[1].row_count == 2);
  CHECK(q.slices(0)[2].row_count == 1);
  CHECK(q.slices(0)[2].row_begin == 4);

  ps::model_spec scalar;
  scalar.add_dense("s", {});
  const ps::placement r(scalar, 4);
  REQUIRE(r.slices(0).size() == 1);
  CHECK(r.slices(0)[0].element_count == 1);
}

TEST_CASE("initializers are pure functions of (name, seed, row, col)") {
  const auto u = ps::initializer::uniform(-2.0f, 3.0f, 11);
  const auto n = ps::initializer::normal(1.0f, 0.5f, 11);
  CHECK(ps::initializer::zeros().value("x", 3, 4) == 0.0f);
  CHECK(ps::initializer::constant(2.5f).value("x", 3, 4) == 2.5f);
  double sum = 0, sq = 0;
  bool all_in = true;
  for (std::uint64_t r = 0; r < 100; ++r) {
    for (std::uint64_t c = 0; c < 50; ++c) {
      const float v = u.value("emb", r, c);
      all_in = all_in && v >= -2.0f && v < 3.0f;
      CHECK(v == u.value("emb", r, c));
      const double x = n.value("emb", r, c);
      sum += x;
      sq += x * x;
    }
  }
  CHECK(all_in);
  const double mean = sum / 5000, var = sq / 5000 - mean * mean;
  CHECK(mean == doctest::Approx(1.0).epsilon(0.03));
  CHECK(std::sqrt(var) == doctest::Approx(0.5).epsilon(0.05));
  CHECK(u.value("emb", 1, 2) != u.value("emb2", 1, 2));
  CHECK(u.value("emb", 1, 2) != ps::initializer::uniform(-2.0f, 3.0f, 12).value("emb", 1, 2));
  CHECK(u.value("emb", 1, 2) != u.value("emb", 2, 1));
}

TEST_CASE("optimizer names: every kind by its name, defaults as its factory gives, others refused") {
  using ps::optimizer_config;
  for (const auto& [name, want] :
       {std::pair{"sgd", optimizer_config::sgd(0.5f)}, std::pair{"momentum", optimizer_config::momentum_sgd(0.5f)},
        std::pair{"adagrad", optimizer_config::adagrad(0.5f)}, std::pair{"adam", optimizer_config::adam(0.5f)}}) {
    CAPTURE(name);
    const optimizer_config got = optimizer_config::from_name(name, 0.5f);
    CHECK(got.kind == want.kind);
    CHECK(ps::to_string(got.kind) == name);
    CHECK(ps::optimizer_kind_from_string(name) == want.kind);
    CHECK(got.learning_rate == want.learning_rate);
    CHECK(got.momentum == want.momentum);
    CHECK(got.nesterov == want.nesterov);
    CHECK(got.initial_accumulator == want.initial_accumulator);
    CHECK(got.beta1 == want.beta1);
    CHECK(got.beta2 == want.beta2);
    CHECK(got.epsilon == want.epsilon);
  }
  CHECK_FALSE(ps::optimizer_kind_from_string("Adam").has_value());
  CHECK(error_of([] { (void)optimizer_config::from_name("rmsprop", 0.1f); }) ==
        "optimizer 'rmsprop' is not one of: sgd, momentum, adagrad, adam: invalid argument");
}

TEST_CASE("optimizer math: exact values of the first steps") {
  std::vector<float> w{1.0f}, slots(2, 0.0f);
  const std::vector<float> g{0.5f};
  std::uint64_t t = 0;
  SUBCASE("sgd") {
    ps::apply_update(ps::optimizer_config::sgd(0.1f), w, {}, g, t);
    CHECK(w[0] == doctest::Approx(0.95).epsilon(1e-7));
  }
  SUBCASE("momentum") {
    const auto cfg = ps::optimizer_config::momentum_sgd(0.1f, 0.9f);
    ps::apply_update(cfg, w, std::span<float>(slots.data(), 1), g, t);
    CHECK(w[0] == doctest::Approx(0.95).epsilon(1e-7));
    ps::apply_update(cfg, w, std::span<float>(slots.data(), 1), g, t);
    CHECK(slots[0] == doctest::Approx(0.95).epsilon(1e-7));
    CHECK(w[0] == doctest::Approx(0.855).epsilon(1e-6));
  }
  SUBCASE("nesterov") {
    const auto cfg = ps::optimizer_config::momentum_sgd(0.1f, 0.9f, true);
    ps::apply_update(cfg, w, std::span<float>(slots.data(), 1), g, t);
    CHECK(w[0] == doctest::Approx(1.0 - 0.1 * (0.5 + 0.9 * 0.5)).epsilon(1e-6));
  }
  SUBCASE("adagrad") {
    const auto cfg = ps::optimizer_config::adagrad(0.1f, 0.1f);
    slots[0] = ps::initial_slot_value(cfg, 0);
    ps::apply_update(cfg, w, std::span<float>(slots.data(), 1), g, t);
    CHECK(slots[0] == doctest::Approx(0.35).epsilon(1e-7));
    CHECK(w[0] == doctest::Approx(0.9154845).epsilon(1e-6));
  }
  SUBCASE("adam") {
    const auto cfg = ps::optimizer_config::adam(0.1f);
    ps::apply_update(cfg, w, slots, g, t);
    CHECK(t == 1);
    CHECK(slots[0] == doctest::Approx(0.05).epsilon(1e-6));
    CHECK(slots[1] == doctest::Approx(0.00025).epsilon(1e-5));
    CHECK(w[0] == doctest::Approx(0.9).epsilon(1e-5));  // Adam's first step is lr * sign(g)
    ps::apply_update(cfg, w, slots, g, t);
    CHECK(w[0] == doctest::Approx(0.8).epsilon(1e-5));
  }
}

TEST_CASE("optimizers agree with the independent reference over many steps") {
  // 31 elements: the eight-lane loops (where the CPU has AVX2), the
  // four-lane loops and their scalar tails.
  constexpr std::size_t n = 31;
  for (const auto& cfg : {ps::optimizer_config::sgd(0.05f), ps::optimizer_config::momentum_sgd(0.05f, 0.9f),
                          ps::optimizer_config::momentum_sgd(0.05f, 0.8f, true), ps::optimizer_config::adagrad(0.1f),
                          ps::optimizer_config::adam(0.01f)}) {
    CAPTURE(ps::to_string(cfg.kind));
    std::vector<float> w(n, 0.25f), slots(n * cfg.slots(), ps::initial_slot_value(cfg, 0));
    fw::test::reference_optimizer ref(cfg, w);
    // The same rule one element at a time (never a many-lane loop).
    std::vector<float> w1(n, 0.25f), slots1(n * cfg.slots(), ps::initial_slot_value(cfg, 0));
    std::vector<std::uint64_t> t1(n, 0);
    std::uint64_t t = 0;
    for (int s = 0; s < 20; ++s) {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = fw::test::grad_at(s, i);
      ps::apply_update(cfg, w, slots, g, t, 0.5f);
      for (float& x : g) x *= 0.5f;
      ref.step(g);
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<float> one_slot(cfg.slots());
        for (std::size_t k = 0; k < cfg.slots(); ++k) one_slot[k] = slots1[k * n + i];
        ps::apply_update(cfg, std::span<float>(&w1[i], 1), one_slot, std::span<const float>(&g[i], 1), t1[i]);
        for (std::size_t k = 0; k < cfg.slots(); ++k) slots1[k * n + i] = one_slot[k];
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(w[i] == doctest::Approx(ref.w[i]).epsilon(1e-4));
      CHECK(w[i] == doctest::Approx(w1[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("request encoding round-trips and rejects every malformation") {
  ps::request_builder rb;
  rb.set_header(0x1111, 5, 0xabcdef, 3, 4, ps::request_flags::sync | ps::request_flags::contributes);
  const std::vector<float> grad{1.5f, -2.0f};
  const std::vector<std::int64_t> ids{7, -3};
  const std::vector<float> rows{1, 2, 3, 4};
  rb.pull_dense(2, 1);
  rb.push_dense(2, 1, grad);
  rb.pull_rows(4, ids);
  rb.push_rows(4, ids, rows);
  const fw::tensor_buffer bytes = rb.finish();
  CHECK(bytes.size() == rb.bytes());
  CHECK(bytes.size() == 64 + 4 * 32 + 2 * 4 + 2 * 8 + 2 * 8 + 4 * 4);
  ps::request_view r;
  std::error_code ec;
  std::string why;
  ps::decode_request(bytes.bytes(), r, ec, why);
  REQUIRE(!ec);
  CHECK(r.incarnation == 0x1111);
  CHECK(r.seq == 5);
  CHECK(r.fingerprint == 0xabcdef);
  CHECK(r.push_step == 3);
  CHECK(r.min_step == 4);
  CHECK(r.flags == 3);
  REQUIRE(r.entries.size() == 4);
  CHECK(r.entries[0].kind == ps::op::pull_dense);
  CHECK(r.entries[0].var == 2);
  CHECK(r.entries[0].slice == 1);
  CHECK(r.entries[1].value_count == 2);
  CHECK(r.entries[1].value(1) == -2.0f);
  CHECK(r.entries[2].id_count == 2);
  CHECK(r.entries[2].id(1) == -3);
  CHECK(r.entries[3].value(3) == 4.0f);

  // Every truncation fails cleanly.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    ps::decode_request(fw::const_buffer(bytes.data(), n), r, ec, why);
    CHECK(ec);
  }
  auto mutate = [&](std::size_t at, std::byte v) {
    auto copy = fw::tensor_buffer::copy_of(bytes.bytes());
    copy.data()[at] = v;
    ps::decode_request(copy.bytes(), r, ec, why);
    return why;
  };
  CHECK(mutate(0, std::byte{0}) == "request does not start with 'FWPS'");
  CHECK(mutate(4, std::byte{9}) == "request version 9 (this PS speaks 1)");
  CHECK(mutate(6, std::byte{2}) == "message type is not a request");
  CHECK(mutate(64, std::byte{9}) == "entry 0: unknown op 9");
  CHECK(mutate(65, std::byte{1}) == "entry 0: reserved bytes are not zero");
  CHECK(mutate(55, std::byte{0x10}) == "entry count 268435460 does not fit in 184 bytes");
  CHECK(mutate(64 + 16, std::byte{1}) == "entry 0: a dense op carries ids");
  CHECK(mutate(64 + 32 + 31, std::byte{0x7f}).starts_with("entry 1: 9151314442816847874 values do not fit"));
  CHECK(mutate(49, std::byte{1}) == "unknown request flags 0x103");
  auto longer = fw::tensor_buffer::allocate(bytes.size() + 3);
  std::memcpy(longer.data(), bytes.data(), bytes.size());
  ps::decode_request(longer.bytes(), r, ec, why);
  CHECK(ec == fw::make_error_code(fw::errc::malformed_frame));
  CHECK(why == "3 bytes after the last entry");
}

TEST_CASE("a gathered request has the same bytes as an encoded one, large values left in place") {
  std::vector<float> big(8192, 1.5f), big2(5000, -2.0f), small(3, 7.0f);
  const std::vector<std::int64_t> ids{4, 9};
  std::vector<float> rows(2 * 3000, 0.25f);
  ps::request_builder rb;
  rb.push_dense(0, 0, big);
  rb.pull_dense(1, 0);
  rb.push_dense(2, 1, small);
  rb.push_rows(3, ids, rows);
  rb.push_dense(4, 0, big2);
  rb.set_header(1, 2, 3, 4, 5, ps::request_flags::sync);
  const fw::tensor_buffer flat = rb.finish();
  auto concat = [](const ps::request_builder::encoded& e) {
    std::vector<std::byte> out;
    for (const fw::const_buffer& seg : e.segments) out.insert(out.end(), seg.begin(), seg.end());
    return out;
  };
  const std::vector<std::byte> expected(flat.data(), flat.data() + flat.size());
  // Everything inline: one segment, the head itself.
  const auto inline_all = rb.finish_gathered(0);
  CHECK(inline_all.segments.size() == 1);
  CHECK(inline_all.bytes == flat.size());
  CHECK(concat(inline_all) == expected);
  // From 16 KiB: big (32 KiB), rows (24 KiB) and big2 (20 KiB) stay in the caller's memory.
  const auto gathered = rb.finish_gathered(16 * 1024);
  CHECK(gathered.bytes == flat.size());
  CHECK(concat(gathered) == expected);
  std::size_t in_place = 0;
  for (const fw::const_buffer& seg : gathered.segments) {
    const auto* p = reinterpret_cast<const float*>(seg.data());
    in_place += (p == big.data() || p == big2.data() || p == rows.data()) ? 1 : 0;
  }
  CHECK(in_place == 3);
  CHECK(gathered.head.size() == flat.size() - (big.size() + big2.size() + rows.size()) * 4);
  // At most max_gathered arrays stay out of line, the largest ones.
  ps::request_builder many;
  std::vector<std::vector<float>> grads;
  for (std::size_t i = 0; i < ps::request_builder::max_gathered + 8; ++i) grads.emplace_back(5000 + i, 1.0f);
  for (std::uint32_t i = 0; i < grads.size(); ++i) many.push_dense(i, 0, grads[i]);
  const auto capped = many.finish_gathered(1024);
  std::size_t out_of_line = 0;
  for (const fw::const_buffer& seg : capped.segments) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (reinterpret_cast<const float*>(seg.data()) == grads[i].data()) {
        ++out_of_line;
        CHECK(i >= 8);  // the 8 smallest were copied
      }
    }
  }
  CHECK(out_of_line == ps::request_builder::max_gathered);
  const fw::tensor_buffer many_flat = many.finish();
  CHECK(concat(capped) == std::vector<std::byte>(many_flat.data(), many_flat.data() + many_flat.size()));
}

TEST_CASE("reply encoding round-trips") {
  ps::reply_builder rb(9, 12, 77);
  auto v = rb.add(ps::op::pull_dense, 1, 2, 3);
  v[0] = 1;
  v[1] = 2;
  v[2] = 3;
  rb.add(ps::op::pull_rows, 4, 0, 0);
  const auto bytes = rb.finish();
  ps::reply_view r;
  std::error_code ec;
  std::string why;
  ps::decode_reply(bytes.bytes(), r, ec, why);
  REQUIRE(!ec);
  CHECK(r.seq == 9);
  CHECK(r.step == 12);
  CHECK(r.incarnation == 77);
  REQUIRE(r.entries.size() == 2);
  std::vector<float> out(3);
  r.entries[0].copy_values(out.data(), 0, 3);
  CHECK(out == std::vector<float>{1, 2, 3});
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    ps::decode_reply(fw::const_buffer(bytes.data(), n), r, ec, why);
    CHECK(ec);
  }
  ps::decode_reply(fw::const_buffer(bytes.data(), 10), r, ec, why);
  CHECK(ec == fw::errc::truncated_frame);
  CHECK(why == "reply of 10 bytes is shorter than its " + std::to_string(ps::reply_header_bytes) + "-byte header");
  auto mutate = [&](std::size_t at, std::byte b) {
    auto copy = fw::tensor_buffer::copy_of(bytes.bytes());
    copy.data()[at] = b;
    ps::decode_reply(copy.bytes(), r, ec, why);
    return why;
  };
  CHECK(mutate(0, std::byte{0}) == "reply does not start with 'FWPS'");
  CHECK(ec == fw::errc::bad_magic);
  CHECK(mutate(4, std::byte{7}) == "reply version 7 (this PS speaks 1)");
  CHECK(ec == fw::errc::unsupported_version);
  CHECK(mutate(6, std::byte{1}) == "message type is not a reply");
  CHECK(ec == fw::errc::malformed_frame);
  // The entries are checked like a request's, with the same words.
  const std::size_t e0 = ps::reply_header_bytes;
  const std::size_t e1 = e0 + ps::reply_entry_header_bytes + 3 * 4;
  CHECK(mutate(44, std::byte{9}) == "entry count 9 does not fit in " + std::to_string(bytes.size() - e0) + " bytes");
  CHECK(mutate(e0, std::byte{5}) == "reply entry 0: unknown op 5");
  CHECK(ec == fw::errc::malformed_frame);
  CHECK(mutate(e0 + 2, std::byte{1}) == "reply entry 0: reserved bytes are not zero");
  CHECK(mutate(e1 + 13, std::byte{1}) == "reply entry 1: reserved bytes are not zero");
  CHECK(mutate(e0 + 23, std::byte{1}) == "reply entry 0: 72057594037927939 values do not fit in the " +
                                             std::to_string(bytes.size() - e0 - ps::reply_entry_header_bytes) +
                                             " bytes left");
  CHECK(ec == fw::errc::truncated_frame);
  CHECK(mutate(43, std::byte{1}) ==
        "reply: 16777216 message bytes do not fit in the " + std::to_string(bytes.size() - e0) + " bytes left");
  std::vector<std::byte> longer(bytes.bytes().begin(), bytes.bytes().end());
  longer.resize(longer.size() + 3);
  ps::decode_reply(fw::const_buffer(longer.data(), longer.size()), r, ec, why);
  CHECK(why == "3 bytes after the last entry");
  CHECK(ec == fw::errc::malformed_frame);
  ps::reply_builder err(3, 0, 0);
  err.set_error(fw::errc::size_mismatch, "bad");
  ps::decode_reply(err.finish().bytes(), r, ec, why);
  REQUIRE(!ec);
  CHECK(r.status == static_cast<std::uint32_t>(fw::errc::size_mismatch));
  CHECK(r.message == "bad");
}

TEST_CASE("shard: dense pull and push, sparse rows created on first touch") {
  const auto m = small_model();
  const ps::placement place(m, 2);
  REQUIRE(place.slices(0).size() == 2);
  const auto& s0 = place.slices(0)[0];
  shard_harness h(m, s0.ps, 2);
  auto rb = request(m, 2, 1);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  REQUIRE(!out[0].ec);
  CHECK(out[0].reply.status == 0);
  CHECK(out[0].values(0) == std::vector<float>(4, 1.0f));

  const std::vector<float> g{1, 2, 3, 4};
  rb = request(m, 2, 2);
  rb.push_dense(0, 0, g);
  rb.pull_dense(0, 0);
  out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.step == 1);
  CHECK(out[0].values(0) == std::vector<float>{0.5f, 0.0f, -0.5f, -1.0f});  // sgd lr 0.5

  // Rows: ids that hash to this PS; first touch initialises them deterministically.
  std::vector<std::int64_t> mine;
  for (std::int64_t id = 0; mine.size() < 3; ++id) {
    if (place.ps_of_id(id) == s0.ps) mine.push_back(id);
  }
  CHECK(h.shard.row_count(2) == 0);
  rb = request(m, 2, 3);
  rb.pull_rows(2, mine);
  out = h.send(1, rb);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].reply.status == 0);
  auto rows = out[0].values(0);
  REQUIRE(rows.size() == 9);
  for (std::size_t k = 0; k < 3; ++k) {
    for (std::size_t c = 0; c < 3; ++c) {
      CHECK(rows[k * 3 + c] == m.variables[2].init.value("emb", static_cast<std::uint64_t>(mine[k]), c));
    }
  }
  CHECK(h.shard.row_count(2) == 3);
  // Duplicate ids in one push are summed and applied once.
  const std::vector<std::int64_t> dup{mine[0], mine[0]};
  const std::vector<float> gr{1, 1, 1, 1, 1, 1};
  rb = request(m, 2, 4);
  rb.push_rows(2, dup, gr);
  rb.pull_rows(2, std::span<const std::int64_t>(mine.data(), 1));
  out = h.send(1, rb);
  REQUIRE(out[0].reply.status == 0);
  for (std::size_t c = 0; c < 3; ++c) CHECK(out[0].values(0)[c] == doctest::Approx(rows[c] - 0.5f * 2.0f));
}

TEST_CASE("shard: bad requests get error replies naming the problem; the shard keeps serving") {
  const auto m = small_model();
  const ps::placement place(m, 2);
  const std::uint32_t me = place.slices(0)[0].ps;
  shard_harness h(m, me, 2);
  auto expect_error = [&](ps::request_builder rb, fw::errc code, const std::string& msg) {
    auto out = h.send(0, std::move(rb));
    REQUIRE(out.size() == 1);
    CHECK(out[0].reply.status == static_cast<std::uint32_t>(code));
    CHECK(out[0].reply.message == msg);
  };
  auto rb = request(m, 2, 1);
  rb.pull_dense(9, 0);
  expect_error(rb, fw::errc::invalid_argument,
               "ps " + std::to_string(me) + ": entry 0 (pull): variable index 9 out of range (model has 3)");
  rb = request(m, 2, 2);
  rb.pull_dense(2, 0);
  expect_error(
      rb, fw::errc::invalid_argument,
      "ps " + std::to_string(me) + ": entry 0 (pull): variable 'emb' is an embedding (use pull_rows/push_rows)");
  const std::vector<float> three{1, 2, 3};
  rb = request(m, 2, 3);
  rb.push_dense(0, 0, three);
  expect_error(
      rb, fw::errc::size_mismatch,
      "ps " + std::to_string(me) + ": entry 0 (push): variable 'w' slice 0: gradient of 3 values, the slice has 4");
  rb = request(m, 2, 4);
  rb.pull_dense(0, 1);
  expect_error(
      rb, fw::errc::invalid_argument,
      "ps " + std::to_string(me) + ": entry 0 (pull): variable 'w' slice 1 is not on ps " + std::to_string(me));
  const std::vector<std::int64_t> far{100};
  rb = request(m, 2, 5);
  rb.pull_rows(2, far);
  expect_error(rb, fw::errc::invalid_argument,
               "ps " + std::to_string(me) + ": entry 0 (pull_rows): variable 'emb': id 100 out of range [0, 100)");
  std::int64_t other = 0;
  while (place.ps_of_id(other) == me) ++other;
  const std::vector<std::int64_t> wrong{other};
  rb = request(m, 2, 6);
  rb.pull_rows(2, wrong);
  expect_error(rb, fw::errc::invalid_argument,
               "ps " + std::to_string(me) + ": entry 0 (pull_rows): variable 'emb': id " + std::to_string(other) +
                   " belongs to ps " + std::to_string(1 - me) + ", not ps " + std::to_string(me));
  ps::request_builder foreign;
  foreign.set_header(7, 7, 12345, 0, 0, 0);
  expect_error(foreign, fw::errc::invalid_argument,
               "ps " + std::to_string(me) +
                   ": model fingerprint mismatch: the worker's model_spec (or PS count) differs from this PS's");
  rb = request(m, 2, 8, ps::request_flags::sync);
  expect_error(rb, fw::errc::invalid_argument,
               "ps " + std::to_string(me) + ": training mode mismatch: the worker trains sync, this PS async");
  // A request with a valid push and an invalid entry applies nothing.
  const std::vector<float> g4{1, 1, 1, 1};
  rb = request(m, 2, 9);
  rb.push_dense(0, 0, g4);
  rb.pull_dense(7, 0);
  (void)h.send(0, rb);
  CHECK(h.shard.dense_values(0, 0)[0] == 1.0f);
  // Garbage bytes.
  h.replies.clear();
  auto junk = fw::tensor_buffer::allocate(10);
  std::memset(junk.data(), 0x5a, 10);
  h.shard.handle(0, std::move(junk));
  REQUIRE(h.replies.size() == 1);
  CHECK(h.replies[0].reply.status == static_cast<std::uint32_t>(fw::errc::truncated_frame));
  CHECK(h.replies[0].reply.message ==
        "ps " + std::to_string(me) + ": malformed request: request of 10 bytes is shorter than its 64-byte header");
  // Still serving.
  rb = request(m, 2, 10);
  rb.pull_dense(0, 0);
  auto out = h.send(1, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.status == 0);
  CHECK(h.shard.stats().errors == 10);
}

TEST_CASE("shard: a resent request's pushes are applied once") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  shard_harness h(m, me, 2);
  const std::vector<float> g{1, 1, 1, 1};
  for (int i = 0; i < 2; ++i) {
    auto rb = request(m, 2, 1);
    rb.push_dense(0, 0, g);
    rb.pull_dense(0, 0);
    auto out = h.send(0, rb);
    REQUIRE(out.size() == 1);
    CHECK(out[0].values(0)[0] == 0.5f);
  }
  CHECK(h.shard.stats().duplicates == 1);
  CHECK(h.shard.global_step() == 1);
  // A new client incarnation with seq 1 is not a duplicate.
  auto rb = request(m, 2, 1, 0, 0, 0, 8);
  rb.push_dense(0, 0, g);
  (void)h.send(0, rb);
  CHECK(h.shard.dense_values(0, 0)[0] == 0.0f);
}

TEST_CASE("shard: sync step averages two workers and holds pulls until it is applied") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  ps::server_options so;
  so.mode = ps::training_mode::sync;
  shard_harness h(m, me, 2, so, 2);
  const std::uint32_t sync_push = ps::request_flags::sync | ps::request_flags::contributes;
  const std::vector<float> g0{1, 1, 1, 1}, g1{3, 3, 3, 3};
  auto rb = request(m, 2, 1, sync_push, 0, 1);
  rb.push_dense(0, 0, g0);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  CHECK(out.empty());  // worker 0 waits for worker 1
  CHECK(h.shard.global_step() == 0);
  CHECK(h.shard.dense_values(0, 0)[0] == 1.0f);
  // A stale contribution (step already applied) is dropped — here none yet; worker 1 completes step 0.
  rb = request(m, 2, 1, sync_push, 0, 1, 9);
  rb.push_dense(0, 0, g1);
  rb.pull_dense(0, 0);
  out = h.send(1, rb);
  REQUIRE(out.size() == 2);
  CHECK(h.shard.global_step() == 1);
  for (const auto& c : out) {
    CHECK(c.reply.step == 1);
    CHECK(c.values(0) == std::vector<float>(4, 1.0f - 0.5f * 2.0f));  // mean gradient 2
  }
  std::set<std::uint32_t> who{out[0].worker, out[1].worker};
  CHECK(who == std::set<std::uint32_t>{0, 1});
  // A late push for step 0 is stale: dropped and flagged.
  rb = request(m, 2, 2, sync_push, 0, 1);
  rb.push_dense(0, 0, g0);
  out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK((out[0].reply.flags & ps::reply_flags::stale) != 0);
  CHECK(h.shard.stats().stale_pushes == 1);
  // A plain pull (min_step 0) never waits.
  rb = request(m, 2, 3, ps::request_flags::sync);
  rb.pull_dense(0, 0);
  out = h.send(0, rb);
  CHECK(out.size() == 1);
}

TEST_CASE("shard: checkpoint round trip restores values, slots, rows, step") {
  auto m = small_model();
  m.optimizer = ps::optimizer_config::adam(0.1f);
  const ps::placement place(m, 2);
  const std::uint32_t me = place.slices(0)[0].ps;
  const auto dir = temp_dir("ckpt");
  ps::server_options so;
  so.checkpoint_dir = dir;
  const std::vector<std::int64_t> mine = ids_on(place, me, 4);
  std::vector<float> before_w, before_rows;
  {
    shard_harness h(m, me, 2, so);
    for (int s = 0; s < 3; ++s) {
      std::vector<float> g(4), gr(12);
      for (std::size_t i = 0; i < 4; ++i) g[i] = fw::test::grad_at(s, i);
      for (std::size_t i = 0; i < 12; ++i) gr[i] = fw::test::grad_at(s, i, 1);
      auto rb = request(m, 2, static_cast<std::uint64_t>(s + 1), s == 2 ? ps::request_flags::save : 0u);
      rb.push_dense(0, 0, g);
      rb.push_rows(2, mine, gr);
      auto out = h.send(0, rb);
      REQUIRE(out.size() == 1);
      REQUIRE(out[0].reply.status == 0);
    }
    CHECK(h.shard.stats().checkpoints == 1);
    auto w = h.shard.dense_values(0, 0);
    before_w.assign(w.begin(), w.end());
    for (auto id : mine) {
      auto r = h.shard.row_values(2, id);
      before_rows.insert(before_rows.end(), r.begin(), r.end());
    }
    CHECK(std::filesystem::exists(ps::checkpoint_path(dir, me, 2)));
    CHECK(!std::filesystem::exists(ps::checkpoint_path(dir, me, 2).string() + ".tmp"));
  }
  shard_harness restored(m, me, 2, so);
  CHECK(restored.shard.global_step() == 3);
  CHECK(restored.shard.restored_step() == 3);
  auto w = restored.shard.dense_values(0, 0);
  CHECK(std::vector<float>(w.begin(), w.end()) == before_w);
  std::vector<float> rows;
  for (auto id : mine) {
    auto r = restored.shard.row_values(2, id);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  CHECK(rows == before_rows);
  // The slots came back too: one more identical step on both gives identical values.
  shard_harness fresh(m, me, 2);  // no checkpoint: differs
  std::vector<float> g(4, 0.25f);
  auto rb = request(m, 2, 100, 0, 0, 0, 99);
  rb.push_dense(0, 0, g);
  (void)restored.send(0, rb);
  // Adam's 4th step from the restored state: compute it from the saved values with the saved slots
  // by replaying the same 4 steps on a fresh shard.
  for (int s = 0; s < 3; ++s) {
    std::vector<float> gs(4), gr(12);
    for (std::size_t i = 0; i < 4; ++i) gs[i] = fw::test::grad_at(s, i);
    for (std::size_t i = 0; i < 12; ++i) gr[i] = fw::test::grad_at(s, i, 1);
    auto r2 = request(m, 2, static_cast<std::uint64_t>(s + 1));
    r2.push_dense(0, 0, gs);
    r2.push_rows(2, mine, gr);
    (void)fresh.send(0, r2);
  }
  (void)fresh.send(0, rb);
  auto a = restored.shard.dense_values(0, 0), b = fresh.shard.dense_values(0, 0);
  CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));

  // A damaged file is refused with a message naming it; a different model too.
  const auto file = ps::checkpoint_path(dir, me, 2);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  CHECK(error_of([&] { shard_harness bad(m, me, 2, so); }) ==
        "checkpoint " + file.string() + ": checksum mismatch (corrupt or truncated): invalid argument");
  std::filesystem::remove_all(dir);
}

TEST_CASE("shard: a checkpoint of another model is refused") {
  auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  const auto dir = temp_dir("other");
  ps::server_options so;
  so.checkpoint_dir = dir;
  {
    shard_harness h(m, me, 2, so);
    h.shard.save(h.shard.checkpoint_file());
  }
  m.add_dense("extra", {3});
  CHECK(error_of([&] { shard_harness bad(m, me, 2, so); }) ==
        "checkpoint " + ps::checkpoint_path(dir, me, 2).string() +
            ": written for a different model_spec or PS count: invalid argument");
  so.restore = false;
  CHECK_NOTHROW(shard_harness ok(m, me, 2, so));
  std::filesystem::remove_all(dir);
}

TEST_CASE("shard: a save request without a checkpoint directory fails with a reason") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  shard_harness h(m, me, 2);
  auto out = h.send(0, request(m, 2, 1, ps::request_flags::save));
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.status == static_cast<std::uint32_t>(fw::errc::invalid_argument));
  CHECK(out[0].reply.message ==
        "ps " + std::to_string(me) + ": checkpoint failed: this PS has no checkpoint_dir: invalid argument");
}

TEST_CASE("shard: barrier answers every worker once all arrived, counts a resend once, and is reusable") {
  const auto m = small_model();
  shard_harness h(m, 0, 1, {}, 3);
  const auto arrive = [&](std::uint32_t w, std::uint64_t seq, std::uint64_t generation) {
    return h.send(w, request(m, 1, seq, ps::request_flags::barrier, generation, 0, 7 + w));
  };
  for (std::uint64_t gen = 0; gen < 2; ++gen) {
    const std::uint64_t base = gen * 10 + 1;
    CHECK(arrive(0, base, gen).empty());
    CHECK(arrive(0, base, gen).empty());  // a resend: workers 1 and 2 are still missing
    CHECK(arrive(1, base + 1, gen).empty());
    auto out = arrive(2, base + 2, gen);
    REQUIRE(out.size() == 3);
    for (std::uint32_t w = 0; w < 3; ++w) {
      CHECK(out[w].worker == w);
      CHECK(out[w].reply.status == 0);
      CHECK(out[w].reply.seq == base + w);
    }
    CHECK(h.shard.barrier_generation() == gen + 1);
  }
  // An arrival at a barrier already passed (its reply was lost) is answered at once.
  auto late = arrive(1, 30, 0);
  REQUIRE(late.size() == 1);
  CHECK(late[0].reply.status == 0);
  CHECK(h.shard.barrier_generation() == 2);
}

TEST_CASE("shard: a request may not cost more than the PS holds") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  shard_harness h(m, me, 2);
  // The same dense slice twice: refused, naming the repeat.
  auto rb = request(m, 2, 1);
  rb.pull_dense(0, 0);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.status == static_cast<std::uint32_t>(fw::errc::invalid_argument));
  CHECK(out[0].reply.message.find("already in entry 0") != std::string::npos);
  // The same row many times: the reply would outgrow everything the PS holds.
  const std::vector<std::int64_t> mine = ids_on(ps::placement(m, 2), me, 1);
  REQUIRE(mine.size() == 1);
  // request_builder keeps views: the ids must outlive the send.
  const std::vector<std::int64_t> many(5000, mine[0]);
  rb = request(m, 2, 2);
  rb.pull_rows(2, many);
  out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  INFO(out[0].reply.message);
  CHECK(out[0].reply.status == static_cast<std::uint32_t>(fw::errc::invalid_argument));
  CHECK(out[0].reply.message.find("more than this PS holds") != std::string::npos);
  // A few repeats within what it holds are still answered.
  const std::vector<std::int64_t> twice(2, mine[0]);
  rb = request(m, 2, 3);
  rb.pull_rows(2, twice);
  out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  INFO(out[0].reply.message);
  CHECK(out[0].reply.status == 0);
}

TEST_CASE("shard: max_new_rows bounds the rows one request creates") {
  auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  ps::server_options so;
  so.max_new_rows = 3;
  shard_harness h(m, me, 2, so);
  const std::vector<std::int64_t> ids = ids_on(ps::placement(m, 2), me, 4);
  REQUIRE(ids.size() == 4);
  auto rb = request(m, 2, 1);
  rb.pull_rows(2, ids);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.message.find("would create 4 embedding rows") != std::string::npos);
  CHECK(h.shard.row_count(2) == 0);
  rb = request(m, 2, 2);
  rb.pull_rows(2, std::span<const std::int64_t>(ids).first(3));
  out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.status == 0);
  CHECK(h.shard.row_count(2) == 3);
}

TEST_CASE("shard: replies say whether the PS restored a checkpoint") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  shard_harness h(m, me, 2);
  auto rb = request(m, 2, 1);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK((out[0].reply.flags & ps::reply_flags::fresh) != 0);
}

TEST_CASE("shard: a lost worker fails the sync step and the barrier that wait for it, naming it") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  ps::server_options so;
  so.mode = ps::training_mode::sync;
  shard_harness h(m, me, 2, so, 2);
  const std::uint32_t sync_push = ps::request_flags::sync | ps::request_flags::contributes;
  // request_builder keeps views: the gradients must outlive each send.
  const std::vector<float> ones{1, 1, 1, 1}, threes{3, 3, 3, 3};
  auto rb = request(m, 2, 1, sync_push, 0, 1);
  rb.push_dense(0, 0, ones);
  rb.pull_dense(0, 0);
  CHECK(h.send(0, rb).empty());  // waits for worker 1
  h.replies.clear();
  h.shard.worker_lost(1, "connection reset by peer");
  REQUIRE(h.replies.size() == 1);
  CHECK(h.replies[0].worker == 0);
  CHECK(h.replies[0].reply.status == static_cast<std::uint32_t>(fw::errc::peer_lost));
  CHECK(h.replies[0].reply.message.find("worker:1 was lost (connection reset by peer)") != std::string::npos);
  // A new request for that step is answered at once, until worker 1 is back.
  rb = request(m, 2, 2, sync_push, 0, 1);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.status == static_cast<std::uint32_t>(fw::errc::peer_lost));
  rb = request(m, 2, 1, sync_push, 0, 1, 11);  // worker 1 restarted: a new incarnation
  rb.push_dense(0, 0, threes);
  rb.pull_dense(0, 0);
  out = h.send(1, rb);
  REQUIRE(out.size() == 1);  // its own pull: the step completed with both pushes
  CHECK(out[0].reply.status == 0);
  CHECK(h.shard.global_step() == 1);

  // The barrier: worker 0 waits, worker 1 is lost.
  ps::server_options ao;
  shard_harness b(m, me, 2, ao, 2);
  rb = request(m, 2, 1, ps::request_flags::barrier, 0);
  CHECK(b.send(0, rb).empty());
  b.replies.clear();
  b.shard.worker_lost(1, "keepalive");
  REQUIRE(b.replies.size() == 1);
  CHECK(b.replies[0].reply.status == static_cast<std::uint32_t>(fw::errc::peer_lost));
  CHECK(b.replies[0].reply.message.find("barrier: worker:1 was lost") != std::string::npos);
}

TEST_CASE("shard: a waiting sync request resent many times is queued and answered once") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  ps::server_options so;
  so.mode = ps::training_mode::sync;
  so.max_waiting_per_worker = 2;
  shard_harness h(m, me, 2, so, 2);
  const std::uint32_t sync_push = ps::request_flags::sync | ps::request_flags::contributes;
  const std::vector<float> g0{1, 1, 1, 1}, g1{3, 3, 3, 3};
  // Worker 0 hears nothing while worker 1 is slow, and resends its step every retry interval.
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto rb = request(m, 2, 1, sync_push, 0, 1);
    rb.push_dense(0, 0, g0);
    rb.pull_dense(0, 0);
    CHECK(h.send(0, rb).empty());
  }
  auto rb = request(m, 2, 1, sync_push, 0, 1, 9);
  rb.push_dense(0, 0, g1);
  rb.pull_dense(0, 0);
  const auto out = h.send(1, rb);
  REQUIRE(out.size() == 2);
  CHECK(h.shard.global_step() == 1);
  for (const auto& c : out) {
    CHECK(c.reply.status == 0);
    CHECK(c.values(0) == std::vector<float>(4, 1.0f - 0.5f * 2.0f));  // worker 0's push counted once
  }
  std::set<std::uint32_t> who{out[0].worker, out[1].worker};
  CHECK(who == std::set<std::uint32_t>{0, 1});
}

TEST_CASE("shard: sync requests waiting for their step are bounded per worker") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  ps::server_options so;
  so.mode = ps::training_mode::sync;
  so.max_waiting_per_worker = 2;
  shard_harness h(m, me, 2, so, 2);
  for (std::uint64_t seq = 1; seq <= 2; ++seq) {
    auto rb = request(m, 2, seq, ps::request_flags::sync, 0, 1);
    rb.pull_dense(0, 0);
    CHECK(h.send(0, rb).empty());
  }
  auto rb = request(m, 2, 3, ps::request_flags::sync, 0, 1);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.message.find("max_waiting_per_worker") != std::string::npos);
}

TEST_CASE("shard: a waiting sync step names the workers that pushed and those it still waits for") {
  const auto m = small_model();
  const std::uint32_t me = ps::placement(m, 2).slices(0)[0].ps;
  ps::server_options so;
  so.mode = ps::training_mode::sync;
  shard_harness h(m, me, 2, so, 3);
  const std::uint32_t sync_push = ps::request_flags::sync | ps::request_flags::contributes;
  const std::vector<float> g{1, 1, 1, 1};
  CHECK_FALSE(h.shard.step_waiting());
  CHECK_FALSE(h.shard.step_wait().waiting);
  // Worker 0 pushes for step 1 and waits; worker 1 only pulls (it waits too); worker 2 sends nothing.
  auto rb = request(m, 2, 1, sync_push, 0, 1);
  rb.push_dense(0, 0, g);
  rb.pull_dense(0, 0);
  CHECK(h.send(0, rb).empty());
  rb = request(m, 2, 1, ps::request_flags::sync, 0, 1, 8);
  rb.pull_dense(0, 0);
  CHECK(h.send(1, rb).empty());
  CHECK(h.shard.step_waiting());
  ps::wait_state s = h.shard.step_wait();
  CHECK(s.waiting);
  CHECK(s.number == 1);
  CHECK(s.needed == 3);
  CHECK(s.arrived() == std::vector<std::uint32_t>{0});
  CHECK(s.missing() == std::vector<std::uint32_t>{1, 2});
  CHECK(s.workers[0].pushed_step == 1);
  CHECK(s.workers[0].requests_waiting == 1);
  CHECK(s.workers[1].seen);
  CHECK(s.workers[1].pushed_step == 0);
  CHECK(s.workers[1].requests_waiting == 1);
  CHECK_FALSE(s.workers[2].seen);
  CHECK(s.workers[2].lost.empty());

  // The block a stall report logs: the missing ones with what the PS knows, the arrived one only as arrived.
  ps::detail::wait_context ctx{"ps:" + std::to_string(me),     "worker", false, false, std::chrono::milliseconds(1234),
                               std::chrono::milliseconds(300), {}};
  ctx.last_request = {std::chrono::milliseconds(1200), std::chrono::milliseconds(50), std::nullopt};
  const std::string block = ps::detail::format_wait(s, ctx);
  MESSAGE(block);
  CHECK(block.starts_with("ps server ps:" + std::to_string(me) +
                          ": stall report: sync step 1 has waited 1.234 s (FUSEWIRE_STALL_MS = 300) for pushes: 1 of 3 "
                          "in, waiting for worker:1, worker:2\n  arrived: worker:0\n"));
  CHECK(block.find("\n  worker:1: connected, no push for step 1 yet; no push from it so far; last request 0.050 s "
                   "ago; 1 of its requests wait here") != std::string::npos);
  CHECK(block.find("\n  worker:2: no request from it yet") != std::string::npos);
  CHECK(block.find("worker:0:") == std::string::npos);

  // Worker 2 is lost: named so (the step cannot complete; the waiting requests got errors).
  h.shard.worker_lost(2, "connection reset by peer");
  s = h.shard.step_wait();
  CHECK(s.waiting);  // worker 0's push is in; the step waits for worker 2 to come back
  CHECK(s.missing() == std::vector<std::uint32_t>{1, 2});
  CHECK(s.workers[2].lost == "connection reset by peer");
  ctx.last_request.clear();
  CHECK(ps::detail::format_wait(s, ctx).find("\n  worker:2: lost (connection reset by peer)") != std::string::npos);

  // Everyone pushes: the step completes, and step 2 waits for nobody yet.
  for (std::uint32_t w = 1; w < 3; ++w) {
    rb = request(m, 2, 2, sync_push, 0, 1, 20 + w);
    rb.push_dense(0, 0, g);
    h.send(w, rb);
  }
  CHECK(h.shard.global_step() == 1);
  CHECK_FALSE(h.shard.step_waiting());
  s = h.shard.step_wait();
  CHECK_FALSE(s.waiting);
  CHECK(s.number == 2);
  CHECK(s.arrived().empty());
  CHECK(s.workers[2].pushed_step == 1);
}

TEST_CASE("shard: a waiting barrier names the workers that arrived and those it still waits for") {
  const auto m = small_model();
  shard_harness h(m, 0, 1, {}, 3);
  const auto arrive = [&](std::uint32_t w, std::uint64_t seq, std::uint64_t generation) {
    return h.send(w, request(m, 1, seq, ps::request_flags::barrier, generation, 0, 7 + w));
  };
  CHECK_FALSE(h.shard.barrier_waiting());
  CHECK(arrive(0, 1, 0).empty());
  CHECK(arrive(2, 1, 0).empty());
  CHECK(h.shard.barrier_waiting());
  ps::wait_state s = h.shard.barrier_wait();
  CHECK(s.waiting);
  CHECK(s.number == 0);
  CHECK(s.needed == 3);
  CHECK(s.arrived() == std::vector<std::uint32_t>{0, 2});
  CHECK(s.missing() == std::vector<std::uint32_t>{1});
  ps::detail::wait_context ctx{"ps:0", "worker", true, true, std::chrono::milliseconds(20), {}, {}};
  const std::string block = ps::detail::format_wait(s, ctx);
  MESSAGE(block);
  CHECK(block ==
        "ps server ps:0: snapshot (SIGUSR1): barrier 0 has waited 0.020 s for workers: 2 of 3 arrived, waiting for "
        "worker:1\n  arrived: worker:0, worker:2\n  worker:1: no request from it yet");
  // Worker 1 was heard from (a push), but is not at the barrier.
  auto rb = request(m, 1, 1, 0, 0, 0, 8);
  rb.pull_dense(1, 0);
  REQUIRE(h.send(1, rb).size() == 1);
  CHECK(ps::detail::format_wait(h.shard.barrier_wait(), ctx).find("\n  worker:1: connected, not at barrier 0 yet") !=
        std::string::npos);
  REQUIRE(arrive(1, 2, 0).size() == 3);
  CHECK_FALSE(h.shard.barrier_waiting());
  s = h.shard.barrier_wait();
  CHECK_FALSE(s.waiting);
  CHECK(s.number == 1);
  CHECK(s.missing().size() == 3);
}

namespace {

/// One PS holding "big" (8 x 1024 floats: shared by replies), "b" (2 floats:
/// copied into them) and the embedding "emb" (dim 4); SGD with lr 0.5.
ps::model_spec big_model() {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.5f);
  m.min_slice_bytes = 1 << 20;  // one slice each
  m.add_dense("big", {8, 1024}, ps::initializer::constant(1.0f));
  m.add_dense("b", {2}, ps::initializer::constant(2.0f));
  m.add_embedding("emb", 4, ps::initializer::constant(3.0f), 100);
  return m;
}
constexpr std::size_t big_floats = 8 * 1024;
constexpr std::size_t big_bytes = big_floats * 4;

bool same_bytes(const fw::tensor_buffer& a, const fw::tensor_buffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TEST_CASE("shard: a pull reply shares a large dense slice, copies small ones and rows, and decodes the same") {
  static_assert(big_bytes >= ps::shard::share_min_bytes);
  const auto m = big_model();
  shard_harness h(m, 0, 1);
  h.hold = true;
  const std::vector<std::int64_t> ids{5, 7};
  auto rb = request(m, 1, 1);
  rb.pull_dense(0, 0);
  rb.pull_dense(1, 0);
  rb.pull_rows(2, ids);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  REQUIRE(!out[0].ec);
  REQUIRE(out[0].reply.entries.size() == 3);
  CHECK(out[0].values(0) == std::vector<float>(big_floats, 1.0f));
  CHECK(out[0].values(1) == std::vector<float>(2, 2.0f));
  CHECK(out[0].values(2) == std::vector<float>(8, 3.0f));
  // The headers, "big"'s own buffer, then the rest (b's values and the rows copied in).
  REQUIRE(h.held.size() == 1);
  const ps::reply_message& r = h.held[0];
  REQUIRE(r.sg.size() == 3);
  CHECK(r.sg[0].size() == ps::reply_header_bytes + ps::reply_entry_header_bytes);
  CHECK(r.sg[1].size() == big_bytes);
  CHECK(r.sg[1].data() == reinterpret_cast<const std::byte*>(h.shard.dense_values(0, 0).data()));
  CHECK(r.sg[2].size() == 2 * ps::reply_entry_header_bytes + (2 + 8) * 4);
  CHECK(r.owners.size() == 2);
  CHECK(h.shard.stats().shared_reply_bytes == big_bytes);
  CHECK(h.shard.stats().cow_copies == 0);
}

TEST_CASE("shard: a reply being sent keeps its values byte for byte while pushes update the slice") {
  const auto m = big_model();
  shard_harness h(m, 0, 1);
  h.hold = true;
  auto rb = request(m, 1, 1);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  const fw::tensor_buffer before = std::move(out[0].bytes);

  // The push finds the slice held by the reply: the slice moves to a copy, which it updates.
  std::vector<float> g(big_floats);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7);
  rb = request(m, 1, 2);
  rb.push_dense(0, 0, g);
  out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].reply.status == 0);
  CHECK(h.shard.stats().cow_copies == 1);
  REQUIRE(h.held.size() == 2);  // the pull's reply and the push's
  CHECK(same_bytes(h.held[0].gather(), before));
  const auto now = h.shard.dense_values(0, 0);
  for (std::size_t i = 0; i < now.size(); ++i) REQUIRE(now[i] == 1.0f - 0.5f * g[i]);

  // Nothing holds the new buffer: the next push updates it in place.
  rb = request(m, 1, 3);
  rb.push_dense(0, 0, g);
  h.send(0, rb);
  CHECK(h.shard.stats().cow_copies == 1);
  CHECK(same_bytes(h.held[0].gather(), before));
  CHECK(h.shard.dense_values(0, 0)[1] == 1.0f - 2 * 0.5f);

  // Once the replies are gone (sent), pulls and pushes copy nothing.
  h.hold = false;
  h.held.clear();
  for (std::uint64_t seq = 4; seq < 8; ++seq) {
    rb = request(m, 1, seq);
    rb.push_dense(0, 0, g);
    rb.pull_dense(0, 0);
    out = h.send(0, rb);
    REQUIRE(out.size() == 1);
    CHECK(out[0].values(0)[1] == doctest::Approx(1.0f - static_cast<float>(seq - 1) * 0.5f));
  }
  CHECK(h.shard.stats().cow_copies == 1);
  CHECK(h.shard.stats().shared_reply_bytes == 5 * big_bytes);
}

TEST_CASE("shard: dense slices and their copy-on-write copies come from the value allocator; replies share them") {
  std::vector<const std::byte*> given;  // every buffer the allocator made
  auto allocate = [&given](std::size_t n) {
    fw::tensor_buffer b = fw::tensor_buffer::allocate(n);
    given.push_back(b.data());
    return b;
  };
  const auto m = big_model();
  shard_harness h(m, 0, 1, {}, 2, allocate);
  REQUIRE(given.size() == 2);  // "big" and "b"; embedding rows are not slices
  CHECK(h.shard.dense_values(0, 0).data() == reinterpret_cast<const float*>(given[0]));
  CHECK(h.shard.dense_values(1, 0).data() == reinterpret_cast<const float*>(given[1]));

  h.hold = true;
  auto rb = request(m, 1, 1);
  rb.pull_dense(0, 0);
  REQUIRE(h.send(0, rb).size() == 1);
  REQUIRE(h.held.size() == 1);
  const auto& owners = h.held[0].owners;
  CHECK(std::any_of(owners.begin(), owners.end(), [&](const fw::tensor_buffer& b) { return b.data() == given[0]; }));

  // A push while the reply holds the slice: its fresh copy comes from the allocator too.
  rb = request(m, 1, 2);
  const std::vector<float> g(big_floats, 1.0f);  // sent from where it lies: kept until sent
  rb.push_dense(0, 0, g);
  REQUIRE(h.send(0, rb).size() == 1);
  CHECK(h.shard.stats().cow_copies == 1);
  REQUIRE(given.size() == 3);
  CHECK(h.shard.dense_values(0, 0).data() == reinterpret_cast<const float*>(given[2]));
  CHECK(h.shard.dense_values(0, 0)[0] == 0.5f);
}

TEST_CASE("shard: sync: a pull that waited for step s keeps the state after s while step s + 1 is applied") {
  const auto m = big_model();
  ps::server_options so;
  so.mode = ps::training_mode::sync;
  shard_harness h(m, 0, 1, so, 2);
  h.hold = true;
  const std::uint32_t sync_push = ps::request_flags::sync | ps::request_flags::contributes;
  const std::vector<float> g(big_floats, 1.0f);
  auto step = [&](std::uint64_t s) {
    auto rb = request(m, 1, s, sync_push, s - 1, s);
    rb.push_dense(0, 0, g);
    rb.pull_dense(0, 0);
    CHECK(h.send(0, rb).empty());  // waits for worker 1
    rb = request(m, 1, s, sync_push, s - 1, 0, 9);
    rb.push_dense(0, 0, g);
    return h.send(1, rb);
  };
  auto out = step(1);
  REQUIRE(out.size() == 2);
  const auto& pulled = out[0].worker == 0 ? out[0] : out[1];
  CHECK(pulled.reply.step == 1);
  CHECK(pulled.values(0) == std::vector<float>(big_floats, 0.5f));
  const fw::tensor_buffer after_1 = pulled.bytes.share();
  const std::size_t held_pull = out[0].worker == 0 ? 0 : 1;
  CHECK(h.shard.stats().cow_copies == 0);
  // Step 2 is applied while the step-1 reply is still being sent.
  out = step(2);
  REQUIRE(out.size() == 2);
  CHECK(h.shard.stats().cow_copies == 1);
  CHECK(h.shard.dense_values(0, 0)[0] == 0.0f);
  CHECK(same_bytes(h.held[held_pull].gather(), after_1));
}

TEST_CASE("shard: a restore leaves a reply being sent as it was") {
  const auto m = big_model();
  const auto dir = temp_dir("restore_held");
  ps::server_options so;
  so.checkpoint_dir = dir;
  shard_harness h(m, 0, 1, so);
  const std::vector<float> g(big_floats, 1.0f);
  h.shard.save(h.shard.checkpoint_file());
  auto rb = request(m, 1, 1);
  rb.push_dense(0, 0, g);
  h.send(0, rb);
  h.hold = true;
  rb = request(m, 1, 2);
  rb.pull_dense(0, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  CHECK(out[0].values(0)[0] == 0.5f);
  h.shard.restore(h.shard.checkpoint_file());
  CHECK(h.shard.stats().cow_copies == 1);
  CHECK(h.shard.dense_values(0, 0)[0] == 1.0f);
  CHECK(same_bytes(h.held[0].gather(), out[0].bytes));
  std::filesystem::remove_all(dir);
}

TEST_CASE("shard: a push whose values are not aligned for float is copied, then applied alike") {
  const auto m = big_model();
  shard_harness aligned(m, 0, 1);
  shard_harness odd(m, 0, 1);
  std::vector<float> g(big_floats);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 5) - 2.0f;
  const std::vector<std::int64_t> ids{3, 8, 3};
  const std::vector<float> gr{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  auto rb = request(m, 1, 1);
  rb.push_dense(0, 0, g);
  rb.push_rows(2, ids, gr);
  const fw::tensor_buffer req = rb.finish();
  // The same bytes one byte off a float boundary.
  const fw::tensor_buffer storage = fw::tensor_buffer::allocate(req.size() + 1);
  std::memcpy(storage.data() + 1, req.data(), req.size());
  const fw::tensor_buffer shifted = fw::tensor_buffer::view(storage.data() + 1, req.size());
  REQUIRE(ps::detail::floats_in_place(req.data() + ps::request_header_bytes + ps::entry_header_bytes) != nullptr);
  REQUIRE(ps::detail::floats_in_place(shifted.data() + ps::request_header_bytes + ps::entry_header_bytes) == nullptr);

  aligned.shard.handle(0, req.share());
  odd.shard.handle(0, shifted.share());
  REQUIRE(aligned.replies.size() == 1);
  REQUIRE(odd.replies.size() == 1);
  CHECK(odd.replies[0].reply.status == 0);
  CHECK(aligned.shard.stats().gradient_copies == 0);
  CHECK(odd.shard.stats().gradient_copies == 2);  // both entries
  const auto a = aligned.shard.dense_values(0, 0), o = odd.shard.dense_values(0, 0);
  REQUIRE(a.size() == big_floats);
  CHECK(std::equal(a.begin(), a.end(), o.begin(), o.end()));
  CHECK(a[1] == 1.0f - 0.5f * g[1]);
  for (std::int64_t id : {3, 8}) {
    const auto ra = aligned.shard.row_values(2, id), ro = odd.shard.row_values(2, id);
    REQUIRE(ra.size() == 4);
    CHECK(std::equal(ra.begin(), ra.end(), ro.begin(), ro.end()));
  }
  // Id 3 twice: its two gradient rows summed, applied once.
  CHECK(aligned.shard.row_values(2, 3)[0] == 3.0f - 0.5f * (1.0f + 9.0f));
  CHECK(aligned.shard.row_values(2, 8)[3] == 3.0f - 0.5f * 8.0f);
}

TEST_CASE("shard: a pull of many large slices stays within a frame's scatter-gather segments") {
  ps::model_spec m;
  m.min_slice_bytes = 1 << 20;
  const std::size_t vars = 600;  // more than max_segments / 2 slices of share_min_bytes
  for (std::size_t v = 0; v < vars; ++v) {
    m.add_dense("v" + std::to_string(v), {ps::shard::share_min_bytes / 4}, ps::initializer::constant(1.0f));
  }
  shard_harness h(m, 0, 1);
  h.hold = true;
  auto rb = request(m, 1, 1);
  for (std::uint32_t v = 0; v < vars; ++v) rb.pull_dense(v, 0);
  auto out = h.send(0, rb);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].reply.status == 0);
  REQUIRE(out[0].reply.entries.size() == vars);
  for (std::size_t v = 0; v < vars; ++v) {
    REQUIRE(out[0].values(v) == std::vector<float>(ps::shard::share_min_bytes / 4, 1.0f));
  }
  const std::size_t max_shared = (fw::wire::limits{}.max_segments - 1) / 2;
  REQUIRE(h.held.size() == 1);
  CHECK(h.held[0].sg.size() <= fw::wire::limits{}.max_segments);
  CHECK(h.held[0].owners.size() == 1 + max_shared);
  CHECK(h.shard.stats().shared_reply_bytes == max_shared * ps::shard::share_min_bytes);
}

}  // namespace ps_unit_cases
