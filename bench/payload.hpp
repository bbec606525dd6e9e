#pragma once
/// fwbench payloads: TF-gRPC-Bench's iovec buffers (Small, Medium, Large), the
/// schemes that lay them out in one payload (uniform, random, skew, custom),
/// and the buffers themselves.
///
/// A payload is planned from a `payload_spec` (validated, with errors that
/// name the option and the allowed range) and then allocated once per worker;
/// every call of a run sends the same buffers, so every backend sees the same
/// bytes for the same seed.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fusewire/core/error.hpp>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fusewire::bench {

/// One read-only iovec buffer of a payload.
using const_buffer = std::span<const std::byte>;

inline constexpr std::size_t kib = 1024;
inline constexpr std::size_t mib = 1024 * 1024;
inline constexpr std::size_t gib = 1024 * mib;

/// Most buffers in one payload: IOV_MAX on Linux.
inline constexpr std::size_t max_buffer_count = 1024;
/// Largest payload fwbench builds (all buffers together).
inline constexpr std::size_t max_payload_bytes = gib;

/// The paper's buffer size categories (Table 1).
enum class category : std::uint8_t { small = 0, medium = 1, large = 2 };

/// How buffers are laid out in one payload (paper, section 3.2).
enum class scheme : std::uint8_t { uniform, random, skew, custom };

/// Inclusive byte range of a category: Small [1 B, 1 KiB), Medium [1 KiB, 1 MiB), Large [1 MiB, 10 MiB].
struct size_range {
  std::size_t min = 0;
  std::size_t max = 0;
};

constexpr size_range range_of(category c) noexcept {
  switch (c) {
    case category::small:
      return {1, kib - 1};
    case category::medium:
      return {kib, mib - 1};
    case category::large:
      return {mib, 10 * mib};
  }
  return {};
}

constexpr std::size_t default_size(category c) noexcept {
  switch (c) {
    case category::small:
      return 10;
    case category::medium:
      return 10 * kib;
    case category::large:
      return mib;
  }
  return 0;
}

/// Capitalised name as in the paper ("Small").
constexpr std::string_view display_name(category c) noexcept {
  switch (c) {
    case category::small:
      return "Small";
    case category::medium:
      return "Medium";
    case category::large:
      return "Large";
  }
  return "?";
}

/// Name used on the command line ("small").
constexpr std::string_view option_name(category c) noexcept {
  switch (c) {
    case category::small:
      return "small";
    case category::medium:
      return "medium";
    case category::large:
      return "large";
  }
  return "?";
}

constexpr std::string_view option_name(scheme s) noexcept {
  switch (s) {
    case scheme::uniform:
      return "uniform";
    case scheme::random:
      return "random";
    case scheme::skew:
      return "skew";
    case scheme::custom:
      return "custom";
  }
  return "?";
}

/// Human-readable size: "10 B", "10 KiB", "1 MiB", "6.03 MiB".
inline std::string format_size(std::size_t bytes) {
  auto with_unit = [](double value, const char* unit) {
    char text[48];
    if (value == static_cast<double>(static_cast<std::uint64_t>(value))) {
      std::snprintf(text, sizeof text, "%llu %s", static_cast<unsigned long long>(value), unit);
    } else {
      std::snprintf(text, sizeof text, "%.3g %s", value, unit);
    }
    return std::string(text);
  };
  if (bytes >= gib) return with_unit(static_cast<double>(bytes) / gib, "GiB");
  if (bytes >= mib) return with_unit(static_cast<double>(bytes) / mib, "MiB");
  if (bytes >= kib) return with_unit(static_cast<double>(bytes) / kib, "KiB");
  return with_unit(static_cast<double>(bytes), "B");
}

namespace detail {

[[noreturn]] inline void bad_option(const std::string& what) { throw_error(errc::invalid_argument, what); }

inline std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

inline std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

}  // namespace detail

/// Parses "10", "10B", "10K", "10KiB", "1M", "1.5M" (K = 1024 B, M = 1024 K);
/// throws `system_error(errc::invalid_argument)` naming `option` otherwise.
inline std::size_t parse_size(std::string_view text, std::string_view option) {
  auto fail = [&] {
    detail::bad_option(std::string(option) + " '" + std::string(text) +
                       "' is not a size; use bytes with an optional K, KiB, M or MiB suffix (1 K = 1024 B)");
  };
  std::size_t digits = 0;
  bool seen_dot = false;
  while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || (text[digits] == '.' && !seen_dot))) {
    seen_dot = seen_dot || text[digits] == '.';
    ++digits;
  }
  if (digits == 0 || text.substr(0, digits) == ".") fail();
  const std::string number(text.substr(0, digits));
  const std::string unit = detail::lower(text.substr(digits));
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    scale = kib;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    scale = mib;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    scale = gib;
  else
    fail();
  const double value = std::stod(number) * scale;
  if (value > 1e18) fail();
  const auto bytes = static_cast<std::size_t>(value);
  if (static_cast<double>(bytes) != value) {
    detail::bad_option(std::string(option) + " '" + std::string(text) + "' is not a whole number of bytes");
  }
  return bytes;
}

inline category parse_category(std::string_view text, std::string_view option) {
  const std::string name = detail::lower(text);
  for (category c : {category::small, category::medium, category::large}) {
    if (name == option_name(c)) return c;
  }
  detail::bad_option(std::string(option) + " '" + std::string(text) +
                     "' is not a buffer category; choose small, medium or large");
}

/// Parses "small,medium,large" (order kept; each at most once).
inline std::vector<category> parse_categories(std::string_view list, std::string_view option) {
  std::vector<category> out;
  for (std::string_view part : detail::split(list, ',')) {
    const category c = parse_category(part, option);
    if (std::find(out.begin(), out.end(), c) != out.end()) {
      detail::bad_option(std::string(option) + " " + std::string(list) + ": '" + std::string(option_name(c)) +
                         "' is listed twice");
    }
    out.push_back(c);
  }
  return out;
}

inline scheme parse_scheme(std::string_view text, std::string_view option = "--scheme") {
  const std::string name = detail::lower(text);
  for (scheme s : {scheme::uniform, scheme::random, scheme::skew, scheme::custom}) {
    if (name == option_name(s)) return s;
  }
  detail::bad_option(std::string(option) + " '" + std::string(text) +
                     "' is not a scheme; choose uniform, random, skew or custom");
}

/// Parses a custom buffer list "10,10K,1M" (every entry 1 B to 10 MiB).
inline std::vector<std::size_t> parse_size_list(std::string_view list, std::string_view option) {
  std::vector<std::size_t> sizes;
  for (std::string_view part : detail::split(list, ',')) {
    sizes.push_back(parse_size(part, option));
  }
  return sizes;
}

/// Small, Medium and Large, in that order.
inline std::vector<category> all_categories() {
  std::vector<category> out(3);
  out[0] = category::small;
  out[1] = category::medium;
  out[2] = category::large;
  return out;
}

/// Everything that decides a payload's layout; the CLI fills it, `validate` checks it.
struct payload_spec {
  scheme kind = scheme::uniform;
  std::size_t count = 10;  ///< buffers per payload (not used by `custom`)
  std::array<std::size_t, 3> sizes{default_size(category::small), default_size(category::medium),
                                   default_size(category::large)};  ///< indexed by category
  std::vector<category> categories = all_categories();
  category bias = category::large;  ///< which category `skew` favours (60%)
  bool random_sizes = false;        ///< `random`: draw each size within its category's range
  std::uint64_t seed = 1;           ///< `random`: same seed, same payload
  std::vector<std::size_t> custom;  ///< `custom`: the buffer sizes, in order

  std::size_t size_of(category c) const noexcept { return sizes[static_cast<std::size_t>(c)]; }
  friend bool operator==(const payload_spec&, const payload_spec&) = default;
};

/// Checks one category size against the paper's range for it.
inline void validate_category_size(category c, std::size_t bytes) {
  const size_range r = range_of(c);
  if (bytes >= r.min && bytes <= r.max) return;
  std::string allowed;
  switch (c) {
    case category::small:
      allowed = "1 B up to (not including) 1 KiB";
      break;
    case category::medium:
      allowed = "1 KiB up to (not including) 1 MiB";
      break;
    case category::large:
      allowed = "1 MiB to 10 MiB";
      break;
  }
  detail::bad_option("--" + std::string(option_name(c)) + " " + std::to_string(bytes) + ": out of range, " +
                     std::string(display_name(c)) + " buffers are " + allowed);
}

namespace detail {

inline std::string join_categories(const std::vector<category>& cats) {
  std::string out;
  for (category c : cats) {
    if (!out.empty()) out += ',';
    out += option_name(c);
  }
  return out;
}

}  // namespace detail

/// Throws `system_error(errc::invalid_argument)` naming the first bad value.
inline void validate(const payload_spec& spec) {
  for (category c : {category::small, category::medium, category::large}) {
    validate_category_size(c, spec.size_of(c));
  }
  if (spec.kind == scheme::custom) {
    if (spec.custom.empty()) {
      detail::bad_option("--scheme custom needs --buffers SIZE,SIZE,... (for example --buffers 10,10K,1M)");
    }
    if (spec.custom.size() > max_buffer_count) {
      detail::bad_option("--buffers has " + std::to_string(spec.custom.size()) +
                         " entries: out of range, a payload has 1 to 1024 buffers");
    }
    for (std::size_t i = 0; i < spec.custom.size(); ++i) {
      if (spec.custom[i] < 1 || spec.custom[i] > 10 * mib) {
        detail::bad_option("--buffers entry " + std::to_string(i + 1) + " (" + std::to_string(spec.custom[i]) +
                           "): out of range, a buffer is 1 B to 10 MiB");
      }
    }
    return;
  }
  if (spec.count < 1 || spec.count > max_buffer_count) {
    detail::bad_option("--count " + std::to_string(spec.count) + ": out of range, a payload has 1 to 1024 buffers");
  }
  if (spec.categories.empty()) {
    detail::bad_option("--categories is empty; choose one or more of small, medium, large");
  }
  for (std::size_t i = 0; i < spec.categories.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (spec.categories[i] == spec.categories[j]) {
        detail::bad_option("--categories " + detail::join_categories(spec.categories) + ": '" +
                           std::string(option_name(spec.categories[i])) + "' is listed twice");
      }
    }
  }
  if ((spec.kind == scheme::random || spec.kind == scheme::skew) && spec.categories.size() < 2) {
    detail::bad_option("--scheme " + std::string(option_name(spec.kind)) +
                       " needs at least two buffer categories, --categories has only '" +
                       detail::join_categories(spec.categories) + "'");
  }
  if (spec.kind == scheme::skew) {
    if (std::find(spec.categories.begin(), spec.categories.end(), spec.bias) == spec.categories.end()) {
      detail::bad_option("--skew-bias " + std::string(option_name(spec.bias)) + ": " +
                         std::string(display_name(spec.bias)) + " is not among --categories (" +
                         detail::join_categories(spec.categories) + ")");
    }
    if (spec.count < 2) {
      detail::bad_option("--count " + std::to_string(spec.count) + ": the skew scheme needs at least 2 buffers");
    }
  }
}

/// The planned layout of one payload: a size and a category per buffer.
struct buffer_plan {
  std::vector<std::size_t> sizes;
  std::vector<category> categories;  ///< category of each buffer (custom: by size)

  std::size_t total() const noexcept {
    std::size_t sum = 0;
    for (std::size_t s : sizes) sum += s;
    return sum;
  }
  std::size_t count_of(category c) const noexcept {
    return static_cast<std::size_t>(std::count(categories.begin(), categories.end(), c));
  }
};

/// The category a size falls in.
constexpr category category_of(std::size_t bytes) noexcept {
  if (bytes < kib) return category::small;
  if (bytes < mib) return category::medium;
  return category::large;
}

/// Skew order: the bias category first, then the others by closeness to it
/// (large: L, M, S; medium: M, S, L; small: S, M, L), keeping only `chosen`.
inline std::vector<category> skew_order(category bias, const std::vector<category>& chosen) {
  std::array<category, 3> order{};
  switch (bias) {
    case category::large:
      order = {category::large, category::medium, category::small};
      break;
    case category::medium:
      order = {category::medium, category::small, category::large};
      break;
    case category::small:
      order = {category::small, category::medium, category::large};
      break;
  }
  std::vector<category> out;
  for (category c : order) {
    if (std::find(chosen.begin(), chosen.end(), c) != chosen.end()) out.push_back(c);
  }
  return out;
}

/// Buffers per category for `skew`: the bias gets 60%, the rest 30% / 10% (or
/// 40% with two categories), rounded by largest remainder (ties: earlier in
/// skew order). Indexed by category.
inline std::array<std::size_t, 3> skew_counts(std::size_t count, category bias, const std::vector<category>& chosen) {
  const std::vector<category> order = skew_order(bias, chosen);
  std::vector<unsigned> percent;
  if (order.size() == 3)
    percent = {60, 30, 10};
  else if (order.size() == 2)
    percent = {60, 40};
  else
    percent = {100};
  std::array<std::size_t, 3> counts{};
  std::vector<std::size_t> remainder(order.size());
  std::size_t given = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t scaled = count * percent[i];
    counts[static_cast<std::size_t>(order[i])] = scaled / 100;
    remainder[i] = scaled % 100;
    given += scaled / 100;
  }
  while (given < count) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (remainder[i] > remainder[best]) best = i;
    }
    ++counts[static_cast<std::size_t>(order[best])];
    remainder[best] = 0;
    ++given;
  }
  return counts;
}

namespace detail {

/// A reproducible random source: mt19937_64 (its output is fixed by the
/// standard) with our own bounded draw (the std distributions are not).
class seeded_random {
 public:
  seeded_random(std::uint64_t seed, std::uint64_t stream) : engine_(mix(seed ^ mix(stream + 0x9e3779b97f4a7c15ULL))) {}

  /// Uniform in [0, bound).
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    while (true) {
      const std::uint64_t r = engine_();
      if (r >= threshold) return r % bound;
    }
  }

  /// Uniform in [lo, hi].
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }

 private:
  static std::uint64_t mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  std::mt19937_64 engine_;
};

}  // namespace detail

/// Lays out one payload. `stream` separates the random draws of different
/// workers that share a seed. Validates `spec` first.
inline buffer_plan plan_payload(const payload_spec& spec, std::uint64_t stream = 0) {
  validate(spec);
  buffer_plan plan;
  auto add = [&](category c, std::size_t bytes) {
    plan.categories.push_back(c);
    plan.sizes.push_back(bytes);
  };
  switch (spec.kind) {
    case scheme::custom:
      for (std::size_t bytes : spec.custom) add(category_of(bytes), bytes);
      break;
    case scheme::uniform:
      for (std::size_t i = 0; i < spec.count; ++i) {
        const category c = spec.categories[i % spec.categories.size()];
        add(c, spec.size_of(c));
      }
      break;
    case scheme::random: {
      detail::seeded_random random(spec.seed, stream);
      for (std::size_t i = 0; i < spec.count; ++i) {
        const category c = spec.categories[random.below(spec.categories.size())];
        if (spec.random_sizes) {
          const size_range r = range_of(c);
          add(c, random.between(r.min, r.max));
        } else {
          add(c, spec.size_of(c));
        }
      }
      break;
    }
    case scheme::skew: {
      const std::array<std::size_t, 3> counts = skew_counts(spec.count, spec.bias, spec.categories);
      for (category c : skew_order(spec.bias, spec.categories)) {
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(c)]; ++i) add(c, spec.size_of(c));
      }
      break;
    }
  }
  if (plan.total() > max_payload_bytes) {
    detail::bad_option("the payload totals " + format_size(plan.total()) + " in " + std::to_string(plan.sizes.size()) +
                       " buffers; the limit is 1 GiB");
  }
  return plan;
}

/// The buffers of one payload, each its own allocation (as separate tensors
/// are), filled with a pattern derived from `fill_seed`. Move-only.
class payload {
 public:
  payload() = default;

  explicit payload(const buffer_plan& plan, std::uint64_t fill_seed = 1) {
    storage_.reserve(plan.sizes.size());
    views_.reserve(plan.sizes.size());
    std::uint64_t state = fill_seed * 0x9e3779b97f4a7c15ULL + 1;
    for (std::size_t bytes : plan.sizes) {
      auto block = std::make_unique_for_overwrite<std::byte[]>(bytes);
      for (std::size_t i = 0; i < bytes; ++i) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        block[i] = static_cast<std::byte>(state);
      }
      views_.emplace_back(block.get(), bytes);
      storage_.push_back(std::move(block));
      total_ += bytes;
    }
  }

  payload(payload&&) noexcept = default;
  payload& operator=(payload&&) noexcept = default;

  /// The iovec buffers; valid as long as this payload lives.
  std::span<const const_buffer> buffers() const noexcept { return views_; }
  std::size_t total_size() const noexcept { return total_; }
  std::size_t count() const noexcept { return views_.size(); }

 private:
  std::vector<std::unique_ptr<std::byte[]>> storage_;
  std::vector<const_buffer> views_;
  std::size_t total_ = 0;
};

}  // namespace fusewire::bench
