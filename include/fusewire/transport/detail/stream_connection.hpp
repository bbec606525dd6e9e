#pragma once
/// The state every stream transport's connection shares (asio_tcp, uring_tcp):
/// the read queue and what was read ahead of it, close, the release state
/// machine and completion bookkeeping, written once. A CRTP base: the
/// transport's state supplies the engine's part through hooks, called
/// statically (no virtual call, allocation or atomic per message). Private to
/// the transport layer.

#include <unistd.h>

#include <cstddef>
#include <deque>
#include <string>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/util/small_fifo.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/received.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// A read queued on a stream connection: an exact one (fills dst) or a read_some.
struct stream_read_op {
  mutable_buffer dst;
  std::size_t filled = 0;  // exact reads: bytes already in dst
  util::unique_function<void(std::error_code, std::size_t)> exact;
  util::unique_function<void(std::error_code, tensor_buffer)> some;
  std::error_code preset;  // started on a closed connection
};

/// The shared part of a stream connection's state, kept alive by its handle
/// and by its engine's operations. `Derived` (final) is also the engine's
/// spin_reader, and supplies:
/// - `transport_name` (static, for messages);
/// - `pump_reads()` and `pump_writes()`, which serve the queues (posted
///   through read_task_ and write_task_);
/// - `may_start_read(op)`: whether a read queued on an idle connection (open,
///   nothing queued or read ahead, no error) may go to the engine at once;
///   `start_first_read()` does that;
/// - `may_take_ahead(n)` and `took_ahead(n)`: try_read's check and bookkeeping
///   beyond the read queue and what was read ahead;
/// - `dropped_ahead()`: what was read ahead was dropped (close, release);
/// - `close_stream()` (close) and `begin_release()` (async_release): how the
///   engine stops the socket's operations;
/// - `let_go_if_idle()`: lets go of the socket once closed and no engine
///   operation is left; a release's finish is posted from there
///   (post_release_finish());
/// - `abort_handoff()`: a release was cancelled (close, reactor stop);
/// - `writes_pending()` and `take_released_fd()`: finish_release's view.
template <class Derived, class Reactor>
class stream_connection : public ref_counted, public closable {
 public:
  using release_handler = release_progress::handler_type;

  Reactor& reactor() const noexcept { return *reactor_; }
  bool is_open() const noexcept { return open_; }
  const std::string& peer() const noexcept { return peer_; }

  template <class H>
  void async_read(mutable_buffer dst, H&& handler) {
    reactor_->work_started();
    read_op op;
    op.dst = dst;
    op.exact = std::forward<H>(handler);
    if (!open_) op.preset = make_error_code(errc::connection_closed);
    enqueue_read(std::move(op));
  }

  template <class H>
  void async_read_some(H&& handler) {
    reactor_->work_started();
    read_op op;
    op.some = std::forward<H>(handler);
    if (!open_) op.preset = make_error_code(errc::connection_closed);
    enqueue_read(std::move(op));
  }

  /// An exact read served now from the bytes read ahead (see
  /// readahead_connection); false: nothing consumed.
  bool try_read(mutable_buffer dst) {
    if (!open_ || !reads_.empty() || !derived().may_take_ahead(dst.size())) return false;
    if (!take_exactly(ahead_, dst)) return false;
    derived().took_ahead(dst.size());
    return true;
  }

  /// Closes the socket and stops the engine's operations on it. Their handlers
  /// run once the engine is done with their buffers, the queued ones' after
  /// them, in call order (errc::cancelled; posted, never inline).
  /// During a release: the release fails with errc::cancelled and closes the socket.
  void close() noexcept {
    if (!open_) {
      if (release_.active()) abort_release();
      return;
    }
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    derived().close_stream();
    wind_down();
  }

  void shutdown() noexcept override { close(); }

  /// Gives up the socket without shutting it down: stops the engine's
  /// operations as close() does, and once the engine is done with the socket
  /// `handler(error_code{}, fd)` runs, posted, after the stopped operations'
  /// handlers (see handoff_transport in concepts.hpp). The fd is handed out
  /// non-blocking and close-on-exec.
  template <class H>
  void async_release(H&& handler) {
    reactor_->work_started();
    release_handler h(std::forward<H>(handler));
    if (!open_) {  // closed, or released (or being released) already
      reactor_->post([self = ref_ptr<Derived>(&derived()), h = std::move(h)]() mutable {
        self->complete(h, make_error_code(errc::connection_closed), -1);
      });
      return;
    }
    open_ = false;
    release_.start(std::move(h));
    // Still registered as closable: a stop during the release closes the socket.
    if (!ahead_.empty()) release_.lose_stream();
    derived().begin_release();
    wind_down();
  }

 protected:
  using read_op = stream_read_op;

  explicit stream_connection(Reactor& reactor)
      : reactor_(&reactor), read_task_(derived(), &Derived::pump_reads), write_task_(derived(), &Derived::pump_writes) {
    reactor_->add_closable(*this);
  }

  /// From the derived state's destructor (while it is whole): leaves the
  /// reactor's lists.
  void unlink() noexcept {
    if (closable_linked_) {  // still open, so the reactor (and its engine) still runs
      reactor_->remove_closable(*this);
      reactor_->engine().unwatch(derived());
    }
  }

  Derived& derived() noexcept { return static_cast<Derived&>(*this); }

  /// Left to the running pump when a handler it called queues this read;
  /// straight to the engine when it cannot complete anything inline (see
  /// may_start_read()); else posted.
  void enqueue_read(read_op op) {
    const bool direct = reads_.empty() && ahead_.empty() && open_ && !read_error_ && derived().may_start_read(op);
    reads_.push_back(std::move(op));
    if (reads_pump_.running) return;  // a handler the pump called: the pump serves it next
    if (direct) {
      derived().start_first_read();
    } else {
      read_task_.schedule(*reactor_);
    }
  }

  read_op pop_read() {
    read_op op = std::move(reads_.front());
    reads_.pop_front();
    return op;
  }

  /// Completes `op` with `ec` (and what an exact read filled so far).
  void fail_read(read_op& op, std::error_code ec) {
    if (op.filled != 0) release_.lose_stream();  // the bytes in dst would be lost to the next owner
    if (op.exact) {
      complete(op.exact, ec, op.filled);
    } else {
      complete(op.some, ec, tensor_buffer());
    }
  }

  /// close() and async_release(), once the connection stopped being open:
  /// drops what was read ahead, posts the completions of the queued
  /// operations, and lets go of the socket once the engine is done with it.
  void wind_down() noexcept {
    reactor_->engine().unwatch(derived());
    ahead_.clear();
    derived().dropped_ahead();
    read_task_.schedule(*reactor_);  // posting them cannot fail: the tasks are members
    write_task_.schedule(*reactor_);
    derived().let_go_if_idle();
  }

  /// From let_go_if_idle(): a release finishes once no engine operation is left.
  void post_release_finish() noexcept {
    release_.post_finish(*reactor_, Derived::release_no_memory,
                         [self = ref_ptr<Derived>(&derived())] { self->finish_release(); });
  }

  /// close() or the reactor's stop during a release.
  void abort_release() noexcept {
    if (!release_.cancel()) return;
    if (closable_linked_) reactor_->remove_closable(*this);
    derived().abort_handoff();
  }

  /// Posted once the engine is done with the socket: completes what the
  /// release stopped (in call order, before its own handler), then hands out
  /// the fd, or closes it if the release failed meanwhile.
  void finish_release() {
    derived().pump_reads();
    derived().pump_writes();
    if (!reads_.empty() || derived().writes_pending()) {  // more than one pass of the read pump
      release_.repost();
      derived().let_go_if_idle();  // posts this again
      return;
    }
    if (closable_linked_) reactor_->remove_closable(*this);
    // Bytes read ahead that no read took would be lost to the next owner.
    if (!ahead_.empty()) release_.lose_stream();
    ahead_.clear();
    std::error_code ec = release_.error();
    int fd = derived().take_released_fd();
    if (!ec) ec = set_nonblocking_cloexec(fd);
    if (ec && fd >= 0) {
      ::close(fd);
      fd = -1;
    }
    release_handler h = release_.finish();
    complete(h, ec, fd);
  }

  template <class F, class... Args>
  void complete(F& handler, Args&&... args) {
    reactor_->work_finished();
    reactor_->invoke(handler, std::forward<Args>(args)...);
  }

  Reactor* reactor_;
  std::string peer_;
  bool open_ = true;
  read_pump reads_pump_;
  member_task<Derived> read_task_;   ///< pump_reads, posted
  member_task<Derived> write_task_;  ///< pump_writes, posted
  std::error_code read_error_;
  std::error_code write_error_;
  release_progress release_;
  util::small_fifo<read_op> reads_;
  std::deque<tensor_buffer> ahead_;  ///< bytes read ahead, not handed out yet
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
