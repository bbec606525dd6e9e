#pragma once
/// ps::detail::write_atomically: how a checkpoint file is replaced so that a
/// crash leaves the old file or the new one, never a mix — written to
/// "<file>.tmp", fsync'ed, renamed over <file>, then the directory fsync'ed.

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace fusewire {
inline namespace v0 {
namespace ps {
namespace detail {

/// See the file comment; creates the parent directories. Throws system_error
/// naming the file and the step that failed.
inline void write_atomically(const std::filesystem::path& file, const std::vector<std::byte>& bytes) {
  const std::string name = file.string();
  const std::string tmp = name + ".tmp";
  auto sys_fail = [&](const std::string& what) {
    const int e = errno;
    throw std::system_error(e, std::generic_category(), "checkpoint " + name + ": " + what);
  };
  if (file.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) sys_fail("cannot create " + tmp);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      errno = e;
      sys_fail("write failed");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    sys_fail("fsync failed");
  }
  ::close(fd);
  if (::rename(tmp.c_str(), name.c_str()) != 0) sys_fail("rename from " + tmp + " failed");
  const std::string dir = file.has_parent_path() ? file.parent_path().string() : std::string(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace detail
}  // namespace ps
}  // namespace v0
}  // namespace fusewire
