#include <fusewire/core/buffer_pool.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <boost/lockfree/spsc_queue.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

using fusewire::buffer_pool;
using fusewire::buffer_pool_config;
using fusewire::errc;
using fusewire::registration;
using fusewire::tensor_buffer;

namespace {

buffer_pool_config small_config(std::size_t blocks, std::size_t block_size = 4096, unsigned shards = 1) {
  buffer_pool_config c;
  c.total_bytes = blocks * block_size;
  c.block_size = block_size;
  c.shards = shards;
  return c;
}

std::string config_error(buffer_pool_config c) {
  try {
    buffer_pool pool(std::move(c));
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_argument);
    return e.what();
  }
  return "no exception";
}

/// Records every registration and unregistration a pool makes.
struct registry {
  struct slab {
    void* base;
    std::size_t len;
    registration reg;
  };
  std::vector<slab> registered;
  std::vector<slab> unregistered;
  std::uint32_t next_key = 100;

  void hook(buffer_pool_config& c) {
    c.register_slab = [this](void* base, std::size_t len) {
      registration r{next_key, next_key + 1, base};
      next_key += 2;
      registered.push_back({base, len, r});
      return r;
    };
    c.unregister_slab = [this](const registration& r, void* base, std::size_t len) {
      unregistered.push_back({base, len, r});
    };
  }
};

}  // namespace

TEST_CASE("a bad config is refused with a message naming the value") {
  auto c = small_config(4);
  c.block_size = 3000;
  c.total_bytes = 12000;
  CHECK(config_error(c) ==
        "buffer_pool: block_size 3000 must be a power of two of at least 64 bytes: invalid argument");
  c = small_config(4);
  c.block_size = 32;
  c.total_bytes = 128;
  CHECK(config_error(c) == "buffer_pool: block_size 32 must be a power of two of at least 64 bytes: invalid argument");
  c = small_config(4);
  c.shards = 0;
  CHECK(config_error(c) == "buffer_pool: shards must be at least 1: invalid argument");
  c = small_config(4);
  c.total_bytes = 10000;
  CHECK(config_error(c) ==
        "buffer_pool: total_bytes 10000 must be a positive multiple of block_size 4096: invalid argument");
  c.total_bytes = 0;
  CHECK(config_error(c) ==
        "buffer_pool: total_bytes 0 must be a positive multiple of block_size 4096: invalid argument");
  c = small_config(2, 4096, 3);
  CHECK(config_error(c) ==
        "buffer_pool: total_bytes 8192 holds 2 blocks of 4096 bytes, fewer than its 3 shards "
        "(each shard needs at least one): invalid argument");
  c = small_config(4);
  c.slab_size = 5000;
  CHECK(config_error(c) ==
        "buffer_pool: slab_size 5000 must be a multiple of block_size 4096 (or 0 for one slab per shard): invalid "
        "argument");
}

TEST_CASE("allocate hands out distinct, aligned blocks from page-aligned slabs") {
  buffer_pool pool(small_config(4, 1024));
  CHECK(pool.block_size() == 1024);
  CHECK(pool.shards() == 1);
  REQUIRE(pool.slabs().size() == 1);
  CHECK(reinterpret_cast<std::uintptr_t>(pool.slabs()[0].base) % 4096 == 0);
  CHECK(pool.slabs()[0].size == 4096);
  CHECK_FALSE(pool.slabs()[0].registered);

  std::vector<tensor_buffer> held;
  std::set<std::byte*> seen;
  for (int i = 0; i < 4; ++i) {
    tensor_buffer b;
    REQUIRE_FALSE(pool.allocate(1000, 0, b));
    CHECK(b.size() == 1000);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 1024 == 0);
    CHECK(pool.owns(b.data()));
    CHECK(b.reg() == nullptr);       // no registration hook
    std::memset(b.data(), i, 1024);  // the whole block is usable
    seen.insert(b.data());
    held.push_back(std::move(b));
  }
  CHECK(seen.size() == 4);
  CHECK(pool.stats(0).free_blocks == 0);
  CHECK(pool.stats(0).total_blocks == 4);
  int outside = 0;
  CHECK_FALSE(pool.owns(&outside));
}

TEST_CASE("an exhausted shard fails with pool_exhausted and never falls back to the heap") {
  buffer_pool pool(small_config(2));
  tensor_buffer a = pool.allocate(10, 0);
  tensor_buffer b = pool.allocate(4096, 0);
  tensor_buffer c = tensor_buffer::allocate(8);  // `out` is reset on failure
  CHECK(pool.allocate(1, 0, c) == errc::pool_exhausted);
  CHECK(c.empty());
  CHECK(pool.stats(0).failed_allocations == 1);
  try {
    (void)pool.allocate(1, 0);
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::pool_exhausted);
    CHECK(std::string(e.what()) ==
          "buffer_pool: shard 0 has no free block (all 2 blocks of 4096 bytes are in use): buffer pool exhausted");
  }
  CHECK(pool.stats(0).failed_allocations == 2);

  // Releasing one alias is not enough; releasing the last gives the block back.
  tensor_buffer alias = a.share(2, 3);
  a.reset();
  CHECK(pool.allocate(1, 0, c) == errc::pool_exhausted);
  alias.reset();
  CHECK(pool.stats(0).free_blocks == 1);
  CHECK_FALSE(pool.allocate(1, 0, c));
  CHECK(c.size() == 1);
}

TEST_CASE("bad requests: too large, unknown shard, size zero") {
  buffer_pool pool(small_config(2, 4096, 2));
  tensor_buffer out;
  CHECK(pool.allocate(4097, 0, out) == errc::invalid_argument);
  CHECK(pool.allocate(1, 2, out) == errc::invalid_argument);
  CHECK(pool.allocate(0, 0, out) == std::error_code());
  CHECK(out.empty());
  CHECK(pool.stats(0).free_blocks == 1);  // size 0 takes no block
  try {
    (void)pool.allocate(5000, 1);
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(std::string(e.what()) ==
          "buffer_pool: cannot allocate 5000 bytes from blocks of 4096 bytes: invalid argument");
  }
  try {
    (void)pool.allocate(1, 7);
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(std::string(e.what()) == "buffer_pool: no shard 7 (the pool has 2): invalid argument");
  }
  CHECK(pool.stats(9).total_blocks == 0);
}

TEST_CASE("blocks are spread evenly over shards, and shards are independent") {
  buffer_pool pool(small_config(5, 4096, 2));
  CHECK(pool.stats(0).total_blocks == 3);
  CHECK(pool.stats(1).total_blocks == 2);
  REQUIRE(pool.slabs().size() == 2);
  CHECK(pool.slabs()[0].shard == 0);
  CHECK(pool.slabs()[0].size == 3 * 4096);
  CHECK(pool.slabs()[1].shard == 1);
  std::vector<tensor_buffer> held;
  tensor_buffer b;
  while (!pool.allocate(64, 1, b)) held.push_back(std::move(b));
  CHECK(held.size() == 2);
  CHECK(pool.stats(1).free_blocks == 0);
  CHECK(pool.stats(0).free_blocks == 3);
  CHECK_FALSE(pool.allocate(64, 0, b));
  const auto& slab1 = pool.slabs()[1];
  for (const auto& h : held) {
    CHECK(h.data() >= slab1.base);
    CHECK(h.data() < slab1.base + slab1.size);
  }
  // A block goes back to the shard it came from, whoever frees it.
  held.clear();
  CHECK(pool.stats(1).free_blocks == 2);
}

TEST_CASE("the registration hook runs once per slab and buffers carry the slab's keys") {
  registry r;
  {
    auto c = small_config(8, 4096, 2);
    c.slab_size = 2 * 4096;  // 4 blocks per shard -> 2 slabs per shard
    r.hook(c);
    buffer_pool pool(std::move(c));
    REQUIRE(r.registered.size() == 4);
    REQUIRE(pool.slabs().size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(pool.slabs()[i].registered);
      CHECK(pool.slabs()[i].base == r.registered[i].base);
      CHECK(r.registered[i].len == 2 * 4096);
      CHECK(pool.slabs()[i].reg == r.registered[i].reg);
      CHECK(pool.slabs()[i].shard == i / 2);
    }
    std::vector<tensor_buffer> held;
    for (unsigned shard = 0; shard < 2; ++shard) {
      for (int i = 0; i < 4; ++i) held.push_back(pool.allocate(100, shard));
    }
    for (const tensor_buffer& b : held) {
      REQUIRE(b.reg() != nullptr);
      const auto& slabs = pool.slabs();
      const auto slab = std::find_if(slabs.begin(), slabs.end(), [&](const fusewire::slab_info& s) {
        return b.data() >= s.base && b.data() < s.base + s.size;
      });
      REQUIRE(slab != slabs.end());
      CHECK(*b.reg() == slab->reg);
      // A share keeps the registration.
      CHECK(*b.share(10, 10).reg() == slab->reg);
    }
    CHECK(r.registered.size() == 4);  // allocation registers nothing
    CHECK(r.unregistered.empty());
  }
  REQUIRE(r.unregistered.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    // Undone in reverse order, each exactly once.
    CHECK(r.unregistered[i].reg == r.registered[3 - i].reg);
    CHECK(r.unregistered[i].base == r.registered[3 - i].base);
    CHECK(r.unregistered[i].len == r.registered[3 - i].len);
  }
}

TEST_CASE("a failing registration hook undoes the slabs already registered") {
  std::vector<void*> unregistered;
  int calls = 0;
  auto c = small_config(4, 4096, 2);
  c.register_slab = [&](void* base, std::size_t) {
    if (++calls == 2) fusewire::throw_error(errc::device_error, "ibv_reg_mr failed");
    return registration{1, 2, base};
  };
  c.unregister_slab = [&](const registration&, void* base, std::size_t) { unregistered.push_back(base); };
  try {
    buffer_pool pool(std::move(c));
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::device_error);
  }
  CHECK(calls == 2);
  CHECK(unregistered.size() == 1);
}

TEST_CASE("destroying the pool with buffers out defers unregistration to the last buffer") {
  registry r;
  tensor_buffer survivor;
  {
    auto c = small_config(2, 4096, 2);
    r.hook(c);
    buffer_pool pool(std::move(c));
    survivor = pool.allocate(64, 1);
    std::memset(survivor.data(), 7, 64);
  }
  CHECK(r.unregistered.empty());
  CHECK(survivor.data()[63] == std::byte{7});  // memory still mapped
  tensor_buffer alias = survivor.share();
  survivor.reset();
  CHECK(r.unregistered.empty());
  alias.reset();
  CHECK(r.unregistered.size() == 2);
}

TEST_CASE("a moved pool keeps working; the moved-from one refuses politely") {
  buffer_pool a(small_config(2));
  tensor_buffer held = a.allocate(8, 0);
  buffer_pool b(std::move(a));
  tensor_buffer out;
  CHECK(a.allocate(8, 0, out) == errc::invalid_argument);  // NOLINT(bugprone-use-after-move)
  CHECK(a.shards() == 0);
  CHECK(a.slabs().empty());
  CHECK_FALSE(b.allocate(8, 0, out));
  CHECK(b.stats(0).free_blocks == 0);
  held.reset();
  CHECK(b.stats(0).free_blocks == 1);
  buffer_pool c(small_config(1));
  c = std::move(b);
  CHECK(c.stats(0).total_blocks == 2);
}

TEST_CASE("populate maps the pool eagerly and it works the same") {
  auto c = small_config(4);
  c.populate = true;
  buffer_pool pool(std::move(c));
  tensor_buffer b = pool.allocate(4096, 0);
  std::memset(b.data(), 1, b.size());
  CHECK(pool.stats(0).free_blocks == 3);
}

TEST_CASE("buffer_pool_config::from takes sizes from options") {
  fusewire::options o;
  o.pool_size = 1 << 20;
  o.pool_block_size = 1 << 16;
  const buffer_pool_config c = buffer_pool_config::from(o, 4);
  CHECK(c.total_bytes == (1u << 20));
  CHECK(c.block_size == (1u << 16));
  CHECK(c.shards == 4);
  buffer_pool pool(c);
  CHECK(pool.stats(3).total_blocks == 4);
}

TEST_SUITE("thread") {
  struct handoff {
    tensor_buffer buffer;
    std::uint64_t seq;
  };
  using queue = boost::lockfree::spsc_queue<handoff*, boost::lockfree::capacity<64>>;

  TEST_CASE("buffers released on another thread go back to their shard") {
    constexpr std::uint64_t count = 20000;
    buffer_pool pool(small_config(8, 256));
    queue q;
    std::atomic<bool> corrupt{false};
    std::thread releaser([&] {
      for (std::uint64_t got = 0; got < count;) {
        handoff* h = nullptr;
        if (!q.pop(h)) {
          std::this_thread::yield();
          continue;
        }
        std::uint64_t seen = 0;
        std::memcpy(&seen, h->buffer.data(), sizeof seen);
        if (seen != h->seq) corrupt = true;
        delete h;  // releases the block on this thread
        ++got;
      }
    });
    for (std::uint64_t seq = 0; seq < count;) {
      tensor_buffer b;
      if (const std::error_code ec = pool.allocate(256, 0, b)) {
        REQUIRE(ec == errc::pool_exhausted);
        std::this_thread::yield();
        continue;
      }
      std::memcpy(b.data(), &seq, sizeof seq);
      auto* h = new handoff{std::move(b), seq};
      while (!q.push(h)) std::this_thread::yield();
      ++seq;
    }
    releaser.join();
    CHECK_FALSE(corrupt.load());
    CHECK(pool.stats(0).free_blocks == 8);
  }

  TEST_CASE("two shard owners trade buffers and release each other's") {
    constexpr std::uint64_t count = 10000;
    buffer_pool pool(small_config(8, 128, 2));
    queue to[2];
    std::atomic<bool> corrupt{false};
    auto run = [&](unsigned me) {
      const unsigned other = 1 - me;
      std::uint64_t sent = 0;
      std::uint64_t received = 0;
      while (sent < count || received < count) {
        bool progressed = false;
        if (sent < count) {
          tensor_buffer b;
          if (!pool.allocate(128, me, b)) {
            const std::uint64_t tag = (std::uint64_t{me} << 32) | sent;
            std::memcpy(b.data(), &tag, sizeof tag);
            auto* h = new handoff{std::move(b), tag};
            if (to[other].push(h)) {
              ++sent;
              progressed = true;
            } else {
              delete h;  // released on the owning thread: same path
            }
          }
        }
        handoff* h = nullptr;
        while (to[me].pop(h)) {
          std::uint64_t seen = 0;
          std::memcpy(&seen, h->buffer.data(), sizeof seen);
          if (seen != h->seq || (seen >> 32) != other) corrupt = true;
          delete h;
          ++received;
          progressed = true;
        }
        if (!progressed) std::this_thread::yield();
      }
    };
    std::thread t1(run, 1u);
    run(0);
    t1.join();
    CHECK_FALSE(corrupt.load());
    CHECK(pool.stats(0).free_blocks == 4);
    CHECK(pool.stats(1).free_blocks == 4);
  }

  TEST_CASE("the pool may die while another thread still holds its buffers") {
    std::atomic<int> unregistered{0};
    std::promise<void> pool_gone;
    std::promise<tensor_buffer> handed;
    std::thread holder;
    {
      auto c = small_config(4, 4096, 1);
      c.register_slab = [](void* base, std::size_t) { return registration{5, 6, base}; };
      c.unregister_slab = [&](const registration&, void*, std::size_t) { unregistered.fetch_add(1); };
      buffer_pool pool(std::move(c));
      auto future_buffer = handed.get_future();
      holder = std::thread([&, gone = pool_gone.get_future(), fb = std::move(future_buffer)]() mutable {
        tensor_buffer b = fb.get();
        gone.wait();
        std::memset(b.data(), 3, b.size());
        b.reset();  // last buffer: unregisters and unmaps here
      });
      handed.set_value(pool.allocate(4096, 0));
    }
    CHECK(unregistered.load() == 0);
    pool_gone.set_value();
    holder.join();
    CHECK(unregistered.load() == 1);
  }
}
