#pragma once
/// uring_tcp's write path: a speculative direct sendmsg for small writes,
/// sendmsg (or SENDMSG_ZC) SQEs for the rest, completions in call order once
/// the kernel is done with the caller's buffers.

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>

#include <fusewire/transport/uring_tcp/connection_state.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

template <class H>
inline void uring_connection_state::async_write(std::span<const const_buffer> sg, H&& handler) {
  reactor_->work_started();
  std::unique_ptr<write_req> req = spare_write_ ? std::move(spare_write_) : std::make_unique<write_req>();
  req->owner = this;
  req->complete = &on_send_cqe;
  req->handler = std::forward<H>(handler);
  req->iov.reserve(sg.size());
  for (const_buffer b : sg) {
    if (b.empty()) continue;
    req->iov.push_back({const_cast<std::byte*>(b.data()), b.size()});
    req->total += b.size();
  }
  if (!open_ || write_error_) {
    req->result = !open_ ? make_error_code(errc::connection_closed) : write_error_;
    req->finished = true;
  }
  // Straight to the kernel when nothing could complete inline; else via a
  // posted pump. The writes queued before it may be waiting only for their
  // completions to run (every byte sent): a reactor task that writes frame
  // after frame then has each leave as it is made, and the peer works on the
  // first while this side makes the next.
  const bool direct = (writes_.empty() || writes_.back()->finished) && !req->finished && req->total != 0;
  writes_.push_back(std::move(req));
  if (direct) {
    write_req& w = *writes_.back();
    if (w.total <= opts_.speculative_send && try_send_now(w)) {
      write_task_.schedule(*reactor_);  // completes it, posted
    } else if (!w.finished) {
      send(w);  // what pump_writes would start, without completing the earlier writes inline
    }
  } else {
    write_task_.schedule(*reactor_);
  }
}

inline void uring_connection_state::pump_writes() {
  ref_ptr<uring_connection_state> guard(this);
  // Start the first write that still has bytes to send (one send SQE at a time).
  for (auto& w : writes_) {
    if (w->finished) continue;
    if (w->in_flight) break;
    if (!open_) {
      w->finished = true;
      w->result = make_error_code(errc::cancelled);
      continue;
    }
    if (write_error_) {
      w->finished = true;
      w->result = write_error_;
      continue;
    }
    if (w->sent == w->total) {
      w->finished = true;
      continue;
    }
    send(*w);
    break;
  }
  // Complete writes in call order once the kernel is done with their bytes.
  while (!writes_.empty()) {
    write_req& w = *writes_.front();
    if (!w.finished || w.in_flight || w.notifications != 0) break;
    std::unique_ptr<write_req> done = std::move(writes_.front());
    writes_.pop_front();
    if (done->sent != 0 && done->sent != done->total) release_.lose_stream();  // the peer got half
    complete(done->handler, done->result, done->sent);
    if (!spare_write_) {  // the next write reuses it (the kernel is done with it)
      std::destroy_at(done.get());
      std::construct_at(done.get());
      spare_write_ = std::move(done);
    }
  }
}

/// One non-blocking sendmsg straight from the caller's thread, for a small
/// write with nothing queued before it: saves the ring round trip when the
/// socket has room. Returns false if the rest must go through the ring.
inline bool uring_connection_state::try_send_now(write_req& w) {
  msghdr msg{};
  msg.msg_iov = w.iov.data() + w.next_iov;
  msg.msg_iovlen = std::min<std::size_t>(w.iov.size() - w.next_iov, IOV_MAX);
  const ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  ++stats_.speculative_sends;
  if (n > 0) {
    advance(w, static_cast<std::size_t>(n));
    stats_.bytes_sent += static_cast<std::size_t>(n);
    if (w.sent == w.total) {
      w.finished = true;
      return true;
    }
    return false;
  }
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    const std::error_code ec = from_errno(errno);
    write_error_ = ec;
    w.result = ec;
    w.finished = true;
    return true;
  }
  return false;
}

inline void uring_connection_state::send(write_req& w) {
  const uring_features& f = engine().features();
  w.zero_copy = zc_allowed_ && w.total >= opts_.zc_threshold && f.op_sendmsg_zc;
  w.msg = msghdr{};
  w.msg.msg_iov = w.iov.data() + w.next_iov;
  w.msg.msg_iovlen = std::min<std::size_t>(w.iov.size() - w.next_iov, IOV_MAX);
  io_uring_sqe* sqe = start(w);
  if (w.zero_copy) {
    io_uring_prep_sendmsg_zc(sqe, fd_, &w.msg, MSG_NOSIGNAL | MSG_WAITALL);
    if (engine().runtime_features().zc_report_usage != uring_features::tri::no) {
      sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
    }
    ++stats_.zc_sends;
  } else {
    io_uring_prep_sendmsg(sqe, fd_, &w.msg, MSG_NOSIGNAL | MSG_WAITALL);
    ++stats_.sends;
  }
  w.in_flight = true;
}

inline void uring_connection_state::on_send_cqe(uring_op* op, int res, unsigned flags) {
  auto* w = static_cast<write_req*>(op);
  w->owner->on_send(*w, res, flags);
}

inline void uring_connection_state::on_send(write_req& w, int res, unsigned flags) {
  ref_ptr<uring_connection_state> guard(this);
  if ((flags & IORING_CQE_F_NOTIF) != 0) {
    --w.notifications;
    --notifications_owed_;
    ++stats_.zc_notifications;
    if ((static_cast<unsigned>(res) & IORING_NOTIF_USAGE_ZC_COPIED) != 0) {
      ++stats_.zc_copied;
      // The route copies anyway: plain sends from now on, unless forced.
      if (opts_.zero_copy != zero_copy_policy::always) zc_allowed_ = false;
    }
    pump_writes();
    op_done();
    return;
  }
  w.in_flight = false;
  request_done();
  if ((flags & IORING_CQE_F_MORE) != 0) {  // counted in flight until the notification
    ++w.notifications;
    ++notifications_owed_;
  }
  if (res > 0) {
    advance(w, static_cast<std::size_t>(res));
    stats_.bytes_sent += static_cast<std::size_t>(res);
  } else if (res == -EINVAL && w.zero_copy &&
             engine().runtime_features().zc_report_usage == uring_features::tri::unknown) {
    engine().runtime_features().zc_report_usage = uring_features::tri::no;  // retried without the flag
  } else if (res < 0 && res != -EAGAIN && res != -EINTR) {
    const std::error_code ec = error_from(res);
    if (open_ && !write_error_) write_error_ = ec;
    w.result = ec;
    w.finished = true;
  }
  if (w.zero_copy && res >= 0 && engine().runtime_features().zc_report_usage == uring_features::tri::unknown) {
    engine().runtime_features().zc_report_usage = uring_features::tri::yes;
  }
  if (!w.finished && w.sent == w.total) w.finished = true;
  if (!w.finished && !open_) {
    w.result = make_error_code(errc::cancelled);
    w.finished = true;
  }
  pump_writes();
  if ((flags & IORING_CQE_F_MORE) == 0) op_done();
}

inline void uring_connection_state::advance(write_req& w, std::size_t n) {
  w.sent += n;
  while (n != 0 && w.next_iov < w.iov.size()) {
    iovec& v = w.iov[w.next_iov];
    const std::size_t k = std::min(n, v.iov_len);
    v.iov_base = static_cast<char*>(v.iov_base) + k;
    v.iov_len -= k;
    n -= k;
    if (v.iov_len == 0) ++w.next_iov;
  }
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
