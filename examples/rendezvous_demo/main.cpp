// rendezvous_demo: moves tensors between two processes on loopback with the
// rendezvous API, verifies every byte, and prints a table.
//
// The program forks: the parent is task worker:0 (it sends), the child is
// ps:0 (it receives into posted destination buffers, checks every tensor and
// answers with how many were intact). Exit status 0 = every tensor verified.
#include <fusewire/rendezvous/endpoint.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/launcher.hpp"
#include "common/options.hpp"
#include "common/ports.hpp"
#include "common/transport.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;

namespace {

constexpr auto op_timeout = 60s;
constexpr unsigned default_timeout_seconds = 600;
const fw::task_id sender_task{"worker", 0};
const fw::task_id receiver_task{"ps", 0};

void usage(std::FILE* out, const char* argv0) {
  std::fprintf(out,
               "usage: %s [--transport NAME] [--sizes LIST] [--count N] [--timeout S]\n"
               "\n"
               "Forks a second process and moves tensors to it on this host (loopback) with\n"
               "fusewire's rendezvous send/recv, verifying every byte.\n"
               "\n"
               "  --transport NAME        auto (default: shm, as both tasks are on this host),\n"
               "                          uring, asio or shm\n"
               "  --sizes LIST            comma-separated tensor sizes, with optional K/M suffix\n"
               "                          (default: 1,1K,64K,1M,16M; each at most 256M)\n"
               "  --count N               tensors per size (default: enough for ~64 MiB, 4..2000)\n"
               "  --timeout S             stop the receiving process if it still runs S seconds after\n"
               "                          it started (default %u)\n"
               "  --help                  this text\n"
               "\n"
               "fusewire's environment knobs apply (docs/configuration.md), e.g. FUSEWIRE_CLUSTER_TOKEN.\n",
               argv0, default_timeout_seconds);
}

std::optional<std::size_t> parse_size(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  const char last = s.back();
  if (last == 'K' || last == 'k') mult = 1024;
  if (last == 'M' || last == 'm') mult = 1024 * 1024;
  if (mult != 1) s.remove_suffix(1);
  if (s.empty() || s.size() > 12) return std::nullopt;
  std::size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::size_t>(c - '0');
  }
  return v * mult;
}

fw::tensor_buffer pattern(std::size_t n, std::uint32_t seed) {
  auto b = fw::tensor_buffer::allocate(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    b.data()[i] = static_cast<std::byte>(x >> 24);
  }
  return b;
}

std::string human(std::size_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

/// The environment's options for task `t`; a peer that cannot be reached fails after 20 s
/// unless FUSEWIRE_CONNECT_TIMEOUT_MS says otherwise.
fw::options demo_options(const fw::task_id& t) {
  return example::task_options(example::role_of_job(t.job), {}, {.connect_timeout = 20000ms});
}

/// The child: receives `count` tensors of each size, checks them, answers with the number intact.
template <class T>
int receiver(const fw::cluster_spec& spec, const std::vector<std::size_t>& sizes, const std::vector<unsigned>& counts) {
  rv::endpoint<T> ep(receiver_task, spec, {.options = demo_options(receiver_task)});
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const std::size_t n = sizes[s];
    // Shared with the callbacks: one that fires after the bounded wait below gave up still finds it.
    struct tally {
      fw::tensor_buffer expect;
      std::atomic<unsigned> left{0}, intact{0};
      std::promise<void> all;
    };
    auto t = std::make_shared<tally>();
    t->expect = pattern(n, static_cast<std::uint32_t>(n));
    t->left = counts[s];
    std::future<void> all = t->all.get_future();
    for (unsigned i = 0; i < counts[s]; ++i) {
      ep.recv(
          sender_task, "t/" + std::to_string(n) + "/" + std::to_string(i), fw::tensor_buffer::allocate(n),
          [t, n](std::error_code ec, fw::tensor_buffer b) {
            if (!ec && b.size() == n && (n == 0 || std::memcmp(b.data(), t->expect.data(), n) == 0)) ++t->intact;
            if (ec) std::fprintf(stderr, "receiver: a %s tensor failed: %s\n", human(n).c_str(), ec.message().c_str());
            if (--t->left == 0) t->all.set_value();
          },
          op_timeout);
    }
    // Every recv completes within op_timeout, with its tensor or an error; a few seconds more is a bug.
    if (all.wait_for(op_timeout + 5s) != std::future_status::ready) {
      std::fprintf(stderr, "receiver: %u of %u %s tensors still pending after %lld s\n", t->left.load(), counts[s],
                   human(n).c_str(), static_cast<long long>((op_timeout + 5s).count()));
      return 1;
    }
    auto answer = fw::tensor_buffer::allocate(sizeof(std::uint32_t));
    const std::uint32_t good = t->intact.load();
    std::memcpy(answer.data(), &good, sizeof good);
    if (auto ec = ep.send_sync(sender_task, "ack/" + std::to_string(n), std::move(answer), op_timeout)) {
      std::fprintf(stderr, "receiver: cannot answer: %s\n", ec.message().c_str());
      return 1;
    }
  }
  return 0;
}

struct row {
  std::size_t size;
  unsigned count;
  unsigned intact;
  double seconds;
};

/// The parent: sends, waits for each size's answer, prints the table.
template <class T>
int sender(const fw::cluster_spec& spec, const std::vector<std::size_t>& sizes, const std::vector<unsigned>& counts) {
  rv::endpoint<T> ep(sender_task, spec, {.options = demo_options(sender_task)});
  std::vector<row> rows;
  bool ok = true;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const std::size_t n = sizes[s];
    const auto tensor = pattern(n, static_cast<std::uint32_t>(n));
    std::atomic<unsigned> failed{0};
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 0; i < counts[s]; ++i) {
      ep.send(
          receiver_task, "t/" + std::to_string(n) + "/" + std::to_string(i), tensor.share(),
          [&failed](std::error_code ec) {
            if (ec) ++failed;
          },
          op_timeout);
    }
    rv::recv_result ack = ep.recv_sync(receiver_task, "ack/" + std::to_string(n), op_timeout);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ack.ec || ack.buffer.size() != sizeof(std::uint32_t)) {
      std::fprintf(stderr, "rendezvous_demo: no answer for %s tensors: %s\n", human(n).c_str(),
                   ack.ec ? ack.ec.message().c_str() : "bad answer size");
      return 1;
    }
    std::uint32_t intact = 0;
    std::memcpy(&intact, ack.buffer.data(), sizeof intact);
    rows.push_back({n, counts[s], intact, secs});
    std::printf("  %-10s x %-5u ... %s\n", human(n).c_str(), counts[s],
                intact == counts[s] && failed == 0 ? "verified" : "MISMATCH");
    std::fflush(stdout);
    if (intact != counts[s] || failed != 0) ok = false;
  }
  std::printf("\n%-10s %7s %9s %10s %s\n", "size", "count", "verified", "MB/s", "transport");
  for (const row& r : rows) {
    const double mbps = r.seconds > 0 ? static_cast<double>(r.size) * r.count / r.seconds / 1e6 : 0.0;
    std::printf("%-10s %7u %9u %10.1f %s\n", human(r.size).c_str(), r.count, r.intact, mbps, T::name().data());
  }
  return ok ? 0 : 1;
}

template <class T>
int run(const fw::cluster_spec& spec, const std::vector<std::size_t>& sizes, const std::vector<unsigned>& counts,
        unsigned timeout_seconds) {
  std::printf("rendezvous_demo: worker:0 (pid %d) -> ps:0 over %s on 127.0.0.1 (ports %u, %u)\n", ::getpid(),
              T::name().data(), spec.control_endpoint(sender_task).port, spec.control_endpoint(receiver_task).port);
  std::fflush(stdout);
  std::vector<example::child_process> kids;
  kids.push_back(example::spawn_function(receiver_task.to_string(), example::child_kind::task, [&] {
    try {
      return receiver<T>(spec, sizes, counts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rendezvous_demo (receiver): %s\n", e.what());
      return 1;
    }
  }));
  int rc = 1;
  try {
    rc = sender<T>(spec, sizes, counts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_demo: %s\n", e.what());
  }
  if (rc != 0) example::stop(kids.front());
  if (!example::supervise(kids, {}, {.deadline = std::chrono::seconds(timeout_seconds)}, "rendezvous_demo")) rc = 1;
  std::printf("%s\n", rc == 0 ? "rendezvous_demo: all tensors verified byte for byte" : "rendezvous_demo: FAILED");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport = example::default_transport;
  std::vector<std::size_t> sizes{1, 1024, 64 * 1024, 1 << 20, 16 << 20};
  std::optional<unsigned> count;
  unsigned timeout_seconds = default_timeout_seconds;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](const char* name) -> std::string_view {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rendezvous_demo: %s needs a value (see --help)\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      usage(stdout, argv[0]);
      return 0;
    } else if (arg == "--transport") {
      transport = value("--transport");
    } else if (arg == "--sizes") {
      sizes.clear();
      std::string_view list = value("--sizes");
      while (!list.empty()) {
        const auto comma = list.find(',');
        const std::string_view item = list.substr(0, comma);
        const auto n = parse_size(item);
        if (!n || *n > (256u << 20)) {
          std::fprintf(stderr, "rendezvous_demo: --sizes: '%.*s' is not a size from 0 to 256M (e.g. 1,4K,2M)\n",
                       static_cast<int>(item.size()), item.data());
          return 2;
        }
        sizes.push_back(*n);
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
      }
      if (sizes.empty()) {
        std::fprintf(stderr, "rendezvous_demo: --sizes needs at least one size\n");
        return 2;
      }
    } else if (arg == "--count") {
      const auto n = parse_size(value("--count"));
      if (!n || *n == 0 || *n > 100000) {
        std::fprintf(stderr, "rendezvous_demo: --count must be a number from 1 to 100000\n");
        return 2;
      }
      count = static_cast<unsigned>(*n);
    } else if (arg == "--timeout") {
      const auto n = parse_size(value("--timeout"));
      if (!n || *n == 0 || *n > 86400) {
        std::fprintf(stderr, "rendezvous_demo: --timeout must be a number of seconds from 1 to 86400\n");
        return 2;
      }
      timeout_seconds = static_cast<unsigned>(*n);
    } else {
      std::fprintf(stderr, "rendezvous_demo: unknown argument '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  std::vector<unsigned> counts;
  for (std::size_t n : sizes) {
    counts.push_back(
        count ? *count
              : static_cast<unsigned>(std::clamp<std::size_t>((64u << 20) / std::max<std::size_t>(n, 1), 4, 2000)));
  }
  if (auto problem = example::transport_problem(transport)) {
    std::fprintf(stderr, "rendezvous_demo: --transport %s: %s (see --help)\n", transport.c_str(), problem->c_str());
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  try {
    const fw::options o = demo_options(sender_task);  // a bad environment knob is reported before anything starts
    (void)demo_options(receiver_task);
    const auto spec = fw::cluster_spec::from_string(example::host_cluster({{"ps", 1}, {"worker", 1}}));
    return example::with_transport(transport, o, spec,
                                   [&]<class T>() { return run<T>(spec, sizes, counts, timeout_seconds); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_demo: %s\n", e.what());
    return 1;
  }
}
