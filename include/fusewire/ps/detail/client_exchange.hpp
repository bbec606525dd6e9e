#pragma once
/// ps::client's exchange: send each request to its PS, resend it when no
/// reply came within retry_interval or the PS connection broke, and match
/// replies to requests by (PS, sequence number), dropping late ones.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/client.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

template <transport Transport>
bool client<Transport>::exchange(std::vector<attempt>& attempts, std::chrono::milliseconds timeout, std::error_code& ec,
                                 std::string& why) {
  const bool answered = exchange_until_answered(attempts, timeout, ec, why);
  settle_sends(attempts);
  return answered;
}

template <transport Transport>
void client<Transport>::settle_sends(std::vector<attempt>& attempts) {
  // Sends may read the caller's gradients, split receives write into the
  // caller's destinations: both end before run() returns. (A split receive is
  // only outstanding here after a failed step; its deadline is near.)
  auto in_flight = [&] {
    return std::any_of(attempts.begin(), attempts.end(), [](const attempt& a) { return a.sending != 0; }) ||
           std::find(recv_posted_.begin(), recv_posted_.end(), posted_recv::split) != recv_posted_.end();
  };
  std::deque<event> got;
  while (in_flight()) {
    events_->take(got, std::chrono::steady_clock::time_point::max(), 0, true);
    for (event& e : got) {
      if (!e.is_send) {
        recv_posted_[e.ps] = posted_recv::none;  // a reply after the step ended: nobody waits for it
        continue;
      }
      if (e.ps < attempts.size() && attempts[e.ps].seq == e.seq && attempts[e.ps].sending != 0) {
        --attempts[e.ps].sending;
      }
    }
    got.clear();
  }
}

template <transport Transport>
bool client<Transport>::exchange_until_answered(std::vector<attempt>& attempts, std::chrono::milliseconds timeout,
                                                std::error_code& ec, std::string& why) {
  using namespace std::chrono_literals;
  const auto start = clock::now();
  const auto deadline = start + timeout;
  const std::size_t num_ps = ps_tasks_.size();
  std::vector<clock::time_point> next_recv(num_ps, start);
  std::vector<std::size_t> pending(num_ps, 0);
  for (auto& a : attempts) {
    a.next_send = start;
    ++pending[a.ps];
  }
  std::size_t left = attempts.size();
  std::deque<event> got;
  // Stall reports: at stall_, then each time the wait doubled.
  clock::duration report_at = stall_;
  for (;;) {
    if (left == 0) return true;
    auto now = clock::now();
    if (stall_.count() != 0 && now - start >= report_at) {
      report_stall(attempts, start, now);
      while (report_at <= now - start) report_at *= 2;
    }
    if (now >= deadline) {
      for (const attempt& a : attempts) {
        if (a.done) continue;
        ec = make_error_code(errc::timed_out);
        why = target_name(a.ps) + " did not answer within " + std::to_string(timeout.count()) + " ms" +
              (a.last_error ? " (last error: " + a.last_error.message() + ")" : std::string());
        return false;
      }
    }
    auto wake = deadline;
    if (stall_.count() != 0) wake = std::min(wake, start + report_at);
    // A split receive waits until the step's deadline (below), so no timeout
    // of it says when to send again: the clock does.
    for (attempt& a : attempts) {
      if (a.done || a.need_send || recv_posted_[a.ps] != posted_recv::split) continue;
      if (now - a.last_send >= copts_.retry_interval) {
        a.need_send = true;
        a.next_send = now;
      } else {
        wake = std::min(wake, a.last_send + copts_.retry_interval);
      }
    }
    for (std::size_t i = 0; i < attempts.size(); ++i) {
      attempt& a = attempts[i];
      if (a.done || !a.need_send) continue;
      if (now >= a.next_send) {
        a.need_send = false;
        a.last_send = now;
        if (!a.first_send) ++stats_.resends;
        a.first_send = false;
        auto q = events_;
        ++a.sending;
        if (a.request.segments.size() == 1 && a.request.segments[0].size() == a.request.head.size()) {
          ep_->send(
              ps_tasks_[a.ps], req_keys_[a.ps], a.request.head.share(),
              [q, i, seq = a.seq](std::error_code e) {
                q->push({true, static_cast<std::uint32_t>(i), seq, e, {}});
              },
              deadline - now);
        } else {
          // The header buffer lives as long as the send; the gradients until settle_sends().
          ep_->send(
              ps_tasks_[a.ps], req_keys_[a.ps], std::span<const const_buffer>(a.request.segments),
              [q, i, seq = a.seq, head = a.request.head.share()](std::error_code e) {
                q->push({true, static_cast<std::uint32_t>(i), seq, e, {}});
              },
              deadline - now);
        }
      } else {
        wake = std::min(wake, a.next_send);
      }
    }
    for (std::uint32_t p = 0; p < num_ps; ++p) {
      if (pending[p] == 0 || recv_posted_[p] != posted_recv::none) continue;
      if (now < next_recv[p]) {
        wake = std::min(wake, next_recv[p]);
        continue;
      }
      recv_posted_[p] = posted_recv::reply;
      auto q = events_;
      // A receive that times out wakes this loop to send again. A split one
      // writes into the caller's memory: one whose deadline passes while its
      // reply is arriving (a lossy link) closes the connection it reads from,
      // which a PS in sync mode takes for this worker's loss. It waits for
      // the step's deadline instead.
      const auto limit = std::min<clock::duration>(deadline - now, copts_.retry_interval);
      const attempt* split = nullptr;
      if (pending[p] == 1) {
        for (const attempt& a : attempts) {
          if (a.ps == p && !a.done) {
            if (!a.tail.empty()) split = &a;
            break;
          }
        }
      }
      if (split != nullptr) {
        tensor_buffer head = tensor_buffer::allocate(split->split_head);
        const std::byte* at = head.data();
        recv_posted_[p] = posted_recv::split;
        ep_->recv(
            ps_tasks_[p], rep_keys_[p], std::move(head), split->tail,
            [q, p, at](std::error_code e, tensor_buffer buf) {
              const bool landed = !e && buf.data() == at;
              q->push({false, p, 0, e, std::move(buf), landed});
            },
            deadline - now);
        continue;
      }
      ep_->recv(
          ps_tasks_[p], rep_keys_[p],
          [q, p](std::error_code e, tensor_buffer buf) {
            q->push({false, p, 0, e, std::move(buf)});
          },
          limit);
    }
    // One wake-up for the step's replies: each PS still to answer has one receive posted.
    std::size_t replies = 0;
    for (std::uint32_t p = 0; p < num_ps; ++p) replies += pending[p] != 0 && recv_posted_[p] != posted_recv::none;
    events_->take(got, wake, replies);
    now = clock::now();
    for (event& e : got) {
      if (e.is_send) {
        // Events of an earlier run() carry indexes of its attempts: the sequence number tells them apart.
        if (e.ps >= attempts.size()) continue;
        attempt& a = attempts[e.ps];
        if (e.seq != a.seq) continue;
        if (a.sending != 0) --a.sending;
        if (a.done || !e.ec) continue;
        a.last_error = e.ec;
        if (e.ec == make_error_code(errc::cancelled)) {
          ec = e.ec;
          why = "ps client closed while sending to " + target_name(a.ps);
          return false;
        }
        // Permanent: sending again would be refused again.
        if (e.ec == make_error_code(errc::auth_failed) || e.ec == make_error_code(errc::handshake_failed)) {
          ec = e.ec;
          why = target_name(a.ps) +
                (e.ec == make_error_code(errc::auth_failed)
                     ? " refused our cluster token (FUSEWIRE_CLUSTER_TOKEN or FUSEWIRE_CLUSTER_TOKEN_FILE must be "
                       "the same on every task)"
                     : " refused our handshake (is it a task of the same cluster?)");
          return false;
        }
        a.need_send = true;
        a.next_send = now + 50ms;
        continue;
      }
      const std::uint32_t p = e.ps;
      recv_posted_[p] = posted_recv::none;
      if (pending[p] == 0) continue;
      if (e.ec) {
        if (e.ec == make_error_code(errc::cancelled)) {
          ec = e.ec;
          why = "ps client closed while waiting for " + target_name(p);
          return false;
        }
        const bool reset = e.ec != make_error_code(errc::timed_out);
        // After a reset, poll again soon (the PS reconnects to us when it replies).
        next_recv[p] = reset ? now + 20ms : now;
        for (attempt& a : attempts) {
          if (a.done || a.ps != p) continue;
          if (reset) a.last_error = e.ec;
          if ((reset && !a.reset_resent) || now - a.last_send >= copts_.retry_interval) {
            if (reset) a.reset_resent = true;
            if (!a.need_send) {
              a.need_send = true;
              a.next_send = reset ? now + 20ms : now;
            }
          }
        }
        continue;
      }
      next_recv[p] = now;
      const auto bytes = e.buffer.bytes();
      if (bytes.size() < reply_header_bytes || detail::get<std::uint32_t>(bytes.data()) != message_magic) continue;
      const auto seq = detail::get<std::uint64_t>(bytes.data() + 8);
      for (attempt& a : attempts) {
        if (!a.done && a.ps == p && a.seq == seq) {
          a.done = true;
          a.reply = std::move(e.buffer);
          a.landed = e.landed;
          --pending[p];
          --left;
          break;
        }
      }
    }
    got.clear();
  }
}

template <transport Transport>
void client<Transport>::report_stall(const std::vector<attempt>& attempts, clock::time_point start,
                                     clock::time_point now) {
  auto age = [](clock::duration d) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    std::string frac = std::to_string(ms % 1000);
    return std::to_string(ms / 1000) + "." + std::string(3 - frac.size(), '0') + frac + " s";
  };
  std::size_t waiting = 0;
  for (const attempt& a : attempts) waiting += a.done ? 0 : 1;
  std::string s = "ps client " + ep_->self().to_string() + ": stall report: a step has waited " + age(now - start) +
                  " (FUSEWIRE_STALL_MS = " + std::to_string(stall_.count()) + ") for " + std::to_string(waiting) +
                  " of " + std::to_string(attempts.size()) + " PS requests";
  // The endpoint's view of each PS connection (asked once, from this thread).
  const std::vector<rendezvous::pending_operation> ops = ep_->pending();
  for (const attempt& a : attempts) {
    const std::string who = target_name(a.ps), peer = ps_tasks_[a.ps].to_string();
    s += "\n  " + who + ": ";
    if (a.done) {
      s += "answered";
      continue;
    }
    std::string vars;
    if (a.plan != nullptr) {
      std::vector<std::uint32_t> v = a.plan->vars;
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      std::size_t shown = 0;
      for (const std::uint32_t var : v) {
        if (shown++ == 16) {
          vars += ", ... (" + std::to_string(v.size()) + " in all)";
          break;
        }
        vars += (vars.empty() ? "" : ", ") + model_.variables[var].name;
      }
    }
    s += "no reply; variables " + (vars.empty() ? std::string("(none: a control request)") : vars) + "; request " +
         std::to_string(a.request.bytes) + " B, seq " + std::to_string(a.seq) + ", last sent " +
         age(now - a.last_send) + " ago";
    if (a.last_error) s += ", last error: " + a.last_error.message();
    for (const rendezvous::pending_operation& o : ops) {
      if (o.peer != peer) continue;
      s += "; connection " + o.connection + (o.last_error.empty() ? "" : " (last error: " + o.last_error + ")");
      break;
    }
    s += "; missing: " + who + "'s reply";
  }
  rendezvous::write_log(log_, s);  // to stderr without a sink: a stall must be seen
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
