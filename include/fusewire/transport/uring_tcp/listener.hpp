#pragma once
/// uring_tcp's listener: its state (an accept SQE at a time) and
/// uring_tcp_listener, the public handle.

#include <liburing.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/uring_engine.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/uring_tcp/connection.hpp>
#include <fusewire/transport/uring_tcp/options.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/detail/stream_listener.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// A listening socket's state, shared by its handle and its pending accept.
class uring_listener_state final
    : public stream_listener<uring_listener_state, uring_reactor, uring_tcp_connection, uring_options> {
 public:
  uring_listener_state(uring_reactor& reactor, int fd, uring_options opts)
      : stream_listener(reactor, local_port(fd), opts), fd_(fd) {
    accept_op_.owner = this;
    accept_op_.complete = &on_accept_cqe;
  }
  ~uring_listener_state() override {
    if (fd_ >= 0) ::close(fd_);
  }

  static constexpr const char* handle_name = "uring_tcp_listener";  ///< for handle_name_of

  void async_accept(handler_type handler) {
    reactor_->work_started();
    pending_.push_back(std::move(handler));
    schedule_pump();
  }

 private:
  friend stream_listener;

  void close_socket() noexcept {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    try {
      if (accepting_) {
        io_uring_sqe* sqe = reactor_->engine().start_untracked();
        io_uring_prep_cancel64(sqe, reinterpret_cast<std::uint64_t>(static_cast<uring_op*>(&accept_op_)), 0);
      }
      schedule_pump();
    } catch (...) {
      reactor_->report("uring_tcp: could not cancel an accept (out of memory)");
    }
    close_fd_if_idle();
  }

  struct op_slot : uring_op {
    uring_listener_state* owner = nullptr;
  };

  void schedule_pump() noexcept { pump_task_.schedule(*reactor_); }

  void pump() {
    ref_ptr<uring_listener_state> guard(this);
    if (!open_) {
      while (pending_.size() > (accepting_ ? 1u : 0u)) {
        handler_type h = std::move(pending_.back());
        pending_.pop_back();
        complete(h, make_error_code(errc::cancelled), uring_tcp_connection());
      }
      return;
    }
    if (accepting_ || pending_.empty()) return;
    accepting_ = true;
    add_ref();  // held by the accept SQE
    io_uring_sqe* sqe = reactor_->engine().start(accept_op_);
    peer_ = socket_address{};
    peer_.size = sizeof peer_.storage;
    io_uring_prep_accept(sqe, fd_, peer_.get(), &peer_.size, SOCK_NONBLOCK | SOCK_CLOEXEC);
  }

  static void on_accept_cqe(uring_op* op, int res, unsigned) { static_cast<op_slot*>(op)->owner->on_accept(res); }

  void on_accept(int res) {
    ref_ptr<uring_listener_state> guard(this);
    release();  // the SQE's reference; guard keeps us alive
    accepting_ = false;
    handler_type h = std::move(pending_.front());
    pending_.pop_front();
    std::error_code ec;
    uring_tcp_connection conn;
    if (res >= 0 && !open_) {
      ::close(res);
      ec = make_error_code(errc::cancelled);
    } else if (res >= 0) {
      ref_ptr<uring_connection_state> state(new uring_connection_state(*reactor_, res, opts_));
      ec = state->prepare(&peer_);
      if (!ec) conn = handle_access::make<uring_tcp_connection>(std::move(state));
    } else {
      ec = open_ ? from_errno(-res) : make_error_code(errc::cancelled);
    }
    complete(h, ec, std::move(conn));
    close_fd_if_idle();
    pump();
  }

  void close_fd_if_idle() noexcept {
    if (!open_ && !accepting_ && fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

  int fd_;
  member_task<uring_listener_state> pump_task_{*this, &uring_listener_state::pump};  ///< pump, posted
  op_slot accept_op_;
  socket_address peer_;  // filled by the accept in flight
};

}  // namespace detail

/// A listening TCP socket on a uring_reactor; a model of fusewire::listener.
class uring_tcp_listener : public detail::stream_listener_handle<detail::uring_listener_state, uring_tcp_connection> {
  friend detail::handle_access;
  using stream_listener_handle::stream_listener_handle;
};

}  // namespace v0
}  // namespace fusewire
