#pragma once
/// The connections a spinning reactor reads with a plain non-blocking recv on
/// every tick, as a busy-polling C program does, instead of waiting for the
/// engine to report them (io_uring's multishot completion, epoll's event).
/// Each engine keeps one list; its transports say when a connection waits.

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// A connection waiting for a few bytes (see spin_list).
class spin_reader {
 public:
  enum class result : std::uint8_t {
    idle,  ///< nothing arrived; keep watching
    read,  ///< bytes arrived (and were handled); keep watching
    done,  ///< nothing to wait for any more: stop watching
  };
  /// Called on the reactor's thread; may run handlers (which may watch or
  /// unwatch readers, this one included).
  virtual result spin_read() = 0;
  /// The list stopped calling spin_read(): it evicted this reader for a newer
  /// one, the reader said done, or the engine is about to sleep (stop_all()).
  /// A reader that relied on its plain recvs alone must now have the engine
  /// report its bytes again. Not called after the reader's own unwatch().
  /// Must not throw (the list calls it from watch()).
  virtual void spin_stopped() noexcept {}

 protected:
  ~spin_reader() = default;
};

/// At most `capacity` readers (up to max_readers), in the order they were
/// watched: a full list evicts the longest-watched one, so the connections
/// that waited last win. Reactor thread only.
class spin_list {
 public:
  static constexpr unsigned max_readers = 8;

  explicit spin_list(unsigned capacity) noexcept : capacity_(std::min(capacity, max_readers)) {}

  /// Whether watch() does anything: the reactor spins (spin() was called) and
  /// the capacity is not 0.
  bool active() const noexcept { return spinning_ && capacity_ != 0; }
  bool empty() const noexcept { return count_ == 0; }

  void watch(spin_reader& r) noexcept {
    if (!active() || find(r) != end()) return;
    spin_reader* evicted = nullptr;
    if (count_ == capacity_) {
      evicted = readers_[0];
      std::copy(begin() + 1, end(), begin());
      --count_;
    }
    readers_[count_++] = &r;
    if (evicted != nullptr) evicted->spin_stopped();
  }

  void unwatch(spin_reader& r) noexcept {
    spin_reader** it = find(r);
    if (it == end()) return;
    std::copy(it + 1, end(), it);
    --count_;
  }

  /// The engine is about to sleep: every reader leaves the list and is told
  /// (spin_stopped()). Those still waiting watch again when their connection
  /// next waits on a spinning tick.
  void stop_all() noexcept {
    const std::array<spin_reader*, max_readers> snapshot = readers_;
    const unsigned n = std::exchange(count_, 0u);
    for (unsigned i = 0; i < n; ++i) snapshot[i]->spin_stopped();
  }

  /// A spinning tick: from now on the list is active. If `may_read`, calls
  /// each watched reader once; true if one took bytes. Handlers may watch or
  /// unwatch readers (or destroy them, which unwatches): each reader of the
  /// snapshot taken first is called only while it is still watched.
  bool spin(bool may_read) {
    spinning_ = true;
    if (count_ == 0 || !may_read) return false;
    const std::array<spin_reader*, max_readers> snapshot = readers_;
    const unsigned n = count_;
    bool worked = false;
    for (unsigned i = 0; i < n; ++i) {
      spin_reader* r = snapshot[i];
      if (find(*r) == end()) continue;
      const spin_reader::result got = r->spin_read();
      if (got == spin_reader::result::done && find(*r) != end()) {
        unwatch(*r);
        r->spin_stopped();
      }
      worked |= got == spin_reader::result::read;
    }
    return worked;
  }

 private:
  spin_reader** begin() noexcept { return readers_.data(); }
  spin_reader** end() noexcept { return readers_.data() + count_; }
  spin_reader** find(spin_reader& r) noexcept { return std::find(begin(), end(), &r); }

  unsigned capacity_;
  unsigned count_ = 0;
  bool spinning_ = false;
  std::array<spin_reader*, max_readers> readers_{};
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
