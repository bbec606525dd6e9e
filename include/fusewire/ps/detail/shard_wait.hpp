#pragma once
/// ps::shard's view of what waits: the sync step in progress and the barrier
/// generation in progress — which workers arrived, which not, and what this
/// PS knows of each. The server's stall reports are made of it; no clock and
/// no network here.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <fusewire/ps/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline wait_state shard::step_wait() const {
  wait_state s;
  s.waiting = step_waiting();
  s.number = global_step_ + 1;
  s.needed = opts_.replicas;
  s.workers.resize(num_workers_);
  for (std::uint32_t w = 0; w < num_workers_; ++w) {
    worker_wait& ww = s.workers[w];
    ww.worker = w;
    ww.arrived = contributors_.contains(w);
    ww.lost = lost_[w];
    ww.seen = workers_[w].seen;
    ww.pushed_step = workers_[w].pushed_step;
    ww.requests_waiting = static_cast<std::size_t>(
        std::count_if(deferred_.begin(), deferred_.end(), [w](const deferred_request& d) { return d.worker == w; }));
  }
  return s;
}

inline wait_state shard::barrier_wait() const {
  wait_state s;
  s.waiting = barrier_.waiting();
  s.number = barrier_.generation();
  s.needed = num_workers_;
  s.workers.resize(num_workers_);
  for (std::uint32_t w = 0; w < num_workers_; ++w) {
    worker_wait& ww = s.workers[w];
    ww.worker = w;
    ww.arrived = barrier_.arrived(w);
    ww.lost = lost_[w];
    ww.seen = workers_[w].seen;
    ww.pushed_step = workers_[w].pushed_step;
  }
  return s;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
