#pragma once
/// uring_tcp's read path: the read pump, the multishot recv into the
/// provided-buffer ring, exact and fallback recvs, and a spinning reactor's
/// plain recvs.

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include <fusewire/transport/uring_tcp/connection_state.hpp>
#include <fusewire/transport/detail/received.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

inline bool uring_connection_state::multishot_usable() {
  return opts_.multishot && !ring_starved_ && engine().buffers() != nullptr &&
         engine().runtime_features().recv_multishot != uring_features::tri::no;
}

inline void uring_connection_state::pump_reads() {
  ref_ptr<uring_connection_state> guard(this);
  detail::read_pump::pass pass(reads_pump_);
  while (!reads_.empty()) {
    if (!pass.serve()) {
      read_task_.schedule(*reactor_);
      break;
    }
    if (!open_) {
      // Closed: everything not in the kernel's hands completes with cancelled, in order.
      if (direct_ == direct_kind::exact) return;
      read_op r = pop_read();
      fail_read(r, r.preset ? r.preset : make_error_code(errc::cancelled));
      continue;
    }
    read_op& front = reads_.front();
    if (front.some) {
      if (!ahead_.empty()) {
        tensor_buffer b = std::move(ahead_.front());
        ahead_.pop_front();
        ahead_bytes_ -= b.size();
        read_op r = pop_read();
        complete(r.some, std::error_code(), std::move(b));
        continue;
      }
      if (read_error_) {
        read_op r = pop_read();
        fail_read(r, read_error_);
        continue;
      }
      if (direct_ != direct_kind::none || multishot_ == multishot_state::cancelling) break;
      if (multishot_usable()) {
        if (multishot_ == multishot_state::idle) arm_multishot();
      } else if (multishot_ == multishot_state::idle) {
        start_fallback_recv();
      }
      break;
    }
    // exact read: first what already arrived (the one copy), then straight into dst
    const std::size_t copied = take_received(ahead_, front.dst, front.filled);
    stats_.bytes_copied_to_destination += copied;
    ahead_bytes_ -= copied;
    if (front.filled == front.dst.size()) {
      read_op r = pop_read();
      complete(r.exact, std::error_code(), r.filled);
      continue;
    }
    if (read_error_) {
      read_op r = pop_read();
      fail_read(r, read_error_);
      continue;
    }
    if (direct_ != direct_kind::none) break;
    const bool small = front.dst.size() < opts_.copy_threshold;
    if (small_exact(front) && multishot_usable()) {
      // Small: wait for the multishot receive and copy (no recv SQE per read).
      // A spinning reactor reads a watched connection with plain recvs and
      // arms no multishot for it (see spin_read() and spin_stopped()).
      engine().watch(*this);
      if (multishot_ == multishot_state::idle && !engine().spin_reads()) arm_multishot();
      break;
    }
    if (multishot_ == multishot_state::armed) {
      cancel(multishot_op_);
      multishot_ = multishot_state::cancelling;
    }
    if (multishot_ == multishot_state::cancelling) break;
    // Right after a large read the stream is likely bulk (a chunked tensor):
    // the next few small reads (frame heads) get exact recvs too, so that a
    // multishot recv does not drain the next payload into ring buffers only
    // for it to be copied again.
    if (!small) {
      bulk_credit_ = bulk_follow_reads;
    } else if (bulk_credit_ != 0) {
      --bulk_credit_;
    }
    start_direct_recv(front);
    break;
  }
  // Backpressure: stop reading ahead once enough unconsumed bytes piled up.
  if (multishot_ == multishot_state::armed && ahead_bytes_ >= opts_.read_ahead &&
      (reads_.empty() || reads_.front().exact)) {
    cancel(multishot_op_);
    multishot_ = multishot_state::cancelling;
  }
}

inline void uring_connection_state::arm_multishot() {
  io_uring_sqe* sqe = start(multishot_op_);
  io_uring_prep_recv_multishot(sqe, fd_, nullptr, 0, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = engine().buffers()->group_id();
  multishot_ = multishot_state::armed;
  ++stats_.multishot_arms;
}

inline void uring_connection_state::start_direct_recv(read_op& r) {
  io_uring_sqe* sqe = start(direct_op_);
  const std::size_t len = std::min<std::size_t>(r.dst.size() - r.filled, 1u << 30);
  io_uring_prep_recv(sqe, fd_, r.dst.data() + r.filled, len, MSG_WAITALL);
  direct_ = direct_kind::exact;
  ++stats_.direct_recvs;
}

inline void uring_connection_state::start_fallback_recv() {
  fallback_ = tensor_buffer::allocate(opts_.fallback_read);
  io_uring_sqe* sqe = start(direct_op_);
  io_uring_prep_recv(sqe, fd_, fallback_.data(), fallback_.size(), 0);
  direct_ = direct_kind::fallback;
  ++stats_.fallback_recvs;
}

/// Whether `r` (the front read) waits for the multishot receive or a spin
/// read and a copy: an exact read below copy_threshold, outside a bulk
/// stretch. Anything else gets its own recv, or ring buffers as they are.
inline bool uring_connection_state::small_exact(const read_op& r) const noexcept {
  return !r.some && r.dst.size() < opts_.copy_threshold && bulk_credit_ == 0;
}

/// A spinning reactor's plain recv (see uring_engine::watch()), while the
/// front read, a small exact one, waits: nothing read ahead, no other recv
/// in flight (while the multishot recv is being cancelled, it waits for the
/// cancellation's last bytes).
inline spin_reader::result uring_connection_state::spin_read() {
  if (!open_ || reads_.empty() || direct_ != direct_kind::none || ahead_bytes_ != 0) return result::done;
  if (multishot_ == multishot_state::cancelling) return result::idle;  // its last bytes come first
  // Only small exact reads: a read_some keeps getting ring buffers (handed over as they are).
  if (!small_exact(reads_.front())) return result::done;
  // The recv writes into the reusable buffer, and only bytes read take a
  // handle to it: a spinning tick that finds nothing costs no reference count.
  tensor_buffer fresh;
  mutable_buffer dst = spin_buffer_.scratch();
  if (dst.empty()) {  // the last bytes read are still held
    fresh = tensor_buffer::allocate(spin_read_bytes);
    dst = fresh.bytes();
  }
  const ssize_t n = ::recv(fd_, dst.data(), dst.size(), MSG_DONTWAIT);
  if (n < 0) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return result::idle;
    // The recv took the socket's error: the multishot recv may never see it.
    if (!read_error_) read_error_ = error_from(-err);
  } else if (n == 0) {
    if (!read_error_) read_error_ = make_error_code(errc::connection_closed);
  } else {
    tensor_buffer buf = fresh.empty() ? spin_buffer_.keep(static_cast<std::size_t>(n)) : std::move(fresh);
    buf.trim(static_cast<std::size_t>(n));
    ahead_bytes_ += buf.size();
    stats_.bytes_received += buf.size();
    ++stats_.spin_reads;
    ahead_.push_back(std::move(buf));
    // The connection is hot and these recvs serve it: a multishot recv still
    // armed would be woken by every message, and its poll wake-up runs in the
    // sender's sendmsg. It goes; spin_stopped() arms it again when the plain
    // recvs stop.
    if (multishot_ == multishot_state::armed) {
      cancel(multishot_op_);
      multishot_ = multishot_state::cancelling;
      ++stats_.multishot_disarms;
    }
  }
  pump_reads();  // may re-watch this
  return n > 0 ? result::read : result::done;
}

/// The reactor stopped reading this with plain recvs (evicted, done, or about
/// to sleep): a small exact read still waiting gets the multishot recv again.
inline void uring_connection_state::spin_stopped() noexcept {
  if (!open_ || reads_.empty() || multishot_ != multishot_state::idle || direct_ != direct_kind::none ||
      !multishot_usable()) {
    return;
  }
  if (!small_exact(reads_.front())) return;
  try {
    arm_multishot();
  } catch (const std::system_error& e) {
    // The ring takes no more submissions: the read fails (posted) instead of waiting forever.
    if (!read_error_) read_error_ = e.code();
    read_task_.schedule(*reactor_);
  }
}

inline void uring_connection_state::on_multishot_cqe(uring_op* op, int res, unsigned flags) {
  static_cast<op_slot*>(op)->owner->on_multishot(res, flags);
}

inline void uring_connection_state::on_multishot(int res, unsigned flags) {
  ref_ptr<uring_connection_state> guard(this);
  provided_buffer_ring* ring = engine().buffers();
  if ((flags & IORING_CQE_F_BUFFER) != 0) {
    const auto bid = static_cast<std::uint16_t>(flags >> IORING_CQE_BUFFER_SHIFT);
    if (res > 0 && open_) {
      ahead_.push_back(ring->take(bid, static_cast<std::size_t>(res)));
      ahead_bytes_ += static_cast<std::size_t>(res);
      stats_.bytes_received += static_cast<std::size_t>(res);
      ++stats_.ring_buffers;
      engine().runtime_features().recv_multishot = uring_features::tri::yes;
    } else {
      if (res > 0) release_.lose_stream();  // arrived before the cancellation
      ring->discard(bid);
    }
  }
  const bool final = (flags & IORING_CQE_F_MORE) == 0;
  if (final) {
    multishot_ = multishot_state::idle;
    if (res == 0) {
      if (!read_error_)
        read_error_ = !open_ ? make_error_code(errc::cancelled) : make_error_code(errc::connection_closed);
    } else if (res == -ENOBUFS) {
      ring_starved_ = true;  // the next read_some uses a plain recv
    } else if (res == -EINVAL && engine().runtime_features().recv_multishot == uring_features::tri::unknown) {
      engine().runtime_features().recv_multishot = uring_features::tri::no;
    } else if (res < 0 && res != -ECANCELED && !read_error_) {
      read_error_ = error_from(res);
    }
  }
  if (final) request_done();
  pump_reads();
  if (final) op_done();
}

inline void uring_connection_state::on_direct_cqe(uring_op* op, int res, unsigned flags) {
  static_cast<op_slot*>(op)->owner->on_direct(res, flags);
}

inline void uring_connection_state::on_direct(int res, unsigned) {
  ref_ptr<uring_connection_state> guard(this);
  request_done();
  const direct_kind kind = direct_;
  direct_ = direct_kind::none;
  if (kind == direct_kind::exact) {
    read_op& r = reads_.front();
    if (res > 0) {
      r.filled += static_cast<std::size_t>(res);
      stats_.bytes_received += static_cast<std::size_t>(res);
    }
    if (r.filled == r.dst.size()) {
      read_op done = pop_read();
      complete(done.exact, std::error_code(), done.filled);
    } else if (!open_) {
      read_op done = pop_read();
      fail_read(done, make_error_code(errc::cancelled));
    } else if (res == 0) {
      read_error_ = make_error_code(errc::connection_closed);
    } else if (res < 0 && res != -EAGAIN && res != -EINTR) {
      read_error_ = error_from(res);
    }
  } else {
    tensor_buffer got = std::move(fallback_);
    ring_starved_ = false;
    if (res > 0) release_.lose_stream();
    if (res > 0 && open_) {
      got.trim(static_cast<std::size_t>(res));
      stats_.bytes_received += static_cast<std::size_t>(res);
      ahead_bytes_ += got.size();
      ahead_.push_back(std::move(got));
    } else if (res == 0 && open_) {
      read_error_ = make_error_code(errc::connection_closed);
    } else if (res < 0 && res != -EAGAIN && res != -EINTR && res != -ECANCELED && !read_error_) {
      read_error_ = error_from(res);
    }
  }
  pump_reads();
  op_done();
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
