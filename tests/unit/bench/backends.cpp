// One conformance suite for every built fwbench backend: a PS in a thread of
// this process, a client, and the contract of backend.hpp (echo and ack,
// raw and serialized, one PS and several, mismatches reported, stop works).

#include <doctest/doctest.h>

#include <memory>
#include <thread>

#include "backend.hpp"
#include "payload.hpp"
#include "support/error_text.hpp"
#include "support/ports.hpp"

using namespace fusewire::bench;
using fusewire::test::reserved_ports;

namespace {

/// The cluster of one test: 2 PSs and 3 workers. Backends with fixed_ports
/// (fusewire) get reserved ports for every task; the others listen on port 0
/// and ignore the workers.
struct test_cluster {
  reserved_ports ports;
  cluster_spec spec;

  explicit test_cluster(const backend_info& info) {
    for (int i = 0; i < 2; ++i) spec.ps.push_back({"127.0.0.1", info.fixed_ports ? ports.take() : std::uint16_t{0}});
    for (int j = 0; j < 3; ++j) spec.workers.push_back({"127.0.0.1", ports.take()});
  }

  client_config client(std::vector<endpoint> ps, unsigned task) const {
    client_config cc;
    cc.ps = std::move(ps);
    cc.workers = spec.workers;
    cc.task = task;
    return cc;
  }
};

struct running_server {
  std::unique_ptr<server> srv;
  std::thread thread;

  running_server(const backend_info& info, reply_kind reply, wire_mode mode, const transport_settings& t,
                 const test_cluster& cluster, unsigned task = 0) {
    server_config sc;
    sc.listen = cluster.spec.ps.at(task);
    sc.reply = reply;
    sc.mode = mode;
    sc.transport = t;
    sc.cluster = cluster.spec;
    sc.task = task;
    srv = info.make_server(sc);
    thread = std::thread([s = srv.get()] { s->run(); });
  }
  ~running_server() {
    srv->stop();
    thread.join();
  }
  endpoint where() const { return {"127.0.0.1", srv->port()}; }
};

struct variant {
  std::string backend;
  wait_mode mode;
};

#if defined(__SANITIZE_THREAD__)
constexpr bool under_tsan = true;
#else
constexpr bool under_tsan = false;
#endif

std::vector<variant> built_variants() {
  std::vector<variant> out;
  for (const backend_info& b : backends()) {
    if (!b.available || b.rdma) continue;  // RDMA: the rdma suite (fwbench_fusewire_verbs)
    // fusewire-auto runs one of the others (shm on loopback); fusewire.cpp tests it.
    if (b.picks_transport) continue;
    // libgrpc and libzmq are not built with TSan, which then cannot see their
    // own synchronization and reports races inside them; test only our code.
    if (under_tsan && b.name != "floor" && !b.fusewire) {
      static bool said = false;
      if (!said) MESSAGE("ThreadSanitizer build: grpc and zmq are not tested (their libraries are uninstrumented)");
      said = true;
      continue;
    }
    if (b.fusewire) {
      // Busy-polling reactors (one per endpoint, five here) would only share
      // two cores; fusewire.cpp runs poll mode on its own.
      for (wait_mode m : {wait_mode::adaptive, wait_mode::block}) out.push_back({b.name, m});
    } else if (b.honours_wait_mode) {
      for (wait_mode m : {wait_mode::poll, wait_mode::adaptive, wait_mode::block}) out.push_back({b.name, m});
    } else {
      out.push_back({b.name, wait_mode::block});
    }
  }
  return out;
}

payload make_payload(std::vector<std::size_t> sizes) {
  payload_spec spec;
  spec.kind = scheme::custom;
  spec.custom = std::move(sizes);
  return payload(plan_payload(spec), 3);
}

}  // namespace

TEST_CASE("every built backend echoes and acknowledges, raw and serialized") {
  const payload small = make_payload({10, 1, 1000});
  const payload mixed = make_payload({10, 10 * kib, 2 * mib, 1, 64 * kib});
  for (const variant& v : built_variants()) {
    const backend_info& info = *find_backend(v.backend);
    for (wire_mode mode : {wire_mode::raw, wire_mode::serialized}) {
      if (mode == wire_mode::serialized && !info.serialized) continue;
      for (reply_kind reply : {reply_kind::echo, reply_kind::ack}) {
        CAPTURE(v.backend);
        CAPTURE(option_name(v.mode));
        CAPTURE(option_name(mode));
        CAPTURE(reply == reply_kind::echo ? "echo" : "ack");
        transport_settings t;
        t.mode = v.mode;
        t.connect_timeout_s = 10;
        const test_cluster cluster(info);
        running_server ps0(info, reply, mode, t, cluster, 0);
        running_server ps1(info, reply, mode, t, cluster, 1);

        client_config one = cluster.client({ps0.where()}, 0);
        one.reply = reply;
        one.mode = mode;
        one.transport = t;
        std::unique_ptr<client> c = info.make_client(one);
        for (int i = 0; i < 20; ++i) CHECK(c->exchange(small.buffers(), i == 0) == small.total_size());
        CHECK(c->exchange(mixed.buffers(), true) == mixed.total_size());
        CHECK(c->exchange(small.buffers(), true) == small.total_size());

        client_config two = one;
        two.ps = {ps0.where(), ps1.where()};
        two.task = 1;
        std::unique_ptr<client> both = info.make_client(two);
        for (int i = 0; i < 5; ++i) CHECK(both->exchange(mixed.buffers(), i == 0) == 2 * mixed.total_size());
        // A third worker on the same PS at the same time.
        client_config three = one;
        three.task = 2;
        std::unique_ptr<client> other = info.make_client(three);
        CHECK(other->exchange(small.buffers(), true) == small.total_size());
        CHECK(c->exchange(small.buffers(), true) == small.total_size());
      }
    }
  }
}

TEST_CASE("a worker that expects another reply says so") {
  const payload data = make_payload({10, 20});
  for (const variant& v : built_variants()) {
    if (v.mode == wait_mode::poll) continue;
    CAPTURE(v.backend);
    const backend_info& info = *find_backend(v.backend);
    transport_settings t;
    t.mode = v.mode;
    const test_cluster cluster(info);
    running_server ps(info, reply_kind::echo, wire_mode::raw, t, cluster);
    client_config cc = cluster.client({ps.where()}, 0);
    cc.reply = reply_kind::ack;
    cc.transport = t;
    std::unique_ptr<client> c = info.make_client(cc);
    try {
      c->exchange(data.buffers(), true);
      FAIL("no error for an echo where an ack was expected");
    } catch (const std::system_error& e) {
      CHECK(std::string(e.what()).find("--benchmark") != std::string::npos);
    }
  }
}

TEST_CASE("a worker that cannot reach its PS gives up after the connect timeout") {
  for (const variant& v : built_variants()) {
    if (v.mode != wait_mode::block) continue;
    CAPTURE(v.backend);
    const backend_info& info = *find_backend(v.backend);
    // A port nobody listens on: bind one, note it, close it.
    std::uint16_t port = 0;
    {
      server_config sc;
      sc.listen = {"127.0.0.1", 0};
      port = find_backend("floor")->make_server(sc)->port();
    }
    const test_cluster cluster(info);
    client_config cc = cluster.client({{"127.0.0.1", port}}, 0);
    cc.transport.connect_timeout_s = 0.3;
    try {
      info.make_client(cc);
      FAIL("connected to a closed port");
    } catch (const std::system_error& e) {
      CHECK(e.code().value() == static_cast<int>(fusewire::errc::connection_refused));
      CHECK(std::string(e.what()).find("cannot connect to PS 127.0.0.1:" + std::to_string(port)) != std::string::npos);
    }
  }
}

TEST_CASE("a PS that cannot listen says where") {
  server_config sc;
  sc.listen = {"127.0.0.1", 0};
  auto first = find_backend("floor")->make_server(sc);
  sc.listen.port = first->port();
  for (const variant& v : built_variants()) {
    if (v.mode != wait_mode::block) continue;
    CAPTURE(v.backend);
    const backend_info& info = *find_backend(v.backend);
    // A same-host backend with fixed ports names its sockets after them in
    // its own namespace (shm: abstract Unix sockets), which a TCP listener
    // does not take: it collides with itself. (tensorpipe-uv-cma is same-host
    // for its channel; its ports are TCP ports.)
    std::unique_ptr<server> taken;
    if (info.same_host && info.fixed_ports) taken = info.make_server(sc);  // free in its namespace: this one listens
    try {
      info.make_server(sc);
      FAIL("listened twice on one port");
    } catch (const std::system_error& e) {
      CHECK(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(sc.listen.port)) !=
            std::string::npos);
    }
  }
}
