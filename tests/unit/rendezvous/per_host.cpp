// One cluster whose endpoints run different transports: a PS on
// per_host<shm, asio_tcp>, and workers on per_host (reaching it over shm),
// per_host that takes no host for this one (over TCP), plain asio_tcp and
// plain shm. Every worker exchanges every size with the PS, both ways,
// chunked and whole, in block and poll modes; the tensors are in the shared
// pool of whichever side has one (endpoint::allocate_registered), which shm
// peers copy straight out of and TCP sends as ordinary memory.
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/per_host.hpp>
#include <fusewire/transport/shm.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "endpoint_fixture.hpp"
#include "support/loopback_cluster.hpp"
#include "support/patterns.hpp"

namespace per_host_cases {

using namespace fusewire::test;

namespace {

/// `t` moved into the shared pool of `ep`'s transport, where it has one.
template <class T>
fw::tensor_buffer pooled(rv::endpoint<T>& ep, fw::tensor_buffer t) {
  if constexpr (fw::shared_memory_transport<T>) {
    fw::tensor_buffer p = ep.allocate_registered(t.size());
    std::memcpy(p.data(), t.data(), t.size());
    return p;
  } else {
    return t;
  }
}

using mixed = fw::per_host<fw::shm, fw::asio_tcp>;

const std::vector<std::size_t> sizes{1, 5000, 700000, 3u << 20};

/// A worker's endpoint of transport T, type-erased to the exchange the test makes.
struct worker_side {
  virtual ~worker_side() = default;
  /// Sends every size to the PS under "up/K" and checks its echo under "down/K".
  virtual std::vector<std::error_code> exchange(unsigned seed) = 0;
};

template <class T>
struct worker_of final : worker_side {
  rv::endpoint<T> ep;
  worker_of(fw::task_id self, const fw::cluster_spec& spec, fw::options o, T t)
      : ep(self, spec, rv::endpoint_config<T>{.options = o, .transport = std::move(t)}) {}
  std::vector<std::error_code> exchange(unsigned seed) override {
    std::vector<std::error_code> out;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto s = static_cast<std::uint32_t>(seed * 100 + k);
      out.push_back(ep.send_sync(ps0, "up/" + std::to_string(k), pooled(ep, pattern(sizes[k], s)), 60s));
      auto r = ep.recv_sync(ps0, "down/" + std::to_string(k), 60s);
      if (!r.ec && !matches(r.buffer, sizes[k], s)) r.ec = make_error_code(fw::errc::malformed_frame);
      out.push_back(r.ec);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("per_host: one PS serves workers over shm, over TCP, and on either plain transport") {
  for (const fw::reactor_mode mode : {fw::reactor_mode::block, fw::reactor_mode::poll}) {
    CAPTURE(fw::to_string(mode));
    const auto spec = loopback_cluster(1, 4);
    fw::options o = block_options();
    o.mode = mode;
    o.chunk_size = 256 << 10;
    rv::endpoint<mixed> ps(ps0, spec, {.options = o});
    const mixed nothing_near(fw::shm{}, fw::asio_tcp{}, [](std::string_view) { return false; });
    std::vector<std::unique_ptr<worker_side>> ws;
    ws.push_back(std::make_unique<worker_of<mixed>>(fw::task_id{"worker", 0}, spec, o, mixed{}));
    ws.push_back(std::make_unique<worker_of<mixed>>(fw::task_id{"worker", 1}, spec, o, nothing_near));
    ws.push_back(std::make_unique<worker_of<fw::asio_tcp>>(fw::task_id{"worker", 2}, spec, o, fw::asio_tcp{}));
    ws.push_back(std::make_unique<worker_of<fw::shm>>(fw::task_id{"worker", 3}, spec, o, fw::shm{}));

    // The PS echoes each tensor back; the workers run at once.
    std::vector<std::future<std::vector<std::error_code>>> runs;
    for (unsigned i = 0; i < ws.size(); ++i) {
      runs.push_back(std::async(std::launch::async, [&ws, i] { return ws[i]->exchange(i); }));
    }
    for (unsigned i = 0; i < ws.size(); ++i) {
      const fw::task_id w{"worker", i};
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        auto r = ps.recv_sync(w, "up/" + std::to_string(k), 60s);
        REQUIRE_FALSE(r.ec);
        CHECK(matches(r.buffer, sizes[k], i * 100 + k));
        REQUIRE_FALSE(ps.send_sync(w, "down/" + std::to_string(k), pooled(ps, std::move(r.buffer)), 60s));
      }
    }
    for (unsigned i = 0; i < ws.size(); ++i) {
      CAPTURE(i);
      for (const std::error_code& ec : wait(runs[i])) CHECK_FALSE(ec);
    }
  }
}

}  // namespace per_host_cases
