// with_rdma_or<Fallback>: TF_RDMA_ENABLED=false (or no usable device) runs the
// caller's generic code over the TCP fallback, TF_RDMA_ENABLED=true with a
// device runs it over verbs configured from the options. Runs on any host
// (suite 'unit': there the RDMA-enabled case meets no device and must fall
// back, saying why) and in the QEMU guest (suite 'rdma': there it must pick verbs).
#include <doctest/doctest.h>

#include <fusewire/core/env.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/verbs.hpp>

#include <concepts>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/patterns.hpp"
#include "support/verbs_setup.hpp"

// The shared connection handle gives native_handle() only to fd-based transports.
template <class C>
concept has_native_handle = requires(const C& c) {
  { c.native_handle() } -> std::same_as<int>;
};
static_assert(!has_native_handle<fusewire::verbs_connection>);
static_assert(has_native_handle<fusewire::asio_tcp_connection>);
static_assert(fusewire::transport<fusewire::verbs> && fusewire::rdma_transport<fusewire::verbs>);

namespace fw = fusewire;

namespace {

fw::options options_with(std::map<std::string, std::string, std::less<>> env) {
  return fw::options::from_env(fw::role::worker,
                               [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
                                 auto it = env.find(name);
                                 if (it == env.end()) return std::nullopt;
                                 return it->second;
                               });
}

bool rdma_required() {
  const char* r = std::getenv("FUSEWIRE_RDMA_REQUIRED");
  return r != nullptr && std::string_view(r) == "1";
}

/// Echoes `n` bytes over transport `t` between two reactors: code written once for any transport.
template <fw::transport T>
bool round_trip(const T& t, const std::string& host, std::size_t n) {
  using engine = typename T::reactor_type::engine_type;
  fw::reactor_config rc;
  rc.count = 2;
  fw::basic_reactor_group<engine> group(rc);
  const std::vector<std::byte> out = fw::test::pattern_bytes(n, 7);
  std::vector<std::byte> back(n);
  auto listener = std::make_shared<typename T::listener_type>();
  auto server = std::make_shared<typename T::connection_type>();
  auto server_buf = std::make_shared<std::vector<std::byte>>(n);
  const std::uint16_t port =
      group
          .submit(0,
                  [&, listener, server, server_buf] {
                    *listener = t.listen(*T::reactor_type::current(), host, 0);
                    listener->async_accept([server, server_buf](std::error_code ec, auto c) {
                      if (ec) return;
                      *server = std::move(c);
                      server->async_read(fw::mutable_buffer(*server_buf),
                                         [server, server_buf](std::error_code e, std::size_t) {
                                           if (e) return;
                                           const fw::const_buffer one[] = {fw::const_buffer(*server_buf)};
                                           server->async_write(one, [server_buf](std::error_code, std::size_t) {});
                                         });
                    });
                    return listener->port();
                  })
          .get();
  auto client = std::make_shared<typename T::connection_type>();
  std::promise<bool> done;
  group.submit_to(1, [&, client] {
    t.connect(*T::reactor_type::current(), host, port, [&, client](std::error_code ec, auto c) {
      if (ec) return done.set_value(false);
      *client = std::move(c);
      const fw::const_buffer one[] = {fw::const_buffer(out)};
      client->async_write(one, [](std::error_code, std::size_t) {});
      client->async_read(fw::mutable_buffer(back), [&](std::error_code e, std::size_t) { done.set_value(!e); });
    });
  });
  auto f = done.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
  const bool ok = f.get() && back == out;
  group.submit(1, [client] { client->close(); }).get();
  group
      .submit(0,
              [listener, server] {
                server->close();
                listener->close();
              })
      .get();
  group.stop();
  return ok;
}

}  // namespace

TEST_CASE("with_rdma_or: TF_RDMA_ENABLED=false runs the code over the TCP fallback, silently") {
  const fw::options o = options_with({{"TF_RDMA_ENABLED", "false"}});
  REQUIRE_FALSE(o.rdma_enabled);
  std::vector<std::string> heard;
  const std::string picked = fw::with_rdma_or<fw::asio_tcp>(
      o,
      [](const auto& t) {
        // The generic code works with whichever transport it gets.
        const std::string host = std::string(t.name()) == "verbs" ? fw::test::rdma_host() : std::string("127.0.0.1");
        CHECK(round_trip(t, host, 100000));
        return std::string(t.name());
      },
      [&heard](std::string_view why) { heard.emplace_back(why); });
  CHECK(picked == "asio_tcp");
  CHECK(heard.empty());
}

TEST_CASE("with_rdma_or: TF_RDMA_ENABLED=true picks verbs configured from the options, or says why not") {
  const fw::options o = options_with({{"TF_RDMA_ENABLED", "true"},
                                      {"TF_RDMA_DEV_NAME", fw::test::small_verbs_config().device},
                                      {"TF_RDMA_ACC_SIZE", "4096"},
                                      {"TF_RDMA_CHUNK_SIZE", "3000000"}});
  REQUIRE(o.rdma_enabled);
  std::string why;
  const bool available = fw::verbs::available(why);
  if (rdma_required()) REQUIRE_MESSAGE(available, why);
  std::vector<std::string> heard;
  std::optional<fw::verbs_config> got;
  const std::string picked = fw::with_rdma_or<fw::asio_tcp>(
      o,
      [&got](const auto& t) {
        if constexpr (std::is_same_v<std::decay_t<decltype(t)>, fw::verbs>) got = t.settings();
        return std::string(t.name());
      },
      [&heard](std::string_view w) { heard.emplace_back(w); });
  if (available) {
    CHECK(picked == "verbs");
    CHECK(heard.empty());
    REQUIRE(got.has_value());
    CHECK(got->device == fw::test::small_verbs_config().device);
    CHECK(got->rdma_write_threshold == 4096);
    CHECK(got->chunk_size == (std::size_t{4} << 20));  // rounded up to a power of two
  } else {
    MESSAGE("no RDMA here (", why, "): checking the fallback");
    CHECK(picked == "asio_tcp");
    REQUIRE(heard.size() == 1);
    CHECK(heard[0] == "TF_RDMA_ENABLED is true but RDMA is unusable (" + why + "); using asio_tcp");
    CHECK_FALSE(got.has_value());
  }
}
