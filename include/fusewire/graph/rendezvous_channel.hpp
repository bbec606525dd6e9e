#pragma once
/// `rendezvous_channel`: the executor's `channel` between processes, over a
/// `rendezvous::endpoint<Transport>` (any fusewire transport).
///
/// Each plan message travels as one rendezvous tensor: its payload in the
/// byte form of payload_codec.hpp (descriptors, bytes, the dead bit), sent
/// without gathering (scatter-gather: header, then each entry's own buffer).
/// Routing comes from the TensorFlow key itself: the sender is the task of
/// its src_device, the receiver the task of its dst_device. The endpoint key
/// is "<step>;<key>", so steps never mix.
///
/// Contracts: send() never blocks; it returns an error only for a key that
/// names no task of this process as sender, or a payload that cannot be
/// encoded. A send that fails later (peer unreachable, closed) is recorded:
/// error() returns the first such failure and `on_send_error` (if set) is
/// called on the endpoint's reactor thread that owns that peer. async_recv
/// handlers run on the reactor thread that owns their peer, exactly once (an
/// endpoint with several reactors may run different peers' handlers at the
/// same time); they get errc::timed_out after
/// `recv_timeout` (zero: wait as long as it takes), errc::malformed_frame if
/// the bytes are not a payload. Before destroying the endpoint, call flush()
/// so that no send is cut off by its close().

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/graph/channel.hpp>
#include <fusewire/graph/detail/text.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/payload_codec.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// Settings of a rendezvous_channel.
struct rendezvous_channel_options {
  /// A receive still waiting after this fails with errc::timed_out; zero waits forever.
  std::chrono::milliseconds recv_timeout{0};
  /// Called once per failed send, on the reactor thread that owns the peer (must not block;
  /// with several reactors, possibly on several threads at once).
  std::function<void(const std::string& key, std::error_code)> on_send_error;
};

/// The sending and receiving tasks of a TensorFlow rendezvous key
/// ("src_device;incarnation;dst_device;name;frame:iter"); errc::invalid_argument
/// (and `*why`) if it has fewer parts or a device names no task.
inline std::optional<std::pair<task_id, task_id>> key_route(std::string_view key, std::error_code& ec,
                                                            std::string* why = nullptr) {
  std::string_view parts[3];
  std::string_view rest = key;
  for (auto& part : parts) {
    const auto semi = rest.find(';');
    if (semi == std::string_view::npos) {
      ec = make_error_code(errc::invalid_argument);
      if (why) *why = "key " + util::quoted(key) + " is not src_device;incarnation;dst_device;name;frame:iter";
      return std::nullopt;
    }
    part = rest.substr(0, semi);
    rest.remove_prefix(semi + 1);
  }
  auto src = parse_task(parts[0], ec, why);
  if (!src) return std::nullopt;
  auto dst = parse_task(parts[2], ec, why);
  if (!dst) return std::nullopt;
  ec.clear();
  return std::make_pair(std::move(*src), std::move(*dst));
}

/// Moves plan messages between processes through `endpoint`; see the file comment.
/// Thread-safe. The endpoint must outlive the channel.
template <transport Transport>
class rendezvous_channel {
 public:
  using endpoint_type = rendezvous::endpoint<Transport>;

  /// What one step sent from this process.
  struct counters {
    std::size_t messages = 0;    ///< payloads sent
    std::size_t tensors = 0;     ///< entries across them (control tokens and dead values included)
    std::size_t bytes = 0;       ///< the entries' bytes (live tensor values)
    std::size_t wire_bytes = 0;  ///< encoded payload bytes (values, descriptors, padding)
    std::size_t dead = 0;        ///< entries marked dead (values of untaken branches)
  };

  explicit rendezvous_channel(endpoint_type& ep, rendezvous_channel_options opts = {})
      : ep_(ep), opts_(std::move(opts)), state_(std::make_shared<shared_state>()) {}

  rendezvous_channel(const rendezvous_channel&) = delete;
  rendezvous_channel& operator=(const rendezvous_channel&) = delete;

  /// Sends `p` to the task of the key's dst_device. errc::invalid_argument if
  /// the key's src_device is not this endpoint's task (or the key is bad), or
  /// `p` cannot be encoded (see check_payload).
  std::error_code send(std::uint64_t step, const std::string& key, payload p) {
    std::error_code ec;
    const auto* route = route_of(key, ec);
    if (!route) return ec;
    if (route->first != ep_.self() || check_payload(p)) return make_error_code(errc::invalid_argument);
    auto msg = std::make_shared<outgoing>();
    msg->body = std::move(p);
    const std::size_t wire_bytes = encoded_size(msg->body);
    {
      std::lock_guard lock(state_->mutex);
      auto& c = state_->sent[step];
      ++c.messages;
      c.tensors += msg->body.size();
      for (const auto& e : msg->body) {
        c.bytes += e.bytes.size();
        c.dead += e.dead;
      }
      c.wire_bytes += wire_bytes;
      ++state_->in_flight;
    }
    auto done = [state = state_, msg, key, report = opts_.on_send_error](std::error_code e) {
      if (e && report) report(key, e);
      std::lock_guard lock(state->mutex);
      if (e && !state->first_error) state->first_error = e;
      if (--state->in_flight == 0) state->idle.notify_all();
    };
    std::string ekey = endpoint_key(step, key);
    if (detail::host_is_little) {
      msg->header = encode_payload_header(msg->body);
      msg->segments = payload_segments(msg->header, msg->body);
      if (msg->segments.size() <= wire::limits{}.max_segments) {
        ep_.send(route->second, std::move(ekey), std::span<const const_buffer>(msg->segments), std::move(done));
        return {};
      }
    }
    ep_.send(route->second, std::move(ekey), encode_payload(msg->body), std::move(done));
    return {};
  }

  /// Receives the payload the key's src_device task sends under (`step`, `key`).
  void async_recv(std::uint64_t step, const std::string& key, recv_handler h) {
    std::error_code ec;
    const auto* route = route_of(key, ec);
    if (!route || route->second != ep_.self()) {
      h(route ? make_error_code(errc::invalid_argument) : ec, payload{});
      return;
    }
    auto on_bytes = [h = std::move(h)](std::error_code e, tensor_buffer bytes) mutable {
      payload p;
      if (!e) e = decode_payload(bytes, p);
      h(e, std::move(p));
    };
    const auto timeout = opts_.recv_timeout.count() > 0
                             ? std::chrono::duration_cast<rendezvous::clock::duration>(opts_.recv_timeout)
                             : rendezvous::no_deadline;
    ep_.recv(route->first, endpoint_key(step, key), std::move(on_bytes), timeout);
  }

  /// Waits until every send handed to the endpoint completed, at most
  /// `timeout`; true if none is left in flight.
  bool flush(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock lock(state_->mutex);
    return state_->idle.wait_for(lock, timeout, [&] { return state_->in_flight == 0; });
  }

  /// The first send that failed after send() accepted it, or nothing.
  std::error_code error() const {
    std::lock_guard lock(state_->mutex);
    return state_->first_error;
  }

  /// What `step` sent from this process so far.
  counters sent(std::uint64_t step) const {
    std::lock_guard lock(state_->mutex);
    auto it = state_->sent.find(step);
    return it == state_->sent.end() ? counters{} : it->second;
  }

  /// Forgets the counters of `step`.
  void forget(std::uint64_t step) {
    std::lock_guard lock(state_->mutex);
    state_->sent.erase(step);
  }

  /// "<step>;<key>": the endpoint key of a message.
  static std::string endpoint_key(std::uint64_t step, const std::string& key) {
    return std::to_string(step) + ";" + key;
  }

 private:
  struct outgoing {
    payload body;
    tensor_buffer header;
    std::vector<const_buffer> segments;
  };
  struct shared_state {
    std::mutex mutex;
    std::condition_variable idle;
    std::size_t in_flight = 0;
    std::error_code first_error;
    std::map<std::uint64_t, counters> sent;
  };

  /// The route of `key`, cached by everything before its ";frame:iter" part.
  const std::pair<task_id, task_id>* route_of(const std::string& key, std::error_code& ec) {
    const auto cut = key.rfind(';');
    std::string prefix = key.substr(0, cut == std::string::npos ? key.size() : cut);
    std::lock_guard lock(route_mutex_);
    auto it = routes_.find(prefix);
    if (it != routes_.end()) return &it->second;
    auto r = key_route(key, ec);
    if (!r) return nullptr;
    return &routes_.emplace(std::move(prefix), std::move(*r)).first->second;
  }

  endpoint_type& ep_;
  rendezvous_channel_options opts_;
  std::shared_ptr<shared_state> state_;
  std::mutex route_mutex_;
  std::map<std::string, std::pair<task_id, task_id>, std::less<>> routes_;
};

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
