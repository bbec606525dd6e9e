#pragma once
/// asio_tcp_connection, the public handle of an asio_tcp connection.

#include <utility>

#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/transport/asio_tcp/connection_state.hpp>
#include <fusewire/transport/asio_tcp/options.hpp>
#include <fusewire/transport/asio_tcp/read.hpp>
#include <fusewire/transport/asio_tcp/write.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>

namespace fusewire {
inline namespace v0 {

/// A TCP connection on an asio_reactor; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
class asio_tcp_connection
    : public detail::stream_connection_handle<detail::asio_connection_state, asio_reactor, asio_tcp_stats> {
  friend detail::handle_access;
  using stream_connection_handle::stream_connection_handle;
};

}  // namespace v0
}  // namespace fusewire
