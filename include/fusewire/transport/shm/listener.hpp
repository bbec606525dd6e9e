#pragma once
/// shm: a listener's state (an abstract Unix socket, and the handshake that
/// receives and checks a connecting side's segment) and basic_shm_listener,
/// the public handle. See transport/shm.hpp.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/reactor/basic_reactor.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/shm/connection.hpp>
#include <fusewire/transport/shm/pool.hpp>
#include <fusewire/transport/shm/segment.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// What a listener needs of its transport's config.
struct shm_listener_options {
  std::size_t max_ring_size;
  std::size_t read_some_max;
  std::size_t single_copy_min;
  std::chrono::milliseconds handshake_timeout;
  bool same_user_only;
  std::shared_ptr<shm::shared_pool> pool;  ///< the transport's, for its connections
};

/// A listening socket's state, shared by its handle and its pending waits.
/// Handshakes run one at a time: accept4, then the hello (with a deadline).
template <class Reactor>
class shm_listener_state final : public ref_counted, public closable {
 public:
  using connection_type = basic_shm_connection<Reactor>;
  using handler_type = util::unique_function<void(std::error_code, connection_type)>;
  static constexpr const char* handle_name = "shm_listener";  ///< for handle_name_of

  shm_listener_state(Reactor& reactor, int fd, std::string host, std::uint16_t port, shm_listener_options opts)
      : reactor_(&reactor),
        sock_(std::in_place, reactor.engine(), fd),
        host_(std::move(host)),
        port_(port),
        opts_(opts) {
    reactor_->add_closable(*this);
  }
  ~shm_listener_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
  }

  Reactor& reactor() const noexcept { return *reactor_; }
  std::uint16_t port() const noexcept { return port_; }
  bool is_open() const noexcept { return open_; }

  void async_accept(handler_type h) {
    reactor_->work_started();
    if (!open_) {
      post(std::move(h), make_error_code(errc::connection_closed));
      return;
    }
    pending_.push_back(std::move(h));
    start();
  }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    sock_->close();
    drop_handshake();
    let_go_if_idle();
    while (!pending_.empty()) {
      post(std::move(pending_.front()), make_error_code(errc::cancelled));
      pending_.pop_front();
    }
  }

  void shutdown() noexcept override { close(); }

 private:
  void post(handler_type h, std::error_code ec, connection_type c = {}) noexcept {
    try {
      reactor_->post([r = reactor_, h = std::move(h), ec, c = std::move(c)]() mutable {
        r->work_finished();
        r->invoke(h, ec, std::move(c));
      });
    } catch (...) {
      reactor_->report("shm_listener: no memory to post a completion");
    }
  }

  void start() {
    if (!open_ || busy_ || pending_.empty()) return;
    busy_ = true;
    try_accept();
  }

  void try_accept() {
    const int fd = ::accept4(sock_->native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        sock_->async_wait([self = ref_ptr<shm_listener_state>(this)](std::error_code ec) {
          self->accept_waiting_ = false;
          if (ec || !self->open_) return self->let_go_if_idle();
          self->try_accept();
        });
        accept_waiting_ = true;
        return;
      }
      // Out of descriptors, say: the accept fails, the listener goes on.
      const std::error_code ec = shm::last_error();
      busy_ = false;
      post(std::move(pending_.front()), ec);
      pending_.pop_front();
      return start();
    }
    hs_fd_ = shm::unique_fd(fd);
    ++hs_generation_;
    if (!receive_hello()) {
      hs_.emplace(reactor_->engine(), hs_fd_.release());
      wait_hello();
      hs_timer_ = reactor_->run_after(opts_.handshake_timeout, [self = ref_ptr<shm_listener_state>(this),
                                                                gen = hs_generation_](std::error_code ec) {
        if (ec || gen != self->hs_generation_ || !self->open_) return;
        self->reactor_->report("shm_listener " + self->name() + ": a connecting side sent no hello within " +
                               std::to_string(self->opts_.handshake_timeout.count()) + " ms; dropped");
        self->drop_handshake();
        self->next();
      });
    }
  }

  void wait_hello() {
    hs_->async_wait([self = ref_ptr<shm_listener_state>(this), gen = hs_generation_](std::error_code ec) {
      if (ec || gen != self->hs_generation_ || !self->open_ || !self->hs_) return;
      if (!self->receive_hello()) self->wait_hello();
    });
  }

  std::string name() const { return host_ + ":" + std::to_string(port_); }

  int hs_native() noexcept { return hs_ ? hs_->native_handle() : hs_fd_.get(); }

  void drop_handshake() noexcept {
    if (hs_timer_) reactor_->cancel(hs_timer_);
    hs_timer_ = {};
    if (hs_) hs_->close();
    hs_.reset();
    hs_fd_.reset();
    ++hs_generation_;
  }

  void next() {
    busy_ = false;
    start();
  }

  /// Drops the socket's descriptor object once closed and no wait of it is
  /// left to run, so that nothing of this state touches the reactor's engine
  /// after the reactor stopped.
  void let_go_if_idle() noexcept {
    if (open_ || accept_waiting_) return;
    sock_.reset();
  }

  /// Reads the hello: false if it has not arrived yet. Otherwise the
  /// handshake is over (a connection delivered, or the peer dropped and reported).
  bool receive_hello() {
    const int fd = hs_native();
    shm::hello h{};
    shm::received_message m = shm::receive_with_fds(fd, &h, sizeof h);
    const ssize_t n = m.bytes;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    auto& fds = m.fds;  // the first m.fd_count hold descriptors
    std::string why;
    shm::mapping map;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (n < 0) {
      why = "receiving its hello failed: " + shm::last_error().message();
    } else if (n == 0) {
      why = "it closed before its hello";
    } else if (static_cast<std::size_t>(n) != sizeof h || m.truncated ||
               m.fd_count != static_cast<std::size_t>(shm::hello_fds)) {
      why = "its hello is not " + std::to_string(sizeof h) + " bytes with " + std::to_string(shm::hello_fds) +
            " descriptors";
    } else if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      why = "SO_PEERCRED failed: " + shm::last_error().message();
    } else if (opts_.same_user_only && cred.uid != ::geteuid()) {
      why = "it runs as user " + std::to_string(cred.uid) + ", not this process's user (same_user_only)";
    } else {
      map = shm::accept_segment(h, fds[0].get(), fds[1].get(), fds[2].get(), opts_.max_ring_size, why);
    }
    if (!map) {
      reactor_->report("shm_listener " + name() + ": dropped a connecting side: " + why);
      drop_handshake();
      next();
      return true;
    }
    shm::unique_fd sock(hs_ ? hs_->release() : hs_fd_.release());
    drop_handshake();
    // The memfd is no longer needed: the mapping holds the segment.
    ref_ptr<shm_connection_state<Reactor>> state;
    try {
      state = ref_ptr<shm_connection_state<Reactor>>(new shm_connection_state<Reactor>(
          *reactor_, std::move(sock), std::move(fds[2]), std::move(fds[1]), std::move(map), 1,
          name() + "#" + std::to_string(cred.pid),
          shm_link_options{opts_.read_some_max, opts_.single_copy_min, cred.pid, opts_.pool}));
    } catch (...) {
      reactor_->report("shm_listener " + name() + ": no memory for a connection; dropped");
      next();
      return true;
    }
    post(std::move(pending_.front()), {}, handle_access::make<connection_type>(std::move(state)));
    pending_.pop_front();
    next();
    return true;
  }

  using fd_wait = typename Reactor::engine_type::fd_wait;
  Reactor* reactor_;
  std::optional<fd_wait> sock_;  ///< empty once closed and idle
  std::string host_;
  std::uint16_t port_;
  shm_listener_options opts_;
  std::deque<handler_type> pending_;
  bool open_ = true;
  bool busy_ = false;            ///< an accept or handshake is under way
  bool accept_waiting_ = false;  ///< try_accept()'s wait is under way
  shm::unique_fd hs_fd_;
  std::optional<fd_wait> hs_;
  timer_id hs_timer_{};
  std::uint64_t hs_generation_ = 0;
};

}  // namespace detail

/// A listener of the shm transport on a `Reactor`; a model of fusewire::listener.
template <class Reactor>
class basic_shm_listener
    : public detail::stream_listener_handle<detail::shm_listener_state<Reactor>, basic_shm_connection<Reactor>> {
  friend detail::handle_access;
  using detail::stream_listener_handle<detail::shm_listener_state<Reactor>,
                                       basic_shm_connection<Reactor>>::stream_listener_handle;
};

}  // namespace v0
}  // namespace fusewire
