#pragma once
/// The verbs transport's reactor engine (`verbs_engine`) and the reactor and
/// group aliases built on it; the device resources it drives live in
/// verbs/context.hpp.

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <system_error>

#include <fusewire/reactor/reactor.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {
class verbs_context;
class verbs_listener_state_access;
}  // namespace detail

/// The reactor engine of the verbs transport: polls its reactor's CQ and
/// rdmacm channel every tick, sleeps in epoll on the completion channel, the
/// rdmacm channel and the wake fd. The device resources are created lazily by
/// the first listen/connect on the reactor.
class verbs_engine {
 public:
  struct config {
    unsigned cm_poll_interval = 16;  ///< ticks between non-blocking checks of the rdmacm channel (>= 1)
  };

  verbs_engine(const config& cfg, detail::engine_hooks& hooks)
      : hooks_(&hooks), cm_interval_(std::max(1u, cfg.cm_poll_interval)) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) throw std::system_error(errno, std::system_category(), "verbs_engine: epoll_create1 failed");
    watch(hooks.wake_fd(), wake_tag);
  }
  verbs_engine(const verbs_engine&) = delete;
  verbs_engine& operator=(const verbs_engine&) = delete;
  inline ~verbs_engine();

  inline bool poll();
  inline void wait(std::optional<std::chrono::nanoseconds> timeout);
  inline bool busy() const noexcept;
  static constexpr std::string_view name() noexcept { return "verbs"; }

  /// The device resources, or nullptr before the first listen/connect. Reactor thread.
  detail::verbs_context* context() noexcept { return context_.get(); }
  detail::engine_hooks& hooks() noexcept { return *hooks_; }

  /// Installs the device resources and watches their fds. Reactor thread.
  inline void attach(std::unique_ptr<detail::verbs_context> ctx);

 private:
  static constexpr std::uint32_t wake_tag = 0, cq_tag = 1, cm_tag = 2;

  void watch(int fd, std::uint32_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = tag;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw std::system_error(errno, std::system_category(), "verbs_engine: epoll_ctl failed");
    }
  }

  detail::engine_hooks* hooks_;
  unsigned cm_interval_;
  unsigned tick_ = 0;
  int epoll_fd_ = -1;
  std::unique_ptr<detail::verbs_context> context_;
};

static_assert(reactor_engine<verbs_engine>);

/// A reactor driving a verbs device.
using verbs_reactor = basic_reactor<verbs_engine>;
/// A group of verbs reactors.
using verbs_reactor_group = basic_reactor_group<verbs_engine>;

class verbs_connection;
class verbs_listener;

}  // namespace v0
}  // namespace fusewire

// verbs_engine's members are defined with the context they drive.
#include <fusewire/transport/verbs/context.hpp>
