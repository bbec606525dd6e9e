#pragma once
/// uring_tcp_connection, the public handle of a uring_tcp connection, and
/// the connect that makes one.

#include <liburing.h>

#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/uring_engine.hpp>
#include <fusewire/transport/uring_tcp/connection_state.hpp>
#include <fusewire/transport/uring_tcp/options.hpp>
#include <fusewire/transport/uring_tcp/read.hpp>
#include <fusewire/transport/uring_tcp/write.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/detail/socket.hpp>

namespace fusewire {
inline namespace v0 {

/// A TCP connection on a uring_reactor; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
class uring_tcp_connection
    : public detail::stream_connection_handle<detail::uring_connection_state, uring_reactor, uring_tcp_stats> {
  friend detail::handle_access;
  using stream_connection_handle::stream_connection_handle;
};

namespace detail {

inline void uring_connection_state::connect(const socket_address& addr, connect_handler handler) {
  connect_addr_ = addr;
  connect_handler_ = std::move(handler);
  connecting_ = true;
  io_uring_sqe* sqe = start(connect_op_);
  io_uring_prep_connect(sqe, fd_, connect_addr_.get(), connect_addr_.size);
}

inline void uring_connection_state::on_connect(int res, unsigned) {
  ref_ptr<uring_connection_state> guard(this);
  request_done();
  connecting_ = false;
  std::error_code ec = res < 0 ? error_from(res) : std::error_code();
  if (!ec && !open_) ec = make_error_code(errc::cancelled);
  if (!ec) ec = prepare();
  uring_tcp_connection conn;
  if (!ec) {
    conn = handle_access::make<uring_tcp_connection>(ref_ptr<uring_connection_state>(this));
  } else {
    close();
  }
  connect_handler h = std::move(connect_handler_);
  complete(h, ec, std::move(conn));
  op_done();
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
