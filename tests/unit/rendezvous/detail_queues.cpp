// The rendezvous layer's private containers: small_fifo (the per-(peer, key)
// queues) and op_blocks (batched operation records sharing one allocation).

#include <doctest/doctest.h>

#include <fusewire/rendezvous/detail/op_blocks.hpp>
#include <fusewire/rendezvous/detail/small_fifo.hpp>

#include <memory>
#include <vector>

namespace rvd = fusewire::rendezvous::detail;

namespace {

std::vector<int> contents(rvd::small_fifo<int>& q) { return {q.begin(), q.end()}; }

}  // namespace

TEST_CASE("small_fifo: first in, first out, also through compaction of a queue that never drains") {
  rvd::small_fifo<int> q;
  CHECK(q.empty());
  q.push_back(1);
  CHECK(q.size() == 1);
  CHECK(q.front() == 1);
  q.pop_front();
  CHECK(q.empty());
  // Two ahead of the reader for 1,000 elements: the popped prefix is dropped as it grows.
  int next_in = 0, next_out = 0;
  q.push_back(next_in++);
  q.push_back(next_in++);
  for (int i = 0; i < 1000; ++i) {
    q.push_back(next_in++);
    REQUIRE(q.front() == next_out);
    q.pop_front();
    ++next_out;
    REQUIRE(q.size() == 2);
  }
  CHECK(contents(q) == std::vector<int>{next_out, next_out + 1});
  // A long queue drained from the front keeps its order.
  for (int i = 0; i < 100; ++i) q.push_back(next_in++);
  while (!q.empty()) {
    REQUIRE(q.front() == next_out++);
    q.pop_front();
  }
  CHECK(next_out == next_in);
}

TEST_CASE("small_fifo: erase and erase_if keep the others in order; an emptied queue is reusable") {
  rvd::small_fifo<int> q;
  for (int i = 0; i < 10; ++i) q.push_back(i);
  q.pop_front();
  q.erase(5);
  CHECK(contents(q) == std::vector<int>{1, 2, 3, 4, 6, 7, 8, 9});
  q.erase_if([](int x) { return x % 2 == 0; });
  CHECK(contents(q) == std::vector<int>{1, 3, 7, 9});
  q.erase(42);
  CHECK(q.size() == 4);
  q.erase_if([](int) { return true; });
  CHECK(q.empty());
  q.push_back(7);
  CHECK(q.front() == 7);
  CHECK(q.size() == 1);
}

TEST_CASE("small_fifo: a popped element is released at once") {
  rvd::small_fifo<std::shared_ptr<int>> q;
  auto a = std::make_shared<int>(1);
  auto b = std::make_shared<int>(2);
  q.push_back(a);
  q.push_back(b);
  q.pop_front();
  CHECK(a.use_count() == 1);
  CHECK(b.use_count() == 2);
}

TEST_CASE("op_blocks: records share a block that lives until its last record is released") {
  struct record {
    int value = 0;
  };
  rvd::op_blocks<record, 4> blocks;
  std::vector<std::shared_ptr<record>> first;
  for (int i = 0; i < 4; ++i) {
    first.push_back(blocks.make());
    first.back()->value = i;
  }
  std::weak_ptr<record> watch = first.front();
  // Aliases of one block: distinct, adjacent records.
  for (int i = 1; i < 4; ++i) CHECK(first[i].get() == first[0].get() + i);
  auto fifth = blocks.make();  // a new block
  CHECK(fifth->value == 0);
  CHECK(fifth.get() != first[3].get() + 1);
  const std::shared_ptr<record> keep = first[2];
  first.clear();
  CHECK_FALSE(watch.expired());  // one record of the block is still held
  CHECK(keep->value == 2);
  std::weak_ptr<record> self = keep;  // what recv_op::self holds
  CHECK(self.lock().get() == keep.get());
}

TEST_CASE("op_blocks: a released block's records are reset and the block is handed out again") {
  static int destroyed = 0;
  struct record {
    int value = 0;
    ~record() { ++destroyed; }
  };
  destroyed = 0;
  {
    rvd::op_blocks<record, 3> blocks;
    auto a = blocks.make();
    auto b = blocks.make();
    auto c = blocks.make();
    record* const first = a.get();
    a->value = 1;
    b->value = 2;
    c->value = 3;
    auto d = blocks.make();  // the first block is full: a second one
    CHECK(d.get() != first);
    a.reset();
    b.reset();
    CHECK(destroyed == 0);
    c.reset();  // the first block's last record: its records are reset, the block kept
    CHECK(destroyed == 3);
    auto e = blocks.make();
    auto f = blocks.make();
    auto g = blocks.make();  // the second block is full: the first comes back
    CHECK(g.get() == first);
    CHECK(g->value == 0);
  }
  // 3 resets above; both blocks went back to the cache (3 + 3 resets), then the cache freed them (3 + 3).
  CHECK(destroyed == 15);
}
