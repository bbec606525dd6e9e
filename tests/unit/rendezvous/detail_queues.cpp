// fusewire's private containers: small_fifo (the per-(peer, key) queues, a
// connection's pending reads and writes), op_blocks (batched operation records sharing one allocation) and
// slot_table (the per-(peer, key) state).

#include <doctest/doctest.h>

#include <fusewire/util/small_fifo.hpp>
#include <fusewire/rendezvous/detail/op_blocks.hpp>
#include <fusewire/rendezvous/detail/slot_table.hpp>

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace detail_queues_cases {

namespace rvd = fusewire::rendezvous::detail;

namespace {

std::vector<int> contents(fusewire::util::small_fifo<int>& q) { return {q.begin(), q.end()}; }

}  // namespace

TEST_CASE("small_fifo: first in, first out, also through compaction of a queue that never drains") {
  fusewire::util::small_fifo<int> q;
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
  fusewire::util::small_fifo<int> q;
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
  fusewire::util::small_fifo<std::shared_ptr<int>> q;
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

namespace {

/// A slot_table value: empty unless it holds something.
struct counter {
  int n = 0;
  bool empty() const noexcept { return n == 0; }
};

}  // namespace

TEST_CASE("slot_table: one value per (peer, key), at a stable address through growth") {
  rvd::slot_table<counter> t;
  CHECK(t.find("p", "k") == nullptr);
  counter& a = t.get("p", "k");
  CHECK(a.n == 0);
  a.n = 7;
  CHECK(&t.get("p", "k") == &a);
  CHECK(t.find("p", "k") == &a);
  // The split between peer and key matters, and so do peer and key alone.
  CHECK(t.find("pk", "") == nullptr);
  CHECK(t.find("", "pk") == nullptr);
  counter& b = t.get("ab", "c");
  counter& c = t.get("a", "bc");
  CHECK(&b != &c);
  CHECK(t.size() == 3);
  // Growth (many rehashes below the sweep limit) moves no value.
  std::vector<counter*> where;
  for (int i = 0; i < 3000; ++i) {
    counter& v = t.get("worker:" + std::to_string(i % 3), "key/" + std::to_string(i));
    v.n = i + 1;
    where.push_back(&v);
  }
  CHECK(t.size() == 3003);
  for (int i = 0; i < 3000; ++i) {
    counter* v = t.find("worker:" + std::to_string(i % 3), "key/" + std::to_string(i));
    REQUIRE(v == where[static_cast<std::size_t>(i)]);
    CHECK(v->n == i + 1);
  }
  CHECK(t.find("p", "k")->n == 7);
  CHECK(t.find("worker:1", "key/0") == nullptr);  // key/0 belongs to worker:0
  // A hash computed elsewhere finds the same value.
  CHECK(&t.get("a", "bc", rvd::slot_hash_of("a", "bc")) == &c);
  t.clear();
  CHECK(t.size() == 0);
  CHECK(t.find("p", "k") == nullptr);
  CHECK(t.get("p", "k").n == 0);
}

TEST_CASE("slot_table: reaching the sweep limit drops the empty values, never one in use") {
  rvd::slot_table<counter> t;
  const std::size_t limit = rvd::slot_table<counter>::min_sweep;
  std::vector<counter*> kept;
  for (std::size_t i = 0; i < limit; ++i) {
    counter& v = t.get("w:0", "k" + std::to_string(i));
    if (i % 10 == 0) {
      v.n = static_cast<int>(i) + 1;
      kept.push_back(&v);
    }
  }
  CHECK(t.size() == limit);
  t.get("w:0", "one more");  // sweeps first: 1 in 10 stay, plus the new one
  const std::size_t in_use = (limit + 9) / 10;
  CHECK(t.size() == in_use + 1);
  for (std::size_t i = 0; i < limit; ++i) {
    counter* v = t.find("w:0", "k" + std::to_string(i));
    if (i % 10 == 0) {
      REQUIRE(v == kept[i / 10]);
      CHECK(v->n == static_cast<int>(i) + 1);
    } else {
      CHECK(v == nullptr);
    }
  }
  // A swept key comes back empty (its entry is reused, reset).
  CHECK(t.get("w:0", "k1").n == 0);
  // The next sweep comes when the table is at the limit again (twice what stayed is below it):
  // `limit` empty keys more sweep every empty one once, those added after it stay.
  const std::size_t before = t.size();
  CHECK(before == in_use + 2);
  for (std::size_t i = 0; i < limit; ++i) t.get("w:1", std::to_string(i));
  const std::size_t added_after_sweep = limit - (limit - before);
  CHECK(t.size() == in_use + added_after_sweep);
  CHECK(t.find("w:0", "one more") == nullptr);
  CHECK(t.find("w:1", std::to_string(limit - 1)) != nullptr);
  CHECK(t.find("w:1", "0") == nullptr);
}

TEST_CASE("slot_table: every byte of a key, at every length, moves the hash") {
  for (std::size_t len = 1; len <= 24; ++len) {
    std::string key(len, 'a');
    std::set<std::uint64_t> seen{rvd::slot_hash_of("p", key)};
    for (std::size_t i = 0; i < len; ++i) {
      std::string changed = key;
      changed[i] = 'b';
      seen.insert(rvd::slot_hash_of("p", changed));
    }
    CAPTURE(len);
    CHECK(seen.size() == len + 1);
  }
  CHECK(rvd::slot_hash_of("p", "") != rvd::slot_hash_of("", "p"));
  CHECK(rvd::slot_hash_of("p", "k") != rvd::slot_hash_of("q", "k"));
}

TEST_CASE("same_bytes: equal only for the same bytes, at every length and at every position") {
  for (std::size_t len = 0; len <= 40; ++len) {
    CAPTURE(len);
    std::string a(len, 'x');
    for (std::size_t i = 0; i < len; ++i) a[i] = static_cast<char>('a' + i % 26);
    const std::string b = a;  // a different buffer
    CHECK(rvd::same_bytes(a, b));
    CHECK_FALSE(rvd::same_bytes(a, b + "z"));
    CHECK_FALSE(rvd::same_bytes(a + "z", b));
    for (std::size_t i = 0; i < len; ++i) {
      std::string changed = b;
      changed[i] = static_cast<char>(changed[i] ^ 0x01);
      CAPTURE(i);
      CHECK_FALSE(rvd::same_bytes(a, changed));
      CHECK_FALSE(rvd::same_bytes(changed, a));
    }
  }
  // Views into a longer buffer: only the viewed bytes count.
  const std::string text = "peer:0/key:17|peer:0/key:17!";
  CHECK(rvd::same_bytes(std::string_view(text).substr(0, 13), std::string_view(text).substr(14, 13)));
  CHECK_FALSE(rvd::same_bytes(std::string_view(text).substr(0, 14), std::string_view(text).substr(14, 14)));
}

}  // namespace detail_queues_cases
