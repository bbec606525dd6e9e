#pragma once
/// The RDMA verbs transport (`verbs`), a model of fusewire::transport and
/// rdma_transport, and with_rdma_or(): verbs where a device is usable, else a
/// fallback transport.

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/handle.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/socket.hpp>
#include <fusewire/transport/detail/thread_check.hpp>
#include <fusewire/transport/verbs/config.hpp>
#include <fusewire/transport/verbs/connection.hpp>
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/transport/verbs/engine.hpp>
#include <fusewire/transport/verbs/listener.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

/// The RDMA verbs transport; a model of fusewire::transport. Cheap to copy (it
/// is only its config); the device resources live in each reactor's engine.
class verbs {
 public:
  using transport_concept = transport_tag;
  using reactor_type = verbs_reactor;
  using connection_type = verbs_connection;
  using listener_type = verbs_listener;
  using config = verbs_config;

  /// The config of the environment's RDMA knobs (verbs_config::from_env:
  /// TF_RDMA_DEV_NAME, TF_RDMA_ACC_SIZE, TF_RDMA_CHUNK_SIZE, TF_RDMA_BUF_SIZE).
  /// Throws std::system_error naming a bad variable or field.
  verbs() : verbs(verbs_config::from_env()) {}
  /// Throws std::system_error(errc::invalid_argument) naming a bad field.
  explicit verbs(config cfg) : config_(std::move(cfg)) { config_.validate(); }

  static constexpr std::string_view name() noexcept { return "verbs"; }
  const config& settings() const noexcept { return config_; }

  /// True if an RDMA device with an active port is present and rdmacm's
  /// device node can be opened; otherwise `why` says what is missing. Any
  /// thread. Safe before fork(): it initialises no librdmacm state and closes
  /// every device it opened.
  static bool available(std::string& why) { return scan_devices(why, false); }

  /// available(), and what `cfg` needs to run: a valid config whose
  /// registered-memory limit (TF_RDMA_BUF_SIZE) holds a reactor's fixed
  /// registrations, an active port with a usable GID, and an RLIMIT_MEMLOCK
  /// of at least that limit. The transport choice "auto" asks this before it
  /// picks verbs. Otherwise `why` says what is missing. Any thread; safe before
  /// fork(), as available().
  static bool preflight(const config& cfg, std::string& why) {
    try {
      cfg.validate();
    } catch (const std::exception& e) {
      why = e.what();
      return false;
    }
    if (!scan_devices(why, true)) return false;
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < cfg.registered_limit) {
      why = "RLIMIT_MEMLOCK is " + detail::memlock_limit_text() + ", below TF_RDMA_BUF_SIZE (" +
            std::to_string(cfg.registered_limit) +
            " bytes); raise it (ulimit -l unlimited, LimitMEMLOCK=infinity, docker --ulimit memlock=-1)";
      return false;
    }
    return true;
  }

 private:
  static bool scan_devices(std::string& why, bool need_gid) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) {
      if (list != nullptr) ibv_free_device_list(list);
      why =
          "no RDMA device found (ibv_devices lists none; load a NIC driver, or rdma_rxe for soft-RoCE: "
          "rdma link add rxe0 type rxe netdev <if>)";
      return false;
    }
    bool active = false;
    for (int i = 0; i < n && !active; ++i) {
      if (ibv_context* ctx = ibv_open_device(list[i])) {
        active = need_gid ? detail::has_active_port_with_gid(ctx) : detail::has_active_port(ctx);
        ibv_close_device(ctx);
      }
    }
    ibv_free_device_list(list);
    if (!active) {
      why = need_gid ? "no RDMA device has an active port with a usable GID (is its interface up, with an address?)"
                     : "no RDMA device has an active port";
      return false;
    }
    const int fd = ::open("/dev/infiniband/rdma_cm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      why = "cannot open /dev/infiniband/rdma_cm (" + std::system_category().message(errno) + "; load rdma_ucm)";
      return false;
    }
    ::close(fd);
    return true;
  }

 public:
  /// Connects to host:port from `reactor` (its thread only): `handler(error_code,
  /// verbs_connection)`, never inline. errc::connection_refused when nobody
  /// listens there or the address does not route over RDMA; errc::invalid_argument
  /// for a bad host.
  template <connection_handler<verbs_connection> H>
  void connect(verbs_reactor& reactor, std::string_view host, std::uint16_t port, H&& handler) const {
    detail::pending_connect<verbs_connection, verbs_reactor> op(reactor, "verbs", std::forward<H>(handler));
    detail::socket_address addr;
    if (!op.start(host, port, addr)) return;
    std::error_code ec;
    detail::verbs_context* ctx = context(reactor, ec);
    if (ctx == nullptr) return op.fail(ec);
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ctx->cm_channel(), &id, nullptr, RDMA_PS_TCP) != 0) {
      return op.fail(std::error_code(errno, std::system_category()));
    }
    detail::ref_ptr<detail::verbs_conn_state> state(
        new detail::verbs_conn_state(*ctx, id, detail::verbs_conn_state::phase::resolving_addr));
    state->on_established([op = std::move(op), state](std::error_code e) mutable {
      verbs_connection conn;
      if (!e) conn = verbs_connection(std::move(state));
      state.reset();
      op.finish(e, std::move(conn));
    });
    if (rdma_resolve_addr(id, nullptr, const_cast<sockaddr*>(addr.get()), config_.resolve_timeout_ms) != 0) {
      const int err = errno;
      state->fail_on_start(detail::cm_error(err));
    }
  }

  /// A listener on host:port (port 0: one is chosen; see port()). Throws
  /// std::system_error naming the address on failure.
  verbs_listener listen(verbs_reactor& reactor, std::string_view host, std::uint16_t port) const {
    std::error_code ec;
    std::string why;
    verbs_listener l = listen(reactor, host, port, ec, &why);
    if (ec) {
      throw std::system_error(ec, "verbs::listen(" + std::string(host) + ":" + std::to_string(port) + ")" +
                                      (why.empty() ? "" : " [" + why + "]"));
    }
    return l;
  }

  /// As above, reporting failure through `ec` (and returning an empty listener).
  verbs_listener listen(verbs_reactor& reactor, std::string_view host, std::uint16_t port, std::error_code& ec) const {
    return listen(reactor, host, port, ec, nullptr);
  }

  /// A buffer pool whose slabs are registered (once each) with `reactor`'s
  /// device, for zero-copy one-sided writes: its buffers may be described to
  /// peers and used as async_write_remote sources. The pool may outlive the
  /// reactor. Its bytes count against the reactor's TF_RDMA_BUF_SIZE
  /// (verbs_config::registered_limit) until the pool's memory is released.
  /// Throws std::system_error(errc::out_of_memory) naming TF_RDMA_BUF_SIZE
  /// when the pool would pass it, or the memlock limit when the kernel
  /// refuses. Reactor thread.
  buffer_pool make_registered_pool(verbs_reactor& reactor, buffer_pool_config cfg) const {
    detail::check_reactor_thread(reactor, "verbs", "make_registered_pool");
    std::error_code ec;
    std::string why;
    detail::verbs_context* ctx = context(reactor, ec, &why);
    if (ctx == nullptr) throw std::system_error(ec, "verbs::make_registered_pool: " + why);
    // Refuse a pool past TF_RDMA_BUF_SIZE before mapping any of it.
    detail::registered_budget& budget = ctx->budget();
    budget.take(cfg.total_bytes);
    budget.give_back(cfg.total_bytes);
    ctx->register_slabs(cfg);
    return buffer_pool(std::move(cfg));
  }

  /// What a peer needs to write into registered `b` (address, remote key,
  /// size). Throws std::system_error(errc::invalid_argument) for unregistered memory.
  static remote_region describe(const tensor_buffer& b) {
    if (b.reg() == nullptr) {
      throw_error(errc::invalid_argument,
                  "verbs::describe: the buffer is not registered memory (allocate it from make_registered_pool)");
    }
    return {reinterpret_cast<std::uintptr_t>(b.data()), b.reg()->rkey, b.size()};
  }

  /// The device resources of `reactor`, created on first use with this
  /// transport's config; nullptr and `ec` if the device cannot be opened
  /// (the reason goes to the reactor's error reporter). Reactor thread.
  detail::verbs_context* context(verbs_reactor& reactor, std::error_code& ec) const {
    return context(reactor, ec, nullptr);
  }

 private:
  detail::verbs_context* context(verbs_reactor& reactor, std::error_code& ec, std::string* why) const {
    ec.clear();
    verbs_engine& engine = reactor.engine();
    if (detail::verbs_context* ctx = engine.context()) return ctx;
    try {
      engine.attach(std::make_unique<detail::verbs_context>(reactor, config_));
    } catch (const std::system_error& e) {
      ec = e.code();
      if (why != nullptr) *why = e.what();
      reactor.report(e.what());
      return nullptr;
    } catch (const std::exception& e) {
      ec = make_error_code(errc::device_error);
      if (why != nullptr) *why = e.what();
      reactor.report(e.what());
      return nullptr;
    }
    return engine.context();
  }

  verbs_listener listen(verbs_reactor& reactor, std::string_view host, std::uint16_t port, std::error_code& ec,
                        std::string* why) const {
    detail::check_reactor_thread(reactor, "verbs", "listen");
    const detail::socket_address addr = detail::resolve(host, port, ec);
    if (ec) return {};
    detail::verbs_context* ctx = context(reactor, ec, why);
    if (ctx == nullptr) return {};
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ctx->cm_channel(), &id, nullptr, RDMA_PS_TCP) != 0) {
      ec = std::error_code(errno, std::system_category());
      return {};
    }
    if (rdma_bind_addr(id, const_cast<sockaddr*>(addr.get())) != 0) {
      ec = std::error_code(errno, std::system_category());
      rdma_destroy_id(id);
      return {};
    }
    if (id->verbs != nullptr && id->verbs != ctx->device()) {
      ec = make_error_code(errc::invalid_argument);
      if (why != nullptr) {
        *why = "the address belongs to device " + std::string(ibv_get_device_name(id->verbs->device)) + ", not " +
               ctx->device_name() + " (TF_RDMA_DEV_NAME)";
      }
      rdma_destroy_id(id);
      return {};
    }
    if (rdma_listen(id, config_.backlog) != 0) {
      ec = std::error_code(errno, std::system_category());
      rdma_destroy_id(id);
      return {};
    }
    const std::uint16_t bound = ntohs(rdma_get_src_port(id));
    return verbs_listener(
        detail::ref_ptr<detail::verbs_listener_state>(new detail::verbs_listener_state(*ctx, id, bound)));
  }

  config config_;
};

static_assert(transport<verbs>);
static_assert(rdma_transport<verbs>);
static_assert(!handoff_transport<verbs>);  // a connection is a queue pair, not a socket: no fd to hand off
static_assert(!readahead_connection<verbs::connection_type>);  // a verbs stream's reads complete through its CQ

/// Calls `fn(verbs(cfg))` when `o.rdma_enabled` (TF_RDMA_ENABLED) and an RDMA
/// device is usable, else `fn(Fallback{})` (e.g. uring_tcp or asio_tcp): the
/// caller writes its code once, generic over the transport. When RDMA is
/// enabled but unusable, `on_fallback` (if given) hears why. with_transport()
/// (transport/select.hpp) chooses among every transport, by name or "auto".
template <transport Fallback, class F>
  requires std::invocable<F&, verbs> && std::invocable<F&, Fallback>
decltype(auto) with_rdma_or(const options& o, F&& fn, const std::function<void(std::string_view)>& on_fallback = {}) {
  if (o.rdma_enabled) {
    std::string why;
    if (verbs::available(why)) return fn(verbs(verbs_config::from(o)));
    if (on_fallback)
      on_fallback("TF_RDMA_ENABLED is true but RDMA is unusable (" + why + "); using " + std::string(Fallback::name()));
  }
  return fn(Fallback{});
}

}  // namespace v0
}  // namespace fusewire
