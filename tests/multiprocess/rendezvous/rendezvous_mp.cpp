// Multi-process rendezvous tests on loopback: real processes (fork), real sockets.
//
//   rendezvous_mp exchange <asio|uring>  1 PS + 2 workers, every size class, byte for byte
//   rendezvous_mp kill     <asio|uring>  a worker SIGKILLed mid-transfer; the PS fails the
//                                        pending receives and keeps serving the other worker
//   rendezvous_mp hostile  <asio|uring>  garbage and truncated frames from a raw socket close
//                                        that connection; the PS keeps serving a worker
//   rendezvous_mp frozen   <asio|uring>  the PS is stopped (SIGSTOP: its kernel still ACKs);
//                                        keepalive fails the worker's pending send and recv,
//                                        which have no deadline
//
// Every process runs under alarm(); exit 0 = pass, 1 = fail, 77 = skipped.
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/wire/codec.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "support/dial.hpp"
#include "support/loopback_cluster.hpp"
#include "support/mp.hpp"
#include "support/mp_main.hpp"
#include "support/patterns.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;
using fusewire::test::all_succeeded;
using fusewire::test::signal_pipe;
using fusewire::test::spawn;
using fusewire::test::succeeded;

namespace {

const fw::task_id ps0{"ps", 0};
const fw::task_id w0{"worker", 0};
const fw::task_id w1{"worker", 1};
const std::size_t size_classes[] = {1, 1024, 64 * 1024, 1 << 20, 16 << 20, 64 << 20};

fw::options mp_options() {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 8u << 20;
  o.connect_timeout = 20000ms;
  // RVMP_REACTORS=n: every endpoint runs n reactors (capped by its peers), as
  // NETWORK_*_CORE_NUMBER would ask; the accepted connections then move between them.
  if (const char* r = std::getenv("RVMP_REACTORS")) o.cores = static_cast<unsigned>(std::atoi(r));
  return o;
}

std::uint32_t seed_of(unsigned worker, std::size_t n) { return static_cast<std::uint32_t>(worker * 1000003u + n); }

// ---- exchange ---------------------------------------------------------------

template <class T>
int exchange_ps(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(ps0, spec, {.options = mp_options()});
  for (unsigned w = 0; w < 2; ++w) {
    const fw::task_id peer{"worker", w};
    for (std::size_t n : size_classes) {
      const std::string key = "up/" + std::to_string(n);
      // Alternate: a posted destination (zero-copy path) or the endpoint's own buffer.
      const bool post = (n / 1024) % 2 == 0;
      rv::recv_result r =
          post ? ep.recv_sync(peer, key, fw::tensor_buffer::allocate(n), 60s) : ep.recv_sync(peer, key, 60s);
      EXPECT(!r.ec);
      EXPECT(fw::test::matches(r.buffer, n, seed_of(w, n)));
      // Echo it back, transformed so the worker checks a new payload.
      for (std::size_t i = 0; i < n; ++i) r.buffer.data()[i] = ~r.buffer.data()[i];
      EXPECT(!ep.send_sync(peer, "down/" + std::to_string(n), std::move(r.buffer), 60s));
    }
  }
  std::printf("ps: verified %zu tensors from 2 workers over %s on %u reactor(s)\n", 2 * std::size(size_classes),
              T::name().data(), ep.reactors());
  return 0;
}

template <class T>
int exchange_worker(const fw::cluster_spec& spec, unsigned w) {
  rv::endpoint<T> ep({"worker", w}, spec, {.options = mp_options()});
  for (std::size_t n : size_classes) {
    EXPECT(!ep.send_sync(ps0, "up/" + std::to_string(n), fw::test::pattern(n, seed_of(w, n)), 60s));
  }
  for (std::size_t n : size_classes) {
    rv::recv_result r = ep.recv_sync(ps0, "down/" + std::to_string(n), 60s);
    if (r.ec) std::fprintf(stderr, "worker:%u recv down/%zu: %s\n", w, n, r.ec.message().c_str());
    EXPECT(!r.ec);
    auto expect = fw::test::pattern(n, seed_of(w, n));
    for (std::size_t i = 0; i < n; ++i) expect.data()[i] = ~expect.data()[i];
    EXPECT(r.buffer.size() == n && std::memcmp(r.buffer.data(), expect.data(), n) == 0);
  }
  return 0;
}

template <class T>
int run_exchange() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const pid_t ps = spawn(240, [&] { return exchange_ps<T>(spec); });
  const pid_t a = spawn(240, [&] { return exchange_worker<T>(spec, 0); });
  const pid_t b = spawn(240, [&] { return exchange_worker<T>(spec, 1); });
  bool ok = all_succeeded({{ps, "ps:0"}, {a, "worker:0"}, {b, "worker:1"}});
  return ok ? 0 : 1;
}

// ---- kill ---------------------------------------------------------------------

template <class T>
int kill_ps(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(ps0, spec, {.options = mp_options()});
  rv::recv_result hello = ep.recv_sync(w0, "hello", 60s);
  EXPECT(!hello.ec);
  // worker:0 is killed while sending "big"; "never" is never sent.
  std::promise<std::error_code> never;
  auto never_f = never.get_future();
  ep.recv(
      w0, "never", [&never](std::error_code ec, fw::tensor_buffer) { never.set_value(ec); }, 30s);
  rv::recv_result big = ep.recv_sync(w0, "big", fw::tensor_buffer::allocate(64 << 20), 30s);
  // Either the whole tensor made it before the kill (then intact) or the receive failed.
  EXPECT(big.ec == fw::make_error_code(fw::errc::connection_reset) ||
         (!big.ec && fw::test::matches(big.buffer, 64 << 20, 77)));
  EXPECT(never_f.wait_for(40s) == std::future_status::ready);
  const std::error_code never_ec = never_f.get();
  if (never_ec != fw::make_error_code(fw::errc::connection_reset)) {
    std::fprintf(stderr, "pending recv completed with %s\n", never_ec.message().c_str());
    return 1;
  }
  // A new recv from the dead peer fails at once; the other worker is still served.
  EXPECT(ep.recv_sync(w0, "later", 30s).ec == fw::make_error_code(fw::errc::connection_reset));
  rv::recv_result after = ep.recv_sync(w1, "after", 60s);
  EXPECT(!after.ec);
  EXPECT(fw::test::matches(after.buffer, 1 << 20, 5));
  EXPECT(!ep.send_sync(w1, "ack", fw::test::pattern(3, 3), 60s));
  std::printf("ps: dead worker:0 failed its receives (%s); worker:1 still served\n", never_ec.message().c_str());
  return 0;
}

template <class T>
int kill_victim(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(w0, spec, {.options = mp_options()});
  EXPECT(!ep.send_sync(ps0, "hello", fw::test::pattern(1, 1), 60s));
  auto big = fw::test::pattern(64 << 20, 77);
  ep.send(ps0, "big", big.share(), [](std::error_code) {});
  std::this_thread::sleep_for(2ms);
  ::raise(SIGKILL);
  return 1;
}

template <class T>
int kill_survivor(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(w1, spec, {.options = mp_options()});
  EXPECT(!ep.send_sync(ps0, "after", fw::test::pattern(1 << 20, 5), 60s));
  rv::recv_result ack = ep.recv_sync(ps0, "ack", 60s);
  EXPECT(!ack.ec && fw::test::matches(ack.buffer, 3, 3));
  return 0;
}

template <class T>
int run_kill() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const pid_t ps = spawn(240, [&] { return kill_ps<T>(spec); });
  const pid_t victim = spawn(240, [&] { return kill_victim<T>(spec); });
  const pid_t survivor = spawn(240, [&] { return kill_survivor<T>(spec); });
  bool ok = fusewire::test::died_of_sigkill(victim, "worker:0");
  ok = all_succeeded({{ps, "ps:0"}, {survivor, "worker:1"}}) && ok;
  return ok ? 0 : 1;
}

// ---- hostile --------------------------------------------------------------------

int raw_connect(std::uint16_t port) {
  for (int attempt = 0; attempt < 400; ++attempt) {
    if (const int fd = fw::test::dial_loopback(port); fd >= 0) return fd;
    std::this_thread::sleep_for(25ms);
  }
  return -1;
}

/// True once the peer closed `fd` (bounded).
bool closed_by_peer(int fd) {
  char buf[4096];
  for (int i = 0; i < 400; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

template <class T>
int hostile_ps(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(ps0, spec, {.options = mp_options()});
  for (int round = 0; round < 3; ++round) {
    rv::recv_result r = ep.recv_sync(w1, "round" + std::to_string(round), 60s);
    EXPECT(!r.ec && fw::test::matches(r.buffer, 100000, static_cast<std::uint32_t>(round)));
  }
  return 0;
}

template <class T>
int hostile_worker(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(w1, spec, {.options = mp_options()});
  for (int round = 0; round < 3; ++round) {
    EXPECT(!ep.send_sync(ps0, "round" + std::to_string(round),
                         fw::test::pattern(100000, static_cast<std::uint32_t>(round)), 60s));
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

int attack(std::uint16_t port) {
  // 1. plain garbage
  int fd = raw_connect(port);
  EXPECT(fd >= 0);
  const char junk[] = "\x13\x37 this is not a fusewire frame, not at all.........";
  EXPECT(::send(fd, junk, sizeof junk, MSG_NOSIGNAL) > 0);
  EXPECT(closed_by_peer(fd));
  ::close(fd);
  // 2. a good hello, then a truncated tensor frame
  fd = raw_connect(port);
  EXPECT(fd >= 0);
  fw::wire::hello_meta hello;
  hello.job = "worker";
  hello.task_index = 0;
  std::vector<std::byte> out(4096);
  std::error_code ec;
  std::size_t n = fw::wire::encode_frame(hello, fw::wire::frame_header{}, {}, out, ec);
  EXPECT(!ec);
  EXPECT(::send(fd, out.data(), n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
  fw::wire::tensor_meta t;
  t.key = "cut";
  t.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {1000});
  const std::uint64_t sizes[] = {1000};
  t.segments = fw::wire::segment_list(std::span<const std::uint64_t>(sizes));
  std::vector<std::byte> payload(1000, std::byte{1});
  n = fw::wire::encode_frame(t, fw::wire::frame_header{}, payload, out, ec);
  EXPECT(!ec);
  EXPECT(::send(fd, out.data(), n - 100, MSG_NOSIGNAL) == static_cast<ssize_t>(n - 100));
  ::shutdown(fd, SHUT_WR);
  EXPECT(closed_by_peer(fd));
  ::close(fd);
  // 3. a header with a huge meta length
  fd = raw_connect(port);
  EXPECT(fd >= 0);
  n = fw::wire::encode_frame(hello, fw::wire::frame_header{}, {}, out, ec);
  fw::wire::store_le<std::uint32_t>(out.data() + 16, 0x7fffffffu);
  EXPECT(::send(fd, out.data(), fw::wire::header_size, MSG_NOSIGNAL) == static_cast<ssize_t>(fw::wire::header_size));
  EXPECT(closed_by_peer(fd));
  ::close(fd);
  return 0;
}

template <class T>
int run_hostile() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const pid_t ps = spawn(240, [&] { return hostile_ps<T>(spec); });
  const pid_t attacker = spawn(240, [&] { return attack(spec.fast_path_endpoint(ps0).port); });
  const pid_t worker = spawn(240, [&] { return hostile_worker<T>(spec); });
  bool ok = all_succeeded({{attacker, "attacker"}, {worker, "worker:1"}});
  ok = succeeded(ps, "ps:0") && ok;
  return ok ? 0 : 1;
}

// ---- frozen -----------------------------------------------------------------------

fw::options frozen_options() {
  fw::options o = mp_options();
  o.keepalive = 200ms;
  return o;
}

template <class T>
int frozen_ps(const fw::cluster_spec& spec) {
  rv::endpoint<T> ep(ps0, spec, {.options = frozen_options()});
  EXPECT(!ep.recv_sync(w0, "hello", 60s).ec);
  EXPECT(!ep.send_sync(w0, "welcome", fw::test::pattern(8, 2), 60s));
  // The driver stops this process here and later kills it.
  std::this_thread::sleep_for(200s);
  return 1;
}

template <class T>
int frozen_worker(const fw::cluster_spec& spec, const signal_pipe& ready, const signal_pipe& stopped) {
  rv::endpoint<T> ep(w0, spec, {.options = frozen_options()});
  // A connection each way: the worker's to the PS carries its sends, the PS's
  // to the worker carries what the worker receives.
  EXPECT(!ep.send_sync(ps0, "hello", fw::test::pattern(8, 1), 60s));
  rv::recv_result welcome = ep.recv_sync(ps0, "welcome", 60s);
  EXPECT(!welcome.ec && fw::test::matches(welcome.buffer, 8, 2));
  // Made before the PS stops: keepalive drops it within a few hundred ms, and
  // filling 64 MiB can take that long in a sanitizer build, which would let
  // the send start after the drop, on a fresh connection keepalive never sees.
  fw::tensor_buffer big = fw::test::pattern(64 << 20, 3);
  ready.notify();
  EXPECT(stopped.wait(60000));
  // No deadlines: only keepalive can end these. The send is larger than the
  // socket buffers, so it stays in flight against a peer that reads nothing.
  std::promise<std::error_code> sent, received;
  ep.send(ps0, "big", std::move(big), [&sent](std::error_code ec) { sent.set_value(ec); });
  ep.recv(ps0, "never", [&received](std::error_code ec, fw::tensor_buffer) { received.set_value(ec); });
  auto sent_f = sent.get_future();
  auto received_f = received.get_future();
  // Hang guards only (keepalive needs 2-3 x 200 ms).
  EXPECT(sent_f.wait_for(60s) == std::future_status::ready);
  EXPECT(received_f.wait_for(60s) == std::future_status::ready);
  const std::error_code send_ec = sent_f.get();
  const std::error_code recv_ec = received_f.get();
  if (send_ec != fw::make_error_code(fw::errc::connection_reset) ||
      recv_ec != fw::make_error_code(fw::errc::connection_reset)) {
    std::fprintf(stderr, "worker:0: send ended with '%s', recv with '%s' (want connection_reset for both)\n",
                 send_ec.message().c_str(), recv_ec.message().c_str());
    return 1;
  }
  EXPECT(ep.stats().keepalive_pings > 0);
  std::printf("worker:0: stopped PS detected by keepalive; send and recv failed with '%s'\n",
              send_ec.message().c_str());
  return 0;
}

template <class T>
int run_frozen() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  signal_pipe ready, stopped;
  const pid_t ps = spawn(240, [&] { return frozen_ps<T>(spec); });
  const pid_t worker = spawn(240, [&] { return frozen_worker<T>(spec, ready, stopped); });
  bool ok = ready.wait(60000);
  if (!ok) std::fprintf(stderr, "worker:0 never finished its handshake with ps:0\n");
  ok = fusewire::test::stop_child(ps, "ps:0") && ok;
  stopped.notify();
  ok = succeeded(worker, "worker:0") && ok;
  fusewire::test::kill_and_reap(ps);
  return ok ? 0 : 1;
}

template <class T>
int run(const std::string& scenario) {
  if (scenario == "exchange") return run_exchange<T>();
  if (scenario == "kill") return run_kill<T>();
  if (scenario == "hostile") return run_hostile<T>();
  if (scenario == "frozen") return run_frozen<T>();
  std::fprintf(stderr, "unknown scenario '%s' (allowed: exchange, kill, hostile, frozen)\n", scenario.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  return fusewire::test::main_over_transport(argc, argv, "exchange|kill|hostile|frozen", 280,
                                             []<class T>(const std::string& what) { return run<T>(what); });
}
