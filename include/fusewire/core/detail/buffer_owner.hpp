#pragma once
/// The control block behind every owning tensor_buffer. Private to core.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace fusewire {
inline namespace v0 {

/// RDMA memory-region keys of registered memory (a registered pool's slab, or wrap()).
struct registration {
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  void* handle = nullptr;  ///< the registering library's own handle (e.g. an ibv_mr*)

  friend bool operator==(const registration&, const registration&) = default;
};

namespace detail {

/// Shared by every alias of one buffer. The thread that drops the last
/// reference calls destroy(), which frees the memory (or returns it to a pool).
class buffer_owner {
 public:
  buffer_owner(const buffer_owner&) = delete;
  buffer_owner& operator=(const buffer_owner&) = delete;

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }

  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy();
  }

  std::size_t use_count() const noexcept { return refs_.load(std::memory_order_relaxed); }
  /// Whether the caller's is the only reference; acquire: whatever the other
  /// holders did with the bytes happened before the caller reuses them.
  bool sole() const noexcept { return refs_.load(std::memory_order_acquire) == 1; }

  const registration* reg() const noexcept { return registered_ ? &reg_ : nullptr; }

  void set_registration(const registration& r) noexcept {
    reg_ = r;
    registered_ = true;
  }

 protected:
  buffer_owner() noexcept = default;
  ~buffer_owner() = default;

  /// For owners that are recycled (pool blocks): back to one reference.
  void reset_refs() noexcept { refs_.store(1, std::memory_order_relaxed); }

  virtual void destroy() noexcept = 0;

 private:
  std::atomic<std::size_t> refs_{1};
  registration reg_{};
  bool registered_ = false;
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
