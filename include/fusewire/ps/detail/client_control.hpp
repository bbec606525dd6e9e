#pragma once
/// ps::client's control requests: the worker barrier (one request to PS 0,
/// answered once every worker arrived) and the save-checkpoint and shutdown
/// requests sent to every PS.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/ps/batch.hpp>
#include <fusewire/ps/client.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

template <transport Transport>
void client<Transport>::control(std::uint32_t flags) {
  batch b;
  std::error_code ec;
  run_impl(b, flags, true, ec, copts_.step_timeout, false);
  if (ec) throw std::system_error(ec, b.error_message());
}

template <transport Transport>
void client<Transport>::barrier_impl(std::chrono::milliseconds timeout, std::error_code& ec, std::string& why) {
  ec.clear();
  why.clear();
  const std::string name = "barrier " + std::to_string(barrier_generation_);
  if (timeout.count() <= 0) {
    ec = make_error_code(errc::invalid_argument);
    why = name + ": timeout must be > 0 ms, got " + std::to_string(timeout.count());
    return;
  }
  request_builder rb;
  const std::uint32_t flags = request_flags::barrier | (copts_.mode == training_mode::sync ? request_flags::sync : 0u);
  rb.set_header(incarnation_, ++seq_[0], fingerprint_, barrier_generation_, 0, flags);
  std::vector<attempt> attempts(1);
  attempt& a = attempts[0];
  a.seq = seq_[0];
  a.request = rb.finish_gathered(0);
  stats_.bytes_sent += a.request.bytes;
  ++stats_.requests;
  if (!exchange(attempts, timeout, ec, why)) {
    if (ec == make_error_code(errc::timed_out)) {
      why = name + ": not every worker arrived within " + std::to_string(timeout.count()) + " ms (" + why + ")";
    } else {
      why = name + ": " + why;
    }
    return;
  }
  reply_view r;
  std::string dwhy;
  decode_reply(a.reply.bytes(), r, ec, dwhy);
  if (ec) {
    why = name + ": " + ps_tasks_[0].to_string() + ": bad reply: " + dwhy;
    return;
  }
  stats_.bytes_received += a.reply.size();
  ps_step_[0] = copts_.mode == training_mode::sync ? r.step : std::max(ps_step_[0], r.step);
  if (r.status != 0) {
    ec = make_error_code(static_cast<errc>(r.status));
    why = name + ": " + r.message;
    return;
  }
  ++barrier_generation_;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
