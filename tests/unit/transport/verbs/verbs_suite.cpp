// The transport test suite over verbs, plus verbs-only tests (credits, flow
// control, device choice). Needs an RDMA device: without one it prints why and
// exits 77 (skipped). In the QEMU guest the soft-RoCE device rxe0 sits on
// 192.0.2.1 (override with FUSEWIRE_RDMA_TEST_ADDR).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <fusewire/transport/verbs.hpp>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "support/verbs_setup.hpp"

#include "../transport_suite.hpp"

namespace {

/// The suite reaches verbs on the RDMA-capable interface, with the small test config.
template <>
struct suite_traits<fw::verbs> : suite_defaults<fw::verbs> {
  static std::string host() { return fw::test::rdma_host(); }
  static fw::verbs make() { return fw::test::small_verbs(); }
};

using verbs_transports = std::tuple<fw::verbs>;

}  // namespace

// Every test case of the suite but the hand-off ones: verbs is no handoff_transport.
TEST_CASE_TEMPLATE_APPLY(suite_connect_accept, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_echo, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_scatter_gather, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_buffers, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_back_to_back_writes, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_order, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_read, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_write, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_past_close, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_connections, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_close_cancels, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_peer_closes, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_connect_refused, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_listen_errors, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_off_thread, verbs_transports);
TEST_CASE_TEMPLATE_APPLY(suite_group_stop, verbs_transports);

static_assert(fw::transport<fw::verbs>);

TEST_CASE("verbs: a reader that does not read stops the writer by withholding credits, never overrunning it") {
  harness<fw::verbs> h;
  const std::size_t n = 8u << 20;
  const auto src = pattern_bytes(n, 31);
  auto held = std::make_shared<fw::verbs_connection>();  // reactor 0 only
  std::promise<void> accepted;
  const std::uint16_t port = h.serve(0, [&, held](fw::verbs_connection c) {
    *held = std::move(c);
    accepted.set_value();
  });
  struct outcome {
    bool write_done = false;
    fw::verbs_stats stats;
  };
  auto client = std::make_shared<fw::verbs_connection>();  // reactor 1 only
  auto done = std::make_shared<bool>(false);
  h.on(1, [&, client, done] {
    h.transport.connect(harness<fw::verbs>::here(), fw::test::rdma_host(), port,
                        [&, client, done](std::error_code ec, fw::verbs_connection c) {
                          REQUIRE_FALSE(ec);
                          *client = std::move(c);
                          const fw::const_buffer one[] = {fw::const_buffer(src)};
                          client->async_write(one, [done](std::error_code e, std::size_t) { *done = !e; });
                        });
  });
  auto a = accepted.get_future();
  get(a);
  // Wait until the writer stopped making progress (emulated devices are slow).
  outcome stalled{};
  std::uint64_t last = ~std::uint64_t{0};
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(100ms);
    stalled = h.on(1, [client, done] { return outcome{*done, client->stats()}; });
    if (stalled.stats.bytes_sent == last && stalled.stats.bytes_sent >= (1u << 20)) break;
    last = stalled.stats.bytes_sent;
  }
  CHECK_FALSE(stalled.write_done);
  // Bytes sent are bounded by the receiver's limit plus what it granted before noticing.
  const auto cfg = fw::test::small_verbs().settings();
  CHECK(stalled.stats.bytes_sent >= cfg.rx_buffer_limit);
  CHECK(stalled.stats.bytes_sent <= cfg.rx_buffer_limit + std::size_t{cfg.credits} * cfg.message_size +
                                        std::size_t{cfg.max_grants} * cfg.chunk_size);
  if (cfg.rdma_write_threshold != 0) {
    CHECK(stalled.stats.rdma_writes > 0);  // waiting for grants the reader withholds
  } else {
    CHECK(stalled.stats.credit_stalls > 0);  // waiting for credits the reader withholds
  }
  MESSAGE("stalled after ", stalled.stats.bytes_sent, " bytes, ", stalled.stats.messages_sent, " messages");

  // Now read everything: the writer resumes and the bytes are intact.
  std::vector<std::byte> dst(n);
  std::promise<std::error_code> got;
  h.on(0, [&, held] {
    held->async_read(fw::mutable_buffer(dst), [&](std::error_code e, std::size_t) { got.set_value(e); });
  });
  auto g = got.get_future();
  CHECK_FALSE(get(g));
  CHECK(std::memcmp(dst.data(), src.data(), n) == 0);
  const outcome after = h.on(1, [client, done] { return outcome{*done, client->stats()}; });
  CHECK(after.write_done);
  CHECK(after.stats.bytes_sent == n);
  if (cfg.rdma_write_threshold != 0) {
    CHECK(after.stats.bytes_rdma_written == n);  // one 8 MiB write: all of it by RDMA write, in chunks
    CHECK(after.stats.rdma_writes == n / cfg.chunk_size);
  }
  h.on(0, [held] { held->close(); });
  h.on(1, [client] { client->close(); });
}

TEST_CASE("verbs: small writes in one tick are coalesced into few messages") {
  harness<fw::verbs> h;
  std::vector<std::byte> dst(1000 * 8);
  std::promise<std::error_code> got;
  auto held = std::make_shared<fw::verbs_connection>();
  const std::uint16_t port = h.serve(0, [&, held](fw::verbs_connection c) {
    *held = std::move(c);
    held->async_read(fw::mutable_buffer(dst), [&](std::error_code e, std::size_t) { got.set_value(e); });
  });
  const auto src = pattern_bytes(dst.size(), 5);
  std::promise<fw::verbs_stats> sent;
  auto client = std::make_shared<fw::verbs_connection>();
  h.group.submit_to(1, [&, client] {
    h.transport.connect(harness<fw::verbs>::here(), fw::test::rdma_host(), port,
                        [&, client](std::error_code ec, fw::verbs_connection c) {
                          REQUIRE_FALSE(ec);
                          *client = std::move(c);
                          auto left = std::make_shared<int>(1000);
                          for (int i = 0; i < 1000; ++i) {
                            const fw::const_buffer one[] = {fw::const_buffer(src.data() + i * 8, 8)};
                            client->async_write(one, [&, client, left](std::error_code e, std::size_t n) {
                              CHECK_FALSE(e);
                              CHECK(n == 8);
                              if (--*left == 0) sent.set_value(client->stats());
                            });
                          }
                        });
  });
  auto s = sent.get_future();
  const fw::verbs_stats st = get(s);
  auto g = got.get_future();
  CHECK_FALSE(get(g));
  CHECK(dst == src);
  MESSAGE("1000 writes of 8 bytes left in ", st.messages_sent, " messages");
  CHECK(st.messages_sent < 100);
  h.on(0, [held] { held->close(); });
  h.on(1, [client] { client->close(); });
}

TEST_CASE("verbs: an absent TF_RDMA_DEV_NAME falls back to the first active device with a warning") {
  fw::reactor_config cfg;
  cfg.count = 1;
  auto warnings = std::make_shared<std::vector<std::string>>();
  std::mutex m;
  cfg.on_error = [&m, warnings](unsigned, std::string_view what) {
    std::lock_guard lock(m);
    warnings->emplace_back(what);
  };
  fw::verbs_reactor_group group(cfg);
  fw::verbs_config vc = fw::test::small_verbs().settings();
  vc.device = "no_such_device9";
  fw::verbs t(vc);
  auto port = group.submit(0, [&] {
    auto l = t.listen(*fw::verbs_reactor::current(), fw::test::rdma_host(), 0);
    return l.port();
  });
  CHECK(port.get() != 0);
  group.stop();
  std::lock_guard lock(m);
  REQUIRE(warnings->size() >= 1);
  CHECK(warnings->front().rfind("verbs: RDMA device no_such_device9 (TF_RDMA_DEV_NAME) not found among [", 0) == 0);
  CHECK(warnings->front().find("the first with an active port") != std::string::npos);
}

TEST_CASE("verbs: bad configs are refused naming the field") {
  fw::verbs_config vc;
  vc.message_size = 5000;
  try {
    fw::verbs t(vc);
    FAIL("accepted message_size 5000");
  } catch (const std::system_error& e) {
    CHECK(std::string(e.what()) ==
          "verbs_config.message_size = 5000: must be a power of two from 4096 to 1073741824: invalid argument");
  }
}

static_assert(fw::rdma_transport<fw::verbs>);

TEST_CASE("verbs: registered pools past TF_RDMA_BUF_SIZE are refused until memory is released") {
  fw::verbs_config vc = fw::test::small_verbs_config();
  const std::size_t pool_bytes = std::size_t{4} << 20;
  vc.registered_limit = vc.fixed_registered_bytes() + pool_bytes;  // room for one pool
  fw::reactor_config cfg;
  cfg.count = 1;
  fw::verbs_reactor_group group(cfg);
  fw::verbs t(vc);
  fw::buffer_pool_config pc;
  pc.total_bytes = pool_bytes;
  pc.block_size = std::size_t{1} << 20;
  struct outcome {
    bool first_ok = false;
    std::string refused;
    bool again_ok = false;
  };
  auto result = group.submit(0, [&] {
    outcome o;
    fw::verbs_reactor& r = *fw::verbs_reactor::current();
    std::optional<fw::buffer_pool> first(t.make_registered_pool(r, pc));
    o.first_ok = first->allocate(pc.block_size, 0).size() == pc.block_size;
    try {
      (void)t.make_registered_pool(r, pc);
    } catch (const std::system_error& e) {
      if (e.code() == fw::errc::out_of_memory) o.refused = e.what();
    }
    first.reset();  // its memory is deregistered: the bytes come back
    fw::buffer_pool again = t.make_registered_pool(r, pc);
    o.again_ok = again.allocate(pc.block_size, 0).size() == pc.block_size;
    return o;
  });
  const outcome o = result.get();
  group.stop();
  CHECK(o.first_ok);
  CHECK(o.refused.find("would pass TF_RDMA_BUF_SIZE = " + std::to_string(vc.registered_limit)) != std::string::npos);
  CHECK(o.again_ok);
}

TEST_CASE("verbs: one-sided writes land in the peer's registered buffer, ordered before later messages") {
  harness<fw::verbs> h;
  fw::buffer_pool_config pc;
  pc.total_bytes = 4u << 20;
  pc.block_size = 1u << 20;
  // The server's registered destination; its description travels over the stream.
  auto pool0 = std::make_shared<std::optional<fw::buffer_pool>>();
  auto dst = std::make_shared<fw::tensor_buffer>();
  const fw::remote_region region = h.on(0, [&, pool0, dst] {
    pool0->emplace(h.transport.make_registered_pool(harness<fw::verbs>::here(), pc));
    *dst = (*pool0)->allocate(1u << 20, 0);
    std::memset(dst->data(), 0, dst->size());
    return fw::verbs::describe(*dst);
  });
  CHECK(region.size == (1u << 20));
  CHECK(region.addr == reinterpret_cast<std::uintptr_t>(h.on(0, [dst] { return dst->data(); })));
  std::vector<std::byte> note(1);
  std::promise<std::error_code> noted;
  auto held = std::make_shared<fw::verbs_connection>();
  const std::uint16_t port = h.serve(0, [&, held](fw::verbs_connection c) {
    *held = std::move(c);
    held->async_read(fw::mutable_buffer(note), [&](std::error_code e, std::size_t) { noted.set_value(e); });
  });
  const auto expect = pattern_bytes(1u << 20, 99);
  struct result {
    std::error_code remote_ec, bad_ec, unregistered_ec;
    std::size_t remote_n = 0;
  };
  std::promise<result> wrote;
  auto client = std::make_shared<fw::verbs_connection>();
  auto pool1 = std::make_shared<std::optional<fw::buffer_pool>>();
  auto src = std::make_shared<fw::tensor_buffer>();
  auto plain = std::make_shared<fw::tensor_buffer>(fw::tensor_buffer::allocate(16));
  auto r = std::make_shared<result>();
  h.group.submit_to(1, [&, client, pool1, src, plain, r] {
    pool1->emplace(h.transport.make_registered_pool(harness<fw::verbs>::here(), pc));
    *src = (*pool1)->allocate(1u << 20, 0);
    std::memcpy(src->data(), expect.data(), expect.size());
    h.transport.connect(harness<fw::verbs>::here(), fw::test::rdma_host(), port,
                        [&, client, src, plain, r](std::error_code ec, fw::verbs_connection c) {
                          REQUIRE_FALSE(ec);
                          *client = std::move(c);
                          client->async_write_remote(*plain, region,
                                                     [r](std::error_code e, std::size_t) { r->unregistered_ec = e; });
                          client->async_write_remote(*src, region, [r](std::error_code e, std::size_t n) {
                            r->remote_ec = e;
                            r->remote_n = n;
                          });
                          static const std::byte one[1] = {std::byte{1}};
                          const fw::const_buffer msg[] = {fw::const_buffer(one, 1)};
                          client->async_write(msg, [&, r](std::error_code e, std::size_t) {
                            CHECK_FALSE(e);
                            wrote.set_value(*r);
                          });
                        });
  });
  auto w = wrote.get_future();
  const result res = get(w);
  CHECK(res.unregistered_ec == fw::errc::invalid_argument);
  CHECK_FALSE(res.remote_ec);
  CHECK(res.remote_n == (1u << 20));
  auto n = noted.get_future();
  CHECK_FALSE(get(n));
  // The message arrived after the write: the bytes are already there.
  CHECK(h.on(0, [dst, &expect] { return std::memcmp(dst->data(), expect.data(), expect.size()) == 0; }));

  // A bad key is refused by the peer's adapter: the write fails, the process lives on.
  std::promise<std::error_code> bad;
  h.group.submit_to(1, [&, client, src] {
    fw::remote_region wrong = region;
    wrong.rkey ^= 0x5a5a5a5au;
    client->async_write_remote(*src, wrong, [&](std::error_code e, std::size_t) { bad.set_value(e); });
  });
  auto b = bad.get_future();
  CHECK(get(b) == fw::errc::device_error);
  CHECK_THROWS_WITH_AS(fw::verbs::describe(*plain),
                       "verbs::describe: the buffer is not registered memory (allocate it from make_registered_pool): "
                       "invalid argument",
                       std::system_error);
  h.on(0, [held, dst, pool0] {
    held->close();
    dst->reset();
    pool0->reset();
  });
  h.on(1, [client, src, pool1] {
    client->close();
    src->reset();
    pool1->reset();
  });
}

namespace {

/// Connections from reactor 1 to a server on reactor 0; the accepted ends stay on reactor 0.
struct verbs_pairs {
  explicit verbs_pairs(harness<fw::verbs>& harn) : h(harn) {
    port = h.serve(0, [accepted = accepted](fw::verbs_connection c) { accepted->push_back(std::move(c)); });
  }
  ~verbs_pairs() {
    h.on(0, [a = accepted] { a->clear(); });
    h.on(1, [c = clients] { c->clear(); });
  }

  /// Connects one more pair; returns its index.
  std::size_t add() {
    std::promise<std::error_code> connected;
    h.group.submit_to(1, [&, c = clients] {
      h.transport.connect(harness<fw::verbs>::here(), fw::test::rdma_host(), port,
                          [&, c](std::error_code ec, fw::verbs_connection conn) {
                            c->push_back(std::move(conn));
                            connected.set_value(ec);
                          });
    });
    auto f = connected.get_future();
    REQUIRE_FALSE(get(f));
    const std::size_t n = h.on(1, [c = clients] { return c->size(); });
    for (int i = 0; i < 600 && h.on(0, [a = accepted] { return a->size(); }) < n; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(h.on(0, [a = accepted] { return a->size(); }) == n);
    return n - 1;
  }

  /// Starts writing `pieces` (one write each) on client `i` and reading them all on its
  /// server end; the future is true once every byte arrived intact and every write succeeded.
  std::future<bool> start(std::size_t i, std::shared_ptr<const std::vector<std::vector<std::byte>>> pieces) {
    struct state {
      std::vector<std::byte> expect, dst;
      std::size_t writes_left = 0;
      bool ok = true, read_done = false;
      std::mutex m;
      std::promise<bool> done;
      void finish_one(bool good, bool is_read) {
        std::lock_guard lock(m);
        ok = ok && good;
        if (is_read)
          read_done = true;
        else
          --writes_left;
        if (read_done && writes_left == 0) done.set_value(ok && dst == expect);
      }
    };
    auto st = std::make_shared<state>();
    for (const auto& p : *pieces) st->expect.insert(st->expect.end(), p.begin(), p.end());
    st->dst.resize(st->expect.size());
    st->writes_left = pieces->size();
    auto fut = st->done.get_future();
    h.group
        .submit(0,
                [a = accepted, i, st] {
                  (*a)[i].async_read(fw::mutable_buffer(st->dst),
                                     [st](std::error_code e, std::size_t) { st->finish_one(!e, true); });
                })
        .get();
    h.group
        .submit(1,
                [c = clients, i, st, pieces] {
                  for (const auto& p : *pieces) {
                    const fw::const_buffer one[] = {fw::const_buffer(p)};
                    (*c)[i].async_write(
                        one, [st, pieces](std::error_code e, std::size_t n) { st->finish_one(!e && n > 0, false); });
                  }
                })
        .get();
    return fut;
  }

  fw::verbs_stats client_stats(std::size_t i) {
    return h.on(1, [c = clients, i] { return (*c)[i].stats(); });
  }
  fw::verbs_stats server_stats(std::size_t i) {
    return h.on(0, [a = accepted, i] { return (*a)[i].stats(); });
  }

  harness<fw::verbs>& h;
  std::shared_ptr<std::vector<fw::verbs_connection>> accepted = std::make_shared<std::vector<fw::verbs_connection>>();
  std::shared_ptr<std::vector<fw::verbs_connection>> clients = std::make_shared<std::vector<fw::verbs_connection>>();
  std::uint16_t port = 0;
};

std::shared_ptr<const std::vector<std::vector<std::byte>>> pieces_of(std::initializer_list<std::size_t> sizes,
                                                                     unsigned seed) {
  auto v = std::make_shared<std::vector<std::vector<std::byte>>>();
  for (std::size_t n : sizes) v->push_back(pattern_bytes(n, seed++));
  return v;
}

}  // namespace

TEST_CASE("verbs: bulk writes after the first need no announcement round trip (the window stays granted)") {
  harness<fw::verbs> h;
  const fw::verbs_config cfg = h.transport.settings();
  verbs_pairs pairs(h);
  const std::size_t i = pairs.add();
  // Bulk and eager writes mixed; bulk runs larger than a chunk, smaller than one, and
  // several in a row that share a chunk. The writer goes idle between rounds.
  for (unsigned round = 0; round < 3; ++round) {
    auto f = pairs.start(
        i, pieces_of({64 * 1024, 100, 300 * 1024, 64 * 1024, 9000, 5, 1u << 20, 12000, 12000}, round * 20 + 1));
    CHECK(get(f));
  }
  const fw::verbs_stats client = pairs.client_stats(i);
  const fw::verbs_stats server = pairs.server_stats(i);
  MESSAGE("client: ", client.messages_sent, " messages, ", client.rdma_writes, " RDMA writes, ", client.announces,
          " announcements; server: ", server.grants_sent, " grants");
  if (cfg.rdma_write_threshold != 0) {
    CHECK(client.announces == 1);
    const std::size_t bulk = 3 * (64 * 1024 + 300 * 1024 + 64 * 1024 + 9000 + (1u << 20) + 12000 + 12000);
    CHECK(client.bytes_rdma_written == bulk);
    CHECK(server.grants_sent >= cfg.max_grants);
    CHECK(server.revokes_sent == 0);
  } else {
    CHECK(client.announces == 0);
    CHECK(client.rdma_writes == 0);
  }
}

TEST_CASE("verbs: a staging pool too small for every window is shared by revoking idle windows") {
  fw::verbs_config vc = fw::test::small_verbs_config();
  vc.staging_blocks = 2;
  vc.max_grants = 2;
  harness<fw::verbs> h(fw::reactor_mode::adaptive, fw::verbs(vc));
  verbs_pairs pairs(h);
  const std::size_t a = pairs.add(), b = pairs.add(), c = pairs.add();
  const auto big = [](unsigned seed) { return pieces_of({700 * 1024, 10, 200 * 1024}, seed); };
  // One after the other: each takes the window the previous one left idle.
  for (const std::size_t i : {a, b, c, a}) {
    auto f = pairs.start(i, big(static_cast<unsigned>(i) * 7 + 3));
    CHECK(get(f));
  }
  // All at once: the windows change hands while bytes flow.
  auto fa = pairs.start(a, pieces_of({2u << 20, 3u << 20}, 40));
  auto fb = pairs.start(b, pieces_of({3u << 20, 100, 1u << 20}, 50));
  auto fc = pairs.start(c, pieces_of({1u << 20, 4u << 20}, 60));
  CHECK(get(fa));
  CHECK(get(fb));
  CHECK(get(fc));
  const fw::verbs_stats sa = pairs.server_stats(a), ca = pairs.client_stats(a), cb = pairs.client_stats(b);
  MESSAGE("a: ", ca.announces, " announcements, ", sa.revokes_sent, " revokes; b: ", cb.announces, " announcements");
  if (vc.rdma_write_threshold != 0) {
    CHECK(sa.revokes_sent >= 1);  // b took a's idle window
    CHECK(ca.announces >= 2);     // so a announced again
    CHECK(cb.announces >= 1);
  } else {
    CHECK(sa.revokes_sent == 0);
    CHECK(ca.announces == 0);
  }
}

int main(int argc, char** argv) {
  std::string why;
  if (!fusewire::verbs::available(why)) {
    std::printf("SKIP verbs_suite: no usable RDMA device here: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
