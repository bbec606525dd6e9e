#pragma once
/// A ring of provided receive buffers registered with one io_uring (kernel 5.19+).
/// Private to the reactor layer (used by uring_engine and uring_tcp).

#include <liburing.h>
#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <vector>

#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

struct provided_buffer_memory;

/// The control block of a handed-out provided buffer: one per buffer id, made
/// with the ring, so that handing a buffer out allocates nothing. While the
/// buffer is out it keeps the ring's memory alive.
class provided_buffer_owner final : public buffer_owner {
 public:
  provided_buffer_owner() noexcept = default;

  /// Buffer `bid` goes out (owning thread; the last hand-out's destroy() is over).
  void hand_out(std::shared_ptr<provided_buffer_memory> keep, std::uint16_t bid) noexcept {
    reset_refs();
    keep_ = std::move(keep);
    bid_ = bid;
  }

 private:
  inline void destroy() noexcept override;  // after provided_buffer_ring, whose give_back it calls

  std::shared_ptr<provided_buffer_memory> keep_;
  std::uint16_t bid_ = 0;
};

/// Memory shared between the ring and every buffer handed out from it; freed
/// when the ring and the last handed-out buffer are gone. Returns from other
/// threads are queued under a mutex and put back by the owning thread.
struct provided_buffer_memory {
  std::unique_ptr<provided_buffer_owner[]> owners;  ///< one per buffer id
  std::byte* buffers = nullptr;
  std::size_t buffer_size = 0;
  unsigned count = 0;
  void* ring_mem = nullptr;
  std::size_t ring_bytes = 0;
  const void* owner = nullptr;  // the provided_buffer_ring, while it lives

  std::mutex mutex;
  std::vector<std::uint16_t> returned;
  std::atomic<bool> has_returned{false};

  ~provided_buffer_memory() {
    if (ring_mem != nullptr) ::munmap(ring_mem, ring_bytes);
    ::operator delete(buffers, std::align_val_t{4096});
  }
};

/// The provided-buffer ring of one engine (buffer group `group_id`).
/// Owning-thread only, except that handed-out buffers may die on any thread.
class provided_buffer_ring {
 public:
  /// Registers `count` (a power of two, <= 32768) buffers of `size` bytes.
  /// Returns nullptr with `ec` set if the kernel refuses (e.g. before 5.19).
  static std::unique_ptr<provided_buffer_ring> create(io_uring& ring, std::uint16_t group_id, unsigned count,
                                                      std::size_t size, std::error_code& ec) {
    ec.clear();
    if (count == 0 || count > 32768 || (count & (count - 1)) != 0 || size == 0 || size > (1u << 30)) {
      ec = std::make_error_code(std::errc::invalid_argument);
      return nullptr;
    }
    auto mem = std::make_shared<provided_buffer_memory>();
    mem->buffer_size = size;
    mem->count = count;
    mem->ring_bytes = count * sizeof(io_uring_buf);
    void* ring_mem = ::mmap(nullptr, mem->ring_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (ring_mem == MAP_FAILED) {
      ec = std::error_code(errno, std::system_category());
      return nullptr;
    }
    mem->ring_mem = ring_mem;
    mem->buffers = static_cast<std::byte*>(::operator new(count* size, std::align_val_t{4096}));
    mem->owners = std::make_unique<provided_buffer_owner[]>(count);

    io_uring_buf_reg reg;
    std::memset(&reg, 0, sizeof reg);
    reg.ring_addr = reinterpret_cast<std::uint64_t>(ring_mem);
    reg.ring_entries = count;
    reg.bgid = group_id;
    if (const int rc = io_uring_register_buf_ring(&ring, &reg, 0); rc < 0) {
      ec = std::error_code(-rc, std::system_category());
      return nullptr;
    }
    return std::unique_ptr<provided_buffer_ring>(new provided_buffer_ring(ring, group_id, std::move(mem)));
  }

  provided_buffer_ring(const provided_buffer_ring&) = delete;
  provided_buffer_ring& operator=(const provided_buffer_ring&) = delete;

  /// Runs on the owning thread, before the ring itself is torn down.
  ~provided_buffer_ring() {
    if (owner_thread_ == this) owner_thread_ = nullptr;
    io_uring_unregister_buf_ring(ring_, group_id_);
    std::lock_guard lock(mem_->mutex);
    mem_->owner = nullptr;
  }

  std::uint16_t group_id() const noexcept { return group_id_; }
  std::size_t buffer_size() const noexcept { return mem_->buffer_size; }
  unsigned count() const noexcept { return mem_->count; }
  /// Buffers currently available to the kernel.
  unsigned in_ring() const noexcept { return in_ring_; }

  /// Hands the first `len` bytes of buffer `bid` (just filled by the kernel) to
  /// the caller. Zero copy (the buffer returns to the ring when the last alias
  /// dies) while at least a quarter of the ring stays available; below that the
  /// bytes are copied to the heap and the buffer goes straight back, so one
  /// consumer holding buffers cannot starve the reactor's other connections.
  tensor_buffer take(std::uint16_t bid, std::size_t len) {
    --in_ring_;
    std::byte* p = mem_->buffers + static_cast<std::size_t>(bid) * mem_->buffer_size;
    if (in_ring_ < mem_->count / 4) {
      ++copied_;
      tensor_buffer copy = tensor_buffer::copy_of(const_buffer(p, len));
      recycle(bid);
      return copy;
    }
    ++handed_over_;
    provided_buffer_owner& owner = mem_->owners[bid];
    owner.hand_out(mem_, bid);
    return tensor_buffer_access::adopt(&owner, p, len);
  }

  /// Puts buffer `bid` (just returned by the kernel) straight back, unread.
  void discard(std::uint16_t bid) noexcept {
    --in_ring_;
    recycle(bid);
  }

  /// Copies the first `len` bytes of buffer `bid` into `dst` and recycles it.
  void copy_out(std::uint16_t bid, std::size_t len, std::byte* dst) noexcept {
    --in_ring_;
    std::memcpy(dst, mem_->buffers + static_cast<std::size_t>(bid) * mem_->buffer_size, len);
    recycle(bid);
  }

  /// Puts buffers returned from other threads back into the ring.
  void collect_returns() {
    if (!mem_->has_returned.load(std::memory_order_acquire)) return;
    std::vector<std::uint16_t> ids;
    {
      std::lock_guard lock(mem_->mutex);
      ids.swap(mem_->returned);
      mem_->has_returned.store(false, std::memory_order_relaxed);
    }
    for (std::uint16_t bid : ids) recycle(bid);
  }

  std::uint64_t handed_over() const noexcept { return handed_over_; }
  std::uint64_t copied() const noexcept { return copied_; }

 private:
  provided_buffer_ring(io_uring& ring, std::uint16_t group_id, std::shared_ptr<provided_buffer_memory> mem)
      : ring_(&ring), group_id_(group_id), mem_(std::move(mem)) {
    br_ = static_cast<io_uring_buf_ring*>(mem_->ring_mem);
    io_uring_buf_ring_init(br_);
    mask_ = io_uring_buf_ring_mask(mem_->count);
    for (unsigned i = 0; i < mem_->count; ++i) {
      io_uring_buf_ring_add(br_, mem_->buffers + static_cast<std::size_t>(i) * mem_->buffer_size,
                            static_cast<unsigned>(mem_->buffer_size), static_cast<unsigned short>(i), mask_,
                            static_cast<int>(i));
    }
    io_uring_buf_ring_advance(br_, static_cast<int>(mem_->count));
    in_ring_ = mem_->count;
    mem_->owner = this;
    owner_thread_ = this;
  }

  void recycle(std::uint16_t bid) noexcept {
    io_uring_buf_ring_add(br_, mem_->buffers + static_cast<std::size_t>(bid) * mem_->buffer_size,
                          static_cast<unsigned>(mem_->buffer_size), bid, mask_, 0);
    io_uring_buf_ring_advance(br_, 1);
    ++in_ring_;
  }

  /// Runs where the last alias of a handed-out buffer dies (any thread).
  static void give_back(const std::shared_ptr<provided_buffer_memory>& mem, std::uint16_t bid) noexcept {
    const provided_buffer_ring* self = owner_thread_;
    if (self != nullptr && self->mem_ == mem && mem->owner == self) {
      const_cast<provided_buffer_ring*>(self)->recycle(bid);
      return;
    }
    try {
      std::lock_guard lock(mem->mutex);
      if (mem->owner == nullptr) return;  // the ring is gone; the memory dies with its last user
      mem->returned.push_back(bid);
      mem->has_returned.store(true, std::memory_order_release);
    } catch (...) {
      // push_back failed: the buffer stays out of the ring; nothing else breaks.
    }
  }

  friend class provided_buffer_owner;

  /// The ring owned by the calling thread (each reactor thread has at most one).
  static inline thread_local provided_buffer_ring* owner_thread_ = nullptr;

  io_uring* ring_;
  std::uint16_t group_id_;
  std::shared_ptr<provided_buffer_memory> mem_;
  io_uring_buf_ring* br_ = nullptr;
  int mask_ = 0;
  unsigned in_ring_ = 0;
  std::uint64_t handed_over_ = 0;
  std::uint64_t copied_ = 0;
};

inline void provided_buffer_owner::destroy() noexcept {
  // The buffer may be handed out again as soon as give_back put it back (on
  // this thread at once, else by the owning thread): nothing below touches
  // *this, which also dies with `mem` if that was the last reference.
  std::shared_ptr<provided_buffer_memory> mem = std::move(keep_);
  provided_buffer_ring::give_back(mem, bid_);
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
