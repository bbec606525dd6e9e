// rendezvous_demo: moves tensors between two processes on loopback with the
// rendezvous API, verifies every byte, and prints a table.
//
// The program forks: the parent is task worker:0 (it sends), the child is
// ps:0 (it receives into posted destination buffers, checks every tensor and
// answers with how many were intact). Exit status 0 = every tensor verified.
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;

namespace {

constexpr auto op_timeout = 60s;
const fw::task_id sender_task{"worker", 0};
const fw::task_id receiver_task{"ps", 0};

void usage(std::FILE* out, const char* argv0) {
  std::fprintf(out,
               "usage: %s [--transport asio|uring] [--sizes LIST] [--count N]\n"
               "\n"
               "Forks a second process and moves tensors to it over loopback TCP with\n"
               "fusewire's rendezvous send/recv, verifying every byte.\n"
               "\n"
               "  --transport asio|uring  TCP transport (default: uring when built, else asio)\n"
               "  --sizes LIST            comma-separated tensor sizes, with optional K/M suffix\n"
               "                          (default: 1,1K,64K,1M,16M; each at most 256M)\n"
               "  --count N               tensors per size (default: enough for ~64 MiB, 4..2000)\n"
               "  --help                  this text\n",
               argv0);
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

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::system_error(errno, std::system_category(), "cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
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

fw::options demo_options() {
  fw::options o;
  o.mode = fw::reactor_mode::adaptive;
  o.connect_timeout = 20000ms;
  return o;
}

/// The child: receives `count` tensors of each size, checks them, answers with the number intact.
template <class T>
int receiver(const fw::cluster_spec& spec, const std::vector<std::size_t>& sizes, const std::vector<unsigned>& counts) {
  rv::endpoint<T> ep(receiver_task, spec, {.options = demo_options()});
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const std::size_t n = sizes[s];
    const auto expect = pattern(n, static_cast<std::uint32_t>(n));
    std::atomic<unsigned> left{counts[s]}, intact{0};
    std::promise<void> all;
    for (unsigned i = 0; i < counts[s]; ++i) {
      ep.recv(
          sender_task, "t/" + std::to_string(n) + "/" + std::to_string(i), fw::tensor_buffer::allocate(n),
          [&](std::error_code ec, fw::tensor_buffer b) {
            if (!ec && b.size() == n && (n == 0 || std::memcmp(b.data(), expect.data(), n) == 0)) ++intact;
            if (ec) std::fprintf(stderr, "receiver: a %s tensor failed: %s\n", human(n).c_str(), ec.message().c_str());
            if (--left == 0) all.set_value();
          },
          op_timeout);
    }
    all.get_future().wait();
    auto answer = fw::tensor_buffer::allocate(sizeof(std::uint32_t));
    const std::uint32_t good = intact.load();
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
  rv::endpoint<T> ep(sender_task, spec, {.options = demo_options()});
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
int run(const std::vector<std::size_t>& sizes, const std::vector<unsigned>& counts) {
  const std::uint16_t ps_port = free_port();
  std::uint16_t worker_port = free_port();
  while (worker_port == ps_port) worker_port = free_port();
  const auto spec = fw::cluster_spec::from_string("ps=127.0.0.1:" + std::to_string(ps_port) +
                                                  ";worker=127.0.0.1:" + std::to_string(worker_port));
  std::printf("rendezvous_demo: worker:0 (pid %d) -> ps:0 over %s on 127.0.0.1 (ports %u, %u)\n", ::getpid(),
              T::name().data(), worker_port, ps_port);
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("rendezvous_demo: fork");
    return 1;
  }
  if (child == 0) {
    ::alarm(600);
    int rc = 1;
    try {
      rc = receiver<T>(spec, sizes, counts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rendezvous_demo (receiver): %s\n", e.what());
    }
    std::fflush(stderr);
    ::_exit(rc);
  }
  int rc = 1;
  try {
    rc = sender<T>(spec, sizes, counts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_demo: %s\n", e.what());
  }
  if (rc != 0) ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "rendezvous_demo: the receiving process failed (status %d)\n", status);
    rc = 1;
  }
  std::printf("%s\n", rc == 0 ? "rendezvous_demo: all tensors verified byte for byte" : "rendezvous_demo: FAILED");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport =
#if FUSEWIRE_HAS_URING
      "uring";
#else
      "asio";
#endif
  std::vector<std::size_t> sizes{1, 1024, 64 * 1024, 1 << 20, 16 << 20};
  std::optional<unsigned> count;
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
  ::signal(SIGPIPE, SIG_IGN);
  if (transport == "asio") return run<fw::asio_tcp>(sizes, counts);
  if (transport == "uring") {
#if FUSEWIRE_HAS_URING
    return run<fw::uring_tcp>(sizes, counts);
#else
    std::fprintf(stderr,
                 "rendezvous_demo: this build has no io_uring transport (liburing not found); use --transport asio\n");
    return 2;
#endif
  }
  std::fprintf(stderr, "rendezvous_demo: --transport '%s' is not one of: asio, uring\n", transport.c_str());
  return 2;
}
