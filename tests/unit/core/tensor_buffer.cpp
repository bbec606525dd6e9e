#include <fusewire/core/tensor_buffer.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using fusewire::const_buffer;
using fusewire::errc;
using fusewire::tensor_buffer;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::string text_of(const tensor_buffer& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_argument);
    return e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE("a default buffer is empty and owns nothing") {
  tensor_buffer b;
  CHECK(b.empty());
  CHECK(b.size() == 0);
  CHECK(b.data() == nullptr);
  CHECK(b.reg() == nullptr);
  CHECK_FALSE(b.owns_memory());
  CHECK(b.use_count() == 0);
  CHECK(b.share().empty());
}

TEST_CASE("allocate gives 64-byte aligned, writable memory") {
  for (std::size_t size : {1u, 7u, 64u, 1000u, 1u << 20}) {
    tensor_buffer b = tensor_buffer::allocate(size);
    CHECK(b.size() == size);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
    std::memset(b.data(), 0xab, b.size());
    CHECK(b.bytes().back() == std::byte{0xab});
    CHECK(b.owns_memory());
    CHECK(b.use_count() == 1);
  }
  CHECK(tensor_buffer::allocate(0).empty());
}

TEST_CASE("allocate of an impossible size throws bad_alloc") {
  CHECK_THROWS_AS(tensor_buffer::allocate(static_cast<std::size_t>(-1)), std::bad_alloc);
  CHECK_THROWS_AS(tensor_buffer::allocate(static_cast<std::size_t>(-1) - 10), std::bad_alloc);
}

TEST_CASE("copy_of copies the bytes") {
  auto src = bytes_of("hello tensors");
  tensor_buffer b = tensor_buffer::copy_of(src);
  src[0] = std::byte{'J'};
  CHECK(text_of(b) == "hello tensors");
  CHECK(b.data() != src.data());
  CHECK(tensor_buffer::copy_of({}).empty());
}

TEST_CASE("wrap calls the deleter exactly once, when the last alias dies") {
  int deleted = 0;
  auto storage = bytes_of("0123456789");
  {
    tensor_buffer whole = tensor_buffer::wrap(storage.data(), storage.size(), [&] { ++deleted; });
    CHECK(whole.use_count() == 1);
    tensor_buffer middle = whole.share(2, 5);
    tensor_buffer all = whole.share();
    CHECK(whole.use_count() == 3);
    CHECK(text_of(middle) == "23456");
    CHECK(middle.data() == storage.data() + 2);  // no copy
    CHECK(all.data() == storage.data());
    tensor_buffer inner = middle.share(1, 3);
    CHECK(text_of(inner) == "345");
    whole.reset();
    all = tensor_buffer();
    middle = std::move(inner);  // drops the old middle, keeps inner's alias
    CHECK(deleted == 0);
    CHECK(middle.use_count() == 1);
    CHECK(text_of(middle) == "345");
  }
  CHECK(deleted == 1);
}

TEST_CASE("moving a buffer transfers the alias and leaves the source empty") {
  int deleted = 0;
  std::array<std::byte, 4> storage{};
  tensor_buffer a = tensor_buffer::wrap(storage.data(), storage.size(), [&] { ++deleted; });
  tensor_buffer b = std::move(a);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): documented moved-from state
  CHECK(a.data() == nullptr);
  CHECK(b.size() == 4);
  tensor_buffer& self = b;
  b = std::move(self);
  CHECK(b.size() == 4);
  CHECK(deleted == 0);
  b = tensor_buffer();
  CHECK(deleted == 1);
}

TEST_CASE("a registered wrap carries its registration through shares") {
  std::array<std::byte, 16> storage{};
  const fusewire::registration reg{7, 9, &storage};
  tensor_buffer b = tensor_buffer::wrap(
      storage.data(), storage.size(), [] {}, reg);
  REQUIRE(b.reg() != nullptr);
  CHECK(*b.reg() == reg);
  tensor_buffer part = b.share(4, 4);
  b.reset();
  REQUIRE(part.reg() != nullptr);
  CHECK(part.reg()->lkey == 7);
  CHECK(part.reg()->rkey == 9);
  CHECK(tensor_buffer::allocate(8).reg() == nullptr);
}

TEST_CASE("view owns nothing; its shares alias the caller's bytes") {
  auto storage = bytes_of("abcdef");
  tensor_buffer v = tensor_buffer::view(storage.data(), storage.size());
  CHECK_FALSE(v.owns_memory());
  tensor_buffer s = v.share(1, 2);
  CHECK(text_of(s) == "bc");
  CHECK(s.use_count() == 0);
  storage[1] = std::byte{'B'};
  CHECK(text_of(s) == "Bc");
}

TEST_CASE("share, trim and trim_front reject out-of-range requests with a message") {
  tensor_buffer b = tensor_buffer::allocate(10);
  CHECK(error_of([&] { (void)b.share(11, 0); }) ==
        "tensor_buffer::share(11, 0): range exceeds the buffer's 10 bytes: invalid argument");
  CHECK(error_of([&] { (void)b.share(4, 7); }) ==
        "tensor_buffer::share(4, 7): range exceeds the buffer's 10 bytes: invalid argument");
  CHECK(error_of([&] { (void)b.share(1, static_cast<std::size_t>(-1)); }) ==
        "tensor_buffer::share(1, 18446744073709551615): range exceeds the buffer's 10 bytes: invalid argument");
  CHECK(b.share(10, 0).empty());
  CHECK(b.share(0, 10).size() == 10);
  CHECK(error_of([&] { b.trim(11); }) ==
        "tensor_buffer::trim(11): longer than the buffer's 10 bytes: invalid argument");
  CHECK(error_of([&] { b.trim_front(11); }) ==
        "tensor_buffer::trim_front(11): longer than the buffer's 10 bytes: invalid argument");
  CHECK(b.size() == 10);
}

TEST_CASE("trim and trim_front narrow the view without touching the bytes") {
  auto storage = bytes_of("0123456789");
  tensor_buffer b = tensor_buffer::view(storage.data(), storage.size());
  b.trim_front(3);
  CHECK(text_of(b) == "3456789");
  b.trim(4);
  CHECK(text_of(b) == "3456");
  b.trim_front(4);
  CHECK(b.empty());
}

TEST_CASE("scatter-gather helpers: total_size, as_const_buffers, gather") {
  std::vector<tensor_buffer> parts;
  parts.push_back(tensor_buffer::copy_of(bytes_of("ab")));
  parts.push_back(tensor_buffer());
  parts.push_back(tensor_buffer::copy_of(bytes_of("cde")));
  const std::vector<const_buffer> sg = fusewire::as_const_buffers(parts);
  REQUIRE(sg.size() == 3);
  CHECK(sg[0].data() == parts[0].data());
  CHECK(fusewire::total_size(sg) == 5);
  CHECK(fusewire::total_size({}) == 0);

  std::array<const_buffer, 2> small{};
  CHECK(fusewire::as_const_buffers(parts, small) == 2);
  CHECK(small[0].size() == 2);

  std::array<std::byte, 5> all{};
  CHECK(fusewire::gather(sg, all) == 5);
  CHECK(std::memcmp(all.data(), "abcde", 5) == 0);
  std::array<std::byte, 3> some{};
  CHECK(fusewire::gather(sg, some) == 3);
  CHECK(std::memcmp(some.data(), "abc", 3) == 0);
  CHECK(fusewire::gather(sg, {}) == 0);
}

TEST_CASE("wrap takes any movable callable, including move-only ones") {
  int deleted = 0;
  auto token = std::make_unique<int>(5);
  std::array<std::byte, 1> storage{};
  {
    tensor_buffer b = tensor_buffer::wrap(storage.data(), 1, [&deleted, t = std::move(token)] { deleted += *t; });
  }
  CHECK(deleted == 5);
  static_assert(fusewire::buffer_deleter<void (*)()>);
  static_assert(!fusewire::buffer_deleter<int>);
  static_assert(!fusewire::buffer_deleter<void (*)(int)>);
}

TEST_SUITE("thread") {
  TEST_CASE("large buffers made on one thread and freed on others go back to the one cache, bytes intact") {
    using fusewire::detail::large_blocks;
    for (int round = 0; round < 4; ++round) {
      std::vector<std::thread> workers;
      for (int t = 0; t < 2; ++t) {
        std::vector<tensor_buffer> mine;
        for (std::size_t i = 0; i < large_blocks::max_blocks + 1; ++i) {
          mine.push_back(tensor_buffer::allocate(large_blocks::min_size << (i % 3)));
          std::memset(mine.back().data(), t + 1, mine.back().size());
        }
        workers.emplace_back([mine = std::move(mine), t]() mutable {
          for (tensor_buffer& b : mine) CHECK(b.bytes()[b.size() / 2] == static_cast<std::byte>(t + 1));
          mine.clear();  // into the process's cache (or back to the kernel when it is full)
          tensor_buffer reused = tensor_buffer::allocate(large_blocks::min_size);
          std::memset(reused.data(), 0, reused.size());
        });
      }
      for (auto& w : workers) w.join();
    }
  }

  TEST_CASE("aliases released on many threads run the deleter exactly once") {
    constexpr int rounds = 200;
    constexpr int threads = 4;
    for (int round = 0; round < rounds; ++round) {
      std::atomic<int> deleted{0};
      auto* storage = new std::byte[256];
      std::vector<tensor_buffer> aliases;
      {
        tensor_buffer b = tensor_buffer::wrap(storage, 256, [&deleted, storage] {
          deleted.fetch_add(1);
          delete[] storage;
        });
        for (int t = 0; t < threads; ++t) aliases.push_back(b.share(static_cast<std::size_t>(t) * 64, 64));
      }
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([alias = std::move(aliases[static_cast<std::size_t>(t)]), t]() mutable {
          std::memset(alias.data(), t, alias.size());
          tensor_buffer more = alias.share();
          alias.reset();
        });
      }
      for (auto& w : workers) w.join();
      REQUIRE(deleted.load() == 1);
    }
  }
}

TEST_CASE("small buffers reuse the blocks their thread freed, and keep their bytes apart") {
  using fusewire::detail::heap_owner;
  using fusewire::detail::small_blocks;
  // Sizes at and around the small-block limit, each filled with its own pattern.
  const std::array<std::size_t, 5> sizes{1, 10, heap_owner::small_size - 1, heap_owner::small_size,
                                         heap_owner::small_size + 1};
  std::vector<const std::byte*> freed;
  {
    std::vector<tensor_buffer> first;
    for (std::size_t n : sizes) first.push_back(tensor_buffer::allocate(n));
    for (const tensor_buffer& b : first) freed.push_back(b.data());
  }
  std::vector<tensor_buffer> live;
  for (std::size_t i = 0; i < 3 * small_blocks::max_blocks; ++i) {
    const std::size_t n = sizes[i % sizes.size()];
    tensor_buffer b = tensor_buffer::allocate(n);
    REQUIRE(b.size() == n);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
    std::memset(b.data(), static_cast<int>(i & 0xff), n);
    live.push_back(std::move(b));
  }
  // No two live buffers share bytes, and each still holds its own pattern.
  for (std::size_t i = 0; i < live.size(); ++i) {
    const auto expect = static_cast<std::byte>(i & 0xff);
    CHECK(live[i].bytes().front() == expect);
    CHECK(live[i].bytes().back() == expect);
  }
  if constexpr (small_blocks::enabled) {
    // The small blocks freed above came back (LIFO), the one above the limit did not have to.
    std::size_t reused = 0;
    for (const tensor_buffer& b : live) {
      for (std::size_t i = 0; i + 1 < freed.size(); ++i) reused += b.data() == freed[i] ? 1 : 0;
    }
    CHECK(reused == sizes.size() - 1);
  }
}

TEST_CASE("large buffers reuse the block freed last, within the cache's bounds") {
  using fusewire::detail::large_blocks;
  CHECK(large_blocks::size_class(large_blocks::min_size) == large_blocks::min_size);
  CHECK(large_blocks::size_class((std::size_t{6} << 20) + 1) == (std::size_t{7} << 20));
  CHECK(large_blocks::size_class(5'000'000) >= 5'000'000);
  const std::size_t n = (std::size_t{6} << 20) - 4096;  // header and bytes: within the 6 MiB class
  const std::byte* first = nullptr;
  {
    tensor_buffer b = tensor_buffer::allocate(n);
    REQUIRE(b.size() == n);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
    first = b.data();
  }
  {
    // The same size class: the block just freed, and its bytes are this buffer's to write.
    tensor_buffer again = tensor_buffer::allocate(n - 1000);
    if constexpr (large_blocks::enabled) CHECK(again.data() == first);
    std::memset(again.data(), 0x5a, again.size());
    // A different class never gets it while it is live, nor later a smaller block.
    tensor_buffer other = tensor_buffer::allocate(n / 2);
    CHECK(other.data() != again.data());
    std::memset(other.data(), 0x33, other.size());
    CHECK(again.bytes().back() == std::byte{0x5a});
  }
  // More than the cache holds, all freed at once: the cache keeps at most
  // max_blocks (and max_bytes); the rest go back to the kernel. Under
  // AddressSanitizer the cache is off and LeakSanitizer sees every block freed.
  std::vector<tensor_buffer> many;
  for (std::size_t i = 0; i < 2 * large_blocks::max_blocks; ++i) {
    many.push_back(tensor_buffer::allocate(large_blocks::min_size + i));
    std::memset(many.back().data(), static_cast<int>(i), many.back().size());
  }
  for (std::size_t i = 0; i < many.size(); ++i) {
    CHECK(many[i].bytes().front() == static_cast<std::byte>(i));
    CHECK(many[i].bytes().back() == static_cast<std::byte>(i));
  }
  many.clear();
  tensor_buffer too_big = tensor_buffer::allocate(large_blocks::max_bytes + 1);  // never cached
  CHECK(too_big.size() == large_blocks::max_bytes + 1);
}

TEST_SUITE("thread") {
  TEST_CASE("small buffers freed on other threads and at thread exit are released once, bytes intact") {
    // Buffers made on one thread die on others (a handler's tensor, a frame's
    // meta), which keep their blocks or free them when they exit.
    constexpr int rounds = 50;
    constexpr int per_round = 3 * static_cast<int>(fusewire::detail::small_blocks::max_blocks);
    for (int round = 0; round < rounds; ++round) {
      std::vector<tensor_buffer> made;
      for (int i = 0; i < per_round; ++i) {
        tensor_buffer b = tensor_buffer::allocate(static_cast<std::size_t>(1 + i % 150));
        std::memset(b.data(), i & 0xff, b.size());
        made.push_back(std::move(b));
      }
      std::atomic<int> bad{0};
      std::vector<std::thread> workers;
      for (int t = 0; t < 2; ++t) {
        std::vector<tensor_buffer> mine;
        for (int i = t; i < per_round; i += 2) mine.push_back(std::move(made[static_cast<std::size_t>(i)]));
        workers.emplace_back([mine = std::move(mine), t, &bad]() mutable {
          int i = t;
          for (tensor_buffer& b : mine) {
            for (std::byte x : b.bytes()) bad.fetch_add(x != static_cast<std::byte>(i & 0xff) ? 1 : 0);
            i += 2;
          }
          mine.clear();  // into this thread's list (up to its bound), the rest to the heap
          // Blocks this thread freed serve its own next small buffers.
          for (int k = 0; k < 100; ++k) {
            tensor_buffer again = tensor_buffer::allocate(32);
            std::memset(again.data(), k, again.size());
          }
        });
      }
      for (auto& w : workers) w.join();
      REQUIRE(bad.load() == 0);
    }
  }
}

TEST_CASE("sole: the only handle to owned bytes; false for views, empty buffers and shared bytes") {
  CHECK_FALSE(tensor_buffer().sole());
  auto storage = bytes_of("abc");
  CHECK_FALSE(tensor_buffer::view(storage.data(), storage.size()).sole());
  tensor_buffer a = tensor_buffer::allocate(8);
  CHECK(a.sole());
  tensor_buffer part = a.share(1, 2);
  CHECK_FALSE(a.sole());
  CHECK_FALSE(part.sole());
  std::thread([p = std::move(part)]() mutable { p.reset(); }).join();  // the last other handle dies elsewhere
  CHECK(a.sole());
}
