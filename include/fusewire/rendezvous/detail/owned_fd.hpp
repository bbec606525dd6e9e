#pragma once
/// A socket on its way from one reactor to another.

#include <unistd.h>
#include <utility>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

namespace detail {

/// A socket on its way from one reactor to another: closed unless someone took it.
class owned_fd {
 public:
  explicit owned_fd(int fd) noexcept : fd_(fd) {}
  owned_fd(owned_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  owned_fd& operator=(owned_fd&&) = delete;
  ~owned_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace detail

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
