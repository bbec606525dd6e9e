#pragma once
/// What the executor moves between tasks, and the `channel` concept it moves
/// it through: `send(step, key, payload)` / `async_recv(step, key, handler)`
/// with rendezvous semantics (whichever side comes first waits for the other).
/// A payload is what a transport carries: per entry a core `tensor_descriptor`
/// and a `tensor_buffer` holding its bytes, plus TensorFlow's is_dead bit.
/// Keys are TensorFlow rendezvous keys
/// ("src_device;incarnation;dst_device;name;frame_id:iter_id"), one per
/// message and loop iteration; `step` separates steps as TensorFlow's
/// per-step rendezvous does. `local_channel` is the in-process model.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/graph/graph.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// A dense float32 tensor: row-major values and their shape (empty = scalar).
struct tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;

  tensor() = default;
  /// Throws std::system_error(errc::invalid_argument) when the counts differ.
  tensor(std::vector<std::int64_t> dims, std::vector<float> vals) : shape(std::move(dims)), values(std::move(vals)) {
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
  /// float32 and this shape; throws std::system_error(errc::invalid_argument)
  /// if the rank exceeds max_rank.
  tensor_descriptor descriptor() const { return tensor_descriptor::make(dtype::float32, shape); }

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

/// One entry of a message, as a transport carries it: a tensor's descriptor
/// and bytes, or a control token (token_descriptor(), no bytes). `dead` marks
/// a value from an untaken Switch branch (TensorFlow's is_dead); it has no bytes.
struct message_entry {
  tensor_descriptor descriptor = token_descriptor();
  tensor_buffer bytes;  ///< descriptor.byte_size() bytes, host byte order
  bool dead = false;

  /// An entry holding a copy of `t`'s values.
  static message_entry of(const tensor& t) {
    return {t.descriptor(), tensor_buffer::copy_of(std::as_bytes(std::span(t.values))), false};
  }
  /// A control token, or (dead) a dead value.
  static message_entry token(bool dead) { return {token_descriptor(), {}, dead}; }

  /// The float32 tensor these bytes hold: errc::invalid_argument for another
  /// dtype or a bad descriptor, errc::size_mismatch if the bytes do not match it.
  std::error_code to_tensor(tensor& out) const {
    std::error_code ec;
    const std::size_t expected = descriptor.byte_size(ec);
    if (ec || descriptor.type != dtype::float32) return make_error_code(errc::invalid_argument);
    if (bytes.size() != expected) return make_error_code(errc::size_mismatch);
    const auto dims = descriptor.shape();
    out.shape.assign(dims.begin(), dims.end());
    out.values.resize(expected / sizeof(float));
    if (expected != 0) std::memcpy(out.values.data(), bytes.data(), expected);
    return {};
  }
};

/// One message: its entries, in the order the plan lists them. Move-only.
using payload = std::vector<message_entry>;

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
    std::size_t bytes = 0;     ///< bytes of the entries' buffers (live tensor values)
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
      for (const auto& e : p) st.count.bytes += e.bytes.size();
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
