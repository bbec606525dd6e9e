// memcpy_floor: what one core copies per second, the ceiling of any transport
// that moves bytes through memory once (loopback TCP copies at least twice).
//
//   memcpy_floor [--bytes SIZE] [--time SEC] [--repetitions N]
//
// SIZE takes K/M suffixes (default 6323406, the 6.03 MiB skew payload of
// fwbench). Prints the median MB/s (10^6 bytes) of the repetitions, and the
// min and max, in one line: "memcpy <bytes> B: median <x> MB/s (min <y>, max <z>)".
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::size_t parse_size(std::string_view s) {
  std::size_t used = 0;
  const unsigned long long v = std::stoull(std::string(s), &used);
  const std::string_view suffix = s.substr(used);
  if (suffix.empty()) return v;
  if (suffix == "K" || suffix == "k") return v << 10;
  if (suffix == "M" || suffix == "m") return v << 20;
  if (suffix == "G" || suffix == "g") return v << 30;
  throw std::invalid_argument("size suffix '" + std::string(suffix) + "' (allowed: K, M, G)");
}

struct config {
  std::size_t bytes = 6323406;
  double seconds = 1.0;
  int repetitions = 3;
};

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(a) + " needs a value");
      return argv[++i];
    };
    // std::sto* name only themselves when they fail: say which flag and value.
    auto number = [&](auto convert) {
      const std::string v(value());
      try {
        return convert(v);
      } catch (const std::logic_error&) {
        throw std::invalid_argument(std::string(a) + " '" + v + "' is not a number");
      }
    };
    if (a == "--bytes") {
      const std::string v(value());
      try {
        c.bytes = parse_size(v);
      } catch (const std::logic_error& e) {
        throw std::invalid_argument("--bytes '" + v +
                                    "': " + (std::string_view(e.what()) == "stoull" ? "not a size" : e.what()));
      }
    } else if (a == "--time") {
      c.seconds = number([](const std::string& v) { return std::stod(v); });
    } else if (a == "--repetitions") {
      c.repetitions = number([](const std::string& v) { return std::stoi(v); });
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: memcpy_floor [--bytes SIZE] [--time SEC] [--repetitions N]");
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + std::string(a) + "'");
    }
  }
  if (c.bytes == 0 || c.bytes > (std::size_t{4} << 30)) throw std::invalid_argument("--bytes: 1 B to 4 GiB");
  if (!(c.seconds > 0 && c.seconds <= 600)) throw std::invalid_argument("--time: more than 0, at most 600 s");
  if (c.repetitions < 1 || c.repetitions > 100) throw std::invalid_argument("--repetitions: 1 to 100");
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  try {
    c = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memcpy_floor: %s\n", e.what());
    return 2;
  }
  std::vector<std::byte> src(c.bytes, std::byte{0x5a});
  std::vector<std::byte> dst(c.bytes);
  std::memcpy(dst.data(), src.data(), c.bytes);  // both touched before timing
  std::vector<double> mbps;
  using clock = std::chrono::steady_clock;
  for (int r = 0; r < c.repetitions; ++r) {
    const auto until = clock::now() + std::chrono::duration<double>(c.seconds);
    const auto t0 = clock::now();
    std::size_t copies = 0;
    clock::time_point t1;
    do {
      std::memcpy(dst.data(), src.data(), c.bytes);
      src[copies % c.bytes] = dst[(copies * 7) % c.bytes];  // keeps the copies observable
      ++copies;
    } while ((t1 = clock::now()) < until);
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    mbps.push_back(static_cast<double>(copies) * static_cast<double>(c.bytes) / secs / 1e6);
  }
  std::sort(mbps.begin(), mbps.end());
  std::printf("memcpy %zu B: median %.0f MB/s (min %.0f, max %.0f)\n", c.bytes, mbps[mbps.size() / 2], mbps.front(),
              mbps.back());
  return 0;
}
