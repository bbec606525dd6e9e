#pragma once
/// --main-job: runs the project's main job (examples/ps_worker, what
/// examples/demo.sh runs: 2 PS + 4 workers training an MLP on Fashion-MNIST)
/// and picks its figures out of the summary it prints.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace fusewire::bench::psb {

struct main_job_request {
  std::string exe;   ///< empty: examples/ps_worker/ps_worker next to this build's bench/
  std::string args;  ///< extra arguments, space-separated
  std::string transport;
  std::string reactor_mode;  ///< empty: ps_worker's default
  unsigned timeout_s = 900;
  bool quiet = false;
};

struct main_job_result {
  bool ok = false;
  std::string error;
  std::string command;
  int exit_status = -1;
  std::optional<double> samples_per_s;
  std::optional<double> comm_percent;
  std::optional<double> test_accuracy;
  std::optional<double> wall_s;
};

/// Runs it, forwarding its output ("[main-job] " before each line unless
/// quiet); kills it after timeout_s. Never throws for the job's own failure.
main_job_result run_main_job(const main_job_request& req);

void print_main_job(const main_job_result& r);
nlohmann::json main_job_json(const main_job_result& r);

}  // namespace fusewire::bench::psb
