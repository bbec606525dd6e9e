#pragma once
/// The launcher: runs whole configurations on this host by starting every PS
/// and worker as a child process (this same executable with `--role`), and
/// `fwbench compare`.

#include <cstdio>
#include <string>
#include <vector>

#include "config.hpp"
#include "results.hpp"

namespace fusewire::bench {

/// The cells `run_benchmarks` would run, in order (backend names checked:
/// throws `system_error` for an unknown or unbuilt backend that was asked for).
std::vector<cell> plan_cells(const run_config& config);

/// The cells of `fwbench compare`: the subject, grpc, zmq:block, floor:poll
/// and floor:block on every benchmark and scheme, plus 10 B and 64 KiB
/// single-buffer latency. Cells of backends that are not built are kept,
/// marked `skipped`.
std::vector<cell> plan_compare(const compare_config& config);

/// Runs every cell (progress on stderr), prints the table, writes the
/// outputs. Returns the exit code (1 when any repetition failed).
int run_benchmarks(const run_config& config);

/// Runs the comparison, prints the table and the subject's ratios, writes
/// the JSON and the plot. Returns the exit code.
int run_compare(const compare_config& config);

/// `fwbench list`.
void print_backends(std::FILE* out);

}  // namespace fusewire::bench
