// Choosing a transport by name (transport/select.hpp): the names this machine
// can run, the message of every bad name, and the choice "auto" as a pure
// function of the cluster spec and made-up machine facts. No connection is
// made; 192.0.2.0/24 (TEST-NET-1) only names a host that is not this one.
#include <doctest/doctest.h>

#include <fusewire/transport/select.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fw = fusewire;

namespace {

fw::machine_facts facts(bool uring = true, bool shm = true, bool verbs = false) {
  fw::machine_facts m;
  m.uring = uring;
  if (!uring) m.uring_why = "the kernel refuses an io_uring ring (Operation not permitted)";
  m.shm = shm;
  if (!shm) m.shm_why = "memfd_create fails (Function not implemented)";
  m.verbs = verbs;
  if (!verbs) m.verbs_why = "no RDMA device found";
  m.hostname = "trainer-7";
  m.addresses = {"127.0.0.1", "10.1.2.3", "::1", "fe80::1"};
  return m;
}

fw::options rdma(bool enabled) {
  fw::options o;
  o.rdma_enabled = enabled;
  return o;
}

const fw::cluster_spec loopback = fw::cluster_spec::from_string("ps=127.0.0.1:2222,localhost:2223;worker=[::1]:2224");
/// Two tasks here, one elsewhere.
const fw::cluster_spec remote = fw::cluster_spec::from_string("ps=127.0.0.1:2222;worker=127.0.0.1:2223,192.0.2.7:2224");
/// One task here (this process's), one elsewhere.
const fw::cluster_spec remote_alone = fw::cluster_spec::from_string("ps=127.0.0.1:2222;worker=192.0.2.7:2224");

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

std::string message_of(std::string_view name) {
  try {
    fw::with_transport(name, fw::options{}, loopback, [](auto) { return 0; });
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("available_transports: asio always; every name listed passes, and so does auto") {
  const std::vector<std::string> names = fw::available_transports();
  REQUIRE(std::find(names.begin(), names.end(), "asio") != names.end());
  CHECK(std::find(names.begin(), names.end(), "auto") == names.end());
  for (const std::string& n : names) {
    CAPTURE(n);
    CHECK_FALSE(fw::transport_problem(n));
    CHECK(std::find(fw::transport_names.begin(), fw::transport_names.end(), n) != fw::transport_names.end());
  }
  CHECK_FALSE(fw::transport_problem("auto"));
  // A name not listed says why, in the same words with_transport throws.
  for (std::string_view n : fw::transport_names) {
    if (n == "auto" || std::find(names.begin(), names.end(), n) != names.end()) continue;
    CAPTURE(n);
    const auto problem = fw::transport_problem(n);
    REQUIRE(problem);
    CHECK(contains(*problem, "expected one of auto, "));
    CHECK(contains(message_of(n), "transport '" + std::string(n) + "': "));
  }
}

TEST_CASE("with_transport: a bad name throws, naming it and the allowed names") {
  const std::string allowed = "expected one of auto, " + fw::detail::join_names(fw::available_transports());
  for (std::string_view bad : {"", "tcp", "URING", "auto ", "rdma", "uring_tcp"}) {
    CAPTURE(bad);
    const std::string m = message_of(bad);
    CHECK(m == "transport '" + std::string(bad) + "': unknown transport; " + allowed);
  }
}

TEST_CASE("with_transport: calls the code with the transport it names") {
  CHECK(fw::with_transport("asio", fw::options{}, loopback, [](auto t) { return std::string(t.name()); }) ==
        "asio_tcp");
  for (const std::string& n : fw::available_transports()) {
    if (n == "verbs") continue;  // verbs is made from the options; its name is enough here
    CAPTURE(n);
    const std::string got = fw::with_transport(n, fw::options{}, loopback, []<class T>(T t) {
      static_assert(fw::transport<T>);
      return std::string(t.name());
    });
    CHECK(got.starts_with(n));
  }
}

TEST_CASE("auto: every task on this host picks shm, silently") {
  const fw::transport_choice c = fw::choose_transport(rdma(true), loopback, facts());
  CHECK(c.name == "shm");
  CHECK_FALSE(c.fallback);
  CHECK(contains(c.reason, "every task of the cluster is on this host"));
  // This host's interface addresses and its name count as this host, in any spelling of the address.
  for (const char* spec :
       {"ps=10.1.2.3:1;worker=127.0.0.1:2", "ps=trainer-7:1;worker=TRAINER-7:2", "ps=[fe80:0:0::1]:1;worker=[::1]:2"}) {
    CAPTURE(spec);
    CHECK(fw::choose_transport(rdma(true), fw::cluster_spec::from_string(spec), facts()).name == "shm");
  }
  // ... even when RDMA works: shm is the faster path within a host.
  CHECK(fw::choose_transport(rdma(true), loopback, facts(true, true, true)).name == "shm");
}

TEST_CASE("auto: tasks here and elsewhere pick shm+uring, chosen per peer, and say why") {
  const fw::transport_choice c = fw::choose_transport(rdma(false), remote, facts());
  CHECK(c.name == "shm+uring");
  CHECK(c.fallback);
  CHECK(c.reason ==
        "2 tasks are on this host and use shm between them; worker:1 at 192.0.2.7:2224 is not on this host and is "
        "reached over uring_tcp");
  // Without io_uring: shm+asio, saying why not io_uring.
  const fw::transport_choice a = fw::choose_transport(rdma(false), remote, facts(false));
  CHECK(a.name == "shm+asio");
  CHECK(a.reason ==
        "2 tasks are on this host and use shm between them; worker:1 at 192.0.2.7:2224 is not on this host and is "
        "reached over asio_tcp; io_uring is unusable (the kernel refuses an io_uring ring (Operation not permitted))");
  // Without shm, or with RDMA that works, as before.
  CHECK(fw::choose_transport(rdma(false), remote, facts(true, false)).name == "uring");
  CHECK(fw::choose_transport(rdma(true), remote, facts(true, true, true)).name == "verbs");
  // RDMA enabled but unusable: shm+uring, and the reason says why not RDMA.
  const fw::transport_choice r = fw::choose_transport(rdma(true), remote, facts());
  CHECK(r.name == "shm+uring");
  CHECK(contains(r.reason, "; TF_RDMA_ENABLED is true but RDMA is unusable (no RDMA device found)"));
}

TEST_CASE("auto: this process alone on its host picks TCP and names the task elsewhere") {
  const fw::transport_choice c = fw::choose_transport(rdma(false), remote_alone, facts());
  CHECK(c.name == "uring");
  CHECK(c.fallback);
  CHECK(c.reason == "worker:0 at 192.0.2.7:2224 is not on this host, so shm cannot reach it");
  const fw::transport_choice a = fw::choose_transport(rdma(false), remote_alone, facts(false));
  CHECK(a.name == "asio");
  CHECK(contains(a.reason, "worker:0 at 192.0.2.7:2224 is not on this host"));
  CHECK(contains(a.reason, "io_uring is unusable (the kernel refuses an io_uring ring (Operation not permitted))"));
  // A host name other than this host's is not looked up: another host.
  CHECK(fw::choose_transport(rdma(false), fw::cluster_spec::from_string("ps=trainer-8:1;worker=127.0.0.1:2"), facts())
            .name == "uring");
  // Loopback everywhere but shm unusable: TCP, saying why.
  const fw::transport_choice s = fw::choose_transport(rdma(false), loopback, facts(true, false));
  CHECK(s.name == "uring");
  CHECK(s.reason == "shm is unusable (memfd_create fails (Function not implemented))");
}

TEST_CASE("auto: TF_RDMA_ENABLED=true without a device is not verbs, and says why") {
  const fw::transport_choice c = fw::choose_transport(rdma(true), remote_alone, facts());
  CHECK(c.name == "uring");
  CHECK(c.fallback);
  CHECK(contains(c.reason, "worker:0 at 192.0.2.7:2224 is not on this host"));
  CHECK(contains(c.reason, "TF_RDMA_ENABLED is true but RDMA is unusable (no RDMA device found)"));
  // With RDMA off nothing is said about it.
  CHECK_FALSE(contains(fw::choose_transport(rdma(false), remote_alone, facts()).reason, "RDMA"));
  // A device that passes the preflight: verbs for a cluster across hosts.
  const fw::transport_choice v = fw::choose_transport(rdma(true), remote_alone, facts(true, true, true));
  CHECK(v.name == "verbs");
  CHECK_FALSE(v.fallback);
  // ... but never for loopback addresses, which rdmacm cannot route.
  const fw::transport_choice l = fw::choose_transport(rdma(true), loopback, facts(true, false, true));
  CHECK(l.name == "uring");
  CHECK(contains(l.reason, "RDMA cannot route the cluster's loopback addresses"));
}

TEST_CASE("auto on this machine: chosen per cluster, one log line per distinct fallback") {
  // This machine's probe with RDMA enabled: whatever it finds, a cluster with
  // a task elsewhere never gets shm, and the reason names that task.
  const fw::machine_facts here = fw::probe_machine(rdma(true));
  CHECK(here.shm == fw::detail::shm_probe().ok);
  const fw::transport_choice expect = fw::choose_transport(rdma(true), remote, here);
  CHECK(expect.name != "shm");
  if (!here.verbs) CHECK(contains(expect.reason, "TF_RDMA_ENABLED is true but RDMA is unusable ("));

  std::vector<std::string> lines;
  const fw::log_sink log = [&](std::string_view l) { lines.emplace_back(l); };
  const std::string first = fw::with_transport(
      "auto", rdma(true), remote, [](auto t) { return std::string(t.name()); }, log);
  CHECK(first.starts_with(expect.name));
  if (expect.fallback) {
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] == "fusewire: transport auto: using " + expect.name + ": " + expect.reason);
  }
  // Chosen per call: the same fallback again logs nothing more; a loopback
  // cluster gets shm (where memfd works) and logs nothing.
  const std::size_t logged = lines.size();
  CHECK(fw::auto_transport(rdma(true), remote, log).name == expect.name);
  CHECK(lines.size() == logged);
  if (here.shm) CHECK(fw::auto_transport(rdma(false), loopback, log).name == "shm");
  CHECK(lines.size() == logged);
}
