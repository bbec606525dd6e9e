// The launcher of a local multi-process run: starts the child processes (this
// program again with other arguments, or a function in a forked child),
// forwards their output prefixed with their names, hands their "@" result
// lines to the caller, stops the servers once every task is done, and bounds
// every wait for a child: whatever is still running at the deadline is
// killed and named.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fusewire/protocol/local_token.hpp>

namespace example {

/// How a child ends: a task finishes on its own; a server runs until the
/// launcher stops it (SIGTERM) once every task has finished.
enum class child_kind { task, server };

/// One child process of a local run.
struct child_process {
  /// The read end of one of the child's output streams, and the line it has begun.
  struct stream {
    int fd = -1;
    std::string partial;
  };

  std::string name;  // "ps:0", "worker:3"
  child_kind kind = child_kind::task;
  pid_t pid = -1;
  stream out;  // the child's stdout
  stream err;  // the child's stderr
  std::chrono::steady_clock::time_point started{};
  /// When the launcher sent SIGTERM, if it did.
  std::optional<std::chrono::steady_clock::time_point> stop_sent;
  bool killed = false;  // the launcher sent SIGKILL
  bool exited = false;
  int status = 0;  // waitpid's status once exited
};

/// "exit status 1" or "signal 15 (Terminated)", for a waitpid status.
inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + std::string(::strsignal(WTERMSIG(status))) + ")";
  }
  return "status " + std::to_string(status);
}

namespace detail {

/// What a process that does not finish is doing, from /proc: each thread's
/// state and the kernel function it sleeps in ("1234 S ep_poll, 1235 S
/// futex_wait_queue"), so a run killed at its deadline says where it hung.
inline std::string where_it_waits(pid_t pid) {
  std::string out;
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream stat(t.path() / "stat"), wchan(t.path() / "wchan");
    std::string line, fn;
    std::getline(stat, line);
    std::getline(wchan, fn);
    const auto close = line.rfind(')');  // "tid (comm) S ...": the state follows the name
    const std::string state = close != std::string::npos && close + 2 < line.size() ? line.substr(close + 2, 1) : "?";
    out += (out.empty() ? "" : ", ") + t.path().filename().string() + " " + state + " " +
           (fn.empty() || fn == "0" ? "-" : fn);
  }
  return out.empty() ? "no /proc entry" : out;
}

/// Forks a child whose stdout and stderr are fresh pipes. Returns the child's
/// record in the parent, and one with pid 0 in the child, whose stdout and
/// stderr are then the pipes. The child gets SIGTERM if the launcher dies, so
/// no task outlives it.
inline child_process fork_child(std::string name, child_kind kind) {
  // Every task of a job this program launches runs on this machine: without a
  // configured token they share a fresh one, through the environment.
  fusewire::protocol::provide_local_token();
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::system_error(errno, std::system_category(), "pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw std::system_error(e, std::system_category(), "pipe");
  }
  std::fflush(nullptr);  // what this process has buffered must not be written twice
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw std::system_error(e, std::system_category(), "fork");
  }
  child_process c;
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    c.pid = 0;
    return c;
  }
  ::close(out[1]);
  ::close(err[1]);
  c.name = std::move(name);
  c.kind = kind;
  c.pid = pid;
  c.out.fd = out[0];
  c.err.fd = err[0];
  c.started = std::chrono::steady_clock::now();
  return c;
}

}  // namespace detail

/// Starts this program again (/proc/self/exe) with `args` (args[0] is argv[0]).
inline child_process spawn_self(std::string name, child_kind kind, const std::vector<std::string>& args) {
  std::vector<char*> argv;  // built before fork: the child only calls exec
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  child_process c = detail::fork_child(std::move(name), kind);
  if (c.pid != 0) return c;
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "cannot exec /proc/self/exe: %s\n", std::strerror(errno));
  ::_exit(127);
}

/// Runs `body` in a forked child, whose exit status is what `body` returns
/// (1 if it throws). Fork before this process starts threads: only the
/// calling thread exists in the child.
inline child_process spawn_function(std::string name, child_kind kind, const std::function<int()>& body) {
  child_process c = detail::fork_child(std::move(name), kind);
  if (c.pid != 0) return c;
  int rc = 1;
  try {
    rc = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  std::fflush(nullptr);
  ::_exit(rc);
}

/// Asks a running child to stop (SIGTERM); supervise() kills it if it has not
/// exited `stop_grace` later.
inline void stop(child_process& c) {
  if (c.exited || c.stop_sent) return;
  ::kill(c.pid, SIGTERM);
  c.stop_sent = std::chrono::steady_clock::now();
}

/// How long supervise() waits.
struct supervise_limits {
  /// After this long from the first child's start, every child still running is killed.
  std::chrono::seconds deadline{600};
  /// What sets the deadline, named when it passes.
  std::string_view deadline_source = "--timeout";
  /// A child sent SIGTERM is killed if it still runs this long afterwards.
  std::chrono::seconds stop_grace{10};
};

/// Called with each "@..." line a child prints on its stdout.
using result_handler = std::function<void(const child_process&, const std::string&)>;

/// Forwards every line the children print to this process's stdout and
/// stderr, prefixed "[name] ", except stdout lines starting with '@', which go
/// to `on_result` (if set). When a child fails (exits non-zero without being
/// asked to stop), stops all the others; when every task has exited, stops the
/// servers. Kills, and names, the children still running at the deadline and
/// those that do not stop within stop_grace of SIGTERM. Returns once every
/// child is reaped: true if each exited with status 0 (a server may also end
/// by the SIGTERM that stopped it) and none was killed.
/// `label` starts the lines supervise prints itself.
inline bool supervise(std::vector<child_process>& kids, const result_handler& on_result,
                      const supervise_limits& limits = {}, std::string_view label = "launcher") {
  using clock = std::chrono::steady_clock;
  if (kids.empty()) return true;
  const std::string who(label);
  clock::time_point first_start = kids.front().started;
  for (const auto& c : kids) first_start = std::min(first_start, c.started);
  bool deadline_passed = false;
  bool stopping = false;  // every child still running has been sent SIGTERM
  std::optional<clock::time_point> all_exited_at;

  auto emit = [&](child_process& c, bool is_out, const std::string& line) {
    if (is_out && !line.empty() && line[0] == '@') {
      if (on_result) on_result(c, line);
      return;
    }
    std::FILE* to = is_out ? stdout : stderr;
    std::fprintf(to, "[%s] %s\n", c.name.c_str(), line.c_str());
    std::fflush(to);
  };
  auto close_stream = [&](child_process& c, child_process::stream& s, bool is_out) {
    if (!s.partial.empty()) emit(c, is_out, s.partial);
    s.partial.clear();
    ::close(s.fd);
    s.fd = -1;
  };
  auto stop_all = [&] {
    for (auto& c : kids) stop(c);
    stopping = true;
  };
  auto names = [](const std::vector<const child_process*>& list) {
    std::string s;
    for (const auto* c : list) s += (s.empty() ? "" : ", ") + c->name;
    return s;
  };

  for (;;) {
    // Reap whoever exited, without waiting.
    for (auto& c : kids) {
      if (c.exited) continue;
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r != c.pid && !(r < 0 && errno == ECHILD)) continue;
      c.exited = true;
      c.status = r == c.pid ? status : W_EXITCODE(255, 0);  // reaped elsewhere: its status is lost
      const bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
      if (!ok && !c.stop_sent && !c.killed && !stopping) {
        std::printf("%s: %s failed with %s; stopping the others\n", who.c_str(), c.name.c_str(),
                    describe_status(c.status).c_str());
        std::fflush(stdout);
        stop_all();
      }
    }
    const bool tasks_done =
        std::all_of(kids.begin(), kids.end(), [](const auto& c) { return c.kind != child_kind::task || c.exited; });
    if (tasks_done && !stopping) stop_all();

    const auto now = clock::now();
    const bool all_exited = std::all_of(kids.begin(), kids.end(), [](const auto& c) { return c.exited; });
    if (all_exited && !all_exited_at) all_exited_at = now;

    // Bound every wait: the run's deadline, and the grace after SIGTERM.
    if (!deadline_passed && now - first_start > limits.deadline) {
      deadline_passed = true;
      std::vector<const child_process*> running;
      for (auto& c : kids) {
        if (c.exited) continue;
        running.push_back(&c);
        std::printf("%s: %s at the deadline, its threads: %s\n", who.c_str(), c.name.c_str(),
                    detail::where_it_waits(c.pid).c_str());
        ::kill(c.pid, SIGKILL);
        c.killed = true;
      }
      if (!running.empty()) {
        std::printf("%s: %s still running after %lld s (%.*s); killing %s\n", who.c_str(), names(running).c_str(),
                    static_cast<long long>(limits.deadline.count()), static_cast<int>(limits.deadline_source.size()),
                    limits.deadline_source.data(), running.size() == 1 ? "it" : "them");
        std::fflush(stdout);
      }
    }
    for (auto& c : kids) {
      if (c.exited || c.killed || !c.stop_sent || now - *c.stop_sent <= limits.stop_grace) continue;
      std::printf("%s: %s did not stop within %lld s of SIGTERM; killing it\n", who.c_str(), c.name.c_str(),
                  static_cast<long long>(limits.stop_grace.count()));
      std::fflush(stdout);
      ::kill(c.pid, SIGKILL);
      c.killed = true;
    }

    // Forward output. A pipe still open a second after every child exited is
    // held by something the child left behind: stop reading it.
    std::vector<pollfd> pfds;
    std::vector<std::pair<child_process*, bool>> whose;  // child, is stdout
    for (auto& c : kids) {
      for (bool is_out : {true, false}) {
        child_process::stream& s = is_out ? c.out : c.err;
        if (s.fd < 0) continue;
        if (all_exited_at && now - *all_exited_at > std::chrono::seconds(1)) {
          close_stream(c, s, is_out);
          continue;
        }
        pfds.push_back({s.fd, POLLIN, 0});
        whose.emplace_back(&c, is_out);
      }
    }
    if (all_exited && pfds.empty()) break;
    const int n = ::poll(pfds.data(), pfds.size(), 100);
    if (n < 0 && errno != EINTR) throw std::system_error(errno, std::system_category(), "poll");
    for (std::size_t i = 0; n > 0 && i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      auto [c, is_out] = whose[i];
      child_process::stream& s = is_out ? c->out : c->err;
      char buf[4096];
      const ssize_t got = ::read(s.fd, buf, sizeof buf);
      if (got > 0) {
        s.partial.append(buf, static_cast<std::size_t>(got));
        std::size_t nl;
        while ((nl = s.partial.find('\n')) != std::string::npos) {
          emit(*c, is_out, s.partial.substr(0, nl));
          s.partial.erase(0, nl + 1);
        }
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close_stream(*c, s, is_out);
      }
    }
  }

  bool ok = !deadline_passed;
  for (const auto& c : kids) {
    // A server the launcher asked to stop may still die of that SIGTERM: one
    // that stopped serving on its own (a worker's shutdown) and is exiting
    // has put its handling back. That is the stop the launcher asked for.
    const bool stopped_as_asked = c.kind == child_kind::server && c.stop_sent && !c.killed && WIFSIGNALED(c.status) &&
                                  WTERMSIG(c.status) == SIGTERM;
    if (stopped_as_asked) continue;
    if (c.killed || !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
      if (c.killed) {
        std::printf("%s: %s was killed by the launcher\n", who.c_str(), c.name.c_str());
      } else {
        std::printf("%s: %s ended with %s\n", who.c_str(), c.name.c_str(), describe_status(c.status).c_str());
      }
      ok = false;
    }
  }
  std::fflush(stdout);
  return ok;
}

}  // namespace example
