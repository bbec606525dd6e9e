#pragma once
/// A posted call of one member function of a connection or listener state,
/// embedded in that state: posting it takes no allocation (the per-message
/// pumps and write completions of the TCP transports post one per frame).
/// Private to the transport layer.

#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// `(state.*fn)()` posted on the state's reactor, at most once at a time: a
/// schedule() while it is queued does nothing (the queued call serves both).
/// While queued it holds a reference to the state, as a posted lambda holding
/// a ref_ptr would. `State` derives from ref_counted; reactor thread only.
template <class State>
class member_task final : public util::task {
 public:
  using member = void (State::*)();

  member_task(State& state, member fn) noexcept : state_(&state), fn_(fn) {}
  member_task(const member_task&) = delete;
  member_task& operator=(const member_task&) = delete;

  /// Whether the call is queued and has not started.
  bool scheduled() const noexcept { return scheduled_; }

  /// Queues the call on `reactor` (its post_task) unless it is queued already.
  template <class Reactor>
  void schedule(Reactor& reactor) noexcept {
    if (scheduled_) return;
    scheduled_ = true;
    state_->add_ref();
    reactor.post_task(util::task_ptr(this));
  }

  void run() override {
    scheduled_ = false;  // the call may schedule itself again
    (state_->*fn_)();
  }

  /// The queue is done with it (ran, or dropped by a reactor that stopped):
  /// drops the queue's reference, which may destroy the state and this task.
  void dispose() noexcept override { state_->release(); }

 private:
  State* state_;
  member fn_;
  bool scheduled_ = false;
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
