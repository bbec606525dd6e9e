// Multi-process PS/worker tests over verbs, through rendezvous::endpoint<verbs>
// (real processes, fork; real RC queue pairs on the RDMA device):
//
//   verbs_mp exchange   1 PS + 2 workers; every size class 1 B .. 64 MiB, across the
//                       eager/message and chunk boundaries, byte for byte, both ways
//   verbs_mp kill       a worker SIGKILLed mid-transfer; the PS fails the pending
//                       receives with an error and keeps serving the other worker
//   verbs_mp direct_kill  the same while the worker RDMA-writes straight into the
//                       PS's advertised destination (direct placement)
//
// Every process runs under alarm(); exit 0 = pass, 1 = fail, 77 = skipped (no device).
// Addresses: FUSEWIRE_RDMA_TEST_ADDR (default 192.0.2.1, the QEMU guest's rxe0).
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/verbs.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "support/mp.hpp"
#include "support/patterns.hpp"
#include "support/ports.hpp"
#include "support/verbs_setup.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;
using fusewire::test::all_succeeded;
using fusewire::test::spawn;

namespace {

using ep_t = rv::endpoint<fw::verbs>;

const fw::task_id ps0{"ps", 0};
const fw::task_id w0{"worker", 0};
const fw::task_id w1{"worker", 1};
// Around the eager limit (8 KiB), the test message size (16 KiB) and the chunk size (4 MiB).
const std::size_t size_classes[] = {1,     100,     8192,    8193,          16384 - 16, 16385,
                                    65536, 1 << 20, 4 << 20, (4 << 20) + 1, 16 << 20,   64 << 20};

fw::options mp_options() {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 8u << 20;
  o.connect_timeout = 30000ms;
  o.insecure = true;  // the RDMA address is the test guest's private network
  return o;
}

/// "ps=A:p;worker=A:p,A:p" on the RDMA interface's address with fresh ports.
fw::cluster_spec rdma_cluster() {
  const std::string a = fw::test::rdma_host();
  std::string text = "ps=" + a + ":" + std::to_string(fw::test::free_port()) + ";worker=" + a + ":" +
                     std::to_string(fw::test::free_port()) + "," + a + ":" + std::to_string(fw::test::free_port());
  return fw::cluster_spec::from_string(text);
}

std::uint32_t seed_of(unsigned worker, std::size_t n) { return static_cast<std::uint32_t>(worker * 1000003u + n); }

// No verbs object exists before spawn() forks: each process opens the device itself.

// ---- exchange ---------------------------------------------------------------

int exchange_ps(const fw::cluster_spec& spec) {
  ep_t ep(ps0, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t bytes = 0;
  for (unsigned w = 0; w < 2; ++w) {
    const fw::task_id peer{"worker", w};
    for (std::size_t n : size_classes) {
      const std::string key = "up/" + std::to_string(n);
      // Alternate: a posted destination or the endpoint's own buffer.
      const bool post = (n / 1024) % 2 == 0;
      rv::recv_result r =
          post ? ep.recv_sync(peer, key, fw::tensor_buffer::allocate(n), 120s) : ep.recv_sync(peer, key, 120s);
      if (r.ec) std::fprintf(stderr, "ps: recv %s from worker:%u: %s\n", key.c_str(), w, r.ec.message().c_str());
      EXPECT(!r.ec);
      EXPECT(fw::test::matches(r.buffer, n, seed_of(w, n)));
      for (std::size_t i = 0; i < n; ++i) r.buffer.data()[i] = ~r.buffer.data()[i];
      EXPECT(!ep.send_sync(peer, "down/" + std::to_string(n), std::move(r.buffer), 120s));
      bytes += 2 * n;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "ps: verified %zu tensors (1 B .. 64 MiB) from 2 workers and echoed them over verbs: %.1f MiB in %.1f s\n",
      2 * std::size(size_classes), static_cast<double>(bytes) / (1 << 20), s);
  return 0;
}

int exchange_worker(const fw::cluster_spec& spec, unsigned w) {
  ep_t ep({"worker", w}, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  for (std::size_t n : size_classes) {
    EXPECT(!ep.send_sync(ps0, "up/" + std::to_string(n), fw::test::pattern(n, seed_of(w, n)), 120s));
  }
  for (std::size_t n : size_classes) {
    rv::recv_result r = ep.recv_sync(ps0, "down/" + std::to_string(n), 120s);
    EXPECT(!r.ec);
    auto expect = fw::test::pattern(n, seed_of(w, n));
    for (std::size_t i = 0; i < n; ++i) expect.data()[i] = ~expect.data()[i];
    EXPECT(r.buffer.size() == n && std::memcmp(r.buffer.data(), expect.data(), n) == 0);
  }
  return 0;
}

int run_exchange() {
  const auto spec = rdma_cluster();
  const pid_t ps = spawn(400, [&] { return exchange_ps(spec); });
  const pid_t a = spawn(400, [&] { return exchange_worker(spec, 0); });
  const pid_t b = spawn(400, [&] { return exchange_worker(spec, 1); });
  bool ok = all_succeeded({{ps, "ps:0"}, {a, "worker:0"}, {b, "worker:1"}});
  return ok ? 0 : 1;
}

// ---- kill ---------------------------------------------------------------------

int kill_ps(const fw::cluster_spec& spec) {
  ep_t ep(ps0, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  rv::recv_result hello = ep.recv_sync(w0, "hello", 60s);
  EXPECT(!hello.ec);
  std::promise<std::error_code> never;
  auto never_f = never.get_future();
  ep.recv(
      w0, "never", [&never](std::error_code ec, fw::tensor_buffer) { never.set_value(ec); }, 60s);
  rv::recv_result big = ep.recv_sync(w0, "big", fw::tensor_buffer::allocate(64 << 20), 60s);
  std::printf("ps: receiving 64 MiB from the killed worker ended with: %s\n",
              big.ec ? big.ec.message().c_str() : "success");
  EXPECT(big.ec == fw::make_error_code(fw::errc::connection_reset) ||
         (!big.ec && fw::test::matches(big.buffer, 64 << 20, 77)));
  EXPECT(never_f.wait_for(90s) == std::future_status::ready);
  const std::error_code never_ec = never_f.get();
  if (never_ec != fw::make_error_code(fw::errc::connection_reset)) {
    std::fprintf(stderr, "pending recv completed with %s\n", never_ec.message().c_str());
    return 1;
  }
  EXPECT(ep.recv_sync(w0, "later", 30s).ec == fw::make_error_code(fw::errc::connection_reset));
  rv::recv_result after = ep.recv_sync(w1, "after", 60s);
  EXPECT(!after.ec);
  EXPECT(fw::test::matches(after.buffer, 1 << 20, 5));
  EXPECT(!ep.send_sync(w1, "ack", fw::test::pattern(3, 3), 60s));
  std::printf("ps: killed worker:0 failed the pending receives (%s); worker:1 still served\n",
              never_ec.message().c_str());
  return 0;
}

int kill_victim(const fw::cluster_spec& spec) {
  ep_t ep(w0, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  EXPECT(!ep.send_sync(ps0, "hello", fw::test::pattern(1, 1), 60s));
  auto big = fw::test::pattern(64 << 20, 77);
  ep.send(ps0, "big", big.share(), [](std::error_code) {});
  std::this_thread::sleep_for(50ms);
  ::raise(SIGKILL);
  return 1;
}

int kill_survivor(const fw::cluster_spec& spec) {
  ep_t ep(w1, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  EXPECT(!ep.send_sync(ps0, "after", fw::test::pattern(1 << 20, 5), 60s));
  rv::recv_result ack = ep.recv_sync(ps0, "ack", 120s);
  EXPECT(!ack.ec && fw::test::matches(ack.buffer, 3, 3));
  return 0;
}

// ---- direct_kill ------------------------------------------------------------------

constexpr std::size_t direct_big = 16u << 20;

int direct_kill_ps(const fw::cluster_spec& spec) {
  ep_t ep(ps0, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  EXPECT(!ep.recv_sync(w0, "hello", 60s).ec);  // the worker's ordered connection is known
  std::promise<std::error_code> never;
  auto never_f = never.get_future();
  ep.recv(
      w0, "never", [&never](std::error_code ec, fw::tensor_buffer) { never.set_value(ec); }, 60s);
  fw::tensor_buffer dst = ep.allocate_registered(direct_big);
  rv::recv_result big = ep.recv_sync(w0, "big", dst.share(), 60s);
  std::printf("ps: direct placement from the killed worker ended with: %s (%llu adverts sent)\n",
              big.ec ? big.ec.message().c_str() : "success",
              static_cast<unsigned long long>(ep.rdma_stats().adverts_sent));
  EXPECT(ep.rdma_stats().adverts_sent == 1);
  EXPECT(big.ec == fw::make_error_code(fw::errc::connection_reset) ||
         (!big.ec && fw::test::matches(big.buffer, direct_big, 78)));
  EXPECT(never_f.wait_for(90s) == std::future_status::ready);
  EXPECT(never_f.get() == fw::make_error_code(fw::errc::connection_reset));
  rv::recv_result after = ep.recv_sync(w1, "after", 60s);
  EXPECT(!after.ec);
  EXPECT(fw::test::matches(after.buffer, 1 << 20, 5));
  EXPECT(!ep.send_sync(w1, "ack", fw::test::pattern(3, 3), 60s));
  return 0;
}

int direct_kill_victim(const fw::cluster_spec& spec) {
  ep_t ep(w0, spec, {.options = mp_options(), .transport = fw::test::small_verbs()});
  EXPECT(!ep.send_sync(ps0, "hello", fw::test::pattern(1, 1), 60s));
  fw::tensor_buffer src = ep.allocate_registered(direct_big);
  auto p = fw::test::pattern(direct_big, 78);
  std::memcpy(src.data(), p.data(), direct_big);
  for (int i = 0; i < 60000 && ep.rdma_stats().adverts_received == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT(ep.rdma_stats().adverts_received == 1);
  ep.send(ps0, "big", src.share(), [](std::error_code) {});
  std::this_thread::sleep_for(2ms);
  ::raise(SIGKILL);
  return 1;
}

// A worker SIGKILLed mid-transfer (`victim`); `ps` fails its pending receives
// and keeps serving the survivor.
int run_kill_scenario(int (*ps_role)(const fw::cluster_spec&), int (*victim_role)(const fw::cluster_spec&)) {
  const auto spec = rdma_cluster();
  const pid_t ps = spawn(240, [&] { return ps_role(spec); });
  const pid_t victim = spawn(240, [&] { return victim_role(spec); });
  const pid_t survivor = spawn(240, [&] { return kill_survivor(spec); });
  bool ok = fusewire::test::died_of_sigkill(victim, "worker:0");
  ok = all_succeeded({{ps, "ps:0"}, {survivor, "worker:1"}}) && ok;
  return ok ? 0 : 1;
}

int run_direct_kill() { return run_kill_scenario(direct_kill_ps, direct_kill_victim); }
int run_kill() { return run_kill_scenario(kill_ps, kill_victim); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s exchange|kill|direct_kill\n", argv[0]);
    return 2;
  }
  std::string why;
  if (!fw::verbs::available(why)) {
    std::printf("SKIP verbs_mp %s: no usable RDMA device here: %s\n", argv[1], why.c_str());
    return 77;
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::alarm(450);
  const std::string scenario = argv[1];
  int rc = 2;
  if (scenario == "exchange") {
    rc = run_exchange();
  } else if (scenario == "kill") {
    rc = run_kill();
  } else if (scenario == "direct_kill") {
    rc = run_direct_kill();
  } else {
    std::fprintf(stderr, "unknown scenario '%s' (allowed: exchange, kill, direct_kill)\n", argv[1]);
    return 2;
  }
  std::printf("verbs_mp %s: %s\n", argv[1], rc == 0 ? "passed" : "FAILED");
  return rc;
}
