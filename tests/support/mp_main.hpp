#pragma once
/// The main() of the multi-process drivers that run over a TCP transport named on
/// the command line (rendezvous_mp, graph_mp): `driver <what> asio|uring`.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

namespace fusewire::test {

/// Checks the arguments, ignores SIGPIPE, bounds the driver with alarm(`seconds`)
/// and returns `run.template operator()<Transport>(argv[1])` for the transport named
/// by argv[2] (77, a skipped test, for uring in a build without liburing; 2 for bad
/// arguments). Prints "<what> over <transport>: passed|FAILED" unless `run` returned 2.
template <class Run>
int main_over_transport(int argc, char** argv, const char* what_usage, unsigned seconds, Run&& run) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s %s asio|uring\n", argv[0], what_usage);
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::alarm(seconds);  // the driver itself never hangs
  const std::string what = argv[1];
  const std::string transport = argv[2];
  int rc = 2;
  if (transport == "asio") {
    rc = run.template operator()<fusewire::asio_tcp>(what);
  } else if (transport == "uring") {
#if FUSEWIRE_HAS_URING
    rc = run.template operator()<fusewire::uring_tcp>(what);
#else
    std::printf("uring transport not built: skipped\n");
    return 77;
#endif
  } else {
    std::fprintf(stderr, "unknown transport '%s' (allowed: asio, uring)\n", transport.c_str());
    return 2;
  }
  if (rc != 2) std::printf("%s over %s: %s\n", what.c_str(), transport.c_str(), rc == 0 ? "passed" : "FAILED");
  return rc;
}

}  // namespace fusewire::test
