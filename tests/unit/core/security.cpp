#include <fusewire/core/security.hpp>
#include <fusewire/util/log_limiter.hpp>
#include <fusewire/util/text.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>

using fusewire::cluster_spec;
using fusewire::errc;
using fusewire::options;
using namespace std::chrono_literals;

namespace {

std::error_code code_of(auto&& fn) {
  try {
    fn();
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

std::string message_of(auto&& fn) {
  try {
    fn();
  } catch (const std::system_error& e) {
    return e.what();
  }
  return {};
}

/// A file under /tmp holding `content`, removed with the object.
struct temp_file {
  std::string path;
  explicit temp_file(const std::string& content) {
    char name[] = "/tmp/fusewire-token-XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
    ::close(fd);
    path = name;
  }
  ~temp_file() { std::remove(path.c_str()); }
};

options from(std::map<std::string, std::string, std::less<>> env) {
  return options::from_env(fusewire::role::worker, [env](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

}  // namespace

TEST_CASE("loopback hosts are only the ones that cannot leave the machine") {
  for (const char* h : {"localhost", "LOCALHOST", "ip6-localhost", "a.localhost", "127.0.0.1", "127.1.2.3", "::1",
                        "::ffff:127.0.0.1"}) {
    INFO(h);
    CHECK(fusewire::is_loopback_host(h));
  }
  for (const char* h : {"", "10.0.0.1", "0.0.0.0", "::", "::2", "128.0.0.1", "localhost.example.com", "example.com",
                        "::ffff:10.0.0.1", "fe80::1", "localhostx"}) {
    INFO(h);
    CHECK_FALSE(fusewire::is_loopback_host(h));
  }
}

TEST_CASE("a cluster with a network address needs a token, or an explicit opt-out") {
  const cluster_spec local = cluster_spec::from_string("ps=127.0.0.1:7000;worker=localhost:7001,[::1]:7002");
  const cluster_spec net = cluster_spec::from_string("ps=127.0.0.1:7000;worker=10.0.0.3:7001");
  options o;
  CHECK_FALSE(fusewire::check_cluster_security(o, local));

  CHECK(code_of([&] { fusewire::check_cluster_security(o, net); }) == errc::invalid_config);
  const std::string why = message_of([&] { fusewire::check_cluster_security(o, net); });
  CHECK(why.find("worker:0 at 10.0.0.3:7001") != std::string::npos);
  CHECK(why.find("FUSEWIRE_CLUSTER_TOKEN_FILE") != std::string::npos);
  CHECK(why.find("FUSEWIRE_INSECURE=1") != std::string::npos);

  o.insecure = true;
  const auto warning = fusewire::check_cluster_security(o, net);
  REQUIRE(warning);
  CHECK(warning->find("WARNING") == 0);
  CHECK(warning->find("\n") == std::string::npos);

  o.insecure = false;
  o.cluster_token = "secret";
  CHECK_FALSE(fusewire::check_cluster_security(o, net));
}

TEST_CASE("the token can come from a file, never mixed with the variable") {
  temp_file f("  s3cret with spaces \n");
  CHECK(from({{"FUSEWIRE_CLUSTER_TOKEN_FILE", f.path}}).cluster_token == "  s3cret with spaces ");

  const std::string both = message_of([&] {
    from({{"FUSEWIRE_CLUSTER_TOKEN_FILE", f.path}, {"FUSEWIRE_CLUSTER_TOKEN", "x"}});
  });
  CHECK(both.find("set only one of them") != std::string::npos);

  temp_file empty("\n");
  const std::string e = message_of([&] { from({{"FUSEWIRE_CLUSTER_TOKEN_FILE", empty.path}}); });
  CHECK(e.find("the file is empty") != std::string::npos);

  const std::string missing = message_of([&] { from({{"FUSEWIRE_CLUSTER_TOKEN_FILE", "/nonexistent/token"}}); });
  CHECK(missing.find("FUSEWIRE_CLUSTER_TOKEN_FILE='/nonexistent/token': cannot open it") != std::string::npos);

  temp_file big(std::string(5000, 'x'));
  const std::string large = message_of([&] { from({{"FUSEWIRE_CLUSTER_TOKEN_FILE", big.path}}); });
  CHECK(large.find("larger than 4096 bytes") != std::string::npos);
  CHECK(large.find("xxxx") == std::string::npos);  // the content is never in a message
}

TEST_CASE("hardening knobs are validated") {
  CHECK(code_of([] { from({{"FUSEWIRE_HANDSHAKE_TIMEOUT_MS", "0"}}); }) == errc::invalid_config);
  CHECK(code_of([] { from({{"FUSEWIRE_MAX_PENDING_HANDSHAKES", "0"}}); }) == errc::invalid_config);
  CHECK(code_of([] { from({{"FUSEWIRE_MAX_PENDING_PER_SOURCE", "-1"}}); }) == errc::invalid_config);
  CHECK(code_of([] { from({{"FUSEWIRE_INSECURE", "maybe"}}); }) == errc::invalid_config);
  CHECK(message_of([] {
          from({{"FUSEWIRE_MAX_TRANSFER_BYTES", "65536"}});
        }).find("is below options.max_frame_bytes") != std::string::npos);
  CHECK(message_of([] {
          from({{"FUSEWIRE_RECV_BUDGET_BYTES", "1048576"}, {"FUSEWIRE_RECV_PEER_BUDGET_BYTES", "2097152"}});
        }).find("exceeds options.recv_budget") != std::string::npos);
}

TEST_CASE("printable: a peer's string cannot forge or flood a log line") {
  using fusewire::util::printable;
  CHECK(printable("worker") == "worker");
  CHECK(printable("a\nb") == "a\\x0ab");
  CHECK(printable("\x1b[31mred") == "\\x1b[31mred");
  CHECK(printable("back\\slash") == "back\\\\slash");
  CHECK(printable(std::string(300, 'j'), 10) == "jjjjjjjjjj...");
  CHECK(printable(std::string("\xff\x00", 2)) == "\\xff\\x00");
}

TEST_CASE("log_limiter: a burst per kind and interval, then a count of what was left out") {
  using clock = fusewire::util::log_limiter::clock;
  fusewire::util::log_limiter lim(2, 10s);
  const clock::time_point t0 = clock::now();
  std::string suffix;
  CHECK(lim.allow("refused", suffix, t0));
  CHECK(lim.allow("refused", suffix, t0));
  for (int i = 0; i < 1000; ++i) CHECK_FALSE(lim.allow("refused", suffix, t0 + 1s));
  CHECK(lim.allow("accept", suffix, t0 + 1s));  // other kinds are counted apart
  CHECK(suffix.empty());
  CHECK(lim.suppressed_total() == 1000);
  CHECK(lim.allow("refused", suffix, t0 + 11s));
  CHECK(suffix == " (1000 similar lines suppressed)");
  CHECK(lim.suppressed_total() == 0);
}
