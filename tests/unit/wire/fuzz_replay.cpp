// Runs the libFuzzer target (tests/fuzz/wire_decode_fuzz.cpp, linked in) on
// the seed frames, every truncation and bit flip of them, and seeded random
// mutations. The target aborts on any violated property.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "support/seed_frames.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::size_t run(const std::vector<std::byte>& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  return 1;
}

}  // namespace

TEST_CASE("the fuzz target holds on every seed, truncation and single bit flip") {
  std::size_t runs = 0;
  for (const auto& seed : fusewire::test::seed_frames()) {
    CAPTURE(seed.name);
    for (std::size_t n = 0; n <= seed.frame.size(); ++n) {
      runs += run(std::vector<std::byte>(seed.frame.begin(), seed.frame.begin() + static_cast<std::ptrdiff_t>(n)));
    }
    auto mutated = seed.frame;
    for (std::size_t i = 0; i < mutated.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        mutated[i] ^= static_cast<std::byte>(1 << bit);
        runs += run(mutated);
        mutated[i] ^= static_cast<std::byte>(1 << bit);
      }
    }
    // The same bytes read as [type][payload_len][meta] for the meta decoders.
    std::vector<std::byte> as_meta{seed.frame[5]};
    for (int i = 0; i < 8; ++i) as_meta.push_back(seed.frame[24 + static_cast<std::size_t>(i)]);
    const auto meta_len = fusewire::wire::load_le<std::uint32_t>(seed.frame.data() + 16);
    const auto meta_begin = seed.frame.begin() + static_cast<std::ptrdiff_t>(fusewire::wire::header_size);
    as_meta.insert(as_meta.end(), meta_begin, meta_begin + meta_len);
    runs += run(as_meta);
  }
  CHECK(runs > 20000);
}

TEST_CASE("the fuzz target holds on seeded random mutations") {
  std::mt19937_64 rng(20240601);
  const auto seeds = fusewire::test::seed_frames();
  for (int round = 0; round < 50000; ++round) {
    auto input = seeds[rng() % seeds.size()].frame;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !input.empty(); ++e) {
      const std::size_t at = rng() % input.size();
      switch (rng() % 4) {
        case 0:
          input[at] = static_cast<std::byte>(rng());
          break;
        case 1:
          input.erase(input.begin() + static_cast<std::ptrdiff_t>(at));
          break;
        case 2:
          input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::byte>(rng()));
          break;
        default:
          input[at] = std::byte{0xff};
          break;
      }
    }
    run(input);
  }
}
