#pragma once
/// ps::client's control requests: the worker barrier (one request to PS 0,
/// answered once every worker arrived) and the save-checkpoint and shutdown
/// requests sent to every PS.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
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
void client<Transport>::set_lanes(std::uint32_t lanes) {
  const std::size_t targets = num_tasks_ * lanes;
  const std::vector<std::uint64_t> seq = seq_, step = ps_step_, inc = ps_incarnation_;
  lanes_ = lanes;
  ps_tasks_.clear();
  req_keys_.clear();
  rep_keys_.clear();
  for (std::uint32_t p = 0; p < num_tasks_; ++p) {
    for (std::uint32_t l = 0; l < lanes; ++l) {
      ps_tasks_.push_back({copts_.ps_job, p});
      req_keys_.push_back(request_key_of(l));
      rep_keys_.push_back(reply_key_of(l));
    }
  }
  seq_.assign(targets, 0);
  ps_step_.assign(targets, 0);
  ps_incarnation_.assign(targets, 0);
  want_.assign(targets, 0);
  recv_posted_.assign(targets, posted_recv::none);
  // What lane 0 of each PS said in the hello holds for its other lanes too
  // (one process, one step in sync mode); lane 0 keeps its sequence numbers.
  for (std::uint32_t p = 0; p < num_tasks_ && p < seq.size(); ++p) {
    seq_[p * lanes] = seq[p];
    for (std::uint32_t l = 0; l < lanes; ++l) {
      ps_step_[p * lanes + l] = step[p];
      ps_incarnation_[p * lanes + l] = inc[p];
    }
  }
  place_ = placement(model_, targets, lanes);
  fingerprint_ = model_.fingerprint(targets);
}

template <transport Transport>
bool client<Transport>::ensure_lanes(std::chrono::milliseconds timeout, std::error_code& ec, std::string& why) {
  if (lanes_known_) return true;
  const bool sync = copts_.mode == training_mode::sync;
  std::vector<attempt> attempts(num_tasks_);
  for (std::uint32_t p = 0; p < num_tasks_; ++p) {
    request_builder rb;
    rb.set_header(incarnation_, ++seq_[p], base_fingerprint_, 0, 0,
                  request_flags::hello | (sync ? request_flags::sync : 0u));
    attempts[p].ps = p;
    attempts[p].seq = seq_[p];
    attempts[p].request = rb.finish_gathered(0);
    stats_.bytes_sent += attempts[p].request.bytes;  // not counted in stats_.requests: no step's
  }
  if (!exchange(attempts, timeout, ec, why)) return false;
  std::uint32_t lanes = 0;
  for (std::uint32_t p = 0; p < num_tasks_; ++p) {
    reply_view r;
    std::string dwhy;
    decode_reply(attempts[p].reply.bytes(), r, ec, dwhy);
    if (ec) {
      why = target_name(p) + ": bad reply: " + dwhy;
      return false;
    }
    stats_.bytes_received += attempts[p].reply.size();
    if (r.status != 0) {
      ec = make_error_code(static_cast<errc>(r.status));
      why = r.message;
      return false;
    }
    ps_incarnation_[p] = r.incarnation;
    ps_step_[p] = r.step;
    const std::uint32_t n = reply_flags::lanes_of(r.flags);
    if (lanes != 0 && n != lanes) {
      ec = make_error_code(errc::invalid_argument);
      why = "the PS tasks run different lane counts (" + target_name(0) + ": " + std::to_string(lanes) + ", " +
            target_name(p) + ": " + std::to_string(n) +
            "): every PS of a job needs the same server_config::lanes (NETWORK_PS_CORE_NUMBER)";
      return false;
    }
    lanes = n;
  }
  set_lanes(lanes);
  lanes_known_ = true;
  return true;
}

template <transport Transport>
void client<Transport>::control(std::uint32_t flags) {
  batch b;
  std::error_code ec;
  run_impl(b, flags, true, ec, copts_.step_timeout, false);
  if (ec) throw std::system_error(ec, b.error_message());
}

template <transport Transport>
void client<Transport>::say_goodbye() noexcept {
  if (!ep_ || !lanes_known_ || servers_shut_) return;  // no PS heard from this client, or they are going
  try {
    struct tally {
      std::mutex m;
      std::condition_variable cv;
      std::size_t pending = 0;
    };
    auto t = std::make_shared<tally>();
    for (std::uint32_t p = 0; p < num_tasks_; ++p) {
      const std::size_t target = p * lanes_;
      request_builder rb;
      rb.set_header(incarnation_, ++seq_[target], base_fingerprint_, 0, 0, request_flags::bye);
      {
        std::lock_guard lock(t->m);
        ++t->pending;
      }
      ep_->send(
          ps_tasks_[target], req_keys_[target], rb.finish(),
          [t](std::error_code) {
            std::lock_guard lock(t->m);
            if (--t->pending == 0) t->cv.notify_all();
          },
          goodbye_timeout);
    }
    std::unique_lock lock(t->m);
    t->cv.wait_for(lock, goodbye_timeout, [&] { return t->pending == 0; });
  } catch (...) {
    // A PS that is gone, or no memory: it will see the connection end as a loss.
  }
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
  if (!ensure_lanes(timeout, ec, why)) {
    why = name + ": " + why;
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
    why = name + ": " + target_name(0) + ": bad reply: " + dwhy;
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
