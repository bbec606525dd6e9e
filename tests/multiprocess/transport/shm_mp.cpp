// Multi-process tests of the shm transport (real processes, fork):
//
//   shm_mp exchange     a child echo server; the parent sends 1 B .. 16 MiB and
//                       reads it back byte for byte, three times per connection
//                       (the second time by single copy both ways where the size
//                       allows, since every process here turns it on; the third
//                       from the parent's shared pool), in every reactor mode
//   shm_mp kill_client  the parent accepts; its client child is SIGKILLed with a
//                       read and a ring-filling write pending: both fail with
//                       errc::connection_reset, nothing hangs
//   shm_mp kill_server  the same with the roles swapped
//   shm_mp pool_writer_dies  a client child writes a piece of its shared pool
//                       and is SIGKILLed before the parent reads it: the parent
//                       still reads every byte, then errc::connection_reset
//
// After each, the parent holds no segment mapping and no descriptor it did not
// hold before, and /dev/shm is as it was. Every process runs under alarm();
// exit 0 = pass, 1 = fail.
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/shm.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/patterns.hpp"
#include "support/process_resources.hpp"

namespace fw = fusewire;
using namespace std::chrono_literals;
using fusewire::test::count_fds;
using fusewire::test::count_segment_mappings;
using fusewire::test::dev_shm;
using fusewire::test::pattern_bytes;
using group_t = fw::basic_reactor_group<fw::asio_engine>;

namespace {

int failures = 0;
#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "shm_mp: %s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)

constexpr const char* host = "shm-mp";

/// Every process here turns single copy on (it is off by default), so that
/// large pieces cross processes through process_vm_readv.
constexpr std::size_t single_copy_min = 64 * 1024;
fw::shm single_copy_shm() {
  fw::shm::config cfg;
  cfg.single_copy_min = single_copy_min;
  return fw::shm(cfg);
}

fw::reactor_config config(fw::reactor_mode mode) {
  fw::reactor_config cfg;
  cfg.mode = mode;
  cfg.count = 1;
  return cfg;
}

template <class T>
bool ready(std::future<T>& f, std::chrono::seconds s = 20s) {
  return f.wait_for(s) == std::future_status::ready;
}

/// Child: listens, writes its port to `out`, and echoes (`echo`) or holds what it accepts, until killed.
[[noreturn]] void child_server(int out, bool echo) {
  ::alarm(120);
  group_t group(config(fw::reactor_mode::adaptive));
  const fw::shm transport = single_copy_shm();
  struct session : std::enable_shared_from_this<session> {
    fw::shm_connection conn;
    bool echo = true;
    void read() {
      if (!echo) return;
      conn.async_read_some([self = shared_from_this()](std::error_code ec, fw::tensor_buffer b) {
        if (ec) return self->conn.close();
        auto held = std::make_shared<fw::tensor_buffer>(std::move(b));
        const fw::const_buffer one[] = {held->bytes()};
        self->conn.async_write(one, [held](std::error_code, std::size_t) {});
        self->read();
      });
    }
  };
  struct acceptor : std::enable_shared_from_this<acceptor> {
    fw::shm_listener l;
    bool echo = true;
    std::vector<std::shared_ptr<session>> held;
    void loop() {
      l.async_accept([self = shared_from_this()](std::error_code ec, fw::shm_connection c) {
        if (ec) return;
        auto s = std::make_shared<session>();
        s->conn = std::move(c);
        s->echo = self->echo;
        self->held.push_back(s);
        s->read();
        self->loop();
      });
    }
  };
  auto fp = group.submit(0, [&] {
    auto a = std::make_shared<acceptor>();
    a->echo = echo;
    a->l = transport.listen(*fw::asio_reactor::current(), host, 0);
    a->loop();
    static std::shared_ptr<acceptor> keep;
    keep = a;
    return a->l.port();
  });
  const std::uint16_t port = fp.get();
  if (::write(out, &port, sizeof port) != sizeof port) ::_exit(1);
  for (;;) ::pause();
}

/// Child: connects to the port read from `in`, writes 1000 bytes, holds the connection until killed.
[[noreturn]] void child_client(int in) {
  ::alarm(120);
  std::uint16_t port = 0;
  if (::read(in, &port, sizeof port) != sizeof port) ::_exit(1);
  group_t group(config(fw::reactor_mode::adaptive));
  const fw::shm transport = single_copy_shm();
  static const auto hello = pattern_bytes(1000, 5);
  group.submit_to(0, [&] {
    transport.connect(*fw::asio_reactor::current(), host, port, [](std::error_code ec, fw::shm_connection c) {
      if (ec) ::_exit(1);
      static fw::shm_connection keep;
      keep = std::move(c);
      const fw::const_buffer one[] = {fw::const_buffer(hello)};
      keep.async_write(one, [](std::error_code, std::size_t) {});
    });
  });
  for (;;) ::pause();
}

struct pending_result {
  std::error_code read_ec, write_ec;
  std::size_t written = 0;
};

/// With `conn` on reactor 0 of `group`: a read and a write larger than the
/// ring pending, then the peer `child` is SIGKILLed; both must fail.
void kill_with_pending(group_t& group, std::shared_ptr<fw::shm_connection> conn, pid_t child) {
  std::promise<std::error_code> read_done;
  std::promise<std::pair<std::error_code, std::size_t>> write_done;
  auto big = std::make_shared<std::vector<std::byte>>(std::size_t{4} << 20);
  auto dst = std::make_shared<std::vector<std::byte>>(100);
  group.submit_to(0, [&, conn, big, dst] {
    conn->async_read(fw::mutable_buffer(*dst), [&, dst](std::error_code ec, std::size_t) { read_done.set_value(ec); });
    const fw::const_buffer one[] = {fw::const_buffer(*big)};
    conn->async_write(one, [&, big](std::error_code ec, std::size_t n) { write_done.set_value({ec, n}); });
  });
  std::this_thread::sleep_for(50ms);  // the write fills the ring; the read waits
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto fr = read_done.get_future();
  auto fw_ = write_done.get_future();
  EXPECT(ready(fr));
  EXPECT(ready(fw_));
  if (fr.valid() && ready(fr, 0s)) EXPECT(fr.get() == fw::errc::connection_reset);
  if (fw_.valid() && ready(fw_, 0s)) {
    const auto [ec, n] = fw_.get();
    EXPECT(ec == fw::errc::connection_reset);
    EXPECT(n < (std::size_t{4} << 20));
  }
  // Later operations fail the same way, at once.
  std::promise<std::error_code> later;
  static const std::byte x[1] = {};
  group.submit_to(0, [&, conn] {
    const fw::const_buffer none[] = {fw::const_buffer(x, 1)};
    conn->async_write(none, [&](std::error_code ec, std::size_t) { later.set_value(ec); });
  });
  auto fl = later.get_future();
  EXPECT(ready(fl) && fl.get() == fw::errc::connection_reset);
}

/// Listens on reactor 0 of `group` (a free port, written to `port`) and
/// accepts one connection into the future returned.
std::future<std::shared_ptr<fw::shm_connection>> accept_one(group_t& group, const fw::shm& transport,
                                                            const std::shared_ptr<fw::shm_listener>& listener,
                                                            std::uint16_t& port) {
  auto accepted = std::make_shared<std::promise<std::shared_ptr<fw::shm_connection>>>();
  auto fp = group.submit(0, [&transport, listener, accepted] {
    *listener = transport.listen(*fw::asio_reactor::current(), host, 0);
    listener->async_accept([accepted](std::error_code ec, fw::shm_connection c) {
      if (ec) return;
      accepted->set_value(std::make_shared<fw::shm_connection>(std::move(c)));
    });
    return listener->port();
  });
  port = fp.get();
  return accepted->get_future();
}

/// Forks a child_server and reads its port.
pid_t start_server(bool echo, std::uint16_t& port) {
  int p[2];
  if (::pipe(p) != 0) std::abort();
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(p[0]);
    child_server(p[1], echo);
  }
  ::close(p[1]);
  EXPECT(::read(p[0], &port, sizeof port) == sizeof port);
  ::close(p[0]);
  return child;
}

void kill_client(fw::reactor_mode mode) {
  int p[2];
  if (::pipe(p) != 0) std::abort();
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(p[1]);
    child_client(p[0]);
  }
  ::close(p[0]);
  {
    group_t group(config(mode));
    const fw::shm transport = single_copy_shm();
    auto listener = std::make_shared<fw::shm_listener>();
    std::uint16_t port = 0;
    auto fa = accept_one(group, transport, listener, port);
    EXPECT(::write(p[1], &port, sizeof port) == sizeof port);
    EXPECT(ready(fa));
    auto conn = fa.get();
    // The child's 1000 bytes arrive first.
    std::promise<bool> got;
    auto buf = std::make_shared<std::vector<std::byte>>(1000);
    group.submit_to(0, [&, conn, buf] {
      conn->async_read(fw::mutable_buffer(*buf), [&, buf](std::error_code ec, std::size_t) {
        got.set_value(!ec && *buf == pattern_bytes(1000, 5));
      });
    });
    auto fg = got.get_future();
    EXPECT(ready(fg) && fg.get());
    kill_with_pending(group, conn, child);
    auto fc = group.submit(0, [conn, listener] {
      conn->close();
      *conn = fw::shm_connection();
      listener->close();
      *listener = fw::shm_listener();
      return 0;
    });
    fc.get();
    group.stop();
  }
  ::close(p[1]);
}

void kill_server(fw::reactor_mode mode) {
  std::uint16_t port = 0;
  const pid_t child = start_server(false, port);
  {
    group_t group(config(mode));
    const fw::shm transport = single_copy_shm();
    std::promise<std::shared_ptr<fw::shm_connection>> connected;
    group.submit_to(0, [&] {
      transport.connect(*fw::asio_reactor::current(), host, port, [&](std::error_code ec, fw::shm_connection c) {
        EXPECT(!ec);
        connected.set_value(std::make_shared<fw::shm_connection>(std::move(c)));
      });
    });
    auto fc = connected.get_future();
    EXPECT(ready(fc));
    auto conn = fc.get();
    kill_with_pending(group, conn, child);
    auto fz = group.submit(0, [conn] {
      conn->close();
      *conn = fw::shm_connection();
      return 0;
    });
    fz.get();
    group.stop();
  }
}

/// Child: connects to the port read from `in`, writes `pool_piece` bytes of
/// its shared pool, tells the parent over `out` once the piece is announced,
/// and waits to be killed.
constexpr std::size_t pool_piece = 300 * 1024;
[[noreturn]] void child_pool_writer(int in, int out) {
  ::alarm(120);
  std::uint16_t port = 0;
  if (::read(in, &port, sizeof port) != sizeof port) ::_exit(1);
  group_t group(config(fw::reactor_mode::adaptive));
  const fw::shm transport;
  static fw::tensor_buffer piece = transport.allocate_shared(pool_piece);
  const auto bytes = pattern_bytes(pool_piece, 7);
  std::memcpy(piece.data(), bytes.data(), pool_piece);
  group.submit_to(0, [&] {
    transport.connect(*fw::asio_reactor::current(), host, port, [out](std::error_code ec, fw::shm_connection c) {
      if (ec) ::_exit(1);
      static fw::shm_connection keep;
      keep = std::move(c);
      const fw::const_buffer one[] = {piece.bytes()};
      keep.async_write(one, [](std::error_code, std::size_t) {});
      // async_write announced the piece before it returned.
      const char ok = keep.stats().pool_sent == pool_piece ? 'y' : 'n';
      if (::write(out, &ok, 1) != 1) ::_exit(1);
    });
  });
  for (;;) ::pause();
}

void pool_writer_dies(fw::reactor_mode mode) {
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) std::abort();
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    child_pool_writer(to_child[0], from_child[1]);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  {
    group_t group(config(mode));
    const fw::shm transport;
    auto listener = std::make_shared<fw::shm_listener>();
    std::uint16_t port = 0;
    auto fa = accept_one(group, transport, listener, port);
    EXPECT(::write(to_child[1], &port, sizeof port) == sizeof port);
    char announced = 0;
    EXPECT(::read(from_child[0], &announced, 1) == 1 && announced == 'y');
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    EXPECT(ready(fa));
    auto conn = fa.get();
    std::promise<std::error_code> got, after;
    auto buf = std::make_shared<std::vector<std::byte>>(pool_piece);
    auto one = std::make_shared<std::vector<std::byte>>(1);
    group.submit_to(0, [&, conn, buf, one] {
      conn->async_read(fw::mutable_buffer(*buf), [&, buf](std::error_code ec, std::size_t) { got.set_value(ec); });
      conn->async_read(fw::mutable_buffer(*one), [&, one](std::error_code ec, std::size_t) { after.set_value(ec); });
    });
    auto fg = got.get_future();
    auto fn = after.get_future();
    EXPECT(ready(fg) && !fg.get());
    EXPECT(*buf == pattern_bytes(pool_piece, 7));
    EXPECT(ready(fn) && fn.get() == fw::errc::connection_reset);
    auto fc = group.submit(0, [conn, listener] {
      EXPECT(conn->stats().pool_received == pool_piece);
      conn->close();
      *conn = fw::shm_connection();
      listener->close();
      *listener = fw::shm_listener();
      return 0;
    });
    fc.get();
    group.stop();
  }
  ::close(to_child[1]);
  ::close(from_child[0]);
}

void exchange(fw::reactor_mode mode) {
  std::uint16_t port = 0;
  const pid_t child = start_server(true, port);
  {
    group_t group(config(mode));
    const fw::shm transport = single_copy_shm();
    for (std::size_t n : {std::size_t{1}, std::size_t{10}, std::size_t{4096}, std::size_t{100000}, std::size_t{3} << 20,
                          std::size_t{16} << 20}) {
      const auto src = pattern_bytes(n, static_cast<unsigned>(n));
      std::vector<std::byte> dst(n), again(n), third(n);
      fw::tensor_buffer pooled = transport.allocate_shared(n);
      std::memcpy(pooled.data(), src.data(), n);
      std::promise<std::error_code> done;
      fw::shm_stats st;
      // Twice over one connection: the first round trip lets each side learn
      // that it reads the other's memory, so the second goes by single copy
      // both ways where the size allows.
      group.submit_to(0, [&] {
        transport.connect(*fw::asio_reactor::current(), host, port, [&](std::error_code ec, fw::shm_connection c) {
          if (ec) return done.set_value(ec);
          auto conn = std::make_shared<fw::shm_connection>(std::move(c));
          const fw::const_buffer one[] = {fw::const_buffer(src)};
          conn->async_write(one, [conn](std::error_code, std::size_t) {});
          conn->async_read(fw::mutable_buffer(dst), [&, conn](std::error_code e, std::size_t) {
            if (e) return done.set_value(e);
            const fw::const_buffer two[] = {fw::const_buffer(src)};
            conn->async_write(two, [conn](std::error_code, std::size_t) {});
            conn->async_read(fw::mutable_buffer(again), [&, conn](std::error_code e2, std::size_t) {
              if (e2) return done.set_value(e2);
              const fw::const_buffer three[] = {pooled.bytes()};
              conn->async_write(three, [conn](std::error_code, std::size_t) {});
              conn->async_read(fw::mutable_buffer(third), [&, conn](std::error_code e3, std::size_t) {
                st = conn->stats();
                conn->close();
                done.set_value(e3);
              });
            });
          });
        });
      });
      auto f = done.get_future();
      EXPECT(ready(f, 60s) && !f.get());
      EXPECT(src == dst);
      EXPECT(src == again);
      EXPECT(src == third);
      EXPECT(st.pool_sent == (n >= fw::detail::shm::pool_piece_min ? n : 0));
      if (n >= single_copy_min) {
        EXPECT(st.single_copy_sent >= n);
        EXPECT(st.single_copy_received >= n);
      } else {
        EXPECT(st.single_copy_sent == 0 && st.single_copy_received == 0);
      }
    }
    group.stop();
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  ::alarm(300);
  const std::string scenario = argc > 1 ? argv[1] : "";
  const auto shm_before = dev_shm();
  const std::size_t fds_before = count_fds();
  for (fw::reactor_mode mode : {fw::reactor_mode::block, fw::reactor_mode::poll, fw::reactor_mode::adaptive}) {
    if (scenario == "exchange") {
      exchange(mode);
    } else if (scenario == "kill_client") {
      kill_client(mode);
    } else if (scenario == "kill_server") {
      kill_server(mode);
    } else if (scenario == "pool_writer_dies") {
      pool_writer_dies(mode);
    } else {
      std::fprintf(stderr, "usage: shm_mp exchange|kill_client|kill_server|pool_writer_dies\n");
      return 2;
    }
    EXPECT(count_segment_mappings() == 0);
    EXPECT(count_fds() == fds_before);
  }
  EXPECT(dev_shm() == shm_before);
  std::printf("shm_mp %s: %s\n", scenario.c_str(), failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
