#pragma once
/// ps::server's stall reports: a sync step, or a barrier generation, that has
/// waited longer than options.stall_report (FUSEWIRE_STALL_MS) for some
/// workers is logged as one block naming them — once at the threshold, again
/// each time the wait doubles — and SIGUSR1 (rendezvous::request_report())
/// logs the same at once. The shard says who is missing (shard::step_wait(),
/// barrier_wait()); the server times the wait in the lane's strand.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fusewire/ps/server.hpp>
#include <fusewire/ps/shard.hpp>
#include <fusewire/rendezvous/detail/report_signal.hpp>
#include <fusewire/util/timer_queue.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {
namespace detail {

/// What a wait block is written with besides the shard's wait_state.
struct wait_context {
  std::string self;                           ///< the PS task, e.g. "ps:0"
  std::string worker_job;                     ///< server_options::worker_job
  bool snapshot = false;                      ///< asked for (SIGUSR1), not a stall
  bool barrier = false;                       ///< a barrier generation, else a sync step
  std::chrono::steady_clock::duration age{};  ///< how long it has waited
  std::chrono::milliseconds threshold{};      ///< options.stall_report
  /// Per worker: how long ago its last request arrived (none yet: nullopt).
  std::vector<std::optional<std::chrono::steady_clock::duration>> last_request;
  /// A sync step's " on lane <l>" when the PS runs lanes, else empty.
  std::string lane{};
  /// Per worker: what to say of a connection that broke and may come back
  /// (within server_config::reconnect_grace); empty = nothing to say.
  std::vector<std::string> broken{};
};

/// "1.234 s".
inline std::string seconds_text(std::chrono::steady_clock::duration d) {
  const auto ms = std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  const std::string frac = std::to_string(ms % 1000);
  return std::to_string(ms / 1000) + "." + std::string(3 - frac.size(), '0') + frac + " s";
}

/// Workers named "job:i", comma-separated; at most `limit` names, then how many in all.
inline std::string worker_names(const std::string& job, const std::vector<std::uint32_t>& ws, std::size_t limit = 32) {
  std::string s;
  for (std::size_t i = 0; i < ws.size(); ++i) {
    if (i == limit) {
      s += ", ... (" + std::to_string(ws.size()) + " in all)";
      break;
    }
    s += (i == 0 ? "" : ", ") + job + ":" + std::to_string(ws[i]);
  }
  return s.empty() ? std::string("none") : s;
}

/// The block a stall report or a snapshot logs for one sync step or barrier
/// generation: a header naming it, its age and the workers it waits for, the
/// workers that arrived, then one line per missing worker (at most 32) with
/// what this PS knows of it.
inline std::string format_wait(const wait_state& s, const wait_context& c) {
  const bool step = !c.barrier;
  const std::vector<std::uint32_t> arrived = s.arrived();
  const std::vector<std::uint32_t> missing = s.missing();
  std::string out = "ps server " + c.self + ": " + (c.snapshot ? "snapshot (SIGUSR1)" : "stall report") + ": " +
                    (step ? "sync step " : "barrier ") + std::to_string(s.number) + c.lane + " has waited " +
                    seconds_text(c.age);
  if (!c.snapshot) out += " (FUSEWIRE_STALL_MS = " + std::to_string(c.threshold.count()) + ")";
  out += step ? " for pushes: " + std::to_string(arrived.size()) + " of " + std::to_string(s.needed) + " in"
              : " for workers: " + std::to_string(arrived.size()) + " of " + std::to_string(s.needed) + " arrived";
  out += ", waiting for " + worker_names(c.worker_job, missing);
  out += "\n  arrived: " + worker_names(c.worker_job, arrived);
  std::size_t shown = 0;
  for (const std::uint32_t w : missing) {
    if (shown++ == 32) {
      out += "\n  ... " + std::to_string(missing.size() - 32) + " more missing";
      break;
    }
    const worker_wait& ww = s.workers[w];
    out += "\n  " + c.worker_job + ":" + std::to_string(w) + ": ";
    if (!ww.lost.empty()) {
      out += "lost (" + ww.lost + ")";
    } else if (w < c.broken.size() && !c.broken[w].empty()) {
      out += c.broken[w];
    } else if (!ww.seen) {
      out += "no request from it yet";
    } else if (step) {
      out += "connected, no push for step " + std::to_string(s.number) + " yet";
    } else {
      out += "connected, not at barrier " + std::to_string(s.number) + " yet";
    }
    if (ww.seen && step) {
      out += ww.pushed_step == 0 ? std::string("; no push from it so far")
                                 : "; its last push was for step " + std::to_string(ww.pushed_step);
    }
    if (w < c.last_request.size() && c.last_request[w])
      out += "; last request " + seconds_text(*c.last_request[w]) + " ago";
    if (ww.requests_waiting != 0) out += "; " + std::to_string(ww.requests_waiting) + " of its requests wait here";
  }
  return out;
}

}  // namespace detail

template <transport Transport>
void server<Transport>::note_waits(std::uint32_t l, clock::time_point now) {
  auto note = [&](wait_clock& c, bool waiting, std::uint64_t number) {
    if (!waiting) {
      c.active = false;
    } else if (!c.active || c.number != number) {
      c = {true, number, now, stall_};
    }
  };
  const shard& sh = *shards_[l];
  note(watch_[l].step_clock, sh.step_waiting(), sh.global_step() + 1);
  note(watch_[l].barrier_clock, sh.barrier_waiting(), sh.barrier_generation());
}

template <transport Transport>
void server<Transport>::start_checks(std::uint32_t l) {
  if (watch_[l].reactor != nullptr) return;
  watch_[l].reactor = reactor_type::current();
  if (watch_[l].reactor != nullptr) arm_check(l);
}

template <transport Transport>
void server<Transport>::arm_check(std::uint32_t l) {
  // As the endpoint's own check: a stall is named within the threshold plus one interval.
  const clock::duration every =
      stall_.count() == 0
          ? clock::duration(std::chrono::seconds(1))
          : std::clamp<clock::duration>(stall_ / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
  watch_[l].reactor->run_after(every, [this, l](std::error_code ec) {
    if (ec) return;  // the reactor stops
    arm_check(l);    // first: a job of the lane that throws must not end the checks
    on_lane(l, [this, l] { check_stalls(l); });
  });
}

template <transport Transport>
void server<Transport>::check_stalls(std::uint32_t l) {
  const auto now = util::coarse_now();  // as the request path's stamps
  note_waits(l, now);
  lane_watch& lw = watch_[l];
  const shard& sh = *shards_[l];
  const unsigned asked = rendezvous::detail::report_requests().load(std::memory_order_relaxed);
  const bool snapshot = asked != lw.seen_reports;
  lw.seen_reports = asked;
  const std::string lane = lanes_ == 1 ? std::string() : " on lane " + std::to_string(l);
  auto check = [&](wait_clock& c, bool is_step) {
    if (!c.active) return false;
    const bool due = stall_.count() != 0 && now - c.since >= c.report_at;
    if (!due && !snapshot) return true;
    detail::wait_context ctx{
        ep_->self().to_string(),       sh.options().worker_job, false, !is_step, now - c.since, stall_, {},
        is_step ? lane : std::string()};  // the barrier is lane 0's alone
    ctx.last_request.resize(lw.last_request.size());
    for (std::size_t w = 0; w < lw.last_request.size(); ++w) {
      if (lw.last_request[w] != clock::time_point{}) ctx.last_request[w] = now - lw.last_request[w];
    }
    ctx.broken.resize(lw.links.size());
    for (std::size_t w = 0; w < lw.links.size(); ++w) {
      const link_watch& link = lw.links[w];
      if (link.state != link_state::broken) continue;
      ctx.broken[w] = "its connection broke " + detail::seconds_text(now - link.since) + " ago (" + link.why +
                      "); lost unless it sends within " +
                      detail::seconds_text(last_heard(static_cast<std::uint32_t>(w)) + grace_ - now);
    }
    const wait_state s = is_step ? sh.step_wait() : sh.barrier_wait();
    if (due) {
      say(detail::format_wait(s, ctx));
      while (c.report_at <= now - c.since) c.report_at *= 2;
    }
    if (snapshot) {
      ctx.snapshot = true;
      say(detail::format_wait(s, ctx));
    }
    return true;
  };
  const bool step = check(lw.step_clock, true);
  const bool barrier = check(lw.barrier_clock, false);
  if (snapshot && !step && !barrier) {
    say("ps server " + ep_->self().to_string() + lane + ": snapshot (SIGUSR1): nothing waits; " +
        std::to_string(sh.global_step()) + " steps applied (" + std::string(to_string(sh.options().mode)) +
        "), barrier generation " + std::to_string(sh.barrier_generation()));
  }
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
