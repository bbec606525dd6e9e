#pragma once
/// The read path of a verbs connection: messages arriving on the QP, bytes
/// delivered to pending reads or buffered until read.

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/transport/verbs/config.hpp>
#include <fusewire/transport/verbs/connection_state.hpp>
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/transport/verbs/message_header.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// A SEND arrived on this QP (slot bytes are valid during the call only).
inline void verbs_conn_state::on_message(const std::byte* p, std::size_t len) {
  ref_ptr<verbs_conn_state> guard(this);
  verbs_header h;
  if (!h.load(p, len)) {
    fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                "verbs: malformed message from " + peer_ + " (" + std::to_string(len) + " bytes)");
    return;
  }
  ++stats_.messages_received;
  credits_ += static_cast<int>(h.credits);
  ++owed_;
  if (h.data_len != 0 && open_) {
    stats_.bytes_received += h.data_len;
    deliver(p + verbs_header::size, h.data_len);
  }
  if ((h.flags & verbs_header::flag_release) != 0) {
    // Our revoke reached the peer after its writes: the grants it hands
    // back are the newest ones we granted.
    if (!revoking_ || h.released > landing_.size()) {
      fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                  "verbs: unexpected release of " + std::to_string(h.released) + " grants from " + peer_);
      return;
    }
    for (std::uint32_t i = 0; i < h.released; ++i) landing_.pop_back();
    if (landing_.empty()) landing_offset_ = 0;
    revoking_ = false;
    if (h.released != 0) ctx_->buffer_released();
  }
  if ((h.flags & verbs_header::flag_rts) != 0) window_active_ = true;
  if ((h.flags & verbs_header::flag_grant) != 0) {
    if (h.grant_len == 0 || h.grant_len > ctx_->config().chunk_size) {
      fail_stream(make_error_code(errc::device_error), make_error_code(errc::device_error),
                  "verbs: bad RDMA write grant of " + std::to_string(h.grant_len) + " bytes from " + peer_);
      return;
    }
    grants_.push_back({h.grant_addr, h.grant_rkey, h.grant_len});
  }
  if ((h.flags & verbs_header::flag_revoke) != 0) {
    release_owed_ = static_cast<std::uint32_t>(grants_.size());
    release_pending_ = true;
    grants_.clear();
    grant_used_ = 0;
    announced_ = false;
  }
  pump_tx();
}

inline void verbs_conn_state::deliver(const std::byte* p, std::size_t n) {
  while (n != 0) {
    if (rx_buffered_.empty() && !reads_.empty() && !reads_.front().preset) {
      read_op& r = reads_.front();
      if (r.exact) {
        const std::size_t k = std::min(n, r.dst.size() - r.filled);
        std::memcpy(r.dst.data() + r.filled, p, k);
        r.filled += k;
        p += k;
        n -= k;
        if (r.filled == r.dst.size()) {
          read_op op = std::move(r);
          reads_.pop_front();
          complete(op.exact, std::error_code(), op.filled);
          if (!open_) return;
        }
        continue;
      }
      read_op op = std::move(r);
      reads_.pop_front();
      complete(op.some, std::error_code(), tensor_buffer::copy_of(const_buffer(p, n)));
      return;
    }
    rx_buffered_.push_back(tensor_buffer::copy_of(const_buffer(p, n)));
    rx_buffered_bytes_ += n;
    if (!reads_.empty()) read_task_.schedule(*reactor_);
    return;
  }
}

inline void verbs_conn_state::pump_reads() {
  ref_ptr<verbs_conn_state> guard(this);
  const bool was_withholding = rx_buffered_bytes_ >= ctx_->config().rx_buffer_limit;
  while (!reads_.empty()) {
    read_op& r = reads_.front();
    std::error_code ec = r.preset;
    if (!ec && !open_) ec = make_error_code(errc::cancelled);
    if (!ec && !rx_buffered_.empty()) {
      if (r.exact) {
        while (!rx_buffered_.empty() && r.filled < r.dst.size()) {
          tensor_buffer& b = rx_buffered_.front();
          const std::size_t k = std::min(b.size(), r.dst.size() - r.filled);
          std::memcpy(r.dst.data() + r.filled, b.data(), k);
          r.filled += k;
          rx_buffered_bytes_ -= k;
          if (k == b.size()) {
            rx_buffered_.pop_front();
          } else {
            b.trim_front(k);
          }
        }
        // Short, with the stream ended (no more bytes come): the read fails
        // after the bytes that arrived, as with nothing held.
        if (r.filled < r.dst.size() && !read_error_) break;
        read_op op = std::move(r);
        reads_.pop_front();
        complete(op.exact, op.filled < op.dst.size() ? read_error_ : std::error_code(), op.filled);
      } else {
        tensor_buffer b = std::move(rx_buffered_.front());
        rx_buffered_.pop_front();
        rx_buffered_bytes_ -= b.size();
        read_op op = std::move(r);
        reads_.pop_front();
        complete(op.some, std::error_code(), std::move(b));
      }
      continue;
    }
    if (!ec && r.exact && r.filled == r.dst.size()) {
      read_op op = std::move(r);
      reads_.pop_front();
      complete(op.exact, std::error_code(), op.filled);
      continue;
    }
    if (!ec) ec = read_error_;
    if (!ec) break;
    read_op op = std::move(r);
    reads_.pop_front();
    if (op.exact) {
      complete(op.exact, ec, op.filled);
    } else {
      complete(op.some, ec, tensor_buffer());
    }
  }
  if (was_withholding && rx_buffered_bytes_ < ctx_->config().rx_buffer_limit) pump_tx();
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
