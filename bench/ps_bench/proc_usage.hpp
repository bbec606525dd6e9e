#pragma once
/// CPU time another process has used so far, from /proc/PID/stat: how the
/// launcher marks where a PS process stood when the measured window began
/// (the PS reports its own getrusage when it stops).

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace fusewire::bench::psb {

struct proc_sample {
  double user_s = 0;
  double sys_s = 0;
};

/// Zeros when the process is gone or /proc cannot be read.
inline proc_sample sample_proc(pid_t pid) {
  proc_sample s;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return s;
  const auto close = line.rfind(')');  // "pid (comm) state ...": comm may hold spaces
  if (close == std::string::npos) return s;
  std::istringstream fields(line.substr(close + 2));
  std::string f;
  // Fields from the state (3rd) on: utime is the 14th, stime the 15th.
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  if (hz <= 0) return s;
  s.user_s = static_cast<double>(utime) / hz;
  s.sys_s = static_cast<double>(stime) / hz;
  return s;
}

}  // namespace fusewire::bench::psb
