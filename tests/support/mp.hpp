#pragma once
/// Scaffolding shared by the multi-process tests (rendezvous_mp, verbs_mp, ps_mp,
/// graph_mp): each role runs in a forked child under its own alarm(), and the
/// driver reaps the children and says how each one ended.
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>

/// In a role's body (a function returning int): on failure, name the check and
/// the process, and return 1 (the child's exit status).
#define EXPECT(cond)                                                                                     \
  do {                                                                                                   \
    if (!(cond)) {                                                                                       \
      std::fprintf(stderr, "[pid %d] %s:%d: check failed: %s\n", ::getpid(), __FILE__, __LINE__, #cond); \
      return 1;                                                                                          \
    }                                                                                                    \
  } while (0)

namespace fusewire::test {

/// A pipe, made before fork(), that one process writes a byte to to tell another
/// it reached a point; wait() gives up after `ms` (false).
struct signal_pipe {
  int fds[2] = {-1, -1};
  signal_pipe() {
    if (::pipe(fds) != 0) std::exit(1);
  }
  void notify() const { (void)!::write(fds[1], "x", 1); }
  bool wait(int ms) const {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return false;
    char c;
    return ::read(fds[0], &c, 1) == 1;
  }
};

/// Runs `fn` in a forked child that `seconds` of alarm() bound; the child exits
/// with what `fn` returns (1 if it throws, after printing the exception, prefixed
/// by `who` or else by its pid). Both streams are flushed before the fork (nothing
/// buffered is printed twice) and before the child exits (nothing it printed is
/// lost). Returns the child's pid; exits the process if fork() fails.
inline pid_t spawn(unsigned seconds, const std::function<int()>& fn, const std::string& who = {}) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    ::alarm(seconds);
    int rc = 1;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      if (who.empty()) {
        std::fprintf(stderr, "[pid %d] exception: %s\n", ::getpid(), e.what());
      } else {
        std::fprintf(stderr, "[%s] %s\n", who.c_str(), e.what());
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  return pid;
}

/// Waits for `pid`; true if it exited 0. Otherwise prints how `what` ended
/// (a signal, naming the alarm as a hang, or its exit status) and returns false.
inline bool succeeded(pid_t pid, const char* what) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (WIFSIGNALED(status)) {
    std::fprintf(stderr, "%s died of signal %d%s\n", what, WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? " (its alarm: it hung)" : "");
  } else {
    std::fprintf(stderr, "%s exited with %d\n", what, WEXITSTATUS(status));
  }
  return false;
}

/// A spawned child and the name its failure is reported under.
struct child {
  pid_t pid;
  std::string name;
};

/// Waits for every one of `children` in order (all of them, also after one
/// failed); true if all exited 0, each failure printed as succeeded() does.
inline bool all_succeeded(std::initializer_list<child> children) {
  bool ok = true;
  for (const child& c : children) ok = succeeded(c.pid, c.name.c_str()) && ok;
  return ok;
}

/// Waits for `pid`, a child that is meant to kill itself with SIGKILL; true if
/// it did, else prints that `what` did not and returns false.
inline bool died_of_sigkill(pid_t pid, const char* what) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return true;
  std::fprintf(stderr, "%s was supposed to die of SIGKILL\n", what);
  return false;
}

/// SIGSTOPs the child `pid` and waits until every thread of it has stopped.
/// kill() only queues the signal: until the group stop completes, a thread of
/// the child that another event woke (a request arriving) may still run, and
/// on a loaded machine it may answer a request sent after kill() returned.
/// True once it stopped; false (printing why) if it ended instead, in which
/// case it has been reaped.
inline bool stop_child(pid_t pid, const char* what) {
  ::kill(pid, SIGSTOP);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WUNTRACED);
    if (r < 0 && errno == EINTR) continue;
    if (r == pid && WIFSTOPPED(status)) return true;
    std::fprintf(stderr, "%s ended instead of stopping (waitpid: %d, status %#x)\n", what, static_cast<int>(r),
                 static_cast<unsigned>(status));
    return false;
  }
}

/// SIGKILLs the child `pid` and reaps it: once this returns, it is gone.
inline void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

}  // namespace fusewire::test
