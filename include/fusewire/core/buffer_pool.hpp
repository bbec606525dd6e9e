#pragma once
/// buffer_pool: fixed-size blocks carved from page-aligned slabs that are all
/// mapped up front, one free list per shard (reactor), and one registration
/// per slab (RDMA registers each slab once, not each buffer).
///
/// When a shard runs dry, allocate() fails with errc::pool_exhausted; the pool
/// never falls back to unbounded allocation (callers decide what to do).

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/detail/buffer_owner.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {

/// Registers one slab (e.g. ibv_reg_mr); called once per slab on the thread
/// that constructs the pool. May throw: the pool then undoes what it did and rethrows.
using slab_register_hook = std::function<registration(void* base, std::size_t len)>;
/// Undoes slab_register_hook; called once per registered slab when the pool's
/// memory is released. Must not throw.
using slab_unregister_hook = std::function<void(const registration& reg, void* base, std::size_t len)>;

/// How a buffer_pool is laid out.
struct buffer_pool_config {
  /// Bytes in the whole pool; a positive multiple of block_size.
  std::size_t total_bytes = std::size_t{64} << 20;
  /// Bytes per block, the largest buffer the pool hands out; a power of two, at least 64.
  std::size_t block_size = std::size_t{64} << 10;
  /// Independent free lists, one per reactor; blocks are spread evenly over them.
  unsigned shards = 1;
  /// 0: each shard's memory is one slab. Otherwise each shard's memory is cut
  /// into slabs of this many bytes (a multiple of block_size; the last may be shorter).
  std::size_t slab_size = 0;
  /// Fault every page in at construction (MAP_POPULATE) instead of on first touch.
  bool populate = false;
  /// Optional registration of each slab.
  slab_register_hook register_slab;
  /// Optional release of each registration.
  slab_unregister_hook unregister_slab;

  /// total_bytes and block_size from options' pool_size and pool_block_size.
  static buffer_pool_config from(const options& o, unsigned shards) {
    buffer_pool_config c;
    c.total_bytes = o.pool_size;
    c.block_size = o.pool_block_size;
    c.shards = shards;
    return c;
  }
};

/// A slab: one mapping, registered once.
struct slab_info {
  std::byte* base = nullptr;
  std::size_t size = 0;
  unsigned shard = 0;
  bool registered = false;
  registration reg{};
};

/// A shard's counters, readable from any thread (a snapshot, not a lock).
struct shard_stats {
  std::size_t total_blocks = 0;
  std::size_t free_blocks = 0;
  std::size_t failed_allocations = 0;  ///< allocate() calls that found the shard exhausted
};

namespace detail {

class pool_state;
struct pool_shard;

/// One block's bookkeeping; recycled, never freed while the pool's memory lives.
class pool_block final : public buffer_owner {
 public:
  pool_block() noexcept = default;
  std::byte* data_ = nullptr;
  pool_shard* shard_ = nullptr;
  pool_block* next_ = nullptr;
  using buffer_owner::reset_refs;

 private:
  inline void destroy() noexcept override;
};

/// One shard. The free list is touched only by the shard's owning thread;
/// blocks released elsewhere come back through `returned_`, a lock-free stack
/// that the owner empties in one exchange (so no ABA).
struct alignas(64) pool_shard {
  pool_block* free_ = nullptr;  // owner thread only
  std::size_t total_ = 0;
  pool_state* state_ = nullptr;
  alignas(64) std::atomic<pool_block*> returned_{nullptr};
  // 1 while the pool is open, plus one per block handed out.
  std::atomic<std::size_t> holds_{1};
  std::atomic<std::size_t> failed_{0};

  void give_back(pool_block* b) noexcept {
    pool_block* head = returned_.load(std::memory_order_relaxed);
    do {
      b->next_ = head;
    } while (!returned_.compare_exchange_weak(head, b, std::memory_order_release, std::memory_order_relaxed));
    drop_hold();
  }

  inline void drop_hold() noexcept;
};

inline void pool_block::destroy() noexcept { shard_->give_back(this); }

/// The pool's memory and bookkeeping; outlives the buffer_pool handle until
/// the last outstanding buffer comes back.
class pool_state {
 public:
  explicit pool_state(buffer_pool_config config) : config_(std::move(config)) {}

  pool_state(const pool_state&) = delete;
  pool_state& operator=(const pool_state&) = delete;

  ~pool_state() {
    for (auto it = slabs_.rbegin(); it != slabs_.rend(); ++it) {
      if (it->registered && config_.unregister_slab) config_.unregister_slab(it->reg, it->base, it->size);
      ::munmap(it->base, it->size);
    }
  }

  void shard_done() noexcept {
    if (shards_alive_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  buffer_pool_config config_;
  std::unique_ptr<pool_shard[]> shards_;
  std::unique_ptr<pool_block[]> blocks_;
  std::vector<slab_info> slabs_;
  std::atomic<unsigned> shards_alive_{0};
};

inline void pool_shard::drop_hold() noexcept {
  if (holds_.fetch_sub(1, std::memory_order_acq_rel) == 1) state_->shard_done();
}

[[noreturn]] inline void bad_pool_config(const std::string& what) {
  throw_error(errc::invalid_argument, "buffer_pool: " + what);
}

}  // namespace detail

/// Fixed-size pooled buffers with per-shard free lists.
///
/// Threads: shard `s` belongs to one thread (its reactor); only that thread
/// calls allocate(…, s, …). Buffers may be released on any thread; they go
/// back to their own shard. stats() may be called from any thread.
/// Lifetime: destroying the pool while buffers are still out is allowed; the
/// memory is unregistered and unmapped when the last of them is released, on
/// the thread that releases it.
class buffer_pool {
 public:
  /// Maps and registers every slab. Throws system_error: errc::invalid_argument
  /// naming a bad config value, errc::out_of_memory if a slab cannot be mapped,
  /// or whatever the registration hook throws.
  explicit buffer_pool(buffer_pool_config config) {
    validate(config);
    auto state = std::make_unique<detail::pool_state>(std::move(config));
    const buffer_pool_config& c = state->config_;
    const std::size_t blocks = c.total_bytes / c.block_size;
    state->shards_ = std::make_unique<detail::pool_shard[]>(c.shards);
    state->blocks_ = std::make_unique<detail::pool_block[]>(blocks);
    state->slabs_.reserve(slab_count(c));  // so map_slab() cannot throw between mmap and recording it
    std::size_t next_block = 0;
    for (unsigned s = 0; s < c.shards; ++s) {
      detail::pool_shard& shard = state->shards_[s];
      shard.state_ = state.get();
      shard.total_ = blocks / c.shards + (s < blocks % c.shards ? 1 : 0);
      const std::size_t shard_bytes = shard.total_ * c.block_size;
      const std::size_t slab_bytes = c.slab_size == 0 ? shard_bytes : c.slab_size;
      detail::pool_block* tail = nullptr;
      for (std::size_t offset = 0; offset < shard_bytes; offset += slab_bytes) {
        slab_info& slab = map_slab(*state, std::min(slab_bytes, shard_bytes - offset), s);
        for (std::size_t at = 0; at < slab.size; at += c.block_size) {
          detail::pool_block& b = state->blocks_[next_block++];
          b.data_ = slab.base + at;
          b.shard_ = &shard;
          if (slab.registered) b.set_registration(slab.reg);
          // Lowest addresses first.
          (tail == nullptr ? shard.free_ : tail->next_) = &b;
          tail = &b;
        }
      }
    }
    state->shards_alive_.store(c.shards, std::memory_order_relaxed);
    state_ = state.release();
  }

  buffer_pool(buffer_pool&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}

  buffer_pool& operator=(buffer_pool&& other) noexcept {
    if (this != &other) {
      close();
      state_ = std::exchange(other.state_, nullptr);
    }
    return *this;
  }

  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;

  ~buffer_pool() { close(); }

  /// Sets `out` to a buffer of `size` bytes (at most block_size()) from shard
  /// `shard`'s free list; call only on that shard's thread. Errors (and `out`
  /// left empty): errc::pool_exhausted when the shard has no free block,
  /// errc::invalid_argument when size > block_size() or the shard does not
  /// exist. A block is never split or combined: size 0 succeeds with an empty
  /// buffer and takes no block.
  std::error_code allocate(std::size_t size, unsigned shard, tensor_buffer& out) noexcept {
    out.reset();
    if (state_ == nullptr || shard >= state_->config_.shards || size > state_->config_.block_size) {
      return errc::invalid_argument;
    }
    if (size == 0) return {};
    detail::pool_shard& s = state_->shards_[shard];
    if (s.free_ == nullptr) s.free_ = s.returned_.exchange(nullptr, std::memory_order_acquire);
    detail::pool_block* b = s.free_;
    if (b == nullptr) {
      s.failed_.fetch_add(1, std::memory_order_relaxed);
      return errc::pool_exhausted;
    }
    s.free_ = b->next_;
    b->next_ = nullptr;
    b->reset_refs();
    s.holds_.fetch_add(1, std::memory_order_relaxed);
    out = detail::tensor_buffer_access::adopt(b, b->data_, size);
    return {};
  }

  /// allocate() that throws system_error naming the shard and sizes.
  tensor_buffer allocate(std::size_t size, unsigned shard) {
    tensor_buffer out;
    const std::error_code ec = allocate(size, shard, out);
    if (!ec) return out;
    if (state_ == nullptr) throw_error(errc::invalid_argument, "buffer_pool: used after being moved from");
    if (shard >= shards()) {
      throw_error(errc::invalid_argument, "buffer_pool: no shard " + std::to_string(shard) + " (the pool has " +
                                              std::to_string(shards()) + ")");
    }
    if (size > block_size()) {
      throw_error(errc::invalid_argument, "buffer_pool: cannot allocate " + std::to_string(size) +
                                              " bytes from blocks of " + std::to_string(block_size()) + " bytes");
    }
    throw_error(errc::pool_exhausted, "buffer_pool: shard " + std::to_string(shard) + " has no free block (all " +
                                          std::to_string(state_->shards_[shard].total_) + " blocks of " +
                                          std::to_string(block_size()) + " bytes are in use)");
  }

  std::size_t block_size() const noexcept { return state_ != nullptr ? state_->config_.block_size : 0; }
  unsigned shards() const noexcept { return state_ != nullptr ? state_->config_.shards : 0; }

  /// Counters of shard `shard` (all zero if it does not exist).
  shard_stats stats(unsigned shard) const noexcept {
    if (state_ == nullptr || shard >= shards()) return {};
    const detail::pool_shard& s = state_->shards_[shard];
    const std::size_t out = s.holds_.load(std::memory_order_relaxed) - 1;
    return {s.total_, s.total_ - std::min(out, s.total_), s.failed_.load(std::memory_order_relaxed)};
  }

  /// Every slab, in address order per shard.
  std::span<const slab_info> slabs() const noexcept {
    if (state_ == nullptr) return {};
    return state_->slabs_;
  }

  /// True if `p` points into the pool's memory.
  bool owns(const void* p) const noexcept {
    if (state_ == nullptr) return false;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    for (const slab_info& slab : state_->slabs_) {
      const auto base = reinterpret_cast<std::uintptr_t>(slab.base);
      if (addr >= base && addr - base < slab.size) return true;
    }
    return false;
  }

 private:
  static void validate(const buffer_pool_config& c) {
    using detail::bad_pool_config;
    if (c.block_size < 64 || (c.block_size & (c.block_size - 1)) != 0) {
      bad_pool_config("block_size " + std::to_string(c.block_size) + " must be a power of two of at least 64 bytes");
    }
    if (c.shards == 0) bad_pool_config("shards must be at least 1");
    if (c.total_bytes == 0 || c.total_bytes % c.block_size != 0) {
      bad_pool_config("total_bytes " + std::to_string(c.total_bytes) + " must be a positive multiple of block_size " +
                      std::to_string(c.block_size));
    }
    const std::size_t blocks = c.total_bytes / c.block_size;
    if (blocks < c.shards) {
      bad_pool_config("total_bytes " + std::to_string(c.total_bytes) + " holds " + std::to_string(blocks) +
                      " blocks of " + std::to_string(c.block_size) + " bytes, fewer than its " +
                      std::to_string(c.shards) + " shards (each shard needs at least one)");
    }
    if (c.slab_size % c.block_size != 0) {
      bad_pool_config("slab_size " + std::to_string(c.slab_size) + " must be a multiple of block_size " +
                      std::to_string(c.block_size) + " (or 0 for one slab per shard)");
    }
  }

  static std::size_t slab_count(const buffer_pool_config& c) noexcept {
    const std::size_t blocks = c.total_bytes / c.block_size;
    if (c.slab_size == 0) return c.shards;
    const std::size_t blocks_per_slab = c.slab_size / c.block_size;
    std::size_t n = 0;
    for (unsigned s = 0; s < c.shards; ++s) {
      const std::size_t shard_blocks = blocks / c.shards + (s < blocks % c.shards ? 1 : 0);
      n += (shard_blocks + blocks_per_slab - 1) / blocks_per_slab;
    }
    return n;
  }

  static slab_info& map_slab(detail::pool_state& state, std::size_t size, unsigned shard) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
    if (state.config_.populate) flags |= MAP_POPULATE;
#endif
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      throw_error(errc::out_of_memory, "buffer_pool: cannot map a slab of " + std::to_string(size) +
                                           " bytes: " + std::generic_category().message(err));
    }
    slab_info& slab = state.slabs_.emplace_back();
    slab.base = static_cast<std::byte*>(base);
    slab.size = size;
    slab.shard = shard;
    if (state.config_.register_slab) {
      slab.reg = state.config_.register_slab(base, size);
      slab.registered = true;
    }
    return slab;
  }

  void close() noexcept {
    if (state_ == nullptr) return;
    detail::pool_state* state = std::exchange(state_, nullptr);
    const unsigned n = state->config_.shards;
    for (unsigned s = 0; s < n; ++s) state->shards_[s].drop_hold();
  }

  detail::pool_state* state_ = nullptr;
};

}  // namespace v0
}  // namespace fusewire
