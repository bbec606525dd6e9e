// supervise()'s verdict: what counts as a child ending well.
#include "common/launcher.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

using example::child_kind;
using example::child_process;

/// A server that never handles SIGTERM: it dies of the launcher's stop.
int server_dying_of_sigterm() {
  ::signal(SIGTERM, SIG_DFL);
  for (;;) ::pause();
}

sigset_t sigterm_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  return set;
}

/// A server that answers SIGTERM with a failing exit status. Its parent
/// blocked SIGTERM before forking it, so no stop can come before its wait.
int server_failing_on_sigterm() {
  const sigset_t set = sigterm_set();
  int sig = 0;
  ::sigwait(&set, &sig);
  return 3;
}

bool run(std::vector<child_process> kids) {
  std::vector<std::string> lines;
  return example::supervise(kids, [&](const child_process&, const std::string& l) { lines.push_back(l); });
}

}  // namespace

TEST_CASE("a server that dies of the SIGTERM that stopped it stopped as asked") {
  std::vector<child_process> kids;
  kids.push_back(example::spawn_function("ps:0", child_kind::server, server_dying_of_sigterm));
  kids.push_back(example::spawn_function("worker:0", child_kind::task, [] { return 0; }));
  CHECK(run(std::move(kids)));
}

TEST_CASE("a server that fails when stopped, or a failing task, fails the run") {
  {
    std::vector<child_process> kids;
    const sigset_t set = sigterm_set();
    sigset_t old;
    ::sigprocmask(SIG_BLOCK, &set, &old);
    kids.push_back(example::spawn_function("ps:0", child_kind::server, server_failing_on_sigterm));
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    kids.push_back(example::spawn_function("worker:0", child_kind::task, [] { return 0; }));
    CHECK_FALSE(run(std::move(kids)));
  }
  {
    std::vector<child_process> kids;
    kids.push_back(example::spawn_function("ps:0", child_kind::server, server_dying_of_sigterm));
    kids.push_back(example::spawn_function("worker:0", child_kind::task, [] { return 2; }));
    CHECK_FALSE(run(std::move(kids)));
  }
}

TEST_CASE("a task killed by a signal fails the run") {
  std::vector<child_process> kids;
  kids.push_back(example::spawn_function("worker:0", child_kind::task, [] {
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);
    return 0;
  }));
  CHECK_FALSE(run(std::move(kids)));
}

TEST_CASE("a task past the deadline is killed, and where it waited is said") {
  std::vector<child_process> kids;
  kids.push_back(example::spawn_function("worker:0", child_kind::task, [] {
    ::sleep(60);
    return 0;
  }));
  example::supervise_limits limits;
  limits.deadline = std::chrono::seconds(1);
  CHECK_FALSE(example::supervise(kids, {}, limits));
  CHECK(kids[0].killed);
  // This thread, reading its own entry, is running.
  const std::string self = example::detail::where_it_waits(::getpid());
  CHECK(self.find(std::to_string(::getpid()) + " R") != std::string::npos);
  CHECK(example::detail::where_it_waits(-1) == "no /proc entry");
}
