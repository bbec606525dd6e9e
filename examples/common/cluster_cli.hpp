// The command-line flags both PS examples (ps_worker, embedding) share: the
// cluster shape, the network knobs, and the --role/--task/--cluster form that
// runs one task of a cluster given on the command line or by TF_CONFIG.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include <fusewire/core/cluster_spec.hpp>

#include "common/ps_common.hpp"

namespace example {

/// What every PS example's config holds; each example adds its model's flags.
struct cluster_flags {
  unsigned ps = 2;
  unsigned workers = 2;
  bool sync = false;
  std::string mode = "block";
  std::string fusion = "on";
  std::string transport = default_transport;
  unsigned log_every = 0;
  std::uint64_t seed = 1;
  bool local = false;
  bool check_loss = false;
  unsigned timeout = 600;
  std::string role;
  unsigned task = 0;
  std::string cluster;
};

/// Registers the shared flags on `app`; `fusion_help` and `seed_help` say what
/// fusion and the seed mean for this example.
inline void add_cluster_flags(CLI::App& app, cluster_flags& f, const char* fusion_help, const char* seed_help) {
  app.add_option("--ps", f.ps, "parameter servers to launch")->check(CLI::Range(1u, 64u));
  app.add_option("--workers", f.workers, "workers to launch")->check(CLI::Range(1u, 64u));
  app.add_flag("--sync,!--async", f.sync,
               "synchronous training (the PS aggregates every worker's push per step); "
               "default async");
  app.add_option("--mode", f.mode, "reactor wait mode")->check(CLI::IsMember({"poll", "adaptive", "block"}));
  app.add_option("--fusion", f.fusion, fusion_help)->check(CLI::IsMember({"on", "off"}));
  app.add_option("--transport", f.transport, "TCP transport")->check(CLI::IsMember(transport_names()));
  app.add_option("--log-every", f.log_every, "print progress every N steps (0 = about 8 lines per run)");
  app.add_option("--seed", f.seed, seed_help);
  app.add_flag("--local", f.local, "train in this one process, no parameter servers (for comparison)");
  app.add_flag("--check-loss", f.check_loss, "exit 1 unless the training loss went down");
  app.add_option("--timeout", f.timeout, "launcher: kill every task after this many seconds");
  app.add_option("--role", f.role, "run as one task of a cluster")->check(CLI::IsMember({"ps", "worker"}));
  app.add_option("--task", f.task, "index of this task within its job");
  app.add_option("--cluster", f.cluster, "cluster spec \"ps=h:p,h:p;worker=h:p,...\" (default: TF_CONFIG)");
}

/// For --role: the cluster from --cluster or TF_CONFIG with this task as self
/// (--task defaults to TF_CONFIG's index). Prints why and returns nullopt when
/// the spec lacks a "ps" or "worker" job. Throws what cluster_spec throws on a bad spec.
inline std::optional<fusewire::cluster_spec> task_cluster(const CLI::App& app, cluster_flags& f, const char* program) {
  fusewire::cluster_spec spec =
      f.cluster.empty() ? fusewire::cluster_spec::from_env() : fusewire::cluster_spec::from_string(f.cluster);
  if (f.cluster.empty() && spec.self() && app.count("--task") == 0) f.task = spec.self()->index;
  if (!spec.has_job("ps") || !spec.has_job("worker")) {
    std::fprintf(stderr,
                 "%s: the cluster spec needs jobs \"ps\" and \"worker\" (got \"%s\"); pass --cluster or set "
                 "TF_CONFIG\n",
                 program, spec.to_string().c_str());
    return std::nullopt;
  }
  spec.set_self(fusewire::task_id{f.role, f.task});
  return spec;
}

}  // namespace example
