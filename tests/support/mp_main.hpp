#pragma once
/// The main() of the multi-process drivers that run over a transport named on
/// the command line (rendezvous_mp, graph_mp): `driver <what> asio|uring|verbs`.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif
#if FUSEWIRE_HAS_RDMA
#include <fusewire/transport/verbs.hpp>
#endif

namespace fusewire::test {

/// Checks the arguments, ignores SIGPIPE, bounds the driver with alarm(`seconds`)
/// and returns `run.template operator()<Transport>(argv[1])` for the transport named
/// by argv[2] (77, a skipped test, for uring or verbs in a build without liburing
/// or rdma-core; 2 for bad arguments); verbs needs an RDMA device (the test
/// guest). Prints "<what> over <transport>: passed|FAILED" unless `run` returned 2.
/// `WithVerbs` = false keeps verbs out of drivers whose scenarios are TCP-only
/// (and spares their build the verbs instantiations).
template <bool WithVerbs = false, class Run>
int main_over_transport(int argc, char** argv, const char* what_usage, unsigned seconds, Run&& run) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s %s asio|uring%s\n", argv[0], what_usage, WithVerbs ? "|verbs" : "");
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
  } else if (WithVerbs && transport == "verbs") {
#if FUSEWIRE_HAS_RDMA
    if constexpr (WithVerbs) rc = run.template operator()<fusewire::verbs>(what);
#else
    std::printf("verbs transport not built: skipped\n");
    return 77;
#endif
  } else {
    std::fprintf(stderr, "unknown transport '%s' (allowed: asio, uring%s)\n", transport.c_str(),
                 WithVerbs ? ", verbs" : "");
    return 2;
  }
  if (rc != 2) std::printf("%s over %s: %s\n", what.c_str(), transport.c_str(), rc == 0 ? "passed" : "FAILED");
  return rc;
}

}  // namespace fusewire::test
