#include <fusewire/util/node_cache.hpp>
#include <fusewire/util/unique_function.hpp>

#include <doctest/doctest.h>

#include <array>
#include <memory>
#include <thread>
#include <vector>

using fusewire::util::make_task;
using fusewire::util::node_cache;
using fusewire::util::recycling_allocator;
using fusewire::util::task_ptr;

TEST_CASE("node_cache: size classes") {
  if constexpr (!node_cache::enabled) {  // AddressSanitizer: every node from the heap
    CHECK(node_cache::class_of(1) == node_cache::no_class);
    return;
  }
  CHECK(node_cache::class_of(1) == 0);
  CHECK(node_cache::class_of(64) == 0);
  CHECK(node_cache::class_of(65) == 1);
  CHECK(node_cache::class_of(512) == 3);
  CHECK(node_cache::class_of(513) == node_cache::no_class);
}

TEST_CASE("make_task reuses the node of a task that was dropped") {
  int runs = 0;
  const void* first = nullptr;
  {
    task_ptr t = make_task([&runs] { ++runs; });
    first = t.get();
    t->run();
  }
  task_ptr again = make_task([&runs] { runs += 10; });
  if constexpr (node_cache::enabled) CHECK(static_cast<const void*>(again.get()) == first);
  again->run();
  CHECK(runs == 11);

  // Too large for any class: plain new and delete, and it still runs.
  std::array<char, 1024> big{};
  big[0] = 5;
  task_ptr large = make_task([&runs, big] { runs += big[0]; });
  large->run();
  CHECK(runs == 16);
}

TEST_CASE("a cache keeps at most `keep` nodes per class") {
  std::vector<task_ptr> many;
  for (std::size_t i = 0; i < node_cache::keep * 3; ++i) many.push_back(make_task([] {}));
  many.clear();  // all but `keep` go back to the heap (ASan sees any leak)
  std::vector<task_ptr> again;
  for (std::size_t i = 0; i < node_cache::keep * 3; ++i) again.push_back(make_task([] {}));
  CHECK(again.size() == node_cache::keep * 3);
}

TEST_CASE("recycling_allocator: allocate_shared records come back for the next record") {
  struct record {
    std::array<std::uint64_t, 20> words{};
  };
  const void* first = nullptr;
  {
    auto a = std::allocate_shared<record>(recycling_allocator<record>{});
    a->words[3] = 7;
    first = a.get();
  }
  auto b = std::allocate_shared<record>(recycling_allocator<record>{});
  if constexpr (node_cache::enabled) CHECK(static_cast<const void*>(b.get()) == first);
  CHECK(b->words[3] == 0);  // a fresh object in the old node
  recycling_allocator<record> alloc;
  record* many = alloc.allocate(4);  // arrays: the heap
  alloc.deallocate(many, 4);
}

TEST_CASE("nodes made on one thread and dropped on another" * doctest::test_suite("thread")) {
  std::vector<task_ptr> made;
  std::vector<std::shared_ptr<int>> records;
  int runs = 0;
  for (int i = 0; i < 200; ++i) {
    made.push_back(make_task([&runs] { ++runs; }));
    records.push_back(std::allocate_shared<int>(recycling_allocator<int>{}, i));
  }
  std::thread other([&] {
    for (auto& t : made) t->run();
    made.clear();
    records.clear();
    // This thread's cache now holds nodes from the first; its exit frees them.
    for (int i = 0; i < 10; ++i) make_task([&runs] { ++runs; })->run();
  });
  other.join();
  CHECK(runs == 210);
  CHECK(made.empty());
}
