#pragma once
/// asio_tcp's write path: sendmsg straight from the caller's buffers, Asio's
/// wait for a full socket, completions in call order.

#include <fusewire/transport/asio_tcp/connection_state.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

template <class H>
inline void asio_connection_state::async_write(std::span<const const_buffer> sg, H&& handler) {
  reactor_->work_started();
  write_op op;
  op.handler = std::forward<H>(handler);
  op.buffers.reserve(sg.size());
  for (const_buffer b : sg) {
    if (!b.empty()) op.buffers.emplace_back(b.data(), b.size());
  }
  if (!open_) op.preset = make_error_code(errc::connection_closed);
  const bool direct = writes_.empty() && !writing_ && open_ && !write_error_;
  writes_.push_back(std::move(op));
  if (direct) {
    start_write();  // Asio never completes inline
  } else {
    write_task_.schedule(*reactor_);
  }
}

inline void asio_connection_state::pump_writes() {
  ref_ptr<asio_connection_state> guard(this);
  finish_sent();
  while (!writing_ && !writes_.empty()) {
    const std::error_code ec = writes_.front().preset ? writes_.front().preset : write_failure();
    if (!ec) {
      start_write();
      break;
    }
    write_op op = std::move(writes_.front());
    writes_.pop_front();
    complete(op.handler, ec, std::size_t{0});
  }
  let_go_if_idle();
}

inline void asio_connection_state::start_write() {
  writing_ = true;
  send_some();
}

// Sends what the socket takes of the front write, with sendmsg calls of up
// to IOV_MAX buffers (a fused frame's hundreds of segments go in one or two
// calls; Asio's composed write passes at most 16 buffers per call). All
// sent: the completion is posted (never inline), and the next queued write
// goes out at once, as does a write started before that completion ran (a
// reactor task that writes frame after frame has each leave as it is made,
// so the peer works on the first while this side makes the next). The
// socket is full: waits until it is writable and goes on.
inline void asio_connection_state::send_some() {
  for (;;) {
    write_op& op = writes_.front();
    if (!send_front(op)) return;
    sent_.push_back(std::move(op));
    writes_.pop_front();
    written_task_.schedule(*reactor_);
    if (writes_.empty() || write_failure() || writes_.front().preset) {
      writing_ = false;
      return;
    }
  }
}

// send_some() for one write: true once all its bytes are sent; false if it
// waits for the socket or failed (its completion is then on its way).
inline bool asio_connection_state::send_front(write_op& op) {
  while (!op.buffers.empty()) {
    const std::size_t count = std::min<std::size_t>(op.buffers.size(), IOV_MAX);
    iov_.resize(count);
    std::size_t asked = 0;
    for (std::size_t i = 0; i < count; ++i) {
      iov_[i].iov_base = const_cast<void*>(op.buffers[i].data());
      iov_[i].iov_len = op.buffers[i].size();
      asked += op.buffers[i].size();
    }
    msghdr msg{};
    msg.msg_iov = iov_.data();
    msg.msg_iovlen = count;
    const ssize_t r = ::sendmsg(native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      post_written(boost::system::error_code(err, boost::system::system_category()));
      return false;
    }
    consume(op, static_cast<std::size_t>(r));
    stats_.bytes_sent += static_cast<std::size_t>(r);
    if (static_cast<std::size_t>(r) < asked) break;  // the send buffer is full
  }
  if (op.buffers.empty()) return true;
  if (const boost::system::error_code e = attach()) {
    post_written(e);
    return false;
  }
  socket_->async_wait(boost::asio::socket_base::wait_write,
                      [self = ref_ptr<asio_connection_state>(this)](const boost::system::error_code& ec) {
                        if (ec) return self->on_written(ec);
                        if (!self->open_) return self->on_written(boost::asio::error::operation_aborted);
                        self->send_some();
                      });
  return false;
}

/// Completes the writes sent in full, in order (before anything queued after them).
inline void asio_connection_state::finish_sent() {
  while (!sent_.empty()) {
    write_op op = std::move(sent_.front());
    sent_.pop_front();
    complete(op.handler, std::error_code{}, op.written);
  }
}

/// Drops the first `n` bytes of `op`'s buffers (sent).
inline void asio_connection_state::consume(write_op& op, std::size_t n) {
  op.written += n;
  std::size_t first = 0;
  while (first < op.buffers.size() && n >= op.buffers[first].size()) n -= op.buffers[first++].size();
  op.buffers.erase(op.buffers.begin(), op.buffers.begin() + static_cast<std::ptrdiff_t>(first));
  if (!op.buffers.empty()) op.buffers.front() += n;
}

inline void asio_connection_state::on_written(const boost::system::error_code& ec) {
  finish_sent();
  writing_ = false;
  write_op op = std::move(writes_.front());
  writes_.pop_front();
  const std::error_code e = from_asio(ec, !open_);
  if (e && open_ && !write_error_) write_error_ = e;
  if (op.written != 0 && !op.buffers.empty()) release_.lose_stream();  // the peer got half
  complete(op.handler, e, op.written);
  pump_writes();
}

// The front write failed: its completion runs from the reactor's queue
// (after those of the writes sent before it); writing_ holds until on_written ran.
inline void asio_connection_state::post_written(boost::system::error_code ec) {
  written_ec_ = ec;
  written_failed_ = true;
  written_task_.schedule(*reactor_);
}

inline void asio_connection_state::run_written() {
  if (!std::exchange(written_failed_, false)) return pump_writes();  // writes sent in full
  on_written(written_ec_);
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
