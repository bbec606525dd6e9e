// The command-line flags the PS examples (ps_worker, embedding) share: the
// cluster shape, the network choices, the --role/--task/--cluster form that
// runs one task of a cluster given on the command line or by TF_CONFIG, and
// the arguments the launcher passes on to the tasks it starts.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>

#include "common/transport.hpp"

namespace example {

/// What every PS example's config holds; each example adds its model's flags.
struct cluster_flags {
  unsigned ps = 2;
  unsigned workers = 2;
  bool sync = false;
  std::string mode;    // empty: the environment's reactor mode, else block
  std::string fusion;  // empty: on, with transport coalescing as the environment says
  std::string transport = default_transport;
  std::string host = "127.0.0.1";  // where the launcher's tasks listen
  unsigned log_every = 0;
  std::uint64_t seed = 1;
  bool local = false;
  bool check_loss = false;
  unsigned timeout = 600;
  unsigned step_timeout = 60;
  std::string role;
  unsigned task = 0;
  std::string cluster;

  /// Whether each step's pulls and pushes go to a PS as one request.
  bool fused() const { return fusion != "off"; }
};

/// The flags only the launcher reads; it passes the others on to its tasks.
inline const std::vector<std::string> launcher_flags{"--ps",   "--workers", "--local",   "--timeout",
                                                     "--role", "--task",    "--cluster", "--host"};

/// Registers the shared flags on `app`; `fusion_help` and `seed_help` say what
/// fusion and the seed mean for this example.
inline void add_cluster_flags(CLI::App& app, cluster_flags& f, const char* fusion_help, const char* seed_help) {
  app.add_option("--ps", f.ps, "parameter servers to launch")->check(CLI::Range(1u, 64u));
  app.add_option("--workers", f.workers, "workers to launch")->check(CLI::Range(1u, 64u));
  app.add_flag("--sync,!--async", f.sync,
               "synchronous training (the PS aggregates every worker's push per step); "
               "default async");
  app.add_option("--mode", f.mode,
                 "reactor wait mode (default: as FUSEWIRE_REACTOR_MODE or *_ENABLE_POLLING say, else block)")
      ->check(CLI::IsMember({"poll", "adaptive", "block"}));
  app.add_option("--fusion", f.fusion, fusion_help)->check(CLI::IsMember({"on", "off"}));
  std::string names;
  for (const auto& n : transport_names(true)) names += (names.empty() ? "" : "|") + n;
  app.add_option("--transport", f.transport,
                 std::string("transport (default ") + default_transport +
                     ": shm when every task is on this host, verbs when TF_RDMA_ENABLED and RDMA works, else "
                     "uring or asio; verbs needs an RDMA device and --host)")
      ->check(CLI::Validator(
          [](const std::string& name) {
            auto problem = transport_problem(name, true);
            return problem ? *problem : std::string();
          },
          names, "transport"));
  app.add_option("--host", f.host,
                 "launcher: the IPv4 address every task listens on (default 127.0.0.1; for verbs, the address of "
                 "the RDMA device's interface)");
  app.add_option("--log-every", f.log_every, "print progress every N steps (0 = about 8 lines per run)");
  app.add_option("--seed", f.seed, seed_help);
  app.add_flag("--local", f.local, "train in this one process, no parameter servers (for comparison)");
  app.add_flag("--check-loss", f.check_loss, "exit 1 unless the training loss went down");
  app.add_option("--timeout", f.timeout,
                 "launcher: kill every task still running after this many seconds (default 600)")
      ->check(CLI::Range(1u, 86400u));
  app.add_option("--step-timeout", f.step_timeout,
                 "a worker fails when a parameter server has not answered one step after this many seconds "
                 "(default 60)")
      ->check(CLI::Range(1u, 86400u));
  app.add_option("--role", f.role, "run as one task of a cluster")->check(CLI::IsMember({"ps", "worker"}));
  app.add_option("--task", f.task, "index of this task within its job");
  app.add_option("--cluster", f.cluster,
                 "cluster spec \"ps=h:p,h:p;worker=h:p,...\" (default: TF_CONFIG); an .endpoint_map applies "
                 "either way (docs/configuration.md)");
  app.footer(
      "Every task reads fusewire's environment knobs (docs/configuration.md), e.g. FUSEWIRE_CLUSTER_TOKEN;\n"
      "--mode and --fusion, when given, win over them. Tasks the launcher starts inherit the environment.");
}

/// For --role: the cluster from --cluster or TF_CONFIG, with the endpoint map
/// the environment names (cluster_spec::from_string_or_env), and this task as self
/// (--task defaults to TF_CONFIG's index). Prints why and returns nullopt when
/// the spec lacks a "ps" or "worker" job. Throws what cluster_spec throws on a bad spec.
inline std::optional<fusewire::cluster_spec> task_cluster(const CLI::App& app, cluster_flags& f, const char* program) {
  // Either way the environment's .endpoint_map applies (docs/configuration.md).
  fusewire::cluster_spec spec = fusewire::cluster_spec::from_string_or_env(f.cluster);
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

/// The options given on this command line as "--name=value" arguments, as a
/// task the launcher starts must see them; leaves out launcher_flags,
/// `launcher_only` and --help. A flag not given keeps its default, which is
/// the same in every task.
inline std::vector<std::string> forwarded_args(const CLI::App& app,
                                               std::initializer_list<std::string> launcher_only = {}) {
  std::vector<std::string> skip = launcher_flags;
  skip.insert(skip.end(), launcher_only);
  std::vector<std::string> args;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt == app.get_help_ptr() || opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    // A flag's result is "true" or "false" (a "!--no" alias gives "false"): "--name=false" means the same.
    for (const std::string& value : opt->results()) args.push_back(name + "=" + value);
  }
  return args;
}

}  // namespace example
