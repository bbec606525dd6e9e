// fwbench: TF-gRPC-Bench rebuilt for fusewire. See bench/README.md.

#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <fusewire/protocol/local_token.hpp>

#include "backend.hpp"
#include "cli.hpp"
#include "driver.hpp"
#include "roles.hpp"

int main(int argc, char** argv) {
  using namespace fusewire::bench;
  std::signal(SIGPIPE, SIG_IGN);
  try {
    const parse_result parsed = parse_command_line(std::vector<std::string>(argv, argv + argc));
    if (parsed.exit_now) {
      std::fputs(parsed.output.c_str(), parsed.exit_code == 0 ? stdout : stderr);
      return parsed.exit_code;
    }
    const command& cmd = parsed.cmd;
    switch (cmd.kind) {
      case command_kind::list:
        print_backends(stdout);
        return 0;
      case command_kind::role:
        return cmd.role.role == role_kind::ps ? run_ps(cmd.role) : run_worker(cmd.role);
      case command_kind::compare:
        // Every PS and worker of these runs is a child on this machine: they
        // authenticate with a fresh token unless one is configured.
        fusewire::protocol::provide_local_token();
        return run_compare(cmd.compare);
      case command_kind::run:
        fusewire::protocol::provide_local_token();
        return run_benchmarks(cmd.run);
    }
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "fwbench: %s\n", error_text(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fwbench: %s\n", e.what());
    return 2;
  }
  return 0;
}
