// The fusewire backends of fwbench (fusewire-uring, fusewire-asio, fusewire-shm, fusewire-shm-uring): their
// option errors, a tiny run in each reactor mode (with fusion and pinning),
// serialized mode, a PS serving a worker that comes back, and the launcher's
// port handling. The conformance suite in backends.cpp covers the rest of
// backend.hpp's contract. No timing is judged.

#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "backend.hpp"
#include "driver.hpp"
#include "payload.hpp"
#include "support/error_text.hpp"
#include "support/ports.hpp"

using namespace fusewire::bench;
using fusewire::test::error_text_of;
using fusewire::test::reserved_ports;

namespace {

std::vector<const backend_info*> fusewire_built() {
  std::vector<const backend_info*> out;
  for (const backend_info& b : backends()) {
    if (b.fusewire && b.available && !b.rdma) out.push_back(&b);  // verbs: the rdma suite
  }
  return out;
}

payload make_payload(std::vector<std::size_t> sizes) {
  payload_spec spec;
  spec.kind = scheme::custom;
  spec.custom = std::move(sizes);
  return payload(plan_payload(spec), 5);
}

/// One PS (in a thread) and the cluster around it: 1 PS, `workers` workers.
struct setup {
  reserved_ports ports;
  cluster_spec spec;
  std::unique_ptr<server> srv;
  std::thread thread;

  setup(const backend_info& info, reply_kind reply, wire_mode mode, const transport_settings& t, unsigned workers = 1) {
    spec.ps.push_back({"127.0.0.1", ports.take()});
    for (unsigned j = 0; j < workers; ++j) spec.workers.push_back({"127.0.0.1", ports.take()});
    server_config sc;
    sc.listen = spec.ps[0];
    sc.reply = reply;
    sc.mode = mode;
    sc.transport = t;
    sc.cluster = spec;
    srv = info.make_server(sc);
    thread = std::thread([s = srv.get()] { s->run(); });
  }
  ~setup() {
    srv->stop();
    thread.join();
  }

  client_config client(reply_kind reply, wire_mode mode, const transport_settings& t, unsigned task = 0) const {
    client_config cc;
    cc.ps = spec.ps;
    cc.workers = spec.workers;
    cc.task = task;
    cc.reply = reply;
    cc.mode = mode;
    cc.transport = t;
    return cc;
  }
};

}  // namespace

TEST_CASE("fusewire backends are registered with what compare and the launcher need") {
  const backend_info* asio = find_backend("fusewire-asio");
  const backend_info* uring = find_backend("fusewire-uring");
  REQUIRE(asio != nullptr);
  REQUIRE(uring != nullptr);
  CHECK(asio->available);
  for (const backend_info* b : {asio, uring}) {
    CHECK(b->fusewire);
    CHECK(b->fixed_ports);
    CHECK(b->honours_wait_mode);
  }
#if FUSEWIRE_HAS_URING
  CHECK(uring->available);
#else
  CHECK(uring->unavailable_reason == "fusewire-uring: not built (liburing >= 2.2 was not found; Debian: liburing-dev)");
#endif
  // Verbs is registered (built or not) as RDMA: never compare's TCP subject,
  // never in the default set of a run.
  const backend_info* verbs = find_backend("fusewire-verbs");
  REQUIRE(verbs != nullptr);
  CHECK(verbs->rdma);
  CHECK(verbs->fusewire);
  CHECK_FALSE(asio->rdma);
  run_config rc;
  for (const cell& c : plan_cells(rc)) CHECK(c.backend.name != "fusewire-verbs");
  // Shared memory needs every process on one host: only when named. It runs
  // every fusewire_built() case below.
  const backend_info* shm = find_backend("fusewire-shm");
  REQUIRE(shm != nullptr);
  CHECK(shm->available);
  CHECK(shm->fusewire);
  CHECK(shm->same_host);
  CHECK_FALSE(shm->rdma);
  CHECK_FALSE(asio->same_host);
  for (const cell& c : plan_cells(rc)) CHECK(c.backend.name != "fusewire-shm");
#if FUSEWIRE_HAS_URING
  // The same on io_uring's reactor.
  const backend_info* shm_uring = find_backend("fusewire-shm-uring");
  REQUIRE(shm_uring != nullptr);
  CHECK(shm_uring->available);
  CHECK(shm_uring->same_host);
  for (const cell& c : plan_cells(rc)) CHECK(c.backend.name != "fusewire-shm-uring");
#endif
  // The run-time choice (here shm, the cluster being on loopback): only when named.
  const backend_info* autopick = find_backend("fusewire-auto");
  REQUIRE(autopick != nullptr);
  CHECK(autopick->available);
  CHECK(autopick->fusewire);
  CHECK(autopick->picks_transport);
  CHECK_FALSE(autopick->same_host);
  CHECK_FALSE(autopick->rdma);
  for (const cell& c : plan_cells(rc)) CHECK(c.backend.name != "fusewire-auto");
#if !FUSEWIRE_HAS_RDMA
  CHECK_FALSE(verbs->available);
#endif
  // The others have no fixed ports: the launcher leaves them port 0.
  CHECK_FALSE(find_backend("floor")->fixed_ports);
}

TEST_CASE("fusewire backends: option errors name the value and what is allowed") {
  for (const backend_info* info : fusewire_built()) {
    CAPTURE(info->name);
    const std::string n = info->name;
    reserved_ports ports;
    const std::uint16_t ps_port = ports.take();
    const std::uint16_t worker_port = ports.take();

    server_config sc;
    sc.listen = {"127.0.0.1", 0};
    CHECK(error_text_of([&] { info->make_server(sc); }) ==
          n + ": cannot listen on 127.0.0.1:0: needs a fixed port (a fusewire cluster spec names every task's "
              "address, so every task's port must be known before it starts; the launcher reserves them)");

    sc.listen = {"127.0.0.1", ps_port};
    sc.cluster.ps = {sc.listen};
    sc.cluster.workers = {{"127.0.0.1", worker_port}, {"127.0.0.1", 0}};
    CHECK(error_text_of([&] { info->make_server(sc); }) ==
          n + ": worker 1 has no port (127.0.0.1:0); a fusewire cluster spec names every task's address, so every "
              "PS and worker needs a fixed port (the launcher reserves them; by hand: --cluster "
              "'ps=host:port,...;worker=host:port,...')");

    sc.cluster.workers = {{"127.0.0.1", worker_port}};
    sc.transport.idle_poll = std::chrono::microseconds(2'000'000);
    CHECK(error_text_of([&] { info->make_server(sc); }) ==
          "--idle-poll 2000000: " + n + " takes 0 to 1000000 us (fusewire's FUSEWIRE_IDLE_POLL_US range)");

    client_config cc;
    cc.ps = {{"127.0.0.1", ps_port}};
    cc.workers = {{"127.0.0.1", worker_port}};
    cc.task = 3;
    CHECK(error_text_of([&] { info->make_client(cc); }) ==
          n + ": worker 3 is not in the cluster (it names 1 workers); fusewire PSs reply to the worker addresses "
              "in --cluster");
    cc.task = 0;
    cc.ps = {{"127.0.0.1", 0}};
    CHECK(error_text_of([&] { info->make_client(cc); }) ==
          n + ": PS 0 has no port (127.0.0.1:0); a fusewire cluster spec names every task's address, so every "
              "PS and worker needs a fixed port (the launcher reserves them; by hand: --cluster "
              "'ps=host:port,...;worker=host:port,...')");
  }
}

TEST_CASE("fusewire backends: a tiny run in every reactor mode, with fusion and pinning") {
  const payload data = make_payload({10, 64 * kib, 1, 3 * kib});
  struct variant {
    wait_mode mode;
    bool fusion;
    bool pin;
  };
  for (const backend_info* info : fusewire_built()) {
    for (const variant v : {variant{wait_mode::poll, false, false}, variant{wait_mode::adaptive, true, false},
                            variant{wait_mode::block, false, false}, variant{wait_mode::block, true, true}}) {
      for (const reply_kind reply : {reply_kind::echo, reply_kind::ack}) {
        CAPTURE(info->name);
        CAPTURE(option_name(v.mode));
        CAPTURE(v.fusion);
        CAPTURE(v.pin);
        transport_settings t;
        t.mode = v.mode;
        t.fusion = v.fusion;
        t.pin = v.pin;
        t.connect_timeout_s = 10;
        setup ps(*info, reply, wire_mode::raw, t);
        std::unique_ptr<client> c = info->make_client(ps.client(reply, wire_mode::raw, t));
        CHECK(c->exchange(data.buffers(), true) == data.total_size());

        std::vector<std::int64_t> samples;
        std::atomic<int> ticks{0};
        exchange_run r;
        r.payload = data.buffers();
        r.expected_reply = data.total_size();
        r.until = bench_clock::now() + std::chrono::milliseconds(30);
        r.samples = &samples;
        r.tick = [&](std::uint64_t) { ++ticks; };
        const std::uint64_t n = c->run(r);
        CHECK(n > 0);
        CHECK(samples.size() == n);
        for (std::int64_t s : samples) CHECK(s > 0);
        // The client is still usable after a run, for another payload size.
        const payload other = make_payload({7});
        CHECK(c->exchange(other.buffers(), true) == other.total_size());

        // A run whose replies do not add up says so.
        r.expected_reply = data.total_size() + 1;
        r.until = bench_clock::now() + std::chrono::seconds(5);
        r.samples = nullptr;
        CHECK(error_text_of([&] { c->run(r); }, fusewire::errc::size_mismatch) ==
              "the PSs answered for " + std::to_string(data.total_size()) + " bytes, expected " +
                  std::to_string(data.total_size() + 1) + "; do they run the same --benchmark and --mode?");
      }
    }
  }
}

TEST_CASE("fusewire backends: serialized mode and payloads of several sizes") {
  if (!find_backend("floor")->serialized) {
    MESSAGE("serialized mode needs protobuf, which this build lacks");
    return;
  }
  const payload small = make_payload({10, 1, 1000});
  const payload large = make_payload({2 * mib, 10, 300 * kib});
  for (const backend_info* info : fusewire_built()) {
    for (const reply_kind reply : {reply_kind::echo, reply_kind::ack}) {
      CAPTURE(info->name);
      transport_settings t;
      t.mode = wait_mode::block;
      setup ps(*info, reply, wire_mode::serialized, t);
      std::unique_ptr<client> c = info->make_client(ps.client(reply, wire_mode::serialized, t));
      for (int i = 0; i < 3; ++i) {
        CHECK(c->exchange(small.buffers(), true) == small.total_size());
        CHECK(c->exchange(large.buffers(), true) == large.total_size());
      }
    }
  }
}

TEST_CASE("fusewire backends: a PS keeps serving a worker that leaves and comes back") {
  const payload data = make_payload({100, 5 * kib});
  for (const backend_info* info : fusewire_built()) {
    CAPTURE(info->name);
    transport_settings t;
    t.mode = wait_mode::block;
    t.connect_timeout_s = 10;
    setup ps(*info, reply_kind::echo, wire_mode::raw, t, 2);
    for (int round = 0; round < 2; ++round) {
      std::unique_ptr<client> c = info->make_client(ps.client(reply_kind::echo, wire_mode::raw, t, 0));
      std::unique_ptr<client> d = info->make_client(ps.client(reply_kind::echo, wire_mode::raw, t, 1));
      for (int i = 0; i < 3; ++i) {
        CHECK(c->exchange(data.buffers(), true) == data.total_size());
        CHECK(d->exchange(data.buffers(), i == 0) == data.total_size());
      }
    }
  }
}
