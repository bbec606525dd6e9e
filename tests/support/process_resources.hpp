#pragma once
/// What a process holds that a closed connection must give back: open file
/// descriptors, shm transport segment mappings, files in /dev/shm. For leak
/// checks around a test. No doctest here: the multi-process drivers have
/// their own main.
#include <dirent.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

namespace fusewire::test {

/// Open descriptors of this process (the directory's own included: compare counts).
inline std::size_t count_fds() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

/// Mappings of shm transport segments (memfds named fusewire-shm) in this process.
inline std::size_t count_segment_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:fusewire-shm") != std::string::npos) ++n;
  }
  return n;
}

/// The names in /dev/shm, sorted.
inline std::vector<std::string> dev_shm() {
  std::vector<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace fusewire::test
