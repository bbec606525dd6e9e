#pragma once
/// The processes of one ps_bench measurement, as the launcher starts them
/// (this program again with --role). They report to the launcher with "@"
/// lines on stdout: a worker "@start" when its measured window begins,
/// worker 0 "@progress" every second, every worker "@result" at the end, and
/// each PS "@ps" when it stops.

#include <string>

#include "settings.hpp"

namespace fusewire::bench::psb {

/// Serves as PS `task` of `cluster` until SIGTERM/SIGINT (the launcher's,
/// once every worker has exited); returns the exit code. Throws on setup errors.
int run_ps_role(const run_settings& s, const cell_spec& c, const std::string& cluster, unsigned task);

/// Warm-up, barrier, the measured window; returns the exit code. Throws std::system_error when a step fails.
int run_worker_role(const run_settings& s, const cell_spec& c, const std::string& cluster, unsigned task);

}  // namespace fusewire::bench::psb
