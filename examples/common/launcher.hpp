// A one-command local launcher for the examples: starts this same program
// again as each task of a cluster on loopback, prefixes and forwards their
// output, collects their "@result" lines, and stops the parameter servers
// once every worker is done.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

namespace example {

/// A loopback TCP port nobody listens on right now.
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw std::system_error(err, std::system_category(), "cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// "ps=127.0.0.1:p,...;worker=127.0.0.1:p,..." with distinct free ports.
inline std::string loopback_cluster(unsigned ps, unsigned workers) {
  std::vector<std::uint16_t> used;
  auto port = [&] {
    for (;;) {
      const std::uint16_t p = free_port();
      bool dup = false;
      for (auto u : used) dup = dup || u == p;
      if (!dup) {
        used.push_back(p);
        return p;
      }
    }
  };
  std::string s = "ps=";
  for (unsigned i = 0; i < ps; ++i) s += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(port());
  s += ";worker=";
  for (unsigned i = 0; i < workers; ++i) s += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(port());
  return s;
}

/// One task started by the launcher.
struct child_process {
  std::string name;  // "ps:0", "worker:3"
  bool is_worker = false;
  pid_t pid = -1;
  int out = -1;  // read end of the child's stdout+stderr
  std::string partial;
  int status = 0;
  bool exited = false;
};

/// Runs `args` (argv[0] is replaced by this executable) with stdout and stderr into a pipe.
inline child_process spawn_self(std::string name, bool is_worker, const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::system_category(), "pipe");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::system_category(), "fork");
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "cannot exec /proc/self/exe: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  child_process c;
  c.name = std::move(name);
  c.is_worker = is_worker;
  c.pid = pid;
  c.out = fds[0];
  return c;
}

/// Forwards every child's lines (prefixed "[name] "), except lines starting
/// with '@', which go to `on_result(child, line)`. When every worker has
/// exited, sends SIGTERM to the others (the parameter servers); after
/// `deadline` kills everything. Returns true if every child exited with 0.
inline bool supervise(std::vector<child_process>& kids,
                      const std::function<void(const child_process&, const std::string&)>& on_result,
                      std::chrono::seconds deadline) {
  const auto start = std::chrono::steady_clock::now();
  bool ps_stopped = false, killed = false;
  auto emit = [&](child_process& c, std::string line) {
    if (!line.empty() && line[0] == '@') {
      on_result(c, line);
    } else {
      std::printf("[%s] %s\n", c.name.c_str(), line.c_str());
      std::fflush(stdout);
    }
  };
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<child_process*> who;
    for (auto& c : kids) {
      if (c.out >= 0) {
        pfds.push_back({c.out, POLLIN, 0});
        who.push_back(&c);
      }
    }
    if (pfds.empty()) break;
    const int n = ::poll(pfds.data(), pfds.size(), 500);
    if (n < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      child_process& c = *who[i];
      char buf[4096];
      const ssize_t got = ::read(c.out, buf, sizeof buf);
      if (got > 0) {
        c.partial.append(buf, static_cast<std::size_t>(got));
        std::size_t nl;
        while ((nl = c.partial.find('\n')) != std::string::npos) {
          emit(c, c.partial.substr(0, nl));
          c.partial.erase(0, nl + 1);
        }
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        if (!c.partial.empty()) emit(c, c.partial);
        ::close(c.out);
        c.out = -1;
        ::waitpid(c.pid, &c.status, 0);
        c.exited = true;
        if (c.is_worker && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) && !ps_stopped) {
          std::printf("launcher: %s failed (status %d); stopping the others\n", c.name.c_str(), c.status);
          for (auto& o : kids) {
            if (!o.exited) ::kill(o.pid, SIGTERM);
          }
          ps_stopped = true;
        }
      }
    }
    bool workers_done = true;
    for (auto& c : kids) workers_done = workers_done && (!c.is_worker || c.exited);
    if (workers_done && !ps_stopped) {
      for (auto& c : kids) {
        if (!c.exited) ::kill(c.pid, SIGTERM);
      }
      ps_stopped = true;
    }
    if (!killed && std::chrono::steady_clock::now() - start > deadline) {
      std::printf("launcher: still running after %llds; killing every task\n",
                  static_cast<long long>(deadline.count()));
      for (auto& c : kids) {
        if (!c.exited) ::kill(c.pid, SIGKILL);
      }
      killed = true;
    }
  }
  bool ok = !killed;
  for (auto& c : kids) {
    if (!c.exited) ::waitpid(c.pid, &c.status, 0);
    if (!(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
      std::printf("launcher: %s exited with status %d\n", c.name.c_str(),
                  WIFEXITED(c.status) ? WEXITSTATUS(c.status) : 128 + WTERMSIG(c.status));
      ok = false;
    }
  }
  return ok;
}

}  // namespace example
