#pragma once
/// asio_tcp's listener: its state (an Asio acceptor) and asio_tcp_listener, the public handle.

#include <cstdint>
#include <deque>
#include <optional>
#include <system_error>
#include <utility>

#include <boost/asio/ip/tcp.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/asio_tcp/connection.hpp>
#include <fusewire/transport/asio_tcp/options.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/detail/stream_listener.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// A listening socket's state, shared by its handle and its pending accept.
class asio_listener_state final
    : public stream_listener<asio_listener_state, asio_reactor, asio_tcp_connection, asio_options> {
 public:
  asio_listener_state(asio_reactor& reactor, boost::asio::ip::tcp::acceptor acceptor, std::uint16_t port,
                      asio_options opts)
      : stream_listener(reactor, port, opts), acceptor_(std::move(acceptor)) {}

  static constexpr const char* handle_name = "asio_tcp_listener";  ///< for handle_name_of

  void async_accept(handler_type handler) {
    reactor_->work_started();
    if (!open_) {
      reactor_->post([this, self = ref_ptr<asio_listener_state>(this), h = std::move(handler)]() mutable {
        complete(h, make_error_code(errc::connection_closed));
      });
      return;
    }
    pending_.push_back(std::move(handler));
    start_accept();
  }

 private:
  friend stream_listener;

  void close_socket() noexcept {
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
    while (pending_.size() > (accepting_ ? 1u : 0u)) {
      handler_type h = std::move(pending_.back());
      pending_.pop_back();
      reactor_->post([this, self = ref_ptr<asio_listener_state>(this), h = std::move(h)]() mutable {
        complete(h, make_error_code(errc::cancelled));
      });
    }
    if (!accepting_) acceptor_.reset();
  }

  void start_accept() {
    if (accepting_ || pending_.empty() || !open_) return;
    accepting_ = true;
    acceptor_->async_accept([self = ref_ptr<asio_listener_state>(this)](const boost::system::error_code& ec,
                                                                        boost::asio::ip::tcp::socket socket) {
      self->on_accept(ec, std::move(socket));
    });
  }

  void on_accept(const boost::system::error_code& ec, boost::asio::ip::tcp::socket socket) {
    accepting_ = false;
    handler_type h = std::move(pending_.front());
    pending_.pop_front();
    std::error_code e = from_asio(ec, !open_);
    asio_tcp_connection conn;
    if (!e) {
      ref_ptr<asio_connection_state> state(new asio_connection_state(*reactor_, std::move(socket), opts_));
      e = state->prepare();
      if (!e) conn = handle_access::make<asio_tcp_connection>(std::move(state));
    }
    complete(h, e, std::move(conn));
    if (!open_) {
      acceptor_.reset();
    } else {
      start_accept();
    }
  }

  std::optional<boost::asio::ip::tcp::acceptor> acceptor_;
};

}  // namespace detail

/// A listening TCP socket on an asio_reactor; a model of fusewire::listener.
class asio_tcp_listener : public detail::stream_listener_handle<detail::asio_listener_state, asio_tcp_connection> {
  friend detail::handle_access;
  using stream_listener_handle::stream_listener_handle;
};

}  // namespace v0
}  // namespace fusewire
