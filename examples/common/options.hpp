// The fusewire options of an example's process: the library's environment
// knobs (docs/configuration.md) first, so FUSEWIRE_CLUSTER_TOKEN and the
// others work in every example, then what the command line chose.
//
// The cluster token comes only from FUSEWIRE_CLUSTER_TOKEN, never from a
// command line: a command line is visible to every user of the host (ps,
// /proc/PID/cmdline). Tasks a launcher starts inherit the environment.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <fusewire/core/env.hpp>
#include <fusewire/core/options.hpp>

namespace example {

/// The option fields an example sets; an empty field leaves the value alone.
struct option_choices {
  std::optional<fusewire::reactor_mode> mode{};
  std::optional<bool> coalesce{};
  std::optional<bool> tensor_fuse{};
  std::optional<std::chrono::milliseconds> connect_timeout{};
};

/// Which side of the job a task of job `job` is: "ps" reads the PS_* knobs, any other job the WORKER_* ones.
inline fusewire::role role_of_job(std::string_view job) {
  return job == "ps" ? fusewire::role::ps : fusewire::role::worker;
}

/// options::from_env(r, env), then every field `command_line` sets, then every
/// field `example_defaults` sets whose environment variable is unset (an
/// example's own default gives way to the environment, the command line does
/// not). Throws std::system_error naming a bad variable or field.
inline fusewire::options task_options(fusewire::role r, const option_choices& command_line,
                                      const option_choices& example_defaults = {},
                                      const fusewire::env_lookup& env = fusewire::process_env()) {
  fusewire::options o = fusewire::options::from_env(r, env);
  auto is_set = [&](std::string_view name) {
    const std::optional<std::string> v = env(name);
    return v && !v->empty();  // from_env treats an empty value as unset
  };
  auto choose = [](auto& field, const auto& chosen, const auto& fallback, bool env_set) {
    if (chosen) {
      field = *chosen;
    } else if (fallback && !env_set) {
      field = *fallback;
    }
  };
  const bool mode_set = is_set("FUSEWIRE_REACTOR_MODE") ||
                        is_set(r == fusewire::role::ps ? "PS_ENABLE_POLLING" : "WORKER_ENABLE_POLLING");
  choose(o.mode, command_line.mode, example_defaults.mode, mode_set);
  choose(o.coalesce, command_line.coalesce, example_defaults.coalesce, is_set("FUSEWIRE_COALESCE"));
  choose(o.tensor_fuse, command_line.tensor_fuse, example_defaults.tensor_fuse, is_set("TENSOR_FUSE"));
  choose(o.connect_timeout, command_line.connect_timeout, example_defaults.connect_timeout,
         is_set("FUSEWIRE_CONNECT_TIMEOUT_MS"));
  o.validate();
  return o;
}

}  // namespace example
