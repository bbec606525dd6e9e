// rendezvous_bench: rendezvous::endpoint's data path on loopback, per transport
// (usage and how to read the output: bench/rendezvous/README.md).
//
//   skew   6.3 MB scatter-gather payload (10 buffers: 6 x 1 MiB, 3 x 10 KiB,
//          1 x 10 B, fwbench's skew scheme) worker -> PS -> worker; round trip
//          min/p50/mean and bandwidth = 2 x payload / p50 round trip, per transport
//          (and ZeroMQ's multipart zero-copy PAIR sockets side by side).
//   fuse   1,000 tensors of 64 B per step to one peer, fused vs unfused: steps/s.
//          Both runs start each step's operations through one endpoint::op_batch
//          per side, handed over at submit() (--stream N: in groups of N
//          as they are added); --no-batch: one send/recv call per operation.
//   idle   memory per extra connected peer (one connection each way): RSS and
//          heap delta, measured with forked peer processes.
//   spread (only when asked) one PS endpoint echoes tensors for 4 worker
//          endpoints, each driven by its own thread (send, then wait for the
//          echo): echoes/s in all with the PS on 1 and on 2 reactors
//          (endpoint_tuning::reactors), alternated 3 times, for 100 B and 256 KiB.
//          Skipped for a transport whose endpoints run one reactor whatever
//          is asked (shm: its connections cannot move between reactors).
//
// --transport NAME takes the names of fusewire::with_transport (transport/select.hpp)
// that this build and machine can run: uring, asio, shm, auto (shm here: every
// task is on this host) and the like; verbs is refused, as the clusters are on
// loopback, which rdmacm cannot route. --transport all (the default) runs each
// of them but auto and shm+asio, which on loopback run shm (shm+uring stays:
// it is shm on io_uring's reactor).
//
// RVBENCH_STRIPES=n sets endpoint_tuning::stripes (skew); RVBENCH_URING_ZC=bytes
// sets uring_tcp's zero-copy threshold.
//
// Usage: rendezvous_bench [--quick] [--no-batch] [--stream N] [--rounds N] [--side fused|unfused|both]
//                         [--only skew|fuse|idle|zmq|spread] [--transport NAME|all]

#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/select.hpp>

#include "common/transport.hpp"
#if RVBENCH_HAS_ZMQ
#include <zmq.h>
#endif

#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;
using bench_clock = std::chrono::steady_clock;

namespace {

struct settings {
  bool quick = false;
  std::string only;
  std::string transport = "all";
  bool batch = true;          ///< fuse: start a step's operations through endpoint::op_batch
  std::size_t stream = 0;     ///< fuse: the batches hand over every `stream` operations (0: at submit() only)
  std::string side = "both";  ///< fuse: run the fused run, the unfused run, or both (profiling one alone)
  unsigned rounds = 3;        ///< fuse: fused and unfused runs alternate this many times (the host's load drifts)
};

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::perror("bind");
    std::exit(1);
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

fw::cluster_spec cluster(unsigned workers) {
  std::string text = "ps=127.0.0.1:" + std::to_string(free_port()) + ";worker=";
  for (unsigned i = 0; i < workers; ++i) text += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(free_port());
  return fw::cluster_spec::from_string(text);
}

fw::options bench_options() {
  fw::options o = fw::options::from_env(fw::role::worker);
  o.connect_timeout = 10000ms;
  return o;
}

/// `t` with RVBENCH_URING_ZC (zero-copy threshold, bytes; 0 = off) applied
/// when it is uring_tcp. Recognised by its name: the type is declared only in
/// builds with liburing.
template <class T>
T configured(T t) {
  if constexpr (T::name() == "uring_tcp") {
    if (const char* zc = std::getenv("RVBENCH_URING_ZC")) {
      typename T::config c = t.settings();
      c.zc_threshold = std::strtoull(zc, nullptr, 10);
      return T(c);
    }
  }
  return t;
}

/// Calls `f(transport)` with the transport named `name` (fusewire::with_transport's
/// names), configured. "auto" decides for a cluster on loopback, as every
/// cluster of this program is.
template <class F>
void with_named_transport(const std::string& name, F&& f) {
  const auto loopback = fw::cluster_spec::from_string("ps=127.0.0.1:1;worker=127.0.0.1:2");
  fw::with_transport(name, bench_options(), loopback, [&]<class T>(T t) { f(configured(std::move(t))); });
}

const fw::task_id ps0{"ps", 0};
const fw::task_id w0{"worker", 0};

/// fwbench's skew payload with default sizes: 60% large, 30% medium, 10% small.
std::vector<fw::tensor_buffer> skew_buffers() {
  std::vector<fw::tensor_buffer> out;
  const std::size_t sizes[] = {1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 10240, 10240, 10240, 10};
  std::uint32_t x = 7;
  for (std::size_t n : sizes) {
    auto b = fw::tensor_buffer::allocate(n);
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      b.data()[i] = static_cast<std::byte>(x >> 24);
    }
    out.push_back(std::move(b));
  }
  return out;
}

struct rt_result {
  double min_us = 0, p50_us = 0, mean_us = 0, gbps = 0;
  std::size_t bytes = 0;
  bool ok = true;
};

rt_result summarize(std::vector<double> us, std::size_t bytes) {
  rt_result r;
  r.bytes = bytes;
  std::sort(us.begin(), us.end());
  r.p50_us = us[us.size() / 2];
  r.min_us = us.front();
  double sum = 0;
  for (double u : us) sum += u;
  r.mean_us = sum / static_cast<double>(us.size());
  r.gbps = 2.0 * static_cast<double>(bytes) / (r.p50_us * 1e3);
  return r;
}

void print_rt(const char* name, const rt_result& r) {
  std::printf(
      "  %-14s round trip min %7.1f us  p50 %7.1f us  mean %7.1f us  bandwidth(p50) %5.2f GB/s  (best %5.2f)%s\n", name,
      r.min_us, r.p50_us, r.mean_us, r.gbps, 2.0 * static_cast<double>(r.bytes) / (r.min_us * 1e3),
      r.ok ? "" : "  (ERRORS)");
  std::fflush(stdout);
}

/// PS side of the echo: recv "req" into a destination, send it back as "resp", again.
template <class T>
struct echo_server {
  rv::endpoint<T>& ps;
  std::size_t size;
  std::vector<fw::tensor_buffer> bufs;
  std::size_t next = 0;
  std::atomic<bool> failed{false};

  echo_server(rv::endpoint<T>& p, std::size_t n) : ps(p), size(n) {
    for (int i = 0; i < 3; ++i) bufs.push_back(fw::tensor_buffer::allocate(n));
  }
  void arm() {
    fw::tensor_buffer dst = bufs[next++ % bufs.size()].share();
    ps.recv(w0, "req", std::move(dst), [this](std::error_code ec, fw::tensor_buffer b) {
      if (ec) {
        if (ec != fw::make_error_code(fw::errc::cancelled)) failed = true;
        return;
      }
      arm();
      ps.send(w0, "resp", std::move(b), [this](std::error_code e) {
        if (e && e != fw::make_error_code(fw::errc::cancelled)) failed = true;
      });
    });
  }
};

template <class T>
rt_result skew_round_trip(const settings& s, const T& transport, bool chunking) {
  auto spec = cluster(1);
  fw::options o = bench_options();
  o.chunking = chunking;
  rv::endpoint_tuning tuning;
  if (const char* st = std::getenv("RVBENCH_STRIPES")) tuning.stripes = static_cast<unsigned>(std::atoi(st));
  rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = tuning, .transport = transport});
  rv::endpoint<T> worker(w0, spec, {.options = o, .tuning = tuning, .transport = transport});
  auto bufs = skew_buffers();
  std::vector<fw::const_buffer> sg;
  std::size_t total = 0;
  for (auto& b : bufs) {
    sg.push_back(b.bytes());
    total += b.size();
  }
  echo_server<T> echo(ps, total);
  echo.arm();
  auto dst = fw::tensor_buffer::allocate(total);
  const int warm = 5, iters = s.quick ? 40 : 300;
  std::vector<double> us;
  bool ok = true;
  for (int i = 0; i < warm + iters; ++i) {
    std::promise<rv::recv_result> got;
    auto fut = got.get_future();
    const auto t0 = bench_clock::now();
    worker.recv(ps0, "resp", dst.share(), [&got](std::error_code ec, fw::tensor_buffer b) {
      got.set_value({ec, std::move(b)});
    });
    if (worker.send_sync(ps0, "req", std::span<const fw::const_buffer>(sg), 20s)) ok = false;
    auto r = fut.get();
    const auto t1 = bench_clock::now();
    if (r.ec) ok = false;
    if (i >= warm) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (!ok) break;
  }
  if (us.empty()) us.push_back(0);
  // Byte check of the last round trip.
  std::size_t off = 0;
  for (auto& b : bufs) {
    if (std::memcmp(dst.data() + off, b.data(), b.size()) != 0) ok = false;
    off += b.size();
  }
  auto r = summarize(us, total);
  r.ok = ok && !echo.failed;
  return r;
}

#if RVBENCH_HAS_ZMQ
rt_result zmq_round_trip(const settings& s) {
  void* ctx = zmq_ctx_new();
  void* srv = zmq_socket(ctx, ZMQ_PAIR);
  void* cli = zmq_socket(ctx, ZMQ_PAIR);
  const std::string addr = "tcp://127.0.0.1:" + std::to_string(free_port());
  zmq_bind(srv, addr.c_str());
  zmq_connect(cli, addr.c_str());
  std::thread server([srv] {
    for (;;) {
      std::vector<zmq_msg_t> parts;
      for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, srv, 0) < 0) return;
        const bool more = zmq_msg_more(&m);
        parts.push_back(m);
        if (!more) break;
      }
      if (parts.size() == 1 && zmq_msg_size(&parts[0]) == 0) {
        zmq_msg_close(&parts[0]);
        return;
      }
      for (std::size_t i = 0; i < parts.size(); ++i) {
        zmq_msg_send(&parts[i], srv, i + 1 < parts.size() ? ZMQ_SNDMORE : 0);
      }
    }
  });
  auto bufs = skew_buffers();
  std::size_t total = 0;
  for (auto& b : bufs) total += b.size();
  auto dst = fw::tensor_buffer::allocate(total);
  const int warm = 5, iters = s.quick ? 40 : 300;
  std::vector<double> us;
  for (int i = 0; i < warm + iters; ++i) {
    const auto t0 = bench_clock::now();
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      zmq_msg_t m;
      zmq_msg_init_data(&m, bufs[k].data(), bufs[k].size(), nullptr, nullptr);
      zmq_msg_send(&m, cli, k + 1 < bufs.size() ? ZMQ_SNDMORE : 0);
    }
    std::size_t off = 0;
    for (;;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      zmq_msg_recv(&m, cli, 0);
      // Land the bytes in one destination, as the rendezvous recv does.
      std::memcpy(dst.data() + off, zmq_msg_data(&m), zmq_msg_size(&m));
      off += zmq_msg_size(&m);
      const bool more = zmq_msg_more(&m);
      zmq_msg_close(&m);
      if (!more) break;
    }
    const auto t1 = bench_clock::now();
    if (i >= warm) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  zmq_send(cli, "", 0, 0);
  server.join();
  zmq_close(cli);
  zmq_close(srv);
  zmq_ctx_term(ctx);
  return summarize(us, total);
}
#endif

/// 1,000 tensors of 64 B per step, worker -> PS; steps per second. With
/// `batched` each side starts its step's operations through one
/// endpoint::op_batch (one hand-off to the reactor), else one call per operation.
template <class T>
double small_steps(const settings& s, const T& transport, bool fused, bool batched, rv::endpoint_stats* stats_out) {
  auto spec = cluster(1);
  fw::options o = bench_options();
  o.coalesce = fused;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .transport = transport});
  rv::endpoint<T> worker(w0, spec, {.options = o, .transport = transport});
  constexpr int per_step = 1000;
  std::vector<std::string> keys;
  for (int k = 0; k < per_step; ++k) keys.push_back(std::string("t").append(std::to_string(k)));
  auto payload = fw::tensor_buffer::allocate(64);
  std::memset(payload.data(), 0x5a, 64);
  const int steps = s.quick ? (fused ? 100 : 20) : (fused ? 400 : 40);
  std::atomic<int> errors{0};
  auto one_step = [&] {
    std::atomic<int> left{per_step};
    std::promise<void> all;
    auto fut = all.get_future();
    auto on_recv = [&](std::error_code ec, fw::tensor_buffer b) {
      if (ec || b.size() != 64) errors.fetch_add(1);
      if (left.fetch_sub(1) == 1) all.set_value();
    };
    auto on_send = [&](std::error_code ec) {
      if (ec) errors.fetch_add(1);
    };
    if (batched) {
      typename rv::endpoint<T>::op_batch recvs(ps, s.stream);
      for (int k = 0; k < per_step; ++k) recvs.recv(w0, keys[k], on_recv);
      recvs.submit();
      typename rv::endpoint<T>::op_batch sends(worker, s.stream);
      for (int k = 0; k < per_step; ++k) sends.send(ps0, keys[k], payload.share(), on_send);
      sends.submit();
    } else {
      for (int k = 0; k < per_step; ++k) ps.recv(w0, keys[k], on_recv);
      for (int k = 0; k < per_step; ++k) worker.send(ps0, keys[k], payload.share(), on_send);
    }
    fut.wait();
  };
  one_step();
  const auto t0 = bench_clock::now();
  for (int i = 0; i < steps; ++i) one_step();
  const double secs = std::chrono::duration<double>(bench_clock::now() - t0).count();
  if (stats_out) *stats_out = worker.stats();
  if (errors) std::printf("  (%d errors)\n", errors.load());
  return steps / secs;
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

/// Memory per extra connected peer: the parent (ps:0) exchanges one small tensor
/// each way with `n` forked workers, so it holds one inbound and one outbound
/// connection per worker; RSS and heap deltas between a warm-up round of `warm`
/// peers and all of them.
template <class T>
void idle_memory(const T& transport, unsigned warm, unsigned n) {
  auto spec = cluster(n);
  std::vector<pid_t> kids;
  std::vector<int> go;  // parent -> child: "connect now"
  for (unsigned i = 0; i < n; ++i) {
    int p[2];
    if (::pipe(p) != 0) return;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[1]);
      char c;
      if (::read(p[0], &c, 1) != 1) ::_exit(1);
      fw::options o = bench_options();
      o.mode = fw::reactor_mode::block;
      o.pool_size = 1 << 20;
      rv::endpoint<T> me({"worker", i}, spec, {.options = o, .transport = transport});
      auto b = fw::tensor_buffer::allocate(64);
      if (me.send_sync(ps0, "hello", b.share(), 20s)) ::_exit(2);
      auto r = me.recv_sync(ps0, "hello", 20s);
      if (r.ec) ::_exit(3);
      ::read(p[0], &c, 1);  // until the parent closes the pipe
      ::_exit(0);
    }
    ::close(p[0]);
    kids.push_back(pid);
    go.push_back(p[1]);
  }
  fw::options o = bench_options();
  o.mode = fw::reactor_mode::block;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .transport = transport});
  auto round = [&](unsigned from, unsigned to) {
    for (unsigned i = from; i < to; ++i) (void)!::write(go[i], "g", 1);
    for (unsigned i = from; i < to; ++i) {
      auto r = ps.recv_sync({"worker", i}, "hello", 20s);
      if (r.ec) std::printf("  recv from worker %u: %s\n", i, r.ec.message().c_str());
      auto b = fw::tensor_buffer::allocate(64);
      if (auto ec = ps.send_sync({"worker", i}, "hello", b.share(), 20s)) {
        std::printf("  send to worker %u: %s\n", i, ec.message().c_str());
      }
    }
    std::this_thread::sleep_for(200ms);
  };
  round(0, warm);
  const long rss0 = rss_kib();
  const auto heap0 = mallinfo2().uordblks;
  round(warm, n);
  const long rss1 = rss_kib();
  const auto heap1 = mallinfo2().uordblks;
  const unsigned extra = n - warm;
  std::printf("  %-22s per extra peer (1 in + 1 out connection): RSS %+.1f KiB, heap %+.1f KiB  (%u peers)\n",
              T::name().data(), static_cast<double>(rss1 - rss0) / extra,
              (static_cast<double>(heap1) - static_cast<double>(heap0)) / 1024.0 / extra, extra);
  for (int fd : go) ::close(fd);
  for (pid_t pid : kids) ::waitpid(pid, nullptr, 0);
}

/// spread: echoes per second of one PS (on `ps_reactors` reactors) serving `workers` worker threads.
template <class T>
double spread_run(const settings& s, const T& transport, unsigned ps_reactors, unsigned workers, std::size_t size,
                  bool& ok) {
  auto spec = cluster(workers);
  const fw::options o = bench_options();
  rv::endpoint_tuning pt;
  pt.reactors = ps_reactors;
  rv::endpoint<T> ps(ps0, spec, {.options = o, .tuning = pt, .transport = transport});
  rv::endpoint_tuning wt;
  wt.reactors = 1;
  std::vector<std::unique_ptr<rv::endpoint<T>>> ws;
  for (unsigned i = 0; i < workers; ++i) {
    ws.push_back(std::make_unique<rv::endpoint<T>>(
        fw::task_id{"worker", i}, spec, rv::endpoint_config<T>{.options = o, .tuning = wt, .transport = transport}));
  }
  std::atomic<bool> failed{false};
  std::atomic<bool> ending{false};  // the workers are going: their connections' errors are expected
  std::function<void(unsigned)> arm = [&](unsigned w) {
    ps.recv(fw::task_id{"worker", w}, "req", [&, w](std::error_code ec, fw::tensor_buffer b) {
      if (ec) {
        if (!ending) failed = true;
        return;
      }
      arm(w);
      ps.send(fw::task_id{"worker", w}, "resp", std::move(b), [&](std::error_code e) {
        if (e && !ending) failed = true;
      });
    });
  };
  for (unsigned i = 0; i < workers; ++i) arm(i);
  const auto warm = 300ms;
  const auto span = s.quick ? 1000ms : 3000ms;
  const auto start = bench_clock::now();
  std::atomic<std::uint64_t> echoes{0};
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      auto src = fw::tensor_buffer::allocate(size);
      std::memset(src.data(), static_cast<int>(i), size);
      auto dst = fw::tensor_buffer::allocate(size);
      while (bench_clock::now() < start + warm + span) {
        if (ws[i]->send_sync(ps0, "req", src.share(), 30s)) return (void)(failed = true);
        auto r = ws[i]->recv_sync(ps0, "resp", dst.share(), 30s);
        if (r.ec || std::to_integer<unsigned>(r.buffer.data()[size - 1]) != i) return (void)(failed = true);
        const auto now = bench_clock::now();
        if (now > start + warm && now < start + warm + span) echoes.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& t : threads) t.join();
  ending = true;
  for (auto& w : ws) w->close();
  ps.close();  // before `arm` goes: the pending receives complete (cancelled) now
  if (failed) ok = false;
  return static_cast<double>(echoes.load()) / std::chrono::duration<double>(span).count();
}

template <class T>
void spread(const settings& s, const T& transport) {
  constexpr unsigned workers = 4;
  {
    // Asked for 2 reactors, the endpoint says how many it runs: one when its
    // transport's connections cannot move between reactors.
    rv::endpoint_tuning two;
    two.reactors = 2;
    const rv::endpoint<T> probe(ps0, cluster(workers),
                                {.options = bench_options(), .tuning = two, .transport = transport});
    if (probe.reactors() < 2) {
      std::printf("spread (%s): skipped, an endpoint runs %u reactor whatever is asked\n", T::name().data(),
                  probe.reactors());
      return;
    }
  }
  for (const std::size_t size : {std::size_t{100}, std::size_t{256} << 10}) {
    std::printf("%u workers echoing %zu B through one PS endpoint (%s): echoes/s in all\n", workers, size,
                T::name().data());
    std::vector<double> ratios;
    bool ok = true;
    for (int round = 0; round < 3; ++round) {
      const double one = spread_run<T>(s, transport, 1, workers, size, ok);
      const double two = spread_run<T>(s, transport, 2, workers, size, ok);
      ratios.push_back(two / one);
      std::printf("  round %d: 1 reactor %9.0f   2 reactors %9.0f   -> %.2fx%s\n", round + 1, one, two, two / one,
                  ok ? "" : "  (ERRORS)");
      std::fflush(stdout);
    }
    std::sort(ratios.begin(), ratios.end());
    std::printf("  median 2 reactors / 1 reactor = %.2fx\n", ratios[1]);
  }
}

template <class T>
void run_transport(const settings& s, const T& transport) {
  const char* name = T::name().data();
  if (s.only.empty() || s.only == "skew") {
    std::printf("skew payload round trip (%s)\n", name);
    print_rt("chunking on", skew_round_trip<T>(s, transport, true));
    print_rt("chunking off", skew_round_trip<T>(s, transport, false));
  }
  if (s.only.empty() || s.only == "fuse") {
    const std::string how = !s.batch        ? std::string("one call per operation")
                            : s.stream == 0 ? std::string("one endpoint::op_batch per side and step")
                                            : "one endpoint::op_batch per side and step, handed over every " +
                                                  std::to_string(s.stream) + " operations";
    std::printf("1,000 x 64 B per step to one peer (%s, %s)\n", name, how.c_str());
    // Fused and unfused alternate, each round a ratio of two runs a second
    // apart: a drift in the host's load (other VMs) then moves both sides of
    // a ratio, not one; the median round is reported.
    rv::endpoint_stats st;
    std::vector<double> fused_runs;
    std::vector<double> unfused_runs;
    std::vector<double> ratios;
    const unsigned rounds = s.quick ? 1 : s.rounds;
    for (unsigned r = 0; r < rounds; ++r) {
      const double fused = s.side == "unfused" ? 0.0 : small_steps<T>(s, transport, true, s.batch, &st);
      const double unfused = s.side == "fused" ? 0.0 : small_steps<T>(s, transport, false, s.batch, nullptr);
      fused_runs.push_back(fused);
      unfused_runs.push_back(unfused);
      ratios.push_back(fused / unfused);
      if (rounds > 1) {
        std::printf("  round %u: fused %.1f, unfused %.1f steps/s -> %.1fx\n", r + 1, fused, unfused, fused / unfused);
        std::fflush(stdout);
      }
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf(
        "  fused   %9.1f steps/s  (%.1f tensors per fused frame)\n", median(fused_runs),
        st.fused_frames_sent ? static_cast<double>(st.tensors_fused) / static_cast<double>(st.fused_frames_sent) : 0.0);
    std::printf("  unfused %9.1f steps/s  -> fused/unfused = %.1fx%s\n", median(unfused_runs), median(ratios),
                rounds > 1 ? " (median round)" : "");
    std::fflush(stdout);
  }
  if (s.only.empty() || s.only == "idle") {
    std::printf("idle connection memory (%s)\n", name);
    idle_memory<T>(transport, 4, s.quick ? 12 : 36);
  }
  if (s.only == "spread") spread<T>(s, transport);
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-batch") {
      s.batch = false;
    } else if (a == "--stream" && i + 1 < argc) {
      char* end = nullptr;
      const unsigned long n = std::strtoul(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n > 1000000) {
        std::fprintf(stderr, "rendezvous_bench: --stream %s: give a number of operations (0 to 1000000)\n", argv[i]);
        return 2;
      }
      s.stream = n;
    } else if (a == "--rounds" && i + 1 < argc) {
      char* end = nullptr;
      const unsigned long n = std::strtoul(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n == 0 || n > 100) {
        std::fprintf(stderr, "rendezvous_bench: --rounds %s: give a number of rounds (1 to 100)\n", argv[i]);
        return 2;
      }
      s.rounds = static_cast<unsigned>(n);
    } else if (a == "--quick") {
      s.quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      s.only = argv[++i];
    } else if (a == "--side" && i + 1 < argc) {
      s.side = argv[++i];
      if (s.side != "both" && s.side != "fused" && s.side != "unfused") {
        std::fprintf(stderr, "rendezvous_bench: --side %s: choose fused, unfused or both\n", s.side.c_str());
        return 2;
      }
    } else if (a == "--transport" && i + 1 < argc) {
      s.transport = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::string names;
      for (const std::string& n : example::transport_names(false)) names += n + "|";
      std::printf(
          "usage: rendezvous_bench [--quick] [--no-batch] [--stream N] [--rounds N] [--side fused|unfused|both]\n"
          "                        [--only skew|fuse|idle|zmq|spread] [--transport %sall]\n"
          "  --transport NAME|all  a transport this build and machine can run (auto: shm, every task being\n"
          "              on this host), or all (the default): each of them but auto and shm+asio\n"
          "  --no-batch  fuse: one send/recv call per operation instead of one endpoint::op_batch per step\n"
          "  --rounds N  fuse: alternate the fused and unfused runs N times (default 3), report the median round\n"
          "  --side fused|unfused|both  fuse: run only one of the two runs (to profile it alone)\n"
          "  --stream N  fuse: each batch hands its operations to the reactor every N (default 0 = at submit() "
          "only)\n",
          names.c_str());
      return 0;
    } else {
      std::fprintf(stderr, "rendezvous_bench: unknown argument '%s' (try --help)\n", a.c_str());
      return 2;
    }
  }
  if (s.only != "" && s.only != "skew" && s.only != "fuse" && s.only != "idle" && s.only != "zmq" &&
      s.only != "spread") {
    std::fprintf(stderr, "rendezvous_bench: --only %s: choose skew, fuse, idle, zmq or spread\n", s.only.c_str());
    return 2;
  }
  // The clusters are on loopback: verbs is refused (rdmacm cannot route it),
  // and "all" leaves out the names that run one of the others here: auto
  // picks shm, and shm+asio reaches every peer on this host over shm
  // (shm+uring does too, but on io_uring's reactor: a path of its own).
  std::vector<std::string> transports;
  if (s.transport == "all") {
    for (std::string& n : example::transport_names(false)) {
      if (n != "auto" && n != "shm+asio") transports.push_back(std::move(n));
    }
  } else if (auto problem = example::transport_problem(s.transport, false)) {
    std::fprintf(stderr, "rendezvous_bench: --transport %s: %s, or all\n", s.transport.c_str(), problem->c_str());
    return 2;
  } else {
    transports.push_back(s.transport);
  }
  if (s.only.empty() || s.only == "idle") {
    // Forks first, before any thread exists in this process.
    for (const std::string& name : transports) {
      with_named_transport(name, [&]<class T>(const T& transport) {
        std::printf("idle connection memory (%s)\n", T::name().data());
        idle_memory<T>(transport, 4, s.quick ? 12 : 36);
      });
    }
    if (s.only == "idle") return 0;
  }
#if RVBENCH_HAS_ZMQ
  if (s.only.empty() || s.only == "skew" || s.only == "zmq") {
    std::printf("skew payload round trip (ZeroMQ PAIR, multipart zero-copy send)\n");
    print_rt("zmq", zmq_round_trip(s));
  }
#endif
  if (s.only == "zmq") return 0;
  for (const std::string only : {"skew", "fuse", "spread"}) {
    if (s.only.empty() ? only == "spread" : s.only != only) continue;  // spread runs only when asked
    settings one = s;
    one.only = only;
    for (const std::string& name : transports) {
      with_named_transport(name, [&]<class T>(const T& transport) { run_transport<T>(one, transport); });
    }
  }
  return 0;
}
