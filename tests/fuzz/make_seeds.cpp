// Writes the seed frames (seed_frames.hpp) into a directory, one file each,
// for the fuzzer's starting corpus: make_seeds <dir>
#include <cstdio>
#include <fstream>
#include <string>

#include "support/seed_frames.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <existing directory>\n");
    return 2;
  }
  const std::string dir = argv[1];
  int written = 0;
  for (const auto& seed : fusewire::test::seed_frames()) {
    const std::string path = dir + "/" + seed.name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(seed.frame.data()), static_cast<std::streamsize>(seed.frame.size()));
    if (!out) {
      std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
      return 1;
    }
    ++written;
  }
  std::printf("make_seeds: %d seed frames in %s\n", written, dir.c_str());
  return 0;
}
