// fusewire verbs micro-benchmark, shaped like perftest so the two can run side
// by side in the same (emulated) guest:
//   latency    64 B and 64 KiB ping-pong (like ib_send_lat): one-way time = round trip / 2
//   bandwidth  64 KiB and 4 MiB streaming writes (like ib_write_bw), MiB/s at the receiver
// Server and client are two reactors (threads) of one process, on the address
// FUSEWIRE_RDMA_TEST_ADDR (default 192.0.2.1). Prints a table; exits 77 without a device.
//
//   verbs_bench [--iterations N] [--mode poll|adaptive|block] [--message-size B] [--credits N]
//               [--write-threshold B] [--chunk-size B]
#include <fusewire/transport/verbs.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "support/verbs_setup.hpp"

namespace fw = fusewire;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
  int iterations = 2000;
  fw::reactor_mode mode = fw::reactor_mode::poll;
  fw::verbs_config config;
};

[[noreturn]] void usage(const char* bad) {
  if (bad != nullptr) std::fprintf(stderr, "verbs_bench: bad argument '%s'\n", bad);
  std::fprintf(stderr,
               "usage: verbs_bench [--iterations N] [--mode poll|adaptive|block] [--message-size B] [--credits N]\n"
               "                   [--write-threshold B] [--chunk-size B]\n"
               "  measures 64 B latency and 64 KiB / 4 MiB bandwidth over fusewire::verbs on\n"
               "  FUSEWIRE_RDMA_TEST_ADDR (default 192.0.2.1); device TF_RDMA_DEV_NAME (default rxe0)\n");
  std::exit(bad != nullptr ? 2 : 0);
}

/// Each server connection: reads `size`-byte messages; echoes them if `echo`.
struct session : std::enable_shared_from_this<session> {
  fw::verbs_connection conn;
  std::vector<std::byte> buf;
  bool echo = false;
  void next() {
    conn.async_read(fw::mutable_buffer(buf), [self = shared_from_this()](std::error_code ec, std::size_t) {
      if (ec) return;
      if (self->echo) {
        const fw::const_buffer one[] = {fw::const_buffer(self->buf)};
        self->conn.async_write(one, [](std::error_code, std::size_t) {});
      }
      self->next();
    });
  }
};

double latency_us(fw::verbs_reactor_group& group, fw::verbs& t, const std::string& host, int iterations,
                  std::size_t size) {
  std::promise<std::uint16_t> port_p;
  auto listener = std::make_shared<fw::verbs_listener>();
  group.submit_to(0, [&, listener, size] {
    *listener = t.listen(*fw::verbs_reactor::current(), host, 0);
    listener->async_accept([size](std::error_code ec, fw::verbs_connection c) {
      if (ec) return;
      auto s = std::make_shared<session>();
      s->conn = std::move(c);
      s->buf.resize(size);
      s->echo = true;
      s->next();
    });
    port_p.set_value(listener->port());
  });
  const std::uint16_t port = port_p.get_future().get();
  struct client : std::enable_shared_from_this<client> {
    fw::verbs_connection conn;
    std::vector<std::byte> out, in;
    int left = 0, warmup = 100;
    clock_type::time_point start;
    std::promise<double> done;
    int total = 0;
    void ping() {
      const fw::const_buffer one[] = {fw::const_buffer(out)};
      conn.async_write(one, [](std::error_code, std::size_t) {});
      conn.async_read(fw::mutable_buffer(in), [self = shared_from_this()](std::error_code ec, std::size_t) {
        if (ec) return self->done.set_value(-1);
        if (self->warmup > 0 && --self->warmup == 0) self->start = clock_type::now();
        if (self->warmup == 0 && --self->left == 0) {
          const double us = std::chrono::duration<double, std::micro>(clock_type::now() - self->start).count();
          self->conn.close();
          return self->done.set_value(us / self->total / 2);
        }
        self->ping();
      });
    }
  };
  auto c = std::make_shared<client>();
  c->out.assign(size, std::byte{7});
  c->in.resize(size);
  c->left = c->total = iterations;
  auto result = c->done.get_future();
  group.submit_to(1, [&, c] {
    t.connect(*fw::verbs_reactor::current(), host, port, [c](std::error_code ec, fw::verbs_connection conn) {
      if (ec) return c->done.set_value(-1);
      c->conn = std::move(conn);
      c->ping();
    });
  });
  const double r = result.get();
  group.submit(0, [listener] { listener->close(); }).get();
  return r;
}

double bandwidth_mib_s(fw::verbs_reactor_group& group, fw::verbs& t, const std::string& host, std::size_t size,
                       std::size_t total_bytes) {
  const int count = static_cast<int>(std::max<std::size_t>(4, total_bytes / size));
  std::promise<double> done;
  auto listener = std::make_shared<fw::verbs_listener>();
  std::promise<std::uint16_t> port_p;
  group.submit_to(0, [&, listener] {
    *listener = t.listen(*fw::verbs_reactor::current(), host, 0);
    listener->async_accept([&, size, count](std::error_code ec, fw::verbs_connection c) {
      if (ec) return;
      struct sink : std::enable_shared_from_this<sink> {
        fw::verbs_connection conn;
        std::vector<std::byte> buf;
        int left = 0;
        bool started = false;
        clock_type::time_point start;
        std::promise<double>* done = nullptr;
        std::size_t bytes = 0;
        void next() {
          conn.async_read(fw::mutable_buffer(buf), [self = shared_from_this()](std::error_code e, std::size_t n) {
            if (e) return self->done->set_value(-1);
            if (!self->started) {  // time from the first message on
              self->started = true;
              self->start = clock_type::now();
            } else {
              self->bytes += n;
            }
            if (--self->left == 0) {
              const double s = std::chrono::duration<double>(clock_type::now() - self->start).count();
              self->conn.close();
              return self->done->set_value(static_cast<double>(self->bytes) / (1 << 20) / s);
            }
            self->next();
          });
        }
      };
      auto s = std::make_shared<sink>();
      s->conn = std::move(c);
      s->buf.resize(size);
      s->left = count;
      s->done = &done;
      s->next();
    });
    port_p.set_value(listener->port());
  });
  const std::uint16_t port = port_p.get_future().get();
  auto src = std::make_shared<std::vector<std::byte>>(size, std::byte{3});
  auto conn = std::make_shared<fw::verbs_connection>();
  group.submit_to(1, [&, src, conn, count] {
    t.connect(*fw::verbs_reactor::current(), host, port,
              [&, src, conn, count](std::error_code ec, fw::verbs_connection c) {
                if (ec) return done.set_value(-1);
                *conn = std::move(c);
                for (int i = 0; i < count; ++i) {  // all queued: the transport pipelines them under its credits
                  const fw::const_buffer one[] = {fw::const_buffer(*src)};
                  conn->async_write(one, [src](std::error_code, std::size_t) {});
                }
              });
  });
  const double r = done.get_future().get();
  const fw::verbs_stats st = group
                                 .submit(1,
                                         [conn] {
                                           const fw::verbs_stats s = conn->stats();
                                           conn->close();
                                           return s;
                                         })
                                 .get();
  std::printf("  sender of %zu B writes: %llu SEND messages, %llu RDMA writes\n", size,
              static_cast<unsigned long long>(st.messages_sent), static_cast<unsigned long long>(st.rdma_writes));
  group.submit(0, [listener] { listener->close(); }).get();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  s.config = fw::test::small_verbs_config();
  s.config.max_connections = 4;
  s.config.credits = 32;
  s.config.message_size = 64 * 1024;
  s.config.send_slots = 128;
  s.config.sq_depth = 64;
  s.config.rx_buffer_limit = 16u << 20;
  s.config.chunk_size = 4u << 20;  // TF_RDMA_CHUNK_SIZE's default
  s.config.staging_blocks = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[i]);
      return argv[++i];
    };
    if (a == "--help" || a == "-h")
      usage(nullptr);
    else if (a == "--iterations")
      s.iterations = std::atoi(value().c_str());
    else if (a == "--mode") {
      auto m = fw::reactor_mode_from_string(value());
      if (!m) usage(argv[i]);
      s.mode = *m;
    } else if (a == "--message-size")
      s.config.message_size = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--credits")
      s.config.credits = static_cast<unsigned>(std::atoi(value().c_str()));
    else if (a == "--write-threshold")
      s.config.rdma_write_threshold = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--chunk-size")
      s.config.chunk_size = std::strtoull(value().c_str(), nullptr, 10);
    else
      usage(argv[i]);
  }
  if (s.iterations < 1) usage("--iterations");
  std::string why;
  if (!fw::verbs::available(why)) {
    std::printf("SKIP verbs_bench: %s\n", why.c_str());
    return 77;
  }
  fw::verbs t(s.config);
  fw::reactor_config rc;
  rc.count = 2;
  rc.mode = s.mode;
  fw::verbs_reactor_group group(rc);
  const std::string host = fw::test::rdma_host();
  std::printf(
      "fusewire verbs bench: device=%s host=%s mode=%s message_size=%zu credits=%u "
      "rdma_write_threshold=%zu chunk_size=%zu\n",
      s.config.device.c_str(), host.c_str(), std::string(fw::to_string(s.mode)).c_str(), s.config.message_size,
      s.config.credits, s.config.rdma_write_threshold, s.config.chunk_size);
  const double lat = latency_us(group, t, host, s.iterations, 64);
  std::printf("RESULT fusewire send_lat 64 B: %.2f us (one-way, avg of %d round trips)\n", lat, s.iterations);
  std::fflush(stdout);
  const int big_iterations = std::max(1, s.iterations / 4);
  const double lat64k = latency_us(group, t, host, big_iterations, 64 * 1024);
  std::printf("RESULT fusewire send_lat 65536 B: %.2f us (one-way, avg of %d round trips)\n", lat64k, big_iterations);
  std::fflush(stdout);
  const double bw64k = bandwidth_mib_s(group, t, host, 64 * 1024, std::size_t{64} << 20);
  std::printf("RESULT fusewire write_bw 65536 B: %.1f MiB/s\n", bw64k);
  std::fflush(stdout);
  const double bw4m = bandwidth_mib_s(group, t, host, 4u << 20, std::size_t{128} << 20);
  std::printf("RESULT fusewire write_bw 4194304 B: %.1f MiB/s\n", bw4m);
  group.stop();
  return lat > 0 && lat64k > 0 && bw64k > 0 && bw4m > 0 ? 0 : 1;
}
