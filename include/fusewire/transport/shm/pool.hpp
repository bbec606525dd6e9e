#pragma once
/// shm: the shared pool, memory whose bytes a process hands its shm peers by
/// reference. Private to the transport layer; see transport/shm.hpp.
///
/// One pool per shm transport object (its copies share it): a sealed memfd,
/// made on the first allocation and mapped writable here. A connection that
/// first writes a piece of it sends the pool's descriptor to its peer over the
/// connection's Unix socket; the peer maps it read-only and copies such
/// pieces with memcpy, one copy and no system call. The memfd is sealed
/// against resizing (a peer's mapping can never fault) and against new
/// writable mappings (a peer can read the pool, never write to it).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>

#include <boost/interprocess/mem_algo/rbtree_best_fit.hpp>
#include <boost/interprocess/sync/mutex_family.hpp>

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/transport/shm/segment.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail::shm {

/// The largest pool a side makes or maps of its peer (address space only:
/// pages are backed when first written).
inline constexpr std::uint64_t max_pool_size = std::uint64_t{64} << 30;
/// The smallest pool a side makes (0 is "no pool").
inline constexpr std::uint64_t min_pool_size = std::uint64_t{1} << 20;
/// Pieces of a write in the pool at least this long go by reference; shorter
/// ones are cheaper through the ring (no wait for the peer's copy).
inline constexpr std::size_t pool_piece_min = 16 * 1024;

/// The message a side sends with its pool's descriptor, once per connection.
struct pool_hello {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t reserved;
  std::uint64_t size;
};
inline constexpr std::uint64_t pool_magic = 0x4c4f4f502d574655ull;  // "UFW-POOL", little-endian

class shared_pool : public std::enable_shared_from_this<shared_pool> {
 public:
  /// `size`: bytes of address space, min_pool_size..max_pool_size (the
  /// transport's config checks it).
  explicit shared_pool(std::size_t size) noexcept : size_(size) {}
  shared_pool(const shared_pool&) = delete;
  shared_pool& operator=(const shared_pool&) = delete;
  ~shared_pool() {
    if (std::byte* b = base_.load(std::memory_order_relaxed)) ::munmap(b, size_);
  }

  /// `n` bytes of the pool (64-byte aligned), or an empty buffer when `n` is
  /// 0, the pool is full or it could not be made. Any thread.
  tensor_buffer allocate(std::size_t n) {
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (n == 0 || (algo_ == nullptr && !create())) return {};
      p = algo_->allocate_aligned(n, 64);
      if (p == nullptr) return {};
    }
    // Outside the lock: a wrap() that throws has run the deleter already.
    return tensor_buffer::wrap(static_cast<std::byte*>(p), n, [self = shared_from_this(), p]() noexcept {
      std::lock_guard lock(self->mutex_);
      self->algo_->deallocate(p);
    });
  }

  /// The offset of [p, p + n) in the pool when it lies wholly inside it.
  /// Any thread; lock-free.
  std::optional<std::uint64_t> offset_of(const std::byte* p, std::size_t n) const noexcept {
    const std::byte* b = base_.load(std::memory_order_acquire);
    if (b == nullptr) return std::nullopt;
    const auto at = reinterpret_cast<std::uintptr_t>(p), lo = reinterpret_cast<std::uintptr_t>(b);
    if (at < lo || at - lo > size_ || n > size_ - (at - lo)) return std::nullopt;
    return at - lo;
  }

  /// Sends the pool's descriptor over `sock` (a connected Unix socket, non-blocking).
  /// False if the pool does not exist yet or the socket would not take it.
  bool send_to(int sock) const noexcept {
    if (base_.load(std::memory_order_acquire) == nullptr) return false;
    const pool_hello h{pool_magic, segment_version, 0, size_};
    const int fd[1] = {fd_.get()};
    return send_with_fds(sock, &h, sizeof h, fd, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof h);
  }

 private:
  using algorithm = boost::interprocess::rbtree_best_fit<boost::interprocess::null_mutex_family>;

  /// Makes, seals and maps the memfd, and lays the allocator's bookkeeping
  /// into it (readable by peers, like the rest of the pool: it says nothing
  /// but block sizes). Under mutex_.
  bool create() {
    if (create_failed_) return false;
    const auto fail = [&] {
      create_failed_ = true;
      return false;
    };
    unique_fd fd(::memfd_create("fusewire-shm-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return fail();
    if (::ftruncate(fd.get(), static_cast<off_t>(size_)) != 0) return fail();
    void* base = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(), 0);
    if (base == MAP_FAILED) return fail();
    // After this side's writable mapping: F_SEAL_FUTURE_WRITE refuses any
    // later one, so a peer that receives the descriptor can only read.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
      ::munmap(base, size_);
      return fail();
    }
    algo_ = ::new (base) algorithm(size_, 0);
    fd_ = std::move(fd);
    base_.store(static_cast<std::byte*>(base), std::memory_order_release);
    return true;
  }

  std::mutex mutex_;
  const std::size_t size_;
  std::atomic<std::byte*> base_{nullptr};  ///< set once, by create()
  unique_fd fd_;
  algorithm* algo_ = nullptr;   ///< in the pool's first bytes; under mutex_
  bool create_failed_ = false;  ///< create() is not tried again
};

/// The receiving side's checks of a peer's pool message; maps the pool
/// read-only. On failure `why` names what was wrong.
inline mapping accept_pool(const pool_hello& h, int fd, std::string& why) {
  if (h.magic != pool_magic || h.version != segment_version) {
    why = "the peer's pool message has the wrong magic or version";
    return {};
  }
  if (h.size < min_pool_size || h.size > max_pool_size) {
    why = "the peer's pool of " + std::to_string(h.size) + " bytes is not within " + std::to_string(min_pool_size) +
          ".." + std::to_string(max_pool_size);
    return {};
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  const int need = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & need) != need) {
    why = "the peer's pool is not a memfd sealed against shrinking and growing";
    return {};
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != h.size) {
    why = "the peer's pool is not the " + std::to_string(h.size) + " bytes it announced";
    return {};
  }
  void* base = ::mmap(nullptr, h.size, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    why = "mmap of the peer's pool failed: " + last_error().message();
    return {};
  }
  return mapping(base, h.size);
}

}  // namespace detail::shm
}  // namespace v0
}  // namespace fusewire
