// Writes the seed corpus of every fuzz target, one file per seed, into
// <dir>/<target>/ (each of those directories is emptied first):
//
//   make_seeds tests/fuzz/corpus
//
// The corpus is committed, so a fuzz run does not depend on this program;
// run it after changing a seed (seed_frames.hpp, *_seeds.hpp) and commit
// what it wrote.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "graph_payload_seeds.hpp"
#include "handshake_seeds.hpp"
#include "ps_message_seeds.hpp"
#include "shm_peer_seeds.hpp"
#include "support/seed_frames.hpp"

namespace {

bool write_corpus(const std::filesystem::path& dir, const std::vector<fusewire::test::seed_frame>& seeds) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec || !std::filesystem::create_directories(dir, ec)) {
    std::fprintf(stderr, "make_seeds: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return false;
  }
  for (const auto& seed : seeds) {
    const std::filesystem::path path = dir / seed.name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(seed.frame.data()), static_cast<std::streamsize>(seed.frame.size()));
    if (!out) {
      std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
      return false;
    }
  }
  std::printf("make_seeds: %zu seeds in %s\n", seeds.size(), dir.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus directory>  (writes <dir>/<target>/ for every fuzz target)\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  const bool ok = write_corpus(root / "wire_decode", fusewire::test::seed_frames()) &&
                  write_corpus(root / "ps_message", fusewire::test::ps_message_seeds()) &&
                  write_corpus(root / "handshake", fusewire::test::handshake_seeds()) &&
                  write_corpus(root / "graph_payload", fusewire::test::graph_payload_seeds()) &&
                  write_corpus(root / "shm_peer", fusewire::test::shm_peer::shm_peer_seeds());
  return ok ? 0 : 1;
}
