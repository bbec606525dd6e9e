// What the PS examples (ps_worker, embedding) do the same way with their
// cluster flags: the server's and the client's config, running one task of
// a cluster over the chosen transport, and launching the whole cluster on
// loopback as child processes.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/ps/ps.hpp>

#include "common/cluster_cli.hpp"
#include "common/launcher.hpp"
#include "common/options.hpp"
#include "common/transport.hpp"

namespace example {

namespace ps = fusewire::ps;

/// PS-side training mode for --sync/--async.
inline ps::training_mode training_mode(const cluster_flags& f) {
  return f.sync ? ps::training_mode::sync : ps::training_mode::async;
}

/// The options of a task of role `r`: the environment's knobs, then --mode and
/// --fusion when given. The reactors block by default: with six processes on
/// a small machine, busy-polling reactors take the CPU the others need.
inline fusewire::options net_options(const cluster_flags& f, fusewire::role r) {
  option_choices command_line;
  if (!f.mode.empty()) command_line.mode = fusewire::reactor_mode_from_string(f.mode);
  if (!f.fusion.empty()) command_line.coalesce = command_line.tensor_fuse = f.fused();
  return task_options(r, command_line, {.mode = fusewire::reactor_mode::block});
}

/// How a PS task of this run serves.
template <class Transport>
ps::server_config<Transport> server_config(const cluster_flags& f) {
  auto o = net_options(f, fusewire::role::ps);
  return {.options = o, .mode = training_mode(f), .transport = make_transport<Transport>(o)};
}

/// How a worker of this run talks to the PS tasks.
template <class Transport>
ps::client_config<Transport> client_config(const cluster_flags& f) {
  auto o = net_options(f, fusewire::role::worker);
  return {.options = o,
          .mode = training_mode(f),
          .step_timeout = std::chrono::seconds(f.step_timeout),
          .transport = make_transport<Transport>(o)};
}

/// --role: runs this task of the cluster (from --cluster or TF_CONFIG) over
/// --transport ("auto" decides from the cluster and this task's options), as
/// `run.template operator()<Transport>(spec)`, and returns its exit status; 2
/// if the cluster spec lacks a job.
template <class Run>
int run_task(const CLI::App& app, cluster_flags& f, const char* program, Run&& run) {
  const std::optional<fusewire::cluster_spec> spec = task_cluster(app, f, program);
  if (!spec) return 2;
  const fusewire::options o = net_options(f, f.role == "ps" ? fusewire::role::ps : fusewire::role::worker);
  return with_transport<true>(f.transport, o, *spec,
                              [&]<class Transport>() { return run.template operator()<Transport>(*spec); });
}

/// The launcher: starts this program again as each PS task (servers) and
/// each worker of `cluster` on loopback, with the command line's options
/// except the launcher's own (`launcher_only` adds the example's), and
/// supervises them until --timeout. True if every task ended well.
inline bool launch_cluster(const CLI::App& app, const cluster_flags& f, const char* program, const std::string& cluster,
                           const result_handler& on_result, std::initializer_list<std::string> launcher_only = {}) {
  const std::vector<std::string> args = forwarded_args(app, launcher_only);
  std::vector<child_process> kids;
  auto start = [&](const char* role, unsigned task, child_kind kind) {
    std::vector<std::string> a{program, "--role", role, "--task", std::to_string(task), "--cluster", cluster};
    a.insert(a.end(), args.begin(), args.end());
    kids.push_back(spawn_self(std::string(role) + ":" + std::to_string(task), kind, a));
  };
  try {
    for (unsigned i = 0; i < f.ps; ++i) start("ps", i, child_kind::server);
    for (unsigned i = 0; i < f.workers; ++i) start("worker", i, child_kind::task);
  } catch (...) {
    for (auto& c : kids) stop(c);  // the ones started go too, and are reaped below
    supervise(kids, on_result, {.deadline = std::chrono::seconds(f.timeout)});
    throw;
  }
  return supervise(kids, on_result, {.deadline = std::chrono::seconds(f.timeout)});
}

}  // namespace example
