#pragma once
/// per_host<Near, Far>: a transport that reaches each peer by one of two
/// transports sharing a reactor type, chosen per peer when it connects:
/// `Near` (shm) for a peer on this host, `Far` (asio_tcp) for any other. A
/// model of fusewire::transport (not of handoff_transport: a connection is
/// either kind, and shm's cannot move between reactors).
///
/// Connect: the transport's host test (by default: a loopback address, this
/// host's name, or an address of one of its interfaces) says whether `host`
/// is this host. If it is, the
/// connect goes over Near; when Near finds no listener there (errc::
/// connection_refused, as when the peer listens with Far only) or cannot name
/// the host (errc::invalid_argument), it goes over Far instead. Any other host
/// goes over Far at once.
///
/// Listen: Far listens on host:port (port 0: the kernel picks), then Near on
/// host and the same port, so a peer reaches either under one address. A host
/// Near cannot name (an empty one) leaves Near out: peers then fall back to
/// Far. async_accept delivers connections of both kinds in the order they
/// complete; at most one connection of each kind is accepted ahead of a
/// caller's async_accept.
///
/// Peers need not run per_host themselves: a Far-only peer reaches it over
/// Far, a Near-only peer on this host over Near.

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/this_host.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

/// Counters of a per_host connection, whichever its kind.
struct per_host_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
};

/// A connection of per_host: one of Near's or Far's; a model of
/// fusewire::connection. Move-only; destroying it closes it. Use it on its
/// reactor's thread only.
template <connection Near, connection Far>
  requires(!std::same_as<Near, Far>)
class per_host_connection {
 public:
  using connection_concept = connection_tag;

  /// An empty connection (not open); what a failed connect or accept delivers.
  per_host_connection() noexcept = default;
  explicit per_host_connection(Near c) noexcept : near_(std::move(c)), kind_(kind::near) {}
  explicit per_host_connection(Far c) noexcept : far_(std::move(c)), kind_(kind::far) {}
  per_host_connection(per_host_connection&& o) noexcept
      : near_(std::move(o.near_)), far_(std::move(o.far_)), kind_(std::exchange(o.kind_, kind::none)) {}
  per_host_connection& operator=(per_host_connection&& o) noexcept {
    if (this != &o) {
      near_ = std::move(o.near_);  // each closes what it held
      far_ = std::move(o.far_);
      kind_ = std::exchange(o.kind_, kind::none);
    }
    return *this;
  }

  template <io_handler H>
  void async_write(std::span<const const_buffer> sg, H&& handler) {
    visit("async_write", [&](auto& c) { c.async_write(sg, std::forward<H>(handler)); });
  }
  template <io_handler H>
  void async_read(mutable_buffer dst, H&& handler) {
    visit("async_read", [&](auto& c) { c.async_read(dst, std::forward<H>(handler)); });
  }
  template <read_some_handler H>
  void async_read_some(H&& handler) {
    visit("async_read_some", [&](auto& c) { c.async_read_some(std::forward<H>(handler)); });
  }

  /// Fills `dst` from bytes already read ahead, where the connection's kind
  /// reads ahead; false (nothing consumed) otherwise. See readahead_connection.
  bool try_read(mutable_buffer dst)
    requires(readahead_connection<Near> || readahead_connection<Far>)
  {
    if constexpr (readahead_connection<Near>) {
      if (kind_ == kind::near) return near_.try_read(dst);
    }
    if constexpr (readahead_connection<Far>) {
      if (kind_ == kind::far) return far_.try_read(dst);
    }
    return false;
  }

  /// Closes; pending operations complete with errc::cancelled. Idempotent.
  void close() noexcept {
    near_.close();
    far_.close();
  }
  bool is_open() const noexcept { return near_.is_open() || far_.is_open(); }
  /// "host:port" of the peer (empty for an empty connection).
  std::string remote_endpoint() const {
    if (kind_ == kind::near) return near_.remote_endpoint();
    if (kind_ == kind::far) return far_.remote_endpoint();
    return {};
  }

  /// The byte counters both kinds keep (zeros for an empty connection).
  per_host_stats stats() const noexcept {
    if (kind_ == kind::near) return {near_.stats().bytes_sent, near_.stats().bytes_received};
    if (kind_ == kind::far) return {far_.stats().bytes_sent, far_.stats().bytes_received};
    return {};
  }

  /// True when it runs over Near (the peer is on this host).
  bool is_near() const noexcept { return kind_ == kind::near; }
  /// The underlying connection of either kind, or nullptr (its own counters, say).
  Near* near_connection() noexcept { return kind_ == kind::near ? &near_ : nullptr; }
  Far* far_connection() noexcept { return kind_ == kind::far ? &far_ : nullptr; }

 private:
  enum class kind : std::uint8_t { none, near, far };

  template <class F>
  void visit(const char* what, F&& f) {
    if (kind_ == kind::near) return f(near_);
    if (kind_ == kind::far) return f(far_);
    throw_error(errc::invalid_argument, std::string(what) + " on an empty per_host connection");
  }

  // Two handles rather than a std::variant: each is one pointer, and an empty
  // one is a valid, closed connection.
  Near near_;
  Far far_;
  kind kind_ = kind::none;
};

template <transport Near, transport Far>
  requires std::same_as<typename Near::reactor_type, typename Far::reactor_type> && (!std::same_as<Near, Far>)
class per_host;

/// A listener of per_host: Near's and Far's on one host:port; a model of
/// fusewire::listener. Move-only; destroying it closes it.
template <listener NearL, listener FarL, class Reactor>
class per_host_listener {
  using near_conn = typename NearL::connection_type;
  using far_conn = typename FarL::connection_type;

 public:
  using listener_concept = listener_tag;
  using connection_type = per_host_connection<near_conn, far_conn>;

  per_host_listener() noexcept = default;
  per_host_listener(per_host_listener&&) noexcept = default;
  per_host_listener& operator=(per_host_listener&& other) noexcept {
    if (this != &other) {
      close();
      s_ = std::move(other.s_);
    }
    return *this;
  }
  per_host_listener(const per_host_listener&) = delete;
  per_host_listener& operator=(const per_host_listener&) = delete;
  ~per_host_listener() { close(); }

  /// Accepts one connection of either kind: `handler(error_code, connection)`;
  /// queued accepts are served in call order.
  template <connection_handler<connection_type> H>
  void async_accept(H&& handler) {
    if (!s_) throw_error(errc::invalid_argument, "async_accept on an empty per_host listener");
    detail::check_reactor_thread(*s_->reactor, "per_host_listener", "async_accept");
    s_->accept(handler_type(std::forward<H>(handler)));
  }

  /// The bound port, shared by both kinds; 0 if empty.
  std::uint16_t port() const noexcept { return s_ ? s_->far.port() : 0; }
  bool is_open() const noexcept { return s_ && s_->open; }
  /// True when Near listens too (see the top of this file).
  bool has_near() const noexcept { return s_ && s_->near.is_open(); }
  /// Stops listening; pending accepts complete with errc::cancelled.
  void close() noexcept {
    if (s_) s_->close();
  }

 private:
  template <transport N, transport F>
    requires std::same_as<typename N::reactor_type, typename F::reactor_type> && (!std::same_as<N, F>)
  friend class per_host;

  using handler_type = util::unique_function<void(std::error_code, connection_type)>;

  struct state : std::enable_shared_from_this<state> {
    Reactor* reactor = nullptr;
    NearL near;  ///< not open when Near could not name the host
    FarL far;
    std::deque<handler_type> waiting;                               ///< accepts not served yet
    std::deque<std::pair<std::error_code, connection_type>> ready;  ///< accepted ahead of a caller
    bool open = true;
    bool near_armed = false;
    bool far_armed = false;

    void accept(handler_type h) {
      if (!open) return post(std::move(h), make_error_code(errc::cancelled), {});
      if (!ready.empty()) {
        auto [ec, c] = std::move(ready.front());
        ready.pop_front();
        return post(std::move(h), ec, std::move(c));
      }
      waiting.push_back(std::move(h));
      arm();
    }

    /// Keeps an accept outstanding on each kind while someone waits. The
    /// completions hold the state weakly: closing the listener handle frees it.
    void arm() {
      if (!near_armed && near.is_open()) {
        near_armed = true;
        near.async_accept([w = this->weak_from_this()](std::error_code ec, near_conn c) {
          if (auto s = w.lock()) s->accepted(s->near_armed, ec, ec ? connection_type() : connection_type(std::move(c)));
        });
      }
      if (!far_armed && far.is_open()) {
        far_armed = true;
        far.async_accept([w = this->weak_from_this()](std::error_code ec, far_conn c) {
          if (auto s = w.lock()) s->accepted(s->far_armed, ec, ec ? connection_type() : connection_type(std::move(c)));
        });
      }
    }

    void accepted(bool& armed, std::error_code ec, connection_type c) {
      armed = false;
      if (!open) return;
      if (waiting.empty()) {
        ready.emplace_back(ec, std::move(c));
        return;
      }
      handler_type h = std::move(waiting.front());
      waiting.pop_front();
      reactor->invoke(h, ec, std::move(c));
      if (open && !waiting.empty()) arm();
    }

    void close() noexcept {
      if (!open) return;
      open = false;
      near.close();
      far.close();
      ready.clear();
      std::deque<handler_type> cancelled = std::move(waiting);
      waiting.clear();
      for (handler_type& h : cancelled) post(std::move(h), make_error_code(errc::cancelled), {});
    }

    /// Runs `h(ec, c)` from the reactor's queue (never inline).
    void post(handler_type h, std::error_code ec, connection_type c) noexcept {
      Reactor& r = *reactor;
      r.work_started();
      try {
        r.post([&r, h = std::move(h), ec, c = std::move(c)]() mutable {
          r.work_finished();
          r.invoke(h, ec, std::move(c));
        });
      } catch (...) {
        r.work_finished();
        r.report("per_host_listener: no memory to post a completion");
      }
    }
  };

  per_host_listener(Reactor& r, NearL near, FarL far) : s_(std::make_shared<state>()) {
    s_->reactor = &r;
    s_->near = std::move(near);
    s_->far = std::move(far);
  }

  std::shared_ptr<state> s_;
};

namespace detail {
/// "Near+Far", from the two transports' names, as a constant (NUL-terminated).
template <class Near, class Far>
struct per_host_name {
  static constexpr std::size_t size = Near::name().size() + 1 + Far::name().size();
  static constexpr std::array<char, size + 1> text = [] {
    std::array<char, size + 1> a{};
    std::size_t i = 0;
    for (char ch : Near::name()) a[i++] = ch;
    a[i++] = '+';
    for (char ch : Far::name()) a[i++] = ch;
    return a;
  }();
};
}  // namespace detail

template <transport Near, transport Far>
  requires std::same_as<typename Near::reactor_type, typename Far::reactor_type> && (!std::same_as<Near, Far>)
class per_host {
 public:
  using transport_concept = transport_tag;
  using reactor_type = typename Near::reactor_type;
  using connection_type = per_host_connection<typename Near::connection_type, typename Far::connection_type>;
  using listener_type = per_host_listener<typename Near::listener_type, typename Far::listener_type, reactor_type>;
  /// Whether a host, as a cluster spec names it, is this host.
  using host_test = std::function<bool(std::string_view host)>;

  static constexpr std::string_view name() noexcept {
    using n = detail::per_host_name<Near, Far>;
    return {n::text.data(), n::size};
  }

  /// Near for this host (detail::is_this_host).
  per_host() = default;
  /// `is_near` empty: detail::is_this_host.
  per_host(Near near, Far far, host_test is_near = {})
      : near_(std::move(near)), far_(std::move(far)), is_near_(std::move(is_near)) {}

  const Near& near_transport() const noexcept { return near_; }
  const Far& far_transport() const noexcept { return far_; }
  /// Whether connect() tries Near first for `host`.
  bool near_host(std::string_view host) const { return is_near_ ? is_near_(host) : detail::is_this_host(host); }

  /// Near's allocate_shared(): memory Near's peers read directly, and which
  /// Far sends as it sends any other.
  tensor_buffer allocate_shared(std::size_t n) const
    requires shared_memory_transport<Near>
  {
    return near_.allocate_shared(n);
  }

  /// Connects to host:port over Near or Far (see the top of this file):
  /// `handler(error_code, connection)`, never inline.
  template <connection_handler<connection_type> H>
  void connect(reactor_type& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    using near_conn = typename Near::connection_type;
    auto far_done = [](handler_type h) {
      return [h = std::move(h)](std::error_code ec, typename Far::connection_type c) mutable {
        h(ec, ec ? connection_type() : connection_type(std::move(c)));
      };
    };
    detail::check_reactor_thread(reactor, c_name(), "connect");
    handler_type h(std::forward<H>(handler));
    if (!near_host(host)) return far_.connect(reactor, host, port, far_done(std::move(h)));
    near_.connect(reactor, host, port,
                  [&reactor, far = far_, far_done, host = std::string(host), port, h = std::move(h)](
                      std::error_code ec, near_conn c) mutable {
                    if (ec == errc::connection_refused || ec == errc::invalid_argument) {
                      return far.connect(reactor, host, port, far_done(std::move(h)));
                    }
                    h(ec, ec ? connection_type() : connection_type(std::move(c)));
                  });
  }

  /// A listener on host:port for both kinds (port 0: a free port is picked).
  /// Throws std::system_error naming the address on failure.
  listener_type listen(reactor_type& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    listener_type l = listen(reactor, host, port, ec);
    if (ec) {
      throw std::system_error(ec,
                              std::string(name()) + "::listen(" + std::string(host) + ":" + std::to_string(port) + ")");
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  listener_type listen(reactor_type& reactor, std::string_view host, std::uint16_t port, std::error_code& ec) const {
    detail::check_reactor_thread(reactor, c_name(), "listen");
    ec.clear();
    auto far = far_.listen(reactor, host, port, ec);
    if (ec) return {};
    auto near = near_.listen(reactor, host, far.port(), ec);
    if (ec == errc::invalid_argument) {
      ec.clear();  // a host Near cannot name: peers fall back to Far
    } else if (ec) {
      return {};
    }
    return listener_type(reactor, std::move(near), std::move(far));
  }

 private:
  using handler_type = util::unique_function<void(std::error_code, connection_type)>;

  static const char* c_name() noexcept { return detail::per_host_name<Near, Far>::text.data(); }

  Near near_;
  Far far_;
  host_test is_near_;
};

}  // namespace v0
}  // namespace fusewire
