// transport_pingpong: round-trip latency of a small message over loopback TCP
// and over shared memory, for each transport and reactor mode, next to plain C
// sockets (blocking and busy-polling) measured in the same run. Client and
// server run on different threads, pinned to different allowed CPUs when there
// are two. The transports alone, without the rendezvous layer above them.
//
//   transport_pingpong [--iterations N] [--size BYTES] [--warmup N]
//                      [--transport asio|uring|shm|all] [--mode poll|block|adaptive|all]
//                      [--server-read some|exact]
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/shm.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/dial.hpp"

namespace fw = fusewire;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
  std::size_t iterations = 20000;
  std::size_t warmup = 2000;
  std::size_t size = 10;
  std::string transport = "all";
  std::string mode = "all";
  bool server_read_some = true;
  bool pin = true;
  bool baseline = true;
};

struct summary {
  double p50 = 0, p99 = 0, mean = 0;
};

summary summarize(std::vector<double> us) {
  summary s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  double sum = 0;
  for (double v : us) sum += v;
  s.mean = sum / static_cast<double>(us.size());
  return s;
}

std::vector<int> cpus() {
  std::error_code ec;
  auto c = fw::detail::allowed_cpus(ec);
  if (ec || c.empty()) return {};
  return c;
}

/// Pins the calling thread to `cpu`; -1 restores the mask it had at start.
void pin_self(int cpu) {
  static cpu_set_t original = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    ::sched_getaffinity(0, sizeof set, &set);
    return set;
  }();
  if (cpu >= 0) {
    (void)fw::detail::pin_thread(::pthread_self(), cpu);
  } else {
    ::sched_setaffinity(0, sizeof original, &original);
  }
}

// ---- plain C sockets ---------------------------------------------------------

int listen_loopback(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) {
    std::perror("bind/listen");
    std::exit(1);
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int connect_loopback(std::uint16_t port) {
  const int fd = fw::test::dial_loopback(port);
  if (fd < 0) {
    std::perror("connect");
    std::exit(1);
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/// Reads exactly n bytes; busy-polls with MSG_DONTWAIT when `spin`.
bool read_exact(int fd, char* p, std::size_t n, bool spin) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, p + got, n - got, spin ? MSG_DONTWAIT : 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return false;
    }
  }
  return true;
}

bool write_all(int fd, const char* p, std::size_t n) {
  std::size_t put = 0;
  while (put < n) {
    const ssize_t r = ::send(fd, p + put, n - put, MSG_NOSIGNAL);
    if (r <= 0) return false;
    put += static_cast<std::size_t>(r);
  }
  return true;
}

summary plain_c(const settings& s, bool spin, int server_cpu, int client_cpu) {
  std::uint16_t port = 0;
  const int lfd = listen_loopback(port);
  std::thread server([&] {
    pin_self(server_cpu);
    const int fd = ::accept(lfd, nullptr, nullptr);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<char> buf(s.size);
    while (read_exact(fd, buf.data(), s.size, spin) && write_all(fd, buf.data(), s.size)) {
    }
    ::close(fd);
  });
  pin_self(client_cpu);
  const int fd = connect_loopback(port);
  std::vector<char> buf(s.size, 'x');
  std::vector<double> us;
  us.reserve(s.iterations);
  for (std::size_t i = 0; i < s.warmup + s.iterations; ++i) {
    const auto t0 = clock_type::now();
    write_all(fd, buf.data(), s.size);
    read_exact(fd, buf.data(), s.size, spin);
    const auto t1 = clock_type::now();
    if (i >= s.warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  ::close(fd);
  server.join();
  ::close(lfd);
  pin_self(-1);
  return summarize(std::move(us));
}

// ---- fusewire transports -------------------------------------------------------

template <class T>
summary fusewire_pingpong(const settings& s, fw::reactor_mode mode, bool pin) {
  using reactor_t = typename T::reactor_type;
  using conn_t = typename T::connection_type;
  using group_t = fw::basic_reactor_group<typename reactor_t::engine_type>;
  fw::reactor_config cfg;
  cfg.mode = mode;
  cfg.count = 2;
  cfg.pin_cores = pin;
  T transport;
  std::vector<double> us;
  us.reserve(s.iterations);
  {
    group_t group(cfg);
    // Server on reactor 0: echo `size` bytes at a time.
    auto port_future = group.submit(0, [&] {
      struct server : std::enable_shared_from_this<server> {
        typename T::listener_type listener;
        conn_t conn;
        std::vector<std::byte> buf;
        bool read_some = true;
        std::size_t have = 0;
        void accept() {
          listener.async_accept([self = this->shared_from_this()](std::error_code ec, conn_t c) {
            if (ec) return;
            self->conn = std::move(c);
            self->next();
          });
        }
        void next() {
          if (read_some) {
            conn.async_read_some([self = this->shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
              if (ec) return;
              auto held = std::make_shared<fw::tensor_buffer>(std::move(b));
              const fw::const_buffer one[] = {held->bytes()};
              self->conn.async_write(one, [held](std::error_code, std::size_t) {});
              self->next();
            });
          } else {
            conn.async_read(fw::mutable_buffer(buf),
                            [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                              if (ec) return;
                              const fw::const_buffer one[] = {fw::const_buffer(self->buf)};
                              self->conn.async_write(one, [](std::error_code, std::size_t) {});
                              self->next();
                            });
          }
        }
      };
      auto srv = std::make_shared<server>();
      srv->buf.resize(s.size);
      srv->read_some = s.server_read_some;
      srv->listener = transport.listen(*reactor_t::current(), "127.0.0.1", 0);
      srv->accept();
      return srv->listener.port();
    });
    const std::uint16_t port = port_future.get();
    std::promise<void> done;
    group.submit_to(1, [&] {
      struct client : std::enable_shared_from_this<client> {
        conn_t conn;
        std::vector<std::byte> out, in;
        std::size_t left = 0, warmup = 0;
        std::vector<double>* us = nullptr;
        std::promise<void>* done = nullptr;
        clock_type::time_point t0;
        void round() {
          if (left == 0) {
            conn.close();
            done->set_value();
            return;
          }
          t0 = clock_type::now();
          const fw::const_buffer one[] = {fw::const_buffer(out)};
          conn.async_write(one, [](std::error_code, std::size_t) {});
          conn.async_read(fw::mutable_buffer(in), [self = this->shared_from_this()](std::error_code ec, std::size_t) {
            if (ec) {
              std::fprintf(stderr, "pingpong: read failed: %s\n", ec.message().c_str());
              self->left = 0;
            } else {
              const auto t1 = clock_type::now();
              if (self->warmup != 0) {
                --self->warmup;
              } else {
                self->us->push_back(std::chrono::duration<double, std::micro>(t1 - self->t0).count());
                --self->left;
              }
            }
            self->round();
          });
        }
      };
      auto c = std::make_shared<client>();
      c->out.assign(s.size, std::byte{'x'});
      c->in.resize(s.size);
      c->left = s.iterations;
      c->warmup = s.warmup;
      c->us = &us;
      c->done = &done;
      transport.connect(*reactor_t::current(), "127.0.0.1", port, [c](std::error_code ec, conn_t conn) {
        if (ec) {
          std::fprintf(stderr, "pingpong: connect failed: %s\n", ec.message().c_str());
          c->done->set_value();
          return;
        }
        c->conn = std::move(conn);
        c->round();
      });
    });
    done.get_future().get();
  }
  return summarize(std::move(us));
}

const char* mode_name(fw::reactor_mode m) {
  return m == fw::reactor_mode::poll ? "poll" : m == fw::reactor_mode::block ? "block" : "adaptive";
}

void row(const char* what, const char* mode, const summary& s, double base) {
  std::printf("%-22s %-9s %9.2f %9.2f %9.2f", what, mode, s.p50, s.p99, s.mean);
  if (base > 0) std::printf("   %5.2fx", s.p50 / base);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "transport_pingpong: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--iterations") {
      s.iterations = std::stoul(value());
    } else if (a == "--warmup") {
      s.warmup = std::stoul(value());
    } else if (a == "--size") {
      s.size = std::stoul(value());
    } else if (a == "--transport") {
      s.transport = value();
    } else if (a == "--mode") {
      s.mode = value();
    } else if (a == "--no-baseline") {
      s.baseline = false;
    } else if (a == "--no-pin") {
      s.pin = false;
    } else if (a == "--server-read") {
      s.server_read_some = value() == "some";
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: transport_pingpong [--iterations N] [--warmup N] [--size BYTES]\n"
          "                          [--transport asio|uring|shm|all] [--mode poll|block|adaptive|all]\n"
          "                          [--server-read some|exact] [--no-pin] [--no-baseline]\n"
          "Round trip of a small message: plain C sockets over loopback TCP (blocking and\n"
          "busy-polling) and fusewire's transports (TCP and shared memory), client and\n"
          "server on different CPUs.\n");
      return 0;
    } else {
      std::fprintf(stderr, "transport_pingpong: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  if (s.size == 0 || s.iterations == 0) {
    std::fprintf(stderr, "transport_pingpong: --size and --iterations must be at least 1\n");
    return 2;
  }
  pin_self(-1);  // remember the original mask
  const auto allowed = cpus();
  const bool two = allowed.size() >= 2 && s.pin;
  const int server_cpu = two ? allowed[0] : -1;
  const int client_cpu = two ? allowed[1] : -1;
  std::printf("round trip of %zu B on this host, %zu iterations (+%zu warm-up), %zu CPUs allowed%s\n", s.size,
              s.iterations, s.warmup, allowed.size(), two ? ", client/server pinned apart" : "");
  std::printf("%-22s %-9s %9s %9s %9s   %s\n", "what", "mode", "p50 us", "p99 us", "mean us", "p50 vs C");

  summary c_block, c_spin;
  if (s.baseline) {
    c_block = plain_c(s, false, server_cpu, client_cpu);
    row("C sockets", "block", c_block, 0);
    c_spin = plain_c(s, true, server_cpu, client_cpu);
    row("C sockets", "busy-poll", c_spin, 0);
  }

  std::vector<fw::reactor_mode> modes;
  if (s.mode == "all") {
    modes = {fw::reactor_mode::poll, fw::reactor_mode::block, fw::reactor_mode::adaptive};
  } else if (s.mode == "poll") {
    modes = {fw::reactor_mode::poll};
  } else if (s.mode == "block") {
    modes = {fw::reactor_mode::block};
  } else if (s.mode == "adaptive") {
    modes = {fw::reactor_mode::adaptive};
  } else {
    std::fprintf(stderr, "transport_pingpong: --mode '%s': expected poll, block, adaptive or all\n", s.mode.c_str());
    return 2;
  }
  const auto baseline = [&](fw::reactor_mode m) { return m == fw::reactor_mode::block ? c_block.p50 : c_spin.p50; };
  for (fw::reactor_mode m : modes) {
    if (s.transport == "all" || s.transport == "asio") {
      row("fusewire asio_tcp", mode_name(m), fusewire_pingpong<fw::asio_tcp>(s, m, two), baseline(m));
    }
#if FUSEWIRE_HAS_URING
    if (s.transport == "all" || s.transport == "uring") {
      row("fusewire uring_tcp", mode_name(m), fusewire_pingpong<fw::uring_tcp>(s, m, two), baseline(m));
    }
#endif
    if (s.transport == "all" || s.transport == "shm") {
      row("fusewire shm", mode_name(m), fusewire_pingpong<fw::shm>(s, m, two), baseline(m));
    }
  }
  std::printf("ratios: poll rows vs busy-polling C, block/adaptive rows vs blocking C\n");
  return 0;
}
