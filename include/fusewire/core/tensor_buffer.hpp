#pragma once
/// tensor_buffer: bytes plus a shared, reference-counted deleter, and the
/// scatter-gather vocabulary (`const_buffer`, `mutable_buffer`, `total_size`).
///
/// A tensor_buffer is move-only; `share()` makes another handle to the same
/// bytes (or a sub-range) without copying. The deleter runs exactly once, on
/// whichever thread drops the last handle. Handles themselves are not
/// synchronised: one handle is used by one thread at a time, but different
/// handles to the same bytes may live and die on different threads.

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusewire/core/detail/buffer_owner.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/util/node_cache.hpp>

namespace fusewire {
inline namespace v0 {

/// Read-only bytes: one piece of a scatter-gather payload.
using const_buffer = std::span<const std::byte>;
/// Writable bytes, e.g. a receive destination.
using mutable_buffer = std::span<std::byte>;

/// What wrap() accepts as a deleter: a movable callable taking no arguments.
/// It must not throw (it runs in a destructor).
template <class D>
concept buffer_deleter = std::move_constructible<D> && std::invocable<D&>;

class tensor_buffer;

namespace detail {

/// Lets the buffer pool hand out buffers backed by its own owners.
struct tensor_buffer_access {
  static tensor_buffer adopt(buffer_owner* owner, std::byte* data, std::size_t size) noexcept;
  /// Takes `b`'s reference to its bytes (nullptr for a view or an empty buffer); leaves `b` empty.
  static buffer_owner* release(tensor_buffer& b) noexcept;
};

template <class D>
class deleter_owner final : public buffer_owner {
 public:
  explicit deleter_owner(D&& deleter) : deleter_(std::move(deleter)) {}

 private:
  void destroy() noexcept override {
    deleter_();
    delete this;
  }
  D deleter_;
};

/// Blocks of small heap buffers a thread freed, kept for its next small
/// allocations: a frame's prefix and meta, and a small tensor, cost no trip
/// to the allocator (an aligned allocation skips glibc's per-thread cache, so
/// it is costly on the small-message path). The blocks are util::node_cache's
/// 256-byte class: per thread, no lock, off under AddressSanitizer.
class small_blocks {
 public:
  static constexpr std::size_t block_size = 256;  ///< control block + bytes
  static constexpr std::size_t max_blocks = util::node_cache::keep;  ///< per thread: 16 KiB at most
  static constexpr std::size_t alignment = util::node_cache::alignment;
  static constexpr bool enabled = util::node_cache::enabled;

  /// A free block of this thread, or nullptr.
  static void* take() noexcept {
    if constexpr (!enabled) return nullptr;
    return util::node_cache::try_take(block_class);
  }
  /// Keeps `block` for this thread; false if the list is full (or the thread is exiting).
  static bool give(void* block) noexcept {
    if constexpr (!enabled) return false;
    return util::node_cache::try_give(block, block_class);
  }

 private:
  static constexpr std::uint8_t block_class = util::node_cache::class_of(block_size);
  static_assert(!enabled || util::node_cache::class_bytes(block_class) == block_size);
};

/// Large heap buffers freed in this process, kept whole for the next
/// allocation of the same size class. A receive of a big tensor (or a PS
/// request carrying a big gradient) otherwise gets memory the kernel must
/// fault in and zero while it copies the bytes in. One cache for the process,
/// under a mutex: a big buffer is often made by one thread (the reactor that
/// received it) and freed by another (the one that used it), and a lock per
/// buffer of 256 KiB or more costs nothing next to its bytes. Bounded by
/// `max_blocks` and `max_bytes` (the oldest block is freed first). Off under
/// AddressSanitizer, like small_blocks.
///
/// Blocks are mapped from the kernel directly, not taken from malloc, so that
/// one this cache does not keep goes back to the kernel when it is freed:
/// glibc keeps large freed chunks in the freeing thread's arena once its mmap
/// threshold has risen, and every reactor thread would then hold its own
/// share of each burst of big tensors for the life of the process.
class large_blocks {
 public:
  static constexpr std::size_t min_size = std::size_t{256} << 10;  ///< smaller ones use the allocator
  static constexpr std::size_t max_blocks = 8;
  static constexpr std::size_t max_bytes = std::size_t{64} << 20;  ///< per process
  static constexpr bool enabled = small_blocks::enabled;

  /// The capacity `size` bytes are allocated with: rounded up to a quarter of
  /// its power of two, so that sizes close together share blocks.
  static constexpr std::size_t size_class(std::size_t size) noexcept {
    std::size_t p = std::size_t{1} << (std::bit_width(size - 1) - 1);  // largest power of two < size
    const std::size_t step = std::max<std::size_t>(p / 4, 4096);
    return (size + step - 1) / step * step;
  }

  /// A block of exactly `capacity` bytes (a multiple of the page size, as
  /// size_class() gives): a cached one, else a new mapping. Throws std::bad_alloc.
  static void* take(std::size_t capacity) {
    {
      cache& c = instance();
      std::lock_guard lock(c.mutex);
      for (std::size_t i = c.count; i-- > 0;) {  // newest first: its pages are warmest
        if (c.blocks[i].capacity == capacity) return c.erase(i);
      }
    }
    void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }

  /// Keeps `block` of `capacity` bytes (from take()), freeing the oldest
  /// blocks to make room, or frees it when it is larger than the cache.
  static void give(void* block, std::size_t capacity) noexcept {
    if (capacity > max_bytes) return release(block, capacity);
    entry dropped[max_blocks];
    std::size_t n = 0;
    {
      cache& c = instance();
      std::lock_guard lock(c.mutex);
      while (c.count == max_blocks || c.bytes + capacity > max_bytes) {
        dropped[n] = c.blocks[0];
        c.erase(0);
        ++n;
      }
      c.blocks[c.count++] = {block, capacity};
      c.bytes += capacity;
    }
    for (std::size_t i = 0; i < n; ++i) release(dropped[i].ptr, dropped[i].capacity);  // outside the lock
  }

 private:
  static void release(void* block, std::size_t capacity) noexcept { ::munmap(block, capacity); }

  struct entry {
    void* ptr = nullptr;
    std::size_t capacity = 0;
  };
  struct cache {
    std::mutex mutex;
    entry blocks[max_blocks];
    std::size_t count = 0;
    std::size_t bytes = 0;
    /// Takes entry `i` out; returns its block.
    void* erase(std::size_t i) noexcept {
      void* p = blocks[i].ptr;
      bytes -= blocks[i].capacity;
      for (std::size_t j = i + 1; j < count; ++j) blocks[j - 1] = blocks[j];
      --count;
      return p;
    }
  };
  /// Never destroyed: buffers may be freed by other static destructors; the
  /// process's exit returns what it holds.
  static cache& instance() noexcept {
    static cache* c = new cache;
    return *c;
  }
};

/// One allocation holds this control block followed by the bytes.
class heap_owner final : public buffer_owner {
 public:
  static constexpr std::size_t alignment = small_blocks::alignment;
  static constexpr std::size_t header_size = 64;
  /// Buffers of at most this many bytes come from small_blocks.
  static constexpr std::size_t small_size = small_blocks::block_size - header_size;

  static heap_owner* create(std::size_t size) {
    if (size > static_cast<std::size_t>(-1) - header_size) throw std::bad_alloc();
    if (small_blocks::enabled && size <= small_size) {
      void* raw = small_blocks::take();
      if (raw == nullptr) raw = ::operator new(small_blocks::block_size, std::align_val_t{alignment});
      return ::new (raw) heap_owner(true);
    }
    if (large_blocks::enabled && size >= large_blocks::min_size &&
        size <= static_cast<std::size_t>(-1) / 2 - header_size) {
      const std::size_t capacity = large_blocks::size_class(header_size + size);
      return ::new (large_blocks::take(capacity)) heap_owner(false, capacity);
    }
    void* raw = ::operator new(header_size + size, std::align_val_t{alignment});
    return ::new (raw) heap_owner(false);
  }

  std::byte* bytes() noexcept { return reinterpret_cast<std::byte*>(this) + header_size; }

 private:
  explicit heap_owner(bool small, std::size_t large_capacity = 0) noexcept
      : small_(small), large_capacity_(large_capacity) {}

  void destroy() noexcept override {
    const bool small = small_;
    const std::size_t large_capacity = large_capacity_;
    this->~heap_owner();
    if (small && small_blocks::give(this)) return;
    if (large_capacity != 0) return large_blocks::give(this, large_capacity);
    ::operator delete(static_cast<void*>(this), std::align_val_t{alignment});
  }

  bool small_;
  std::size_t large_capacity_;  ///< bytes of a large_blocks block; 0: not one
};

static_assert(sizeof(heap_owner) <= heap_owner::header_size);

}  // namespace detail

/// Pointer + size + reference-counted deleter (seastar's temporary_buffer idea).
///
/// Owning buffers (allocate, copy_of, wrap, pool buffers) keep their bytes
/// alive until the last alias is destroyed. `view()` buffers own nothing: the
/// caller keeps the bytes alive for as long as any alias is used.
class tensor_buffer {
 public:
  /// An empty buffer: no bytes, no owner.
  tensor_buffer() noexcept = default;

  tensor_buffer(tensor_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        owner_(std::exchange(other.owner_, nullptr)) {}

  tensor_buffer& operator=(tensor_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      owner_ = std::exchange(other.owner_, nullptr);
    }
    return *this;
  }

  tensor_buffer(const tensor_buffer&) = delete;
  tensor_buffer& operator=(const tensor_buffer&) = delete;

  ~tensor_buffer() { reset(); }

  /// `size` uninitialised bytes on the heap, 64-byte aligned; one allocation
  /// for bytes and bookkeeping. Throws std::bad_alloc. allocate(0) is empty().
  static tensor_buffer allocate(std::size_t size) {
    if (size == 0) return {};
    detail::heap_owner* owner = detail::heap_owner::create(size);
    return tensor_buffer(owner->bytes(), size, owner);
  }

  /// A new heap buffer holding a copy of `bytes`.
  static tensor_buffer copy_of(const_buffer bytes) {
    tensor_buffer out = allocate(bytes.size());
    if (!bytes.empty()) std::memcpy(out.data_, bytes.data(), bytes.size());
    return out;
  }

  /// Takes ownership of `n` bytes at `p`: `deleter()` runs once, when the last
  /// alias dies. If wrap() itself throws (std::bad_alloc), the deleter has
  /// already run.
  template <buffer_deleter D>
  static tensor_buffer wrap(std::byte* p, std::size_t n, D deleter) {
    return tensor_buffer(p, n, make_owner(std::move(deleter)));
  }

  /// wrap() for memory the caller has registered for RDMA; reg() returns a copy of `reg`.
  template <buffer_deleter D>
  static tensor_buffer wrap(std::byte* p, std::size_t n, D deleter, const registration& reg) {
    detail::buffer_owner* owner = make_owner(std::move(deleter));
    owner->set_registration(reg);
    return tensor_buffer(p, n, owner);
  }

  /// A non-owning view of `n` bytes at `p`; the caller keeps them alive.
  static tensor_buffer view(std::byte* p, std::size_t n) noexcept { return tensor_buffer(p, n, nullptr); }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  mutable_buffer bytes() const noexcept { return {data_, size_}; }

  /// Another handle to the same bytes; no copy.
  tensor_buffer share() const noexcept {
    if (owner_ != nullptr) owner_->add_ref();
    return tensor_buffer(data_, size_, owner_);
  }

  /// A handle to bytes [pos, pos + len) of this buffer; no copy. Keeps the
  /// whole underlying allocation alive. Throws system_error(errc::invalid_argument)
  /// if the range does not lie inside this buffer.
  tensor_buffer share(std::size_t pos, std::size_t len) const {
    if (pos > size_ || len > size_ - pos) {
      throw_error(errc::invalid_argument, "tensor_buffer::share(" + std::to_string(pos) + ", " + std::to_string(len) +
                                              "): range exceeds the buffer's " + std::to_string(size_) + " bytes");
    }
    if (owner_ != nullptr) owner_->add_ref();
    return tensor_buffer(data_ + pos, len, owner_);
  }

  /// Keeps only the first `len` bytes. Throws system_error(errc::invalid_argument) if len > size().
  void trim(std::size_t len) {
    if (len > size_) {
      throw_error(errc::invalid_argument, "tensor_buffer::trim(" + std::to_string(len) +
                                              "): longer than the buffer's " + std::to_string(size_) + " bytes");
    }
    size_ = len;
  }

  /// Drops the first `n` bytes. Throws system_error(errc::invalid_argument) if n > size().
  void trim_front(std::size_t n) {
    if (n > size_) {
      throw_error(errc::invalid_argument, "tensor_buffer::trim_front(" + std::to_string(n) +
                                              "): longer than the buffer's " + std::to_string(size_) + " bytes");
    }
    data_ += n;
    size_ -= n;
  }

  /// Drops this handle (the bytes die with their last handle); leaves it empty.
  void reset() noexcept {
    if (owner_ != nullptr) owner_->release();
    data_ = nullptr;
    size_ = 0;
    owner_ = nullptr;
  }

  /// RDMA keys of the memory, or nullptr unless it came from a registered
  /// pool or a registered wrap(). Valid while this handle lives.
  const registration* reg() const noexcept { return owner_ != nullptr ? owner_->reg() : nullptr; }

  /// False for view() and empty buffers.
  bool owns_memory() const noexcept { return owner_ != nullptr; }

  /// How many handles share the owner (0 for views); for tests and diagnostics only.
  std::size_t use_count() const noexcept { return owner_ != nullptr ? owner_->use_count() : 0; }

  /// Whether this is the only handle to its owned bytes (false for views and
  /// empty buffers); once true, the other handles' uses of the bytes happened
  /// before, so the owner may write them again.
  bool sole() const noexcept { return owner_ != nullptr && owner_->sole(); }

 private:
  friend struct detail::tensor_buffer_access;

  tensor_buffer(std::byte* data, std::size_t size, detail::buffer_owner* owner) noexcept
      : data_(data), size_(size), owner_(owner) {}

  template <class D>
  static detail::buffer_owner* make_owner(D&& deleter) {
    try {
      return new detail::deleter_owner<std::decay_t<D>>(std::forward<D>(deleter));
    } catch (...) {
      deleter();
      throw;
    }
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  detail::buffer_owner* owner_ = nullptr;
};

inline tensor_buffer detail::tensor_buffer_access::adopt(buffer_owner* owner, std::byte* data,
                                                         std::size_t size) noexcept {
  return tensor_buffer(data, size, owner);
}

inline detail::buffer_owner* detail::tensor_buffer_access::release(tensor_buffer& b) noexcept {
  b.data_ = nullptr;
  b.size_ = 0;
  return std::exchange(b.owner_, nullptr);
}

namespace detail {

/// Keeps a tensor_buffer's bytes alive in one pointer: what a continuation
/// captures to hold bytes it does not look at (a frame prefix being written),
/// so that it stays small enough to be stored inline.
class buffer_hold {
 public:
  explicit buffer_hold(tensor_buffer b) noexcept : owner_(tensor_buffer_access::release(b)) {}
  buffer_hold(buffer_hold&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
  buffer_hold& operator=(buffer_hold&& other) noexcept {
    if (this != &other) {
      reset();
      owner_ = std::exchange(other.owner_, nullptr);
    }
    return *this;
  }
  buffer_hold(const buffer_hold&) = delete;
  buffer_hold& operator=(const buffer_hold&) = delete;
  ~buffer_hold() { reset(); }

  /// Drops the bytes now.
  void reset() noexcept {
    if (owner_ != nullptr) std::exchange(owner_, nullptr)->release();
  }

 private:
  buffer_owner* owner_;
};

}  // namespace detail

/// Sum of the sizes of a scatter-gather payload.
inline std::size_t total_size(std::span<const const_buffer> sg) noexcept {
  std::size_t total = 0;
  for (const_buffer b : sg) total += b.size();
  return total;
}

/// Fills `out` with the byte spans of `buffers`, in order (aliases, no copy);
/// returns how many it wrote: min(buffers.size(), out.size()).
inline std::size_t as_const_buffers(std::span<const tensor_buffer> buffers, std::span<const_buffer> out) noexcept {
  const std::size_t n = std::min(buffers.size(), out.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = buffers[i].bytes();
  return n;
}

/// The byte spans of `buffers`, in order, as a scatter-gather payload (aliases, no copy).
inline std::vector<const_buffer> as_const_buffers(std::span<const tensor_buffer> buffers) {
  std::vector<const_buffer> out(buffers.size());
  as_const_buffers(buffers, std::span<const_buffer>(out));
  return out;
}

/// Copies a scatter-gather payload into `dst`, in order, as far as it fits;
/// returns the number of bytes copied.
inline std::size_t gather(std::span<const const_buffer> sg, mutable_buffer dst) noexcept {
  std::size_t copied = 0;
  for (const_buffer b : sg) {
    const std::size_t n = std::min(b.size(), dst.size() - copied);
    if (n != 0) std::memcpy(dst.data() + copied, b.data(), n);
    copied += n;
    if (copied == dst.size()) break;
  }
  return copied;
}

}  // namespace v0
}  // namespace fusewire
