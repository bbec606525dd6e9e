// rendezvous_channel over real endpoints on loopback, inside one process (one
// endpoint and one executor thread per task); tests/multiprocess/graph does
// the same across processes.
#include <fusewire/graph/rendezvous_channel.hpp>

#include <doctest/doctest.h>

#include <fusewire/core/options.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/transport/asio_tcp.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/graphs.hpp"
#include "support/loopback_cluster.hpp"
#include "support/tensor_string_maker.hpp"

namespace rendezvous_channel_cases {

namespace fg = fusewire::graph;
using fusewire::errc;
using namespace fusewire::test;
using namespace std::chrono_literals;
using endpoint = fusewire::rendezvous::endpoint<fusewire::asio_tcp>;
using channel = fg::rendezvous_channel<fusewire::asio_tcp>;

static_assert(fg::channel<channel>);

namespace {

fusewire::options quiet_options(bool coalesce) {
  fusewire::options o;
  o.mode = fusewire::reactor_mode::block;
  o.pool_size = 1u << 20;
  o.connect_timeout = 10000ms;
  o.coalesce = coalesce;
  return o;
}

std::string key(const std::string& src, const std::string& dst, const std::string& name, int iter = 0) {
  return src + "/device:CPU:0;0000000000000001;" + dst + "/device:CPU:0;" + name + ";0:" + std::to_string(iter);
}

struct received {
  std::error_code ec;
  fg::payload p;
};

received recv_sync(channel& ch, std::uint64_t step, const std::string& k) {
  auto done = std::make_shared<std::promise<received>>();
  auto f = done->get_future();
  ch.async_recv(step, k, [done](std::error_code ec, fg::payload p) { done->set_value({ec, std::move(p)}); });
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  return f.get();
}

bool same_bits(const fg::message_entry& a, const fg::message_entry& b) {
  return a.descriptor == b.descriptor && a.dead == b.dead && a.bytes.size() == b.bytes.size() &&
         (a.bytes.size() == 0 || std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0);
}

fg::payload mixed(float base) {
  fg::payload p;
  p.push_back(fg::message_entry::of(fg::tensor({2}, {base, base + 1})));
  p.push_back(fg::message_entry::token(true));
  p.push_back(fg::message_entry::of(fg::tensor({3}, {base, -base, 0.5f})));
  p.push_back(fg::message_entry::token(false));
  return p;
}

}  // namespace

TEST_CASE("payloads cross endpoints with their descriptors and dead bits, fused or not") {
  for (bool coalesce : {false, true}) {
    CAPTURE(coalesce);
    const auto spec = loopback_cluster(1, 1);
    auto wo = quiet_options(coalesce);
    // A batch waits up to this long for more sends: the sends made below from this
    // thread in a row then share a frame however slowly the reactor runs (TSan),
    // instead of depending on reaching the reactor within one tick.
    if (coalesce) wo.fuse_delay = 200ms;
    endpoint worker_ep(worker_task, spec, {.options = wo});
    endpoint ps_ep(ps0_task, spec, {.options = quiet_options(coalesce)});
    channel w(worker_ep), p(ps_ep);
    // Several small messages in a row: with coalescing they leave as fused frames.
    for (int i = 0; i < 8; ++i)
      CHECK_FALSE(w.send(3, key(worker, ps0, "m" + std::to_string(i)), mixed(static_cast<float>(i))));
    // One whose receive is posted first.
    auto late = std::async(std::launch::async, [&] { return recv_sync(p, 3, key(worker, ps0, "late")); });
    std::this_thread::sleep_for(20ms);
    CHECK_FALSE(w.send(3, key(worker, ps0, "late"), mixed(9)));
    for (int i = 0; i < 8; ++i) {
      auto r = recv_sync(p, 3, key(worker, ps0, "m" + std::to_string(i)));
      REQUIRE_FALSE(r.ec);
      const auto want = mixed(static_cast<float>(i));
      REQUIRE(r.p.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k) CHECK(same_bits(r.p[k], want[k]));
      CHECK(r.p[1].dead);
      CHECK_FALSE(r.p[3].dead);
    }
    auto l = late.get();
    REQUIRE_FALSE(l.ec);
    CHECK(same_bits(l.p[2], mixed(9)[2]));
    CHECK(w.flush(10s));
    CHECK_FALSE(w.error());
    const auto c = w.sent(3);
    CHECK(c.messages == 9);
    CHECK(c.tensors == 36);
    CHECK(c.bytes == 9 * 20);
    CHECK(c.wire_bytes == 9 * fg::encoded_size(mixed(0)));
    if (coalesce) {
      CHECK(worker_ep.stats().fused_frames_sent > 0);
    } else {
      CHECK(worker_ep.stats().fused_frames_sent == 0);
    }
    // Steps keep their keys apart: the same key in step 4 is another message.
    CHECK_FALSE(w.send(4, key(worker, ps0, "m0"), mixed(40)));
    auto again = recv_sync(p, 4, key(worker, ps0, "m0"));
    REQUIRE_FALSE(again.ec);
    CHECK(same_bits(again.p[0], mixed(40)[0]));
    CHECK(w.flush(10s));
  }
}

TEST_CASE("keys that this process neither sends nor receives are refused") {
  const auto spec = loopback_cluster(1, 1);
  endpoint worker_ep(worker_task, spec, {.options = quiet_options(true)});
  channel w(worker_ep, {.recv_timeout = 200ms, .on_send_error = {}});
  CHECK(w.send(1, key(ps0, worker, "not_mine"), {}) == errc::invalid_argument);
  CHECK(w.send(1, "no;parts", {}) == errc::invalid_argument);
  CHECK(w.send(1, key("/job:worker", ps0, "no_task"), {}) == errc::invalid_argument);
  fg::payload bad;
  bad.push_back(fg::message_entry::of(fg::tensor({2}, {1, 2})));
  bad[0].dead = true;
  CHECK(w.send(1, key(worker, ps0, "dead_with_bytes"), std::move(bad)) == errc::invalid_argument);
  CHECK(recv_sync(w, 1, key(worker, ps0, "i_am_the_sender")).ec == errc::invalid_argument);
  CHECK(recv_sync(w, 1, "garbage").ec == errc::invalid_argument);
  // A receive nobody answers times out instead of hanging.
  CHECK(recv_sync(w, 1, key(ps0, worker, "never")).ec == errc::timed_out);
  std::error_code ec;
  std::string why;
  CHECK_FALSE(fg::key_route("a;b", ec, &why));
  CHECK(ec == errc::invalid_argument);
  CHECK(why == "key 'a;b' is not src_device;incarnation;dst_device;name;frame:iter");
  auto r = fg::key_route(
      "/job:worker/replica:0/task:0/device:GPU:0;0000000000000001;"
      "/job:ps/replica:0/task:1/device:CPU:0;edge_5_foo;0:0",
      ec);
  REQUIRE(r);
  CHECK(r->first == worker_task);
  CHECK(r->second == ps1_task);
}

TEST_CASE("a send to a task nobody serves is reported through error()") {
  const auto spec = loopback_cluster(1, 1);
  auto opts = quiet_options(false);
  opts.connect_timeout = 300ms;
  endpoint worker_ep(worker_task, spec, {.options = opts});
  std::promise<std::string> reported;
  channel w(worker_ep, {.recv_timeout = 0ms, .on_send_error = [&](const std::string& k, std::error_code ec) {
                          reported.set_value(k + ": " + ec.message());
                        }});
  CHECK_FALSE(w.send(1, key(worker, ps0, "lost"), mixed(1)));
  CHECK(w.flush(10s));
  CHECK(w.error() == errc::connection_refused);
  auto f = reported.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  CHECK(f.get() == key(worker, ps0, "lost") + ": " + fusewire::make_error_code(errc::connection_refused).message());
}

TEST_CASE("a partitioned loop runs over endpoints, one thread per task, as in one process") {
  fg::placed_graph g(rnn_loop());
  const fg::feed_map feeds{{"h0", fg::tensor({1, 4}, {1, -1, 0.5f, 2})}};
  const std::vector<std::string> fetches{"rnn/while/exit_h", "rnn/while/exit_i", "update_b"};
  fg::executor single(g);
  std::vector<std::map<std::string, fg::tensor>> want;
  for (int s = 0; s < 2; ++s) want.push_back(single.run(feeds, fetches));

  for (auto mode : {fg::partition_mode::send_recv, fg::partition_mode::star_server}) {
    CAPTURE(fg::to_string(mode));
    fg::partition_options o;
    o.mode = mode;
    o.tensor_fuse = true;
    const auto plan = fg::partition(g, o);
    const auto spec = loopback_cluster(1, 1);
    // Each task thread fills its own results; they are merged after the joins.
    std::vector<std::vector<std::map<std::string, fg::tensor>>> per_task(
        plan.partitions.size(), std::vector<std::map<std::string, fg::tensor>>(2));
    std::vector<std::string> errors(plan.partitions.size());
    std::vector<std::thread> tasks;
    std::latch all_done(static_cast<std::ptrdiff_t>(plan.partitions.size()));
    for (std::size_t t = 0; t < plan.partitions.size(); ++t)
      tasks.emplace_back([&, t] {
        const auto& part = plan.partitions[t];
        std::unique_ptr<endpoint> ep;
        try {
          ep = std::make_unique<endpoint>(part.task, spec, endpoint::config_type{.options = quiet_options(true)});
          channel ch(*ep, {.recv_timeout = 20000ms, .on_send_error = {}});
          fg::executor ex(part.graph);
          for (std::uint64_t s = 1; s <= 2; ++s) {
            auto r =
                fg::run_step(ex, ch, s, fg::feeds_for(ex.graph(), feeds), fg::fetches_for(ex.graph(), fetches), 20s);
            for (auto& [name, value] : r) per_task[t][s - 1][name] = std::move(value);
          }
          if (!ch.flush(10s)) errors[t] = "sends still in flight";
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
        // Close the endpoints only once every task is done.
        all_done.arrive_and_wait();
      });
    for (auto& th : tasks) th.join();
    for (const auto& e : errors) CHECK(e == "");
    std::vector<std::map<std::string, fg::tensor>> got(2);
    for (auto& task : per_task)
      for (std::size_t s = 0; s < 2; ++s)
        for (auto& [name, value] : task[s]) got[s][name] = std::move(value);
    CHECK(got == want);
  }
}

}  // namespace rendezvous_channel_cases
