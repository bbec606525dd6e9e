#pragma once
/// fwbench's command line: parsing (CLI11) into a `command`, with errors that
/// name the bad value and what is allowed, and the inverse for one role (the
/// launcher starts each PS and worker with these arguments).

#include <string>
#include <system_error>
#include <vector>

#include "config.hpp"

namespace fusewire::bench {

enum class command_kind { run, compare, list, role };

/// What the user asked for; only the member matching `kind` is meaningful.
struct command {
  command_kind kind = command_kind::run;
  run_config run;
  compare_config compare;
  role_config role;
};

/// The outcome of parsing: a command, or text to print and an exit code
/// (--help: 0; CLI11's own usage errors: non-zero).
struct parse_result {
  command cmd;
  bool exit_now = false;
  int exit_code = 0;
  std::string output;
};

/// Parses `args` (args[0] is the program name). Throws
/// `system_error(errc::invalid_argument)` for values fwbench rejects.
parse_result parse_command_line(const std::vector<std::string>& args);

/// The arguments (without the program name) that make `parse_command_line`
/// return `config` as a role command.
std::vector<std::string> role_arguments(const role_config& config);

/// An error's message without the " : <category message>" std::system_error appends.
std::string error_text(const std::system_error& e);

}  // namespace fusewire::bench
