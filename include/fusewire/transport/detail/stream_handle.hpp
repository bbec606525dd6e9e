#pragma once
/// The public handles of the stream transports (asio_tcp, uring_tcp), written
/// once: a transport's handle only names its state, and is made from one by
/// handle_access. Private to the transport layer.

#include <utility>

#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// A handle's name for error messages, from its state (`State::handle_name`).
template <class State>
struct handle_name_of {
  static constexpr const char* value = State::handle_name;
};

/// Makes a transport's handle from its state: the one friend of every stream
/// handle, so that its transport and listener can make one and nobody else.
struct handle_access {
  template <class Handle, class State>
  static Handle make(ref_ptr<State> s) noexcept {
    return Handle(std::move(s));
  }
};

/// A stream connection's public handle: basic_connection_handle and the
/// transport's counters (`State::stats()`, of type `Stats`).
template <class State, class Reactor, class Stats>
class stream_connection_handle : public basic_connection_handle<State, Reactor, handle_name_of<State>> {
 public:
  stream_connection_handle() noexcept = default;

  /// Counters of this connection (zeros for an empty handle).
  Stats stats() const noexcept { return this->state_ ? this->state_->stats() : Stats{}; }

 protected:
  explicit stream_connection_handle(ref_ptr<State> s) noexcept
      : basic_connection_handle<State, Reactor, handle_name_of<State>>(std::move(s)) {}
};

/// A stream listener's public handle.
template <class State, class Connection>
class stream_listener_handle : public basic_listener_handle<State, Connection, handle_name_of<State>> {
 public:
  stream_listener_handle() noexcept = default;

 protected:
  explicit stream_listener_handle(ref_ptr<State> s) noexcept
      : basic_listener_handle<State, Connection, handle_name_of<State>>(std::move(s)) {}
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
