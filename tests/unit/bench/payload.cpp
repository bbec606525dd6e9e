#include "payload.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <set>

#include "support/error_text.hpp"

using namespace fusewire::bench;
using fusewire::test::error_text_of;

namespace {

constexpr std::size_t S = 10, M = 10 * kib, L = mib;

payload_spec with_scheme(scheme s) {
  payload_spec p;
  p.kind = s;
  return p;
}

std::string category_letters(const buffer_plan& plan) {
  std::string out;
  for (category c : plan.categories) out += display_name(c)[0];
  return out;
}

}  // namespace

TEST_CASE("the paper's categories: defaults and ranges") {
  CHECK(default_size(category::small) == 10);
  CHECK(default_size(category::medium) == 10 * 1024);
  CHECK(default_size(category::large) == 1024 * 1024);
  CHECK(range_of(category::small).min == 1);
  CHECK(range_of(category::small).max == 1023);
  CHECK(range_of(category::medium).min == 1024);
  CHECK(range_of(category::medium).max == 1024 * 1024 - 1);
  CHECK(range_of(category::large).min == 1024 * 1024);
  CHECK(range_of(category::large).max == 10 * 1024 * 1024);
  CHECK(category_of(1023) == category::small);
  CHECK(category_of(1024) == category::medium);
  CHECK(category_of(mib) == category::large);
}

TEST_CASE("uniform cycles through the categories in order") {
  const buffer_plan plan = plan_payload(with_scheme(scheme::uniform));
  REQUIRE(plan.sizes.size() == 10);
  CHECK(plan.sizes == std::vector<std::size_t>{S, M, L, S, M, L, S, M, L, S});
  CHECK(category_letters(plan) == "SMLSMLSMLS");
  CHECK(plan.count_of(category::small) == 4);
  CHECK(plan.count_of(category::medium) == 3);
  CHECK(plan.count_of(category::large) == 3);
  CHECK(plan.total() == 4 * S + 3 * M + 3 * L);

  payload_spec only_small = with_scheme(scheme::uniform);
  only_small.categories = {category::small};
  only_small.count = 4;
  only_small.sizes[0] = 100;
  CHECK(plan_payload(only_small).sizes == std::vector<std::size_t>{100, 100, 100, 100});

  payload_spec order = with_scheme(scheme::uniform);
  order.categories = {category::large, category::small};
  order.count = 3;
  CHECK(category_letters(plan_payload(order)) == "LSL");
}

TEST_CASE("skew: 60% Large, 30% Medium, 10% Small by default") {
  const buffer_plan plan = plan_payload(with_scheme(scheme::skew));
  CHECK(category_letters(plan) == "LLLLLLMMMS");
  CHECK(plan.total() == 6 * L + 3 * M + S);  // 6,322,186 B: the paper's 6.3 MB skew payload

  payload_spec small = with_scheme(scheme::skew);
  small.bias = category::small;
  CHECK(category_letters(plan_payload(small)) == "SSSSSSMMML");

  payload_spec medium = with_scheme(scheme::skew);
  medium.bias = category::medium;
  CHECK(category_letters(plan_payload(medium)) == "MMMMMMSSSL");

  payload_spec two = with_scheme(scheme::skew);
  two.categories = {category::small, category::large};
  CHECK(category_letters(plan_payload(two)) == "LLLLLLSSSS");
}

TEST_CASE("skew counts round by largest remainder") {
  const std::vector<category> all{category::small, category::medium, category::large};
  auto counts = [&](std::size_t n) {
    const auto c = skew_counts(n, category::large, all);
    return std::vector<std::size_t>{c[2], c[1], c[0]};  // L, M, S
  };
  CHECK(counts(10) == std::vector<std::size_t>{6, 3, 1});
  CHECK(counts(7) == std::vector<std::size_t>{4, 2, 1});  // 4.2, 2.1, 0.7
  CHECK(counts(3) == std::vector<std::size_t>{2, 1, 0});  // 1.8, 0.9, 0.3
  CHECK(counts(2) == std::vector<std::size_t>{1, 1, 0});  // 1.2, 0.6, 0.2
  CHECK(counts(20) == std::vector<std::size_t>{12, 6, 2});
  for (std::size_t n = 2; n <= 100; ++n) {
    const auto c = counts(n);
    CHECK(c[0] + c[1] + c[2] == n);
    CHECK(c[0] >= c[1]);
    CHECK(c[1] >= c[2]);
  }
}

TEST_CASE("random is reproducible: same seed and stream, same payload") {
  payload_spec p = with_scheme(scheme::random);
  p.seed = 7;
  const buffer_plan a = plan_payload(p, 0);
  const buffer_plan b = plan_payload(p, 0);
  CHECK(a.sizes == b.sizes);
  CHECK(a.categories == b.categories);
  // Pinned: mt19937_64's output is fixed by the standard and the bounded draw
  // is ours, so this sequence is the same everywhere.
  CHECK(category_letters(a) == "LMSSSLLSLL");

  const buffer_plan other_worker = plan_payload(p, 1);
  CHECK(category_letters(other_worker) == "SSSLLSLLSL");
  p.seed = 8;
  CHECK(category_letters(plan_payload(p, 0)) == "MLMSMLLMML");
}

TEST_CASE("random draws only the chosen categories; random sizes stay in range") {
  payload_spec p = with_scheme(scheme::random);
  p.categories = {category::small, category::large};
  p.count = 200;
  std::set<category> seen;
  for (category c : plan_payload(p).categories) seen.insert(c);
  CHECK(seen == std::set<category>{category::small, category::large});

  p.random_sizes = true;
  p.count = 100;
  p.categories = {category::small, category::medium, category::large};
  const buffer_plan plan = plan_payload(p, 3);
  std::set<std::size_t> distinct;
  for (std::size_t i = 0; i < plan.sizes.size(); ++i) {
    const size_range r = range_of(plan.categories[i]);
    CHECK(plan.sizes[i] >= r.min);
    CHECK(plan.sizes[i] <= r.max);
    distinct.insert(plan.sizes[i]);
  }
  CHECK(distinct.size() > 50);
  CHECK(plan_payload(p, 3).sizes == plan.sizes);
}

TEST_CASE("custom lists keep the given sizes and order") {
  payload_spec p = with_scheme(scheme::custom);
  p.custom = {10, 64 * kib, 4 * mib, 1};
  const buffer_plan plan = plan_payload(p);
  CHECK(plan.sizes == std::vector<std::size_t>{10, 64 * kib, 4 * mib, 1});
  CHECK(category_letters(plan) == "SMLS");
}

TEST_CASE("a payload owns one buffer per planned size, filled reproducibly") {
  payload_spec p = with_scheme(scheme::custom);
  p.custom = {10, 3000, 1};
  const buffer_plan plan = plan_payload(p);
  const payload a(plan, 5);
  const payload b(plan, 5);
  const payload c(plan, 6);
  REQUIRE(a.count() == 3);
  CHECK(a.total_size() == 3011);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(a.buffers()[i].size() == plan.sizes[i]);
    CHECK(std::memcmp(a.buffers()[i].data(), b.buffers()[i].data(), plan.sizes[i]) == 0);
  }
  CHECK(a.buffers()[0].data() != b.buffers()[0].data());
  CHECK(std::memcmp(a.buffers()[1].data(), c.buffers()[1].data(), 3000) != 0);
  // Separate allocations, as separate tensors are.
  CHECK(a.buffers()[0].data() + 10 != a.buffers()[1].data());
}

TEST_CASE("sizes parse with K and M suffixes and print readably") {
  CHECK(parse_size("10", "--small") == 10);
  CHECK(parse_size("10B", "--small") == 10);
  CHECK(parse_size("10K", "--medium") == 10 * kib);
  CHECK(parse_size("10kib", "--medium") == 10 * kib);
  CHECK(parse_size("1.5K", "--medium") == 1536);
  CHECK(parse_size("1M", "--large") == mib);
  CHECK(parse_size("4MiB", "--large") == 4 * mib);
  CHECK(format_size(10) == "10 B");
  CHECK(format_size(10 * kib) == "10 KiB");
  CHECK(format_size(mib) == "1 MiB");
  CHECK(format_size(6 * L + 3 * M + S) == "6.03 MiB");
  CHECK(error_text_of([] { parse_size("abc", "--small"); }) ==
        "--small 'abc' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
  CHECK(error_text_of([] { parse_size("10X", "--small"); }) ==
        "--small '10X' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
  CHECK(error_text_of([] { parse_size("1.5", "--small"); }) == "--small '1.5' is not a whole number of bytes");
  CHECK(error_text_of([] { parse_size("", "--buffers"); }) ==
        "--buffers '' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
}

TEST_CASE("names parse, and bad ones say what is allowed") {
  CHECK(parse_scheme("skew") == scheme::skew);
  CHECK(parse_scheme("Uniform") == scheme::uniform);
  CHECK(parse_categories("large,small", "--categories") == std::vector<category>{category::large, category::small});
  CHECK(error_text_of([] { parse_scheme("zipf"); }) ==
        "--scheme 'zipf' is not a scheme; choose uniform, random, skew or custom");
  CHECK(error_text_of([] { parse_category("huge", "--skew-bias"); }) ==
        "--skew-bias 'huge' is not a buffer category; choose small, medium or large");
  CHECK(error_text_of([] { parse_categories("small,small", "--categories"); }) ==
        "--categories small,small: 'small' is listed twice");
  CHECK(error_text_of([] { parse_size_list("10,x", "--buffers"); }) ==
        "--buffers 'x' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
}

TEST_CASE("range checks name the option, the value and the allowed range") {
  payload_spec p;
  p.sizes[0] = 2000;
  CHECK(error_text_of([&] { validate(p); }) ==
        "--small 2000: out of range, Small buffers are 1 B up to (not including) 1 KiB");
  p = {};
  p.sizes[0] = 0;
  CHECK(error_text_of([&] { validate(p); }) ==
        "--small 0: out of range, Small buffers are 1 B up to (not including) 1 KiB");
  p = {};
  p.sizes[1] = 512;
  CHECK(error_text_of([&] { validate(p); }) ==
        "--medium 512: out of range, Medium buffers are 1 KiB up to (not including) 1 MiB");
  p = {};
  p.sizes[1] = mib;
  CHECK(error_text_of([&] { validate(p); }) ==
        "--medium 1048576: out of range, Medium buffers are 1 KiB up to (not including) 1 MiB");
  p = {};
  p.sizes[2] = 20 * mib;
  CHECK(error_text_of([&] { validate(p); }) == "--large 20971520: out of range, Large buffers are 1 MiB to 10 MiB");
  p = {};
  p.sizes[2] = 10 * mib;
  CHECK_NOTHROW(validate(p));
  p = {};
  p.count = 0;
  CHECK(error_text_of([&] { validate(p); }) == "--count 0: out of range, a payload has 1 to 1024 buffers");
  p.count = 1025;
  CHECK(error_text_of([&] { validate(p); }) == "--count 1025: out of range, a payload has 1 to 1024 buffers");
}

TEST_CASE("scheme rules: random and skew need two categories, skew its bias and two buffers") {
  payload_spec p = with_scheme(scheme::skew);
  p.categories = {category::large};
  CHECK(error_text_of([&] { validate(p); }) ==
        "--scheme skew needs at least two buffer categories, --categories has only 'large'");
  p.kind = scheme::random;
  CHECK(error_text_of([&] { validate(p); }) ==
        "--scheme random needs at least two buffer categories, --categories has only 'large'");
  p.kind = scheme::uniform;
  CHECK_NOTHROW(validate(p));

  p = with_scheme(scheme::skew);
  p.categories = {category::medium, category::large};
  p.bias = category::small;
  CHECK(error_text_of([&] { validate(p); }) == "--skew-bias small: Small is not among --categories (medium,large)");
  p.bias = category::large;
  p.count = 1;
  CHECK(error_text_of([&] { validate(p); }) == "--count 1: the skew scheme needs at least 2 buffers");

  p = with_scheme(scheme::uniform);
  p.categories = {};
  CHECK(error_text_of([&] { validate(p); }) == "--categories is empty; choose one or more of small, medium, large");
  p.categories = {category::small, category::small};
  CHECK(error_text_of([&] { validate(p); }) == "--categories small,small: 'small' is listed twice");
}

TEST_CASE("custom list rules") {
  payload_spec p = with_scheme(scheme::custom);
  CHECK(error_text_of([&] { validate(p); }) ==
        "--scheme custom needs --buffers SIZE,SIZE,... (for example --buffers 10,10K,1M)");
  p.custom = {10, 11 * mib};
  CHECK(error_text_of([&] { validate(p); }) == "--buffers entry 2 (11534336): out of range, a buffer is 1 B to 10 MiB");
  p.custom = {0};
  CHECK(error_text_of([&] { validate(p); }) == "--buffers entry 1 (0): out of range, a buffer is 1 B to 10 MiB");
  p.custom.assign(1025, 10);
  CHECK(error_text_of([&] { validate(p); }) ==
        "--buffers has 1025 entries: out of range, a payload has 1 to 1024 buffers");
}

TEST_CASE("a payload may not pass 1 GiB") {
  payload_spec p = with_scheme(scheme::uniform);
  p.categories = {category::large};
  p.sizes[2] = 10 * mib;
  p.count = 200;
  CHECK(error_text_of([&] { plan_payload(p); }) == "the payload totals 1.95 GiB in 200 buffers; the limit is 1 GiB");
  p.count = 102;
  CHECK(plan_payload(p).total() == 1020 * mib);
}
