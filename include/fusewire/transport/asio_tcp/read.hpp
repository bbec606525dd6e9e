#pragma once
/// asio_tcp's read path: the read pump, Asio's reads into the chunk or the
/// destination, and a spinning reactor's plain recvs.

#include <boost/asio/read.hpp>

#include <fusewire/transport/asio_tcp/connection_state.hpp>
#include <fusewire/transport/detail/received.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// Serves the queued reads, in order, from what was read ahead; reads the
/// socket for the first one that needs more (or fails them on an error).
inline void asio_connection_state::pump_reads() {
  ref_ptr<asio_connection_state> guard(this);
  detail::read_pump::pass pass(reads_pump_);
  while (!reading_ && !reads_.empty()) {
    if (!pass.serve()) {
      read_task_.schedule(*reactor_);
      break;
    }
    read_op& front = reads_.front();
    if (!front.preset && open_) {
      if (front.some && !ahead_.empty()) {
        read_op op = pop_read();
        tensor_buffer b = std::move(ahead_.front());
        ahead_.pop_front();
        complete(op.some, std::error_code(), std::move(b));
        continue;
      }
      if (front.exact) take_received(ahead_, front.dst, front.filled);
      if (front.exact && front.filled == front.dst.size()) {
        read_op op = pop_read();
        complete(op.exact, std::error_code(), op.filled);
        continue;
      }
    }
    const std::error_code ec = front.preset ? front.preset : read_failure();
    if (!ec) {
      if (start_read()) continue;  // bytes (or an error) to serve now
      break;
    }
    read_op op = pop_read();
    fail_read(op, ec);
  }
  let_go_if_idle();
}

// The front read needs bytes from the socket. An exact read of at least
// read_ahead_below bytes gets them straight into its destination, through
// Asio. Anything else reads what there is into the chunk (handed out, or
// read ahead): through Asio on a reactor that never spins (block mode);
// otherwise with a plain non-blocking recv of our own, and if there is
// nothing yet the spinning reactor tries the recv each tick (spin_read);
// when it stops (spin_stopped), Asio waits for the socket to be readable
// (and reads nothing). Every byte of the stream is read by this thread in
// order, whichever comes first. (A wait costs Asio an epoll_ctl to re-arm
// the socket, which its own reads avoid; a sleeping reactor gains nothing
// from the recv of our own.)
// True: bytes (or the socket's error) arrived now, for the pump to serve.
inline bool asio_connection_state::start_read() {
  read_op& op = reads_.front();
  const bool direct = is_direct(op);
  if ((direct || !reactor_->engine().spin_reads()) && !read_error_) {
    if (const boost::system::error_code e = attach()) {
      read_error_ = from_asio(e, false);
      return true;
    }
  }
  auto on_done = [self = ref_ptr<asio_connection_state>(this), direct](const boost::system::error_code& ec,
                                                                       std::size_t n) { self->on_read(direct, ec, n); };
  if (direct) {
    reading_ = true;
    ++stats_.direct_reads;
    boost::asio::async_read(*socket_, boost::asio::buffer(op.dst.data() + op.filled, op.dst.size() - op.filled),
                            transfer_everything{}, std::move(on_done));
    return false;
  }
  const std::size_t room = chunk_room(op);
  if (!reactor_->engine().spin_reads()) {
    reading_ = true;
    ++stats_.chunk_reads;
    socket_->async_read_some(boost::asio::buffer(chunk_.data() + chunk_used_, room), std::move(on_done));
    return false;
  }
  if (recv_chunk(room)) return true;
  reactor_->engine().watch(*this);
  return false;
}

// Whether a queued read may take the socket's next bytes: open, no Asio
// read in flight, no error, the front read not failed in advance.
inline bool asio_connection_state::front_may_read() noexcept {
  return open_ && !reading_ && !read_error_ && !reads_.empty() && !reads_.front().preset;
}

// Whether the front read waits for bytes into the chunk with nothing of
// Asio's in flight for it: what the spinning reactor's recvs serve.
inline bool asio_connection_state::waits_for_chunk() noexcept {
  return front_may_read() && !waiting_ && ahead_.empty() && !is_direct(reads_.front());
}

// Whether `op`'s bytes go straight into its destination (an exact read of at
// least read_ahead_below bytes still to fill) rather than through the chunk.
inline bool asio_connection_state::is_direct(const read_op& op) const noexcept {
  return op.exact && op.dst.size() - op.filled >= opts_.read_ahead_below;
}

// Makes room in the chunk for a read into it for `op` (not a direct read);
// how many bytes that read may take.
inline std::size_t asio_connection_state::chunk_room(const read_op& op) {
  if (chunk_.size() - chunk_used_ < min_chunk_tail) {
    chunk_ = tensor_buffer::allocate(opts_.read_chunk);
    chunk_used_ = 0;
  }
  // Reading ahead for a small exact read takes at most read_ahead_below bytes,
  // so a large payload behind a small header is not copied out of the chunk.
  std::size_t room = chunk_.size() - chunk_used_;
  if (op.exact) room = std::min(room, std::max(opts_.read_ahead_below, op.dst.size() - op.filled));
  return room;
}

// `n` bytes arrived at the chunk's end: read ahead.
inline void asio_connection_state::chunk_filled(std::size_t n) {
  stats_.bytes_received += n;
  ahead_.push_back(chunk_.share(chunk_used_, n));
  chunk_used_ += n;
  if (chunk_.size() - chunk_used_ < min_chunk_tail) {
    chunk_.reset();
    chunk_used_ = 0;
  }
}

// One non-blocking recv of at most `room` bytes into the chunk (chunk_room()
// made them). True: bytes were read ahead, or the socket's error (or its
// end) went to read_error_.
inline bool asio_connection_state::recv_chunk(std::size_t room) {
  ssize_t n;
  do {
    n = ::recv(native_handle(), chunk_.data() + chunk_used_, room, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return false;
    if (!read_error_) read_error_ = from_errno(err);
    return true;
  }
  if (n == 0) {
    if (!read_error_) read_error_ = make_error_code(errc::connection_closed);
    return true;
  }
  ++stats_.recvs;
  chunk_filled(static_cast<std::size_t>(n));
  return true;
}

/// A spinning reactor's recv (see asio_engine::watch()) while the front read
/// waits for the socket to be readable.
inline spin_reader::result asio_connection_state::spin_read() {
  if (!front_may_read()) return result::done;
  if (!ahead_.empty()) return result::idle;  // the pump has bytes to serve first (it is posted)
  const read_op& front = reads_.front();
  if (is_direct(front)) return result::done;
  if (!recv_chunk(chunk_room(front))) return result::idle;
  if (!read_error_) {
    ++stats_.spin_reads;
    detach();  // the connection is hot and these recvs serve it
  }
  pump_reads();  // may watch this again
  return result::read;
}

/// The reactor stopped reading this with plain recvs (evicted, said done, or
/// about to sleep): a read still waiting for the chunk gets Asio's wait.
inline void asio_connection_state::spin_stopped() noexcept {
  if (!waits_for_chunk()) return;
  if (const boost::system::error_code e = attach()) {
    read_error_ = from_asio(e, false);
    read_task_.schedule(*reactor_);
    return;
  }
  try {
    waiting_ = true;
    ++stats_.waits;
    socket_->async_wait(
        boost::asio::socket_base::wait_read,
        [self = ref_ptr<asio_connection_state>(this)](const boost::system::error_code& ec) { self->on_readable(ec); });
  } catch (const std::bad_alloc&) {
    waiting_ = false;
    read_error_ = make_error_code(errc::out_of_memory);
    read_task_.schedule(*reactor_);
  }
}

inline void asio_connection_state::on_readable(const boost::system::error_code& ec) {
  waiting_ = false;
  const std::error_code e = from_asio(ec, !open_);
  if (e && open_ && !read_error_) read_error_ = e;
  pump_reads();
}

// Asio's read finished: into the front read's destination (`direct`), or into the chunk.
inline void asio_connection_state::on_read(bool direct, const boost::system::error_code& ec, std::size_t n) {
  reading_ = false;
  const std::error_code e = from_asio(ec, !open_);
  if (e && open_ && !read_error_) read_error_ = e;
  if (direct) {
    stats_.bytes_received += n;
    read_op op = pop_read();
    if (e && op.filled + n != 0) release_.lose_stream();
    complete(op.exact, e, op.filled + n);
  } else if (!e && n != 0 && !chunk_.empty()) {
    // (An empty chunk: close() ran between Asio's read and this handler, and
    // dropped the chunk; the bytes go with the closed stream.)
    chunk_filled(n);
  }
  pump_reads();
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
