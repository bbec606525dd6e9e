#pragma once
/// The portable reactor engine: a Boost.Asio io_context owned by one reactor
/// thread; its readiness wait (asio_fd_wait); and the reactor/group aliases
/// built on it.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/detail/spin_readers.hpp>
#include <fusewire/reactor/reactor.hpp>

namespace fusewire {
inline namespace v0 {

class asio_fd_wait;

/// An io_context driven by the reactor loop: poll() runs ready handlers without
/// blocking, wait() blocks in run_one until a handler or the wake eventfd is ready.
/// Only its reactor's thread touches the io_context, so it runs without locks
/// (concurrency hint UNSAFE) unless the config says otherwise.
class asio_engine {
 public:
  /// The engine's readiness wait on a descriptor (see asio_fd_wait).
  using fd_wait = asio_fd_wait;

  struct config {
    /// io_context concurrency hint; the default turns off Asio's internal locking.
    int concurrency_hint = BOOST_ASIO_CONCURRENCY_HINT_UNSAFE;
    /// Connections a spinning reactor (poll mode, or adaptive while it polls)
    /// reads with a plain recv each tick, as a busy-polling C program does,
    /// instead of waiting for epoll to report them; the most recently waiting
    /// ones win (at most detail::spin_list::max_readers). 0: off.
    unsigned spin_readers = 4;
    /// While the reactor spins and its polls find nothing, poll_spinning()
    /// asks epoll less and less often: after 1, 2, 4, ... calls, at most
    /// every this many (1: every call). An epoll_wait(0) is a system call,
    /// several times dearer than a tick of a polling reactor whose work is in
    /// memory (shm rings, posted tasks, the plain recvs of spin_readers). A
    /// poll that runs a handler starts the count again at 1, so an event
    /// only epoll reports is seen at most as many ticks late as had passed
    /// since the last poll that ran one (and at most this many). poll()
    /// (ticks that do not spin: block mode, a stopping reactor) and wait()
    /// always ask epoll.
    unsigned idle_poll_stride = 1024;
  };

  asio_engine(const config& cfg, detail::engine_hooks& hooks)
      : context_(cfg.concurrency_hint),
        work_(context_.get_executor()),
        wake_(context_),
        spin_(cfg.spin_readers),
        stride_(cfg.idle_poll_stride == 0 ? 1 : cfg.idle_poll_stride) {
    const int fd = ::dup(hooks.wake_fd());
    if (fd < 0) throw std::system_error(errno, std::system_category(), "asio_engine: dup(eventfd) failed");
    wake_.assign(fd);
    arm_wake();
  }

  asio_engine(const asio_engine&) = delete;
  asio_engine& operator=(const asio_engine&) = delete;

  ~asio_engine() {
    boost::system::error_code ignored;
    wake_.close(ignored);
    work_.reset();
  }

  /// The io_context sockets of this reactor are created on. Reactor thread only.
  boost::asio::io_context& context() noexcept { return context_; }

  /// Runs the ready handlers (epoll_wait with no timeout first).
  bool poll() {
    skip_ = 0;
    gap_ = 1;
    return context_.poll() != 0;
  }

  /// poll() for a tick the reactor spins on: after a poll that ran nothing,
  /// the next calls return false without asking epoll, twice as many after
  /// each such poll (up to idle_poll_stride - 1); a poll that ran a handler
  /// resets that to none.
  bool poll_spinning() {
    if (skip_ != 0) {
      --skip_;
      return false;
    }
    const bool ran = context_.poll() != 0;
    if (ran) {
      gap_ = 1;
    } else {
      skip_ = gap_ - 1;
      gap_ = std::min(gap_ * 2, stride_);
    }
    return ran;
  }

  void wait(std::optional<std::chrono::nanoseconds> timeout) {
    skip_ = 0;
    gap_ = 1;
    spin_.stop_all();  // readers that relied on the plain recvs get Asio's wait again
    if (timeout) {
      context_.run_one_for(*timeout);
    } else {
      context_.run_one();
    }
  }

  /// Asio owes no completions the reactor does not already count (transports
  /// count their operations with work_started/work_finished).
  bool busy() const noexcept { return false; }

  /// Whether watch() does anything: the reactor spins (it called spin()).
  bool spin_reads() const noexcept { return spin_.active(); }

  /// Asks for `r.spin_read()` on every spinning tick, after poll() ran the
  /// ready handlers, until it says done or unwatch(r). The reader owns every
  /// read of its socket that can race with this one (asio_tcp reads itself,
  /// and lets Asio only wait for readability), so the stream keeps its order.
  /// Evicts the longest-watched reader when full; the evicted one, one that
  /// says done, and all of them before the engine sleeps are told
  /// (spin_reader::spin_stopped()).
  void watch(detail::spin_reader& r) noexcept { spin_.watch(r); }
  void unwatch(detail::spin_reader& r) noexcept { spin_.unwatch(r); }

  /// The reactor calls this on ticks it will not sleep after; true if a reader took bytes.
  bool spin() { return spin_.spin(true); }

  static constexpr std::string_view name() noexcept { return "asio"; }

 private:
  void arm_wake() {
    wake_.async_wait(boost::asio::posix::descriptor_base::wait_read, [this](const boost::system::error_code& ec) {
      if (ec) return;  // closed: the engine is going away
      std::uint64_t value = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_.native_handle(), &value, sizeof value);
      arm_wake();
    });
  }

  boost::asio::io_context context_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::posix::stream_descriptor wake_;
  detail::spin_list spin_;  ///< connections read with a plain recv while spinning
  unsigned stride_;
  unsigned skip_ = 0;  ///< poll_spinning() calls left to answer without epoll
  unsigned gap_ = 1;   ///< calls from the next empty poll to the one after (doubles up to stride_)
};

static_assert(reactor_engine<asio_engine>);

/// A descriptor whose readability its reactor's engine reports (here: epoll,
/// through an Asio stream_descriptor). Owns the descriptor. One wait at a
/// time; its handler runs on the reactor's thread with no error once the
/// descriptor is readable, or errc::cancelled when close() came first. Reactor
/// thread only; destroy it only once no wait is pending.
class asio_fd_wait {
 public:
  asio_fd_wait(asio_engine& engine, int fd) : d_(engine.context(), fd) {}

  int native_handle() noexcept { return d_.native_handle(); }

  /// `h(std::error_code)`, never inline.
  template <class H>
  void async_wait(H&& h) {
    d_.async_wait(boost::asio::posix::descriptor_base::wait_read, [h = std::forward<H>(h)](
                                                                      const boost::system::error_code& ec) mutable {
      if (!ec) return h(std::error_code{});
      h(ec == boost::asio::error::operation_aborted ? make_error_code(errc::cancelled)
                                                    : std::error_code(ec.value(), std::system_category()));
    });
  }

  /// Closes the descriptor; a pending wait completes with errc::cancelled.
  void close() noexcept {
    boost::system::error_code ignored;
    d_.close(ignored);
  }

  /// Hands the descriptor over (no wait may be pending).
  int release() { return d_.release(); }

 private:
  boost::asio::posix::stream_descriptor d_;
};

/// A reactor running an Asio io_context.
using asio_reactor = basic_reactor<asio_engine>;
/// A group of Asio reactors.
using asio_reactor_group = basic_reactor_group<asio_engine>;

}  // namespace v0
}  // namespace fusewire
