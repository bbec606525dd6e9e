#pragma once
/// The awaitable behind endpoint::async_send and async_recv.

#include <coroutine>
#include <utility>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

namespace detail {

/// Awaits one operation started by `Start(handler)`; resumes on the reactor thread.
template <class Result, class Start>
class op_awaitable {
 public:
  explicit op_awaitable(Start start) : start_(std::move(start)) {}
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    start_([this, h](auto&&... args) {
      result_ = Result{std::forward<decltype(args)>(args)...};
      h.resume();
    });
  }
  Result await_resume() { return std::move(result_); }

 private:
  Start start_;
  Result result_{};
};

}  // namespace detail

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
