#pragma once
/// Small heap nodes recycled per thread: the posted tasks and operation
/// records that a reactor makes and drops for every message.

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace fusewire {
inline namespace v0 {
namespace util {

/// A thread's freed nodes, by size class (64, 128, 256 and 512 bytes, each
/// aligned to 64). A reactor makes and drops a few small objects per message
/// on its own thread (a posted completion, a send's record, a small
/// tensor's buffer); taking the last freed node of the same class costs a few
/// loads where malloc and free cost a hundred instructions or more. A node
/// freed on another thread than the one that made it joins that thread's
/// cache. Beyond `keep` nodes per class (60 KiB a thread) a freed node goes
/// back to the heap, and a thread's cache is freed when the thread exits.
/// Off under AddressSanitizer, so that it still sees every use after free.
class node_cache {
 public:
  static constexpr std::uint8_t no_class = 0xff;  ///< too large: the caller uses the heap
  static constexpr std::size_t keep = 64;
  static constexpr std::size_t alignment = 64;
#if defined(__SANITIZE_ADDRESS__)
  static constexpr bool enabled = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  static constexpr bool enabled = false;
#else
  static constexpr bool enabled = true;
#endif
#else
  static constexpr bool enabled = true;
#endif

  /// The size class of a node of `bytes`, or no_class (also when the cache is off).
  static constexpr std::uint8_t class_of(std::size_t bytes) noexcept {
    if (!enabled) return no_class;
    for (std::uint8_t c = 0; c < classes; ++c) {
      if (bytes <= class_bytes(c)) return c;
    }
    return no_class;
  }
  static constexpr std::size_t class_bytes(std::uint8_t c) noexcept { return std::size_t{64} << c; }

  /// A freed node of class `c` of this thread, or nullptr.
  static void* try_take(std::uint8_t c) noexcept {
    if (exited_) return nullptr;
    list& l = lists_[c];
    if (l.head == nullptr) return nullptr;
    --l.count;
    return std::exchange(l.head, l.head->next);
  }
  /// Keeps `p` (a node of class `c`) for this thread; false when the
  /// thread's list of that class is full or the thread is exiting.
  static bool try_give(void* p, std::uint8_t c) noexcept {
    if (exited_) return false;
    list& l = lists_[c];
    if (l.count == keep) return false;
    l.head = ::new (p) node{l.head};
    ++l.count;
    return true;
  }

  /// A node of class `c`: a freed one, else a new one. Throws std::bad_alloc.
  static void* take(std::uint8_t c) {
    if (void* p = try_take(c)) return p;
    return ::operator new (class_bytes(c), std::align_val_t{alignment});
  }
  /// Frees a node of class `c` that take() gave out (on any thread).
  static void release(void* p, std::uint8_t c) noexcept {
    if (!try_give(p, c)) ::operator delete (p, std::align_val_t{alignment});
  }

 private:
  static constexpr std::uint8_t classes = 4;
  struct node {
    node* next;
  };
  struct list {
    node* head = nullptr;
    std::size_t count = 0;
  };
  struct lists {
    std::array<list, classes> of{};
    lists() = default;
    lists(const lists&) = delete;
    lists& operator=(const lists&) = delete;
    ~lists() {
      exited_ = true;
      for (std::uint8_t c = 0; c < classes; ++c) {
        while (of[c].head != nullptr) {
          ::operator delete (std::exchange(of[c].head, of[c].head->next), std::align_val_t{alignment});
        }
      }
    }
    list& operator[](std::uint8_t c) noexcept { return of[c]; }
  };
  static thread_local lists lists_;
  static thread_local bool exited_;  // trivially destructible: readable after lists_ is gone
};

inline thread_local node_cache::lists node_cache::lists_;
inline thread_local bool node_cache::exited_ = false;

/// An allocator of single objects from node_cache (std::allocate_shared's
/// control block and object, one node); arrays and large types use the heap.
template <class T>
class recycling_allocator {
 public:
  using value_type = T;

  recycling_allocator() noexcept = default;
  template <class U>
  recycling_allocator(const recycling_allocator<U>&) noexcept {}  // NOLINT: rebinding, as allocators do

  T* allocate(std::size_t n) {
    if (cached(n)) return static_cast<T*>(node_cache::take(node_class));
    if constexpr (over_aligned) {
      return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignof(T)}));
    } else {
      return static_cast<T*>(::operator new(n * sizeof(T)));
    }
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (cached(n)) return node_cache::release(p, node_class);
    if constexpr (over_aligned) {
      ::operator delete(p, std::align_val_t{alignof(T)});
    } else {
      ::operator delete(p);
    }
  }

  template <class U>
  bool operator==(const recycling_allocator<U>&) const noexcept {
    return true;
  }

 private:
  static constexpr std::uint8_t node_class = node_cache::class_of(sizeof(T));
  static constexpr bool cacheable = node_class != node_cache::no_class && alignof(T) <= node_cache::alignment;
  static constexpr bool over_aligned = alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  static bool cached(std::size_t n) noexcept { return cacheable && n == 1; }
};

}  // namespace util
}  // namespace v0
}  // namespace fusewire
