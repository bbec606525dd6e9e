#include "main_job.hpp"

#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "common/launcher.hpp"

namespace fusewire::bench::psb {
namespace {

std::string default_exe() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  // <build>/bench/ps_bench/ps_bench -> <build>/examples/ps_worker/ps_worker
  return (self.parent_path().parent_path().parent_path() / "examples" / "ps_worker" / "ps_worker").string();
}

/// The number after `key` in a summary line "  key   12345 (...)", if the line has it.
std::optional<double> figure(const std::string& line, const std::string& key) {
  const auto at = line.find(key);
  if (at == std::string::npos || line.compare(0, 2, "  ") != 0) return std::nullopt;
  std::istringstream in(line.substr(at + key.size()));
  double v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

}  // namespace

main_job_result run_main_job(const main_job_request& req) {
  main_job_result r;
  const std::string exe = req.exe.empty() ? default_exe() : req.exe;
  if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) {
    r.error = "the main job's executable '" + exe +
              "' is missing or not executable (build it: ninja examples/ps_worker/ps_worker; or --main-job-exe)";
    return r;
  }
  std::vector<std::string> args{exe, "--transport", req.transport};
  if (!req.reactor_mode.empty()) args.insert(args.end(), {"--mode", req.reactor_mode});
  std::istringstream extra(req.args);
  for (std::string a; extra >> a;) args.push_back(a);
  for (const auto& a : args) r.command += (r.command.empty() ? "" : " ") + a;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  if (!req.quiet) {
    std::printf("\nmain job: %s\n", r.command.c_str());
    std::fflush(stdout);
  }

  example::child_process c = example::detail::fork_child("main-job", example::child_kind::task);
  if (c.pid == 0) {
    ::execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::seconds(req.timeout_s);
  bool killed = false;
  auto on_line = [&](bool is_out, const std::string& line) {
    if (is_out) {
      if (auto v = figure(line, "samples/s")) r.samples_per_s = v;
      if (auto v = figure(line, "communication share")) r.comm_percent = v;
      if (auto v = figure(line, "test accuracy"); v && !r.test_accuracy) r.test_accuracy = v;
      if (auto v = figure(line, "wall time")) r.wall_s = v;
    }
    if (!req.quiet || !is_out) {
      std::FILE* to = is_out ? stdout : stderr;
      std::fprintf(to, "[main-job] %s\n", line.c_str());
      std::fflush(to);
    }
  };
  std::string partial[2];
  int fds[2] = {c.out.fd, c.err.fd};
  while (fds[0] >= 0 || fds[1] >= 0) {
    if (!killed && clock::now() > deadline) {
      std::printf("ps_bench: the main job still runs after %u s (--main-job-timeout); killing it\n", req.timeout_s);
      ::kill(c.pid, SIGKILL);  // its tasks get SIGTERM from their parent-death signal
      killed = true;
    }
    pollfd p[2];
    nfds_t n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds[i] >= 0) {
        p[n] = {fds[i], POLLIN, 0};
        which[n++] = i;
      }
    }
    if (::poll(p, n, 200) <= 0) continue;
    for (nfds_t k = 0; k < n; ++k) {
      if (p[k].revents == 0) continue;
      const int i = which[k];
      char buf[4096];
      const ssize_t got = ::read(fds[i], buf, sizeof buf);
      if (got <= 0) {
        if (!partial[i].empty()) on_line(i == 0, partial[i]);
        ::close(fds[i]);
        fds[i] = -1;
        continue;
      }
      partial[i].append(buf, static_cast<std::size_t>(got));
      for (std::size_t nl; (nl = partial[i].find('\n')) != std::string::npos;) {
        on_line(i == 0, partial[i].substr(0, nl));
        partial[i].erase(0, nl + 1);
      }
    }
  }
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.ok = !killed && WIFEXITED(status) && WEXITSTATUS(status) == 0 && r.samples_per_s.has_value();
  if (killed) {
    r.error = "killed after " + std::to_string(req.timeout_s) + " s (--main-job-timeout)";
  } else if (!r.ok) {
    r.error = "ended with " + example::describe_status(status) +
              (r.samples_per_s ? "" : "; it printed no samples/s (the dataset missing? see its output above)");
  }
  return r;
}

void print_main_job(const main_job_result& r) {
  std::printf("\nmain job (examples/ps_worker): %s\n", r.ok ? "" : ("FAILED: " + r.error).c_str());
  auto line = [](const char* what, const std::optional<double>& v, const char* fmt) {
    if (!v) return;
    std::printf("  %-22s ", what);
    std::printf(fmt, *v);
    std::printf("\n");
  };
  line("samples/s", r.samples_per_s, "%.0f");
  line("communication share", r.comm_percent, "%.1f%%");
  line("test accuracy", r.test_accuracy, "%.4f");
  line("wall time", r.wall_s, "%.1f s");
  std::printf("  %-22s %s\n", "command", r.command.c_str());
  std::fflush(stdout);
}

nlohmann::json main_job_json(const main_job_result& r) {
  nlohmann::json j = {{"ok", r.ok}, {"command", r.command}, {"exit_status", r.exit_status}};
  if (!r.error.empty()) j["error"] = r.error;
  if (r.samples_per_s) j["samples_per_s"] = *r.samples_per_s;
  if (r.comm_percent) j["comm_percent"] = *r.comm_percent;
  if (r.test_accuracy) j["test_accuracy"] = *r.test_accuracy;
  if (r.wall_s) j["wall_s"] = *r.wall_s;
  return j;
}

}  // namespace fusewire::bench::psb
