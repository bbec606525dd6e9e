#pragma once
/// The two processes of a benchmark cluster. Started by hand they print what
/// they do; started by the launcher (`managed`) they speak JSON lines on
/// stdout and take commands ("go", "mark", "stop") on stdin.

#include "config.hpp"

namespace fusewire::bench {

/// Runs a PS until stopped (Ctrl-C, SIGTERM, or the launcher's "stop");
/// returns the process exit code. Throws `system_error` on setup errors.
int run_ps(const role_config& config);

/// Runs one worker's warmup and measurement against every PS of the
/// cluster; returns the process exit code. Throws on errors.
int run_worker(const role_config& config);

/// Pins the calling thread (and so the threads it starts later) to one CPU
/// of the process's cpuset: slot `index` modulo the allowed CPUs. Returns the
/// CPU, or -1 when the cpuset could not be read.
int pin_to_slot(unsigned index);

}  // namespace fusewire::bench
