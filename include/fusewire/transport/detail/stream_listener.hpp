#pragma once
/// The state every stream transport's listener shares (asio_tcp, uring_tcp):
/// its reactor, port and queue of pending accepts, close and completion
/// bookkeeping. A CRTP base; private to the transport layer.

#include <cstdint>
#include <deque>
#include <system_error>
#include <utility>

#include <fusewire/reactor/reactor.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// A listening socket's state, shared by its handle and its pending accept.
/// `Derived` (final) supplies `close_socket()`: how close() stops the engine's
/// accept and fails the accepts still queued (errc::cancelled).
template <class Derived, class Reactor, class Connection, class Options>
class stream_listener : public ref_counted, public closable {
 public:
  using handler_type = util::unique_function<void(std::error_code, Connection)>;

  Reactor& reactor() const noexcept { return *reactor_; }
  std::uint16_t port() const noexcept { return port_; }
  bool is_open() const noexcept { return open_; }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    static_cast<Derived&>(*this).close_socket();
  }

  void shutdown() noexcept override { close(); }

 protected:
  stream_listener(Reactor& reactor, std::uint16_t port, Options opts) : reactor_(&reactor), port_(port), opts_(opts) {
    reactor_->add_closable(*this);
  }
  ~stream_listener() override {
    if (closable_linked_) reactor_->remove_closable(*this);
  }

  void complete(handler_type& h, std::error_code ec, Connection conn = {}) {
    reactor_->work_finished();
    reactor_->invoke(h, ec, std::move(conn));
  }

  Reactor* reactor_;
  std::uint16_t port_;
  Options opts_;
  bool open_ = true;
  bool accepting_ = false;
  std::deque<handler_type> pending_;
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
