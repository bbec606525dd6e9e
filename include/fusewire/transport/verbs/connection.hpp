#pragma once
/// A verbs RC connection handle (`verbs_connection`), a model of
/// fusewire::connection; includes every part of the connection's state.

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
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
#include <fusewire/transport/verbs/bulk_window.hpp>
#include <fusewire/transport/verbs/config.hpp>
#include <fusewire/transport/verbs/connection_state.hpp>
#include <fusewire/transport/verbs/context.hpp>
#include <fusewire/transport/verbs/context_impl.hpp>
#include <fusewire/transport/verbs/credits.hpp>
#include <fusewire/transport/verbs/read_path.hpp>
#include <fusewire/transport/verbs/write_path.hpp>
#include <fusewire/util/unique_function.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {
/// Names for error messages.
struct verbs_connection_name {
  static constexpr const char* value = "verbs_connection";
};
struct verbs_listener_name {
  static constexpr const char* value = "verbs_listener";
};
}  // namespace detail

/// An RC connection on a verbs_reactor; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
/// An async_write's handler runs once the peer's adapter acknowledged the
/// messages carrying its last byte; async_read_some delivers the bytes of (at
/// least) one message. No native_handle(): there is no file descriptor.
class verbs_connection
    : public detail::basic_connection_handle<detail::verbs_conn_state, verbs_reactor, detail::verbs_connection_name> {
 public:
  verbs_connection() noexcept = default;

  /// One-sided RDMA write of registered `src` into the peer's `dst` (from its
  /// verbs::describe()), in order with this connection's other writes; the
  /// peer is not notified (send it a message afterwards). `src` must stay
  /// valid until `handler(ec, bytes)` runs. Errors: errc::invalid_argument
  /// (src not registered), errc::size_mismatch (src larger than dst or 1 GiB),
  /// errc::device_error (the peer's adapter refused: bad key or range; this
  /// fails the connection).
  template <io_handler H>
  void async_write_remote(const tensor_buffer& src, remote_region dst, H&& handler) {
    state("async_write_remote").async_write_remote(src, dst, std::forward<H>(handler));
  }

  /// Message and credit counters. Reactor thread.
  verbs_stats stats() const { return state_ ? state_->stats() : verbs_stats{}; }

 private:
  friend class verbs;
  friend class detail::verbs_listener_state_access;

  explicit verbs_connection(detail::ref_ptr<detail::verbs_conn_state> s) noexcept
      : basic_connection_handle(std::move(s)) {}
};

}  // namespace v0
}  // namespace fusewire
