#pragma once
/// The reactor's I/O engine requirement (`reactor_engine`) and the hooks an
/// engine may call back into its reactor.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <optional>
#include <string_view>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// The time from now until `deadline`, never negative: what an engine's wait()
/// takes when the reactor (or the engine itself) has only an absolute deadline.
inline std::chrono::nanoseconds time_left(std::chrono::steady_clock::time_point deadline) noexcept {
  return std::max(std::chrono::nanoseconds(0),
                  std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now()));
}

/// What an engine may ask of its reactor.
class engine_hooks {
 public:
  /// An eventfd (EFD_NONBLOCK) that other threads write to wake the reactor;
  /// the engine must wake from wait() when it becomes readable and reset it.
  virtual int wake_fd() const noexcept = 0;
  /// Reports something that escaped a handler run by the engine.
  virtual void report(std::string_view what) noexcept = 0;

 protected:
  ~engine_hooks() = default;
};

}  // namespace detail

/// What a reactor needs from its I/O engine (io_uring ring, Asio io_context, ...).
/// Constructed and destroyed on the reactor's thread.
template <class E>
concept reactor_engine = std::destructible<E> && requires { typename E::config; } &&
                         std::constructible_from<E, const typename E::config&, detail::engine_hooks&> &&
                         requires(E& e, std::optional<std::chrono::nanoseconds> timeout) {
                           /// Non-blocking: submits queued work and runs ready completions; true if any ran.
                           /// (An engine may also offer poll_spinning(), which the reactor then calls
                           /// instead on ticks it spins on; it may leave completions for a later tick.)
                           { e.poll() } -> std::same_as<bool>;
                           /// Blocks until a completion is ready, the wake fd is written, or the timeout passes.
                           /// (An engine may also offer wait_until(std::optional<steady_clock::time_point>),
                           /// which the reactor then calls instead, with no clock read of its own.)
                           e.wait(timeout);
                           /// True while the engine still owes completions (kernel operations in flight).
                           { e.busy() } -> std::same_as<bool>;
                           { E::name() } -> std::convertible_to<std::string_view>;
                         };

}  // namespace v0
}  // namespace fusewire
