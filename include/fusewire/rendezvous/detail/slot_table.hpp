#pragma once
/// The per-(peer, key) state of rendezvous::endpoint in an open-addressing
/// table: a lookup reads one cell of a flat array (the full hash, so a
/// mismatch costs no string compare) and then the entry it points at, instead
/// of a node-based map's bucket, predecessor node and node (the lookup was
/// ~15 % of the receiving reactor's time at 1,000 keys per step). Entries live
/// in blocks and never move, so a reference stays valid until the entry is
/// swept. Private to the rendezvous layer.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// Hash of a (peer, key) pair: the standard library's string hash of each,
/// combined (hashing is not ours to hand-write; the table's flat cells are
/// what made lookups cheap).
inline std::uint64_t peer_hash_of(std::string_view peer) noexcept { return std::hash<std::string_view>{}(peer); }

/// slot_hash_of(peer, key) with `peer_hash` = peer_hash_of(peer): a caller with
/// many keys of one peer (a fused frame, a batch) hashes the peer once.
inline std::uint64_t slot_hash_of(std::uint64_t peer_hash, std::string_view key) noexcept {
  const std::uint64_t a = peer_hash;
  const std::uint64_t b = std::hash<std::string_view>{}(key);
  return b ^ (a + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
}

inline std::uint64_t slot_hash_of(std::string_view peer, std::string_view key) noexcept {
  return slot_hash_of(peer_hash_of(peer), key);
}

/// Byte equality, inline: keys and peer names are short, and the library's
/// out-of-line compare cost more than the bytes (~1/10 of a fused tensor's
/// instructions went to comparing them).
inline bool same_bytes(std::string_view a, std::string_view b) noexcept {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  const char* x = a.data();
  const char* y = b.data();
  // Up to 16 bytes (most keys and task names): two overlapping word compares.
  const auto same = [&]<class Word>(Word, std::size_t at) {
    Word u;
    Word v;
    std::memcpy(&u, x + at, sizeof u);
    std::memcpy(&v, y + at, sizeof v);
    return u == v;
  };
  if (n >= 8 && n <= 16) return same(std::uint64_t{}, 0) && same(std::uint64_t{}, n - 8);
  if (n >= 4 && n < 8) return same(std::uint32_t{}, 0) && same(std::uint32_t{}, n - 4);
  if (n < 4) {
    for (std::size_t i = 0; i < n; ++i) {
      if (x[i] != y[i]) return false;
    }
    return true;
  }
  return std::memcmp(x, y, n) == 0;
}

/// What a slot_table holds: default-constructible, movable, and able to say
/// when it carries nothing (then the table may drop it).
template <class V>
concept slot_value = std::default_initializable<V> && std::movable<V> && requires(const V& v) {
  { v.empty() } -> std::convertible_to<bool>;
};

/// Map (peer, key) -> Value with stable addresses. Empty values stay (a steady
/// workload reuses them) until the table reaches `sweep_at` entries on an
/// insert: then every empty value is dropped, invalidating references to those
/// only. Not thread-safe (one reactor).
template <slot_value Value>
class slot_table {
 public:
  static constexpr std::size_t min_sweep = 4096;

  slot_table() = default;
  slot_table(const slot_table&) = delete;
  slot_table& operator=(const slot_table&) = delete;

  /// The value of (peer, key), or nullptr.
  Value* find(std::string_view peer, std::string_view key) noexcept {
    if (cells_.empty()) return nullptr;
    const std::uint64_t h = slot_hash_of(peer, key);
    const std::size_t mask = cells_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(h) & mask;; i = (i + 1) & mask) {
      const cell& c = cells_[i];
      if (c.e == nullptr) return nullptr;
      if (c.hash == h && same_bytes(c.e->key, key) && same_bytes(c.e->peer, peer)) return &c.e->value;
    }
  }

  /// The value of (peer, key), made (default) if there is none; may sweep first.
  Value& get(std::string_view peer, std::string_view key) { return get(peer, key, slot_hash_of(peer, key)); }

  /// get(peer, key) with `h` = slot_hash_of(peer, key), computed by the caller (on another thread, say).
  Value& get(std::string_view peer, std::string_view key, std::uint64_t h) {
    if (!cells_.empty()) {
      const std::size_t mask = cells_.size() - 1;
      for (std::size_t i = static_cast<std::size_t>(h) & mask;; i = (i + 1) & mask) {
        const cell& c = cells_[i];
        if (c.e == nullptr) break;
        if (c.hash == h && same_bytes(c.e->key, key) && same_bytes(c.e->peer, peer)) return c.e->value;
      }
    }
    if (size_ >= sweep_at_) {
      sweep();
      sweep_at_ = std::max(min_sweep, 2 * size_);
    }
    if (2 * (size_ + 1) > cells_.size()) rehash(std::max<std::size_t>(64, 2 * cells_.size()));
    entry* e = make_entry();
    e->hash = h;
    e->peer.assign(peer);
    e->key.assign(key);
    place(h, e);
    ++size_;
    return e->value;
  }

  /// Entries (empty values included).
  std::size_t size() const noexcept { return size_; }

  /// Calls `f(peer, key, value)` for every entry (empty values included). `f`
  /// may change a value but must not add entries to the table.
  template <class F>
  requires std::invocable<F&, std::string_view, std::string_view, Value&>
  void for_each(F&& f) {
    for (const cell& c : cells_) {
      if (c.e != nullptr) f(std::string_view(c.e->peer), std::string_view(c.e->key), c.e->value);
    }
  }

  /// Drops every entry.
  void clear() noexcept {
    cells_.clear();
    cells_.shrink_to_fit();
    blocks_.clear();
    free_.clear();
    size_ = 0;
    sweep_at_ = min_sweep;
  }

 private:
  struct entry {
    std::uint64_t hash = 0;
    std::string peer;
    std::string key;
    Value value;
  };
  struct cell {
    std::uint64_t hash = 0;
    entry* e = nullptr;
  };
  static constexpr std::size_t block_size = 64;
  using block = std::array<entry, block_size>;

  entry* make_entry() {
    if (free_.empty()) {
      blocks_.push_back(std::make_unique<block>());
      free_.reserve(free_.size() + block_size);
      for (std::size_t i = block_size; i-- > 0;) free_.push_back(&(*blocks_.back())[i]);
    }
    entry* e = free_.back();
    free_.pop_back();
    return e;
  }

  void place(std::uint64_t h, entry* e) noexcept {
    const std::size_t mask = cells_.size() - 1;
    std::size_t i = static_cast<std::size_t>(h) & mask;
    while (cells_[i].e != nullptr) i = (i + 1) & mask;
    cells_[i] = cell{h, e};
  }

  void rehash(std::size_t n) {
    std::vector<cell> old(n);
    old.swap(cells_);
    for (const cell& c : old) {
      if (c.e != nullptr) place(c.hash, c.e);
    }
  }

  void sweep() {
    std::vector<cell> kept;
    kept.reserve(size_);
    for (const cell& c : cells_) {
      if (c.e == nullptr) continue;
      if (c.e->value.empty()) {
        c.e->peer.clear();
        c.e->key.clear();
        c.e->value = Value{};
        free_.push_back(c.e);
        --size_;
      } else {
        kept.push_back(c);
      }
    }
    std::fill(cells_.begin(), cells_.end(), cell{});
    for (const cell& c : kept) place(c.hash, c.e);
  }

  std::vector<cell> cells_;  ///< power of two, at most half full; nullptr = free
  std::vector<std::unique_ptr<block>> blocks_;
  std::vector<entry*> free_;
  std::size_t size_ = 0;
  std::size_t sweep_at_ = min_sweep;
};

}  // namespace detail
}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
