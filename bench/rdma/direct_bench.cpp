// Steady training steps through rendezvous::endpoint<verbs>, one worker
// sending to one PS (two endpoints of one process on the RDMA device), the
// PS's recv posted before the send. Per step: time from send() to the recv's
// completion. Paths, alternated round by round in the same run:
//   direct   registered destination and source: the sender RDMA-writes into the
//            destination it found advertised (rendezvous/detail/rdma_direct.hpp)
//   staged   registered destination, ordinary source: one copy into a
//            registered staging block on the sender, then the same write
//   stream   ordinary destination: the verbs byte stream (bulk windows of the
//            receiver's staging chunks, then a copy into the destination)
// Prints the median step time and MiB/s per path and size (median of the
// rounds' medians; the order of the paths rotates every round) and the ratio
// to `stream`.
//
//   direct_bench [--rounds N] [--steps N] [--sizes B,B,...]
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/verbs.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/patterns.hpp"
#include "support/ports.hpp"
#include "support/verbs_setup.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;
using ep_t = rv::endpoint<fw::verbs>;

namespace {

const fw::task_id ps0{"ps", 0};
const fw::task_id w0{"worker", 0};
const char* const paths[] = {"direct", "staged", "stream"};

[[noreturn]] void usage(const char* bad) {
  if (bad != nullptr) std::fprintf(stderr, "direct_bench: bad argument '%s'\n", bad);
  std::fprintf(stderr,
               "usage: direct_bench [--rounds N] [--steps N] [--sizes B,B,...]\n"
               "  steady rendezvous steps over verbs (recv posted first): direct placement vs staged vs\n"
               "  the stream path; default 5 rounds of 30 steps, sizes 65536,4194304\n");
  std::exit(bad != nullptr ? 2 : 0);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct bench {
  fw::cluster_spec spec;
  ep_t ps, w;
  bench(fw::cluster_spec s, fw::options o)
      : spec(std::move(s)),
        ps(ps0, spec, {.options = o, .transport = fw::test::small_verbs()}),
        w(w0, spec, {.options = o, .transport = fw::test::small_verbs()}) {
    if (w.send_sync(ps0, "warm", fw::test::pattern(16, 1), 60s) || ps.recv_sync(w0, "warm", 60s).ec) {
      std::fprintf(stderr, "direct_bench: warm-up exchange failed\n");
      std::exit(1);
    }
  }

  /// Median step time (seconds) of `steps` steps on `path` with `n`-byte tensors.
  double run(const std::string& path, std::size_t n, int steps) {
    const std::string key = path + "/" + std::to_string(n);
    fw::tensor_buffer dst = path == "stream" ? fw::tensor_buffer::allocate(n) : ps.allocate_registered(n);
    fw::tensor_buffer src = path == "direct" ? w.allocate_registered(n) : fw::tensor_buffer::allocate(n);
    std::memset(src.data(), 7, n);
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) {
      const std::uint64_t adverts = w.rdma_stats().adverts_received;
      std::promise<std::error_code> got;
      auto got_f = got.get_future();
      ps.recv(w0, key, dst.share(), [&got](std::error_code ec, fw::tensor_buffer) { got.set_value(ec); });
      // The recv is posted long before the send, as in a training step.
      if (path != "stream") {
        while (w.rdma_stats().adverts_received == adverts) std::this_thread::sleep_for(50us);
      } else {
        std::this_thread::sleep_for(1ms);
      }
      const auto t0 = std::chrono::steady_clock::now();
      w.send(ps0, key, src.share(), [](std::error_code) {});
      const std::error_code ec = got_f.get();
      const auto t1 = std::chrono::steady_clock::now();
      if (ec) {
        std::fprintf(stderr, "direct_bench: %s step %d: %s\n", key.c_str(), i, ec.message().c_str());
        std::exit(1);
      }
      times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    return median(times);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, steps = 30;
  std::vector<std::size_t> sizes{65536, 4194304};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(nullptr);
    if (i + 1 >= argc) usage(argv[i]);
    const char* v = argv[++i];
    char* end = nullptr;
    if (a == "--rounds") {
      rounds = static_cast<int>(std::strtol(v, &end, 10));
      if (*end != '\0' || rounds < 1) usage(v);
    } else if (a == "--steps") {
      steps = static_cast<int>(std::strtol(v, &end, 10));
      if (*end != '\0' || steps < 1) usage(v);
    } else if (a == "--sizes") {
      sizes.clear();
      for (const char* p = v; *p != '\0';) {
        const unsigned long long n = std::strtoull(p, &end, 10);
        if (end == p || n <= 8192 || (*end != ',' && *end != '\0')) usage(v);
        sizes.push_back(static_cast<std::size_t>(n));
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      usage(argv[i - 1]);
    }
  }
  std::string why;
  if (!fw::verbs::available(why)) {
    std::printf("SKIP direct_bench: no usable RDMA device here: %s\n", why.c_str());
    return 77;
  }
  ::signal(SIGPIPE, SIG_IGN);
  fw::options o;
  o.mode = std::getenv("FUSEWIRE_BENCH_POLL") != nullptr ? fw::reactor_mode::poll : fw::reactor_mode::block;
  o.pool_size = 8u << 20;
  o.connect_timeout = 30000ms;
  o.insecure = true;  // both endpoints are this process, on the test guest's private RDMA network
  const std::string a = fw::test::rdma_host();
  bench b(fw::cluster_spec::from_string("ps=" + a + ":" + std::to_string(fw::test::free_port()) + ";worker=" + a + ":" +
                                        std::to_string(fw::test::free_port())),
          o);
  std::map<std::pair<std::string, std::size_t>, std::vector<double>> medians;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t n : sizes) {
      // The path that runs first changes every round.
      for (int k = 0; k < 3; ++k) {
        const char* p = paths[(k + r) % 3];
        medians[{p, n}].push_back(b.run(p, n, steps));
      }
    }
    std::fprintf(stderr, "round %d/%d done\n", r + 1, rounds);
  }
  std::printf("%-8s %10s %12s %10s %14s\n", "path", "bytes", "step (us)", "MiB/s", "vs stream");
  for (std::size_t n : sizes) {
    const double stream = median(medians[{"stream", n}]);
    for (const char* p : paths) {
      const double t = median(medians[{p, n}]);
      std::printf("%-8s %10zu %12.1f %10.1f %13.2fx\n", p, n, t * 1e6, static_cast<double>(n) / t / (1 << 20),
                  stream / t);
    }
  }
  const auto d = b.w.rdma_stats();
  std::printf("worker: %llu direct writes (%llu staged), %llu declined\n",
              static_cast<unsigned long long>(d.direct_writes), static_cast<unsigned long long>(d.staged_writes),
              static_cast<unsigned long long>(d.declined));
  return 0;
}
