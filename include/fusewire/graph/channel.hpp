#pragma once
/// What the executor moves between tasks, and the `channel` concept it moves
/// it through: `send(step, key, payload)` / `async_recv(step, key, handler)`
/// with rendezvous semantics (whichever side comes first waits for the other).
/// Keys are TensorFlow rendezvous keys
/// ("src_device;incarnation;dst_device;name;frame_id:iter_id"), one per
/// message and loop iteration; `step` separates steps as TensorFlow's
/// per-step rendezvous does. `local_channel` is the in-process model.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// A dense float32 tensor: row-major values and their shape (empty = scalar).
struct tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;

  tensor() = default;
  /// Throws std::system_error(errc::invalid_argument) when the counts differ.
  tensor(std::vector<std::int64_t> dims, std::vector<float> vals)
      : shape(std::move(dims)), values(std::move(vals)) {
    if (count_of(shape) != values.size())
      throw_error(errc::invalid_argument, "tensor of shape " + shape_string(shape) + " needs " +
                                              std::to_string(count_of(shape)) + " values, got " +
                                              std::to_string(values.size()));
  }
  /// A rank-0 tensor holding `v`.
  static tensor scalar(float v) { return tensor({}, {v}); }

  /// Number of values.
  std::size_t element_count() const noexcept { return values.size(); }
  /// Bytes of the values (what a message carries for this tensor).
  std::size_t byte_size() const noexcept { return values.size() * sizeof(float); }

  /// Number of elements a shape holds (1 for a scalar).
  static std::size_t count_of(const std::vector<std::int64_t>& dims) noexcept {
    std::size_t n = 1;
    for (auto d : dims) n *= d < 0 ? 0 : static_cast<std::size_t>(d);
    return n;
  }
  /// "[2,3]".
  static std::string shape_string(const std::vector<std::int64_t>& dims) {
    std::string out = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
    return out + "]";
  }
  /// "[2,3]{1, 2, 3, 4, 5, 6}" — for test failures and logs.
  std::string to_string() const {
    std::ostringstream os;
    os << shape_string(shape) << '{';
    for (std::size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
    os << '}';
    return os.str();
  }
  friend bool operator==(const tensor&, const tensor&) = default;
};

/// What flows along an edge: a tensor, or a dead token from an untaken
/// Switch branch (TensorFlow's is_dead). Control tokens are empty tensors.
struct edge_value {
  tensor value;
  bool dead = false;
};

/// One message: the values of its entries, in the order the plan lists them.
using payload = std::vector<edge_value>;

/// Completion of a receive: fires exactly once, with the payload or an error.
using recv_handler = std::function<void(std::error_code, payload)>;

/// Moves payloads between the executors of one job.
///
/// `send` never blocks and returns an error only if the channel refuses the
/// payload (closed, duplicate key). `async_recv` calls its handler exactly
/// once, possibly on another thread and possibly before it returns.
template <class C>
concept channel = requires(C& c, std::uint64_t step, const std::string& key, payload p, recv_handler h) {
  { c.send(step, key, std::move(p)) } -> std::convertible_to<std::error_code>;
  c.async_recv(step, key, std::move(h));
};

/// In-process rendezvous for tests and single-host runs. Thread-safe; handlers
/// run on the thread that completes the match (sender or receiver), outside
/// the channel's lock. Counts what was sent, per step.
class local_channel {
 public:
  /// What one step moved.
  struct counters {
    std::size_t messages = 0;  ///< payloads sent
    std::size_t tensors = 0;   ///< entries across those payloads
    std::size_t bytes = 0;     ///< bytes of live tensor values
  };

  /// Delivers `p` to the receiver of (`step`, `key`), now or when it asks.
  /// Returns errc::duplicate_key if that key was already sent this step and
  /// errc::cancelled if the step was cancelled.
  std::error_code send(std::uint64_t step, const std::string& key, payload p) {
    recv_handler waiter;
    {
      std::lock_guard lock(mutex_);
      auto& st = steps_[step];
      if (st.cancelled) return make_error_code(errc::cancelled);
      if (!st.sent_keys.insert(key).second) return make_error_code(errc::duplicate_key);
      ++st.count.messages;
      st.count.tensors += p.size();
      for (const auto& v : p) st.count.bytes += v.dead ? 0 : v.value.byte_size();
      auto w = st.waiters.find(key);
      if (w == st.waiters.end()) {
        st.queued.emplace(key, std::move(p));
        return {};
      }
      waiter = std::move(w->second);
      st.waiters.erase(w);
    }
    waiter(std::error_code{}, std::move(p));
    return {};
  }

  /// Calls `h` with the payload sent under (`step`, `key`), once it is there.
  /// A second receive of the same key gets errc::duplicate_key.
  void async_recv(std::uint64_t step, const std::string& key, recv_handler h) {
    payload ready;
    std::error_code ec;
    {
      std::lock_guard lock(mutex_);
      auto& st = steps_[step];
      if (st.cancelled) {
        ec = make_error_code(errc::cancelled);
      } else if (!st.received_keys.insert(key).second) {
        ec = make_error_code(errc::duplicate_key);
      } else if (auto q = st.queued.find(key); q != st.queued.end()) {
        ready = std::move(q->second);
        st.queued.erase(q);
      } else {
        st.waiters.emplace(key, std::move(h));
        return;
      }
    }
    h(ec, std::move(ready));
  }

  /// Fails every receive still waiting in `step` with errc::cancelled, drops
  /// its undelivered payloads, and refuses further traffic for it.
  void cancel(std::uint64_t step) {
    std::map<std::string, recv_handler> waiters;
    {
      std::lock_guard lock(mutex_);
      auto& st = steps_[step];
      st.cancelled = true;
      st.queued.clear();
      waiters.swap(st.waiters);
    }
    for (auto& [key, h] : waiters) h(make_error_code(errc::cancelled), {});
  }

  /// What `step` sent so far.
  counters sent(std::uint64_t step) const {
    std::lock_guard lock(mutex_);
    auto it = steps_.find(step);
    return it == steps_.end() ? counters{} : it->second.count;
  }

  /// Keys of `step` sent but not received, and received but not sent.
  std::vector<std::string> unmatched(std::uint64_t step) const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    auto it = steps_.find(step);
    if (it == steps_.end()) return out;
    for (const auto& [key, p] : it->second.queued) out.push_back("sent, never received: " + key);
    for (const auto& [key, h] : it->second.waiters) out.push_back("awaited, never sent: " + key);
    return out;
  }

  /// Forgets everything about `step` (call once it has finished).
  void forget(std::uint64_t step) {
    std::lock_guard lock(mutex_);
    steps_.erase(step);
  }

 private:
  struct step_state {
    std::map<std::string, payload> queued;
    std::map<std::string, recv_handler> waiters;
    std::set<std::string> sent_keys, received_keys;
    counters count;
    bool cancelled = false;
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, step_state> steps_;
};

static_assert(channel<local_channel>);

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
