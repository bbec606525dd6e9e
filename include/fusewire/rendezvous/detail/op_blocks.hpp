#pragma once
/// Operation records of endpoint::op_batch carved from blocks, and blocks reused:
/// a step that starts hundreds of operations pays no allocation per operation,
/// and the memory of one step is the next step's (freeing it instead lets the
/// allocator trim the heap, and the next step page-faults it back: ~15 % of the
/// CPU of a fused step). Private to the rendezvous layer.

#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// Blocks of `BlockSize` records whose last record was released, kept for
/// reuse (at most `max_blocks`; any thread).
template <std::default_initializable Op, std::size_t BlockSize>
  requires(BlockSize > 0)
class block_cache {
 public:
  using block = std::array<Op, BlockSize>;
  static constexpr std::size_t max_blocks = 64;

  block_cache() = default;
  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;
  ~block_cache() {
    for (block* b : free_) delete b;
  }

  /// A block of default-constructed records: a reused one, else a new one.
  std::unique_ptr<block> take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        block* b = free_.back();
        free_.pop_back();
        return std::unique_ptr<block>(b);
      }
    }
    return std::make_unique<block>();
  }

  /// Takes back a block nobody refers to: its records are reset (their
  /// destructors run here) and the block kept, or freed when the cache is full.
  void give(block* b) noexcept {
    if constexpr (std::is_nothrow_default_constructible_v<Op>) {
      for (Op& op : *b) {
        std::destroy_at(&op);
        std::construct_at(&op);
      }
      std::lock_guard lock(mutex_);
      if (free_.size() < max_blocks) {
        try {
          free_.push_back(b);
          return;
        } catch (...) {
        }
      }
    }
    delete b;
  }

 private:
  std::mutex mutex_;
  std::vector<block*> free_;
};

/// Hands out `shared_ptr<Op>`s that alias records of a shared block taken from
/// `cache`. A block goes back to the cache when its last record is released,
/// so one long-lived record holds its block (its siblings' handlers and
/// buffers are released when they complete). make() is not thread-safe; the
/// records may be released on any thread.
template <std::default_initializable Op, std::size_t BlockSize = 32>
  requires(BlockSize > 0)
class op_blocks {
 public:
  using cache_type = block_cache<Op, BlockSize>;

  explicit op_blocks(std::shared_ptr<cache_type> cache = std::make_shared<cache_type>()) : cache_(std::move(cache)) {}

  std::shared_ptr<Op> make() {
    if (!block_ || used_ == BlockSize) {
      // If the shared_ptr cannot be made, it hands the block to the deleter (back to the cache).
      block_ = std::shared_ptr<typename cache_type::block>(
          cache_->take().release(), [cache = cache_](typename cache_type::block* p) { cache->give(p); });
      used_ = 0;
    }
    return std::shared_ptr<Op>(block_, &(*block_)[used_++]);
  }

 private:
  std::shared_ptr<cache_type> cache_;
  std::shared_ptr<typename cache_type::block> block_;
  std::size_t used_ = 0;
};

}  // namespace detail
}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
