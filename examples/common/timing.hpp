// Wall-clock timing for the trainer examples' progress lines and results.
#pragma once

#include <chrono>

namespace example {

using steady = std::chrono::steady_clock;

/// Seconds since `t0`.
inline double since(steady::time_point t0) { return std::chrono::duration<double>(steady::now() - t0).count(); }

/// Adds the time spent in its scope to `total` (seconds).
class scoped_timer {
 public:
  explicit scoped_timer(double& total) : total_(total), t0_(steady::now()) {}
  ~scoped_timer() { total_ += since(t0_); }
  scoped_timer(const scoped_timer&) = delete;
  scoped_timer& operator=(const scoped_timer&) = delete;

 private:
  double& total_;
  steady::time_point t0_;
};

}  // namespace example
