// A parameter server facing hostile peers, as real processes on loopback: a PS
// child (ps::server), worker children (ps::client), and raw TCP peers in the
// driver that speak the wire protocol by hand. Each scenario checks a bound that
// docs/security.md promises, and that the PS still serves a real worker after.
//
//   adversarial shutdown_unauthenticated  a peer without the token sends a shutdown request: refused, PS serves on
//   adversarial impostor_first            an idle peer claims worker:0 first: the real worker is still answered
//   adversarial handshake_flood           1000 silent connections: all closed by the handshake deadline, worker served
//   adversarial big_hello_stall           1000 connections stall inside a hello: PS memory stays bounded, all closed
//   adversarial emfile                    the PS runs out of descriptors: its log stays short, it recovers
//   adversarial newline_job               a job name with a newline and an escape: no forged log line, few lines
//   adversarial wrong_token               a worker with another token fails fast with auth_failed, few handshakes
//   adversarial duplicate_slice           one request pulls the same slice 1000 times: refused, PS memory bounded
//   adversarial huge_announcement         a token holder announces 16 GiB and 1 GiB tensors, stalls: refused or
//                                         dropped at the idle deadline, PS memory within the peer budget
//   adversarial unmatched_flood           a token holder floods tensors nobody receives: its reads pause, old ones
//                                         age out, PS memory within the peer budget, a worker is served
//   adversarial ps_restart_no_checkpoint  the PS is killed and restarts empty: the worker's run() fails, state_lost
//   adversarial sync_worker_killed        sync, one of 2 workers killed: the other fails with peer_lost naming it
//   adversarial async_worker_killed       one worker killed while the other waits at barrier(): peer_lost naming it
//
// Every process runs under alarm(); exit 0 = pass, 1 = fail.
#include <fusewire/ps/ps.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/wire/codec.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/loopback_cluster.hpp"
#include "support/mp.hpp"

namespace fw = fusewire;
namespace ps = fusewire::ps;
namespace wire = fusewire::wire;
using namespace std::chrono_literals;
using transport = fw::asio_tcp;
using clock_type = std::chrono::steady_clock;
using fusewire::test::signal_pipe;
using fusewire::test::spawn;
using fusewire::test::succeeded;

namespace {

constexpr const char* token = "adversarial-test-token";
const fw::task_id ps0{"ps", 0};
const fw::task_id w0{"worker", 0};

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

fw::options base_options(std::string cluster_token = {}) {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 4u << 20;
  o.connect_timeout = 20000ms;
  o.cluster_token = std::move(cluster_token);
  return o;
}

/// One dense variable of 256 KiB: one slice, on ps:0.
ps::model_spec model() {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.1f);
  m.add_dense("w", {256, 256}, ps::initializer::constant(1.0f));
  return m;
}

// ---- the PS's log, kept in a file the driver reads --------------------------------

/// A log sink that appends each line to `path` as a u32 length and the bytes, so
/// that a line holding a newline stays one record.
fw::rendezvous::log_sink file_sink(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) std::exit(1);
  return [fd](std::string_view line) {
    std::string rec(4 + line.size(), '\0');
    const auto n = static_cast<std::uint32_t>(line.size());
    std::memcpy(rec.data(), &n, 4);
    std::memcpy(rec.data() + 4, line.data(), line.size());
    (void)!::write(fd, rec.data(), rec.size());
  };
}

std::vector<std::string> read_log(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path, std::ios::binary);
  std::uint32_t n = 0;
  while (in.read(reinterpret_cast<char*>(&n), 4)) {
    std::string s(n, '\0');
    if (!in.read(s.data(), n)) break;
    lines.push_back(std::move(s));
  }
  return lines;
}

std::size_t count_containing(const std::vector<std::string>& lines, std::string_view needle) {
  return static_cast<std::size_t>(
      std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(needle) != l.npos; }));
}

void print_log(const std::vector<std::string>& lines, std::size_t max_lines = 20) {
  for (std::size_t i = 0; i < lines.size() && i < max_lines; ++i)
    std::fprintf(stderr, "  ps log: %s\n", lines[i].c_str());
}

std::string fresh_log(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("fusewire_adversarial_" + std::to_string(::getpid()) + "_" + name + ".log");
  std::filesystem::remove(p);
  return p.string();
}

// ---- processes --------------------------------------------------------------------

/// Runs ps:0 until a worker shuts it down and waits until it listens; -1 (the
/// child killed) if it does not within 20 s. `before` runs first in the child
/// (e.g. to lower its descriptor limit).
pid_t spawn_ps(const fw::cluster_spec& spec, fw::options o, const std::string& log_path,
               std::function<void()> before = {}, ps::training_mode mode = ps::training_mode::async) {
  signal_pipe ready;
  const pid_t pid = spawn(
      60,
      [&spec, o, &log_path, &ready, before, mode] {
        if (before) before();
        ps::server_config<transport> so;
        so.options = o;
        so.mode = mode;
        so.log = file_sink(log_path);
        ps::server<transport> server(ps0, spec, model(), std::move(so));
        ready.notify();
        server.wait();
        return 0;
      },
      "ps:0");
  if (ready.wait(20000)) return pid;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

/// A real worker: `steps` pulls and pushes of "w", then (if asked) stops the PS.
int worker_steps(const fw::cluster_spec& spec, const std::string& cluster_token, int steps, bool shutdown) {
  ps::client<transport> cl(w0, spec, model(),
                           {.options = base_options(cluster_token), .step_timeout = 30000ms, .retry_interval = 500ms});
  ps::batch b;
  std::vector<float> grad(256 * 256, 0.5f);
  const auto start = clock_type::now();
  for (int s = 0; s < steps; ++s) {
    b.clear();
    const auto h = b.pull("w");
    b.push("w", grad);
    cl.run(b);
    EXPECT(b.take(h).size() == grad.size());
  }
  std::printf("worker:0: %d steps in %.2f s\n", steps, seconds_since(start));
  if (shutdown) cl.shutdown_servers();
  return 0;
}

pid_t spawn_worker(const fw::cluster_spec& spec, std::string cluster_token, int steps, bool shutdown = true) {
  return spawn(
      60, [&spec, cluster_token, steps, shutdown] { return worker_steps(spec, cluster_token, steps, shutdown); },
      "worker:0");
}

/// VmRSS of `pid` in KiB (0 if unreadable).
long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool rss_is_meaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool rss_is_meaningful = false;
#else
constexpr bool rss_is_meaningful = true;
#endif
#else
constexpr bool rss_is_meaningful = true;
#endif

/// Whether an RSS growth of `growth` KiB is within `limit` KiB. Always true
/// under AddressSanitizer, whose quarantine and shadow memory keep freed
/// memory resident: there the growth is printed, not judged.
bool rss_growth_within(long growth, long limit) {
  if (rss_is_meaningful) return growth < limit;
  std::printf("RSS growth %ld KiB not checked against %ld KiB under AddressSanitizer\n", growth, limit);
  return true;
}

// ---- raw peers ----------------------------------------------------------------------

/// A blocking TCP connection to 127.0.0.1:`port` from source address `source`
/// (127.x.y.z: one per group of connections, so that the per-source cap is not
/// the only bound hit); -1 on failure.
int dial_from(std::uint16_t port, std::uint32_t source = INADDR_LOOPBACK) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(source);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
    ::close(fd);
    return -1;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  ::close(fd);
  return -1;
}

/// Source address of flood connection `i`: 127.0.1.1 .. 127.0.1.100, in turn.
std::uint32_t flood_source(std::size_t i) { return (127u << 24) | (1u << 8) | static_cast<std::uint32_t>(1 + i % 100); }

bool send_all(int fd, std::span<const std::byte> bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::vector<std::byte> frame_bytes(const auto& meta, fw::const_buffer payload = {}) {
  std::vector<std::byte> out(wire::prefix_size(meta) + payload.size());
  std::error_code ec;
  const std::size_t n = wire::encode_frame(meta, wire::frame_header{}, payload, out, ec);
  if (ec) std::exit(1);
  out.resize(n);
  return out;
}

std::vector<std::byte> hello_bytes(std::string_view job, std::uint32_t index) {
  wire::hello_meta h;
  h.job = job;
  h.task_index = index;
  h.incarnation = 0x5eed;
  return frame_bytes(h);
}

/// A tensor frame carrying `payload` (bytes) under `key`.
std::vector<std::byte> tensor_bytes(const std::string& key, fw::const_buffer payload) {
  wire::tensor_meta t;
  t.key = key;
  t.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(payload.size())});
  const std::uint64_t sizes[] = {payload.size()};
  t.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
  return frame_bytes(t, payload);
}

/// True if the peer closed `fd` (EOF or reset); reads and drops what it sent first.
bool drained_to_close(int fd) {
  std::byte buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

/// Waits until the PS closed every one of `fds` or `limit` passed; closes
/// them; returns how many were still open at the limit.
std::size_t wait_all_closed(std::vector<int>& fds, std::chrono::milliseconds limit) {
  const auto deadline = clock_type::now() + limit;
  std::vector<int> open = fds;
  while (!open.empty() && clock_type::now() < deadline) {
    std::vector<pollfd> p;
    for (int fd : open) p.push_back({fd, POLLIN, 0});
    ::poll(p.data(), p.size(), 100);
    std::vector<int> still;
    for (const pollfd& q : p) {
      if (q.revents != 0 && drained_to_close(q.fd)) continue;
      still.push_back(q.fd);
    }
    open.swap(still);
  }
  for (int fd : fds) ::close(fd);
  fds.clear();
  return open.size();
}

void close_all(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

/// Appends exactly `n` bytes read from blocking `fd` to `out`; false on end of
/// stream, error or the socket's receive timeout.
bool recv_exact(int fd, std::vector<std::byte>& out, std::size_t n) {
  const std::size_t start = out.size();
  out.resize(start + n);
  for (std::size_t got = 0; got < n;) {
    const ssize_t r = ::recv(fd, out.data() + start + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

/// Reads one handshake frame from `fd` into `bytes`; `body` views them.
bool read_handshake_frame(int fd, std::vector<std::byte>& bytes, wire::frame_body& body) {
  const wire::limits lim = fw::protocol::handshake_limits();
  bytes.clear();
  wire::frame_header h;
  if (!recv_exact(fd, bytes, wire::header_size) || wire::decode_header(bytes, lim, h)) return false;
  if (!recv_exact(fd, bytes, h.meta_len + static_cast<std::size_t>(h.payload_len))) return false;
  wire::decoded_frame f;
  if (wire::decode_frame(bytes, lim, f)) return false;
  body = f.body;
  return true;
}

/// A connection to ps:0 that went through the handshake as worker:`index`,
/// proving that it holds `cluster_token`: what a compromised or broken member
/// of the cluster has. -1 on failure.
int authenticated_peer(std::uint16_t port, std::uint32_t index, std::string_view cluster_token,
                       std::uint64_t incarnation) {
  const int fd = dial_from(port);
  if (fd < 0) return -1;
  const auto fail = [fd] {
    ::close(fd);
    return -1;
  };
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  wire::hello_meta hello;
  hello.job = "worker";
  hello.task_index = index;
  hello.incarnation = incarnation;
  hello.features = fw::protocol::feature_token;
  std::vector<std::byte> bytes;
  wire::frame_body body;
  if (!send_all(fd, frame_bytes(hello)) || !read_handshake_frame(fd, bytes, body)) return fail();
  const auto* challenge = std::get_if<wire::auth_challenge_meta>(&body);
  if (challenge == nullptr) return fail();
  wire::auth_response_meta response;
  if (fw::protocol::detail::handshake_mac(cluster_token, "fwc1", challenge->nonce, fw::task_id{"worker", index},
                                          response.mac)) {
    return fail();
  }
  response.nonce.fill(std::byte{0x5a});
  if (!send_all(fd, frame_bytes(response)) || !read_handshake_frame(fd, bytes, body)) return fail();
  if (!std::holds_alternative<wire::hello_ack_meta>(body)) return fail();
  return fd;
}

/// The head (header and meta, no payload) of chunk `index` of a transfer of
/// `total` bytes under `key`, in chunks of `chunk` bytes.
std::vector<std::byte> chunk_head(std::uint64_t transfer_id, const std::string& key, std::uint64_t total,
                                  std::uint64_t chunk, std::uint32_t index) {
  wire::chunk_meta c;
  c.transfer_id = transfer_id;
  c.total_len = total;
  c.offset = std::uint64_t{index} * chunk;
  c.index = index;
  c.count = static_cast<std::uint32_t>((total + chunk - 1) / chunk);
  c.key = key;
  c.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(total)});
  wire::frame_header h;
  h.payload_len = std::min(chunk, total - c.offset);
  std::vector<std::byte> out(wire::prefix_size(c));
  std::error_code ec;
  out.resize(wire::encode_prefix(c, h, out, ec));
  if (ec) std::exit(1);
  return out;
}

/// The head of an unchunked tensor frame announcing `n` bytes under `key`.
std::vector<std::byte> tensor_head(const std::string& key, std::uint64_t n) {
  wire::tensor_meta t;
  t.key = key;
  t.descriptor = fw::tensor_descriptor::make(fw::dtype::uint8, {static_cast<std::int64_t>(n)});
  const std::uint64_t sizes[] = {n};
  t.segments = wire::segment_list(std::span<const std::uint64_t>(sizes));
  wire::frame_header h;
  h.payload_len = n;
  std::vector<std::byte> out(wire::prefix_size(t));
  std::error_code ec;
  out.resize(wire::encode_prefix(t, h, out, ec));
  if (ec) std::exit(1);
  return out;
}

/// The port ps:0 listens on.
std::uint16_t ps_port(const fw::cluster_spec& spec) { return spec.fast_path_endpoint(ps0).port; }

// ---- scenarios ------------------------------------------------------------------

// A peer without the token claims worker:0 and sends a hello, then a shutdown
// request instead of answering the challenge: only a hello and an
// authentication answer are read before authentication.
int shutdown_unauthenticated() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("shutdown");
  const pid_t p = spawn_ps(spec, base_options(token), log);
  EXPECT(p > 0);

  ps::request_builder rb;
  rb.set_header(1, 1, model().fingerprint(1), 0, 0, ps::request_flags::shutdown);
  const fw::tensor_buffer req = rb.finish();
  const int fd = dial_from(ps_port(spec));
  EXPECT(fd >= 0);
  auto bytes = hello_bytes("worker", 0);
  const auto t = tensor_bytes(std::string(ps::request_key), req.bytes());
  bytes.insert(bytes.end(), t.begin(), t.end());
  EXPECT(send_all(fd, bytes));
  std::vector<int> fds{fd};
  EXPECT(wait_all_closed(fds, 15000ms) == 0);
  std::printf("the unauthenticated shutdown request was refused (connection closed)\n");

  const pid_t w = spawn_worker(spec, token, 5);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  const auto lines = read_log(log);
  if (!ok || count_containing(lines, "refused") == 0) {
    print_log(lines);
    return 1;
  }
  std::printf("the PS served a real worker afterwards; it logged the refusal\n");
  return 0;
}

// An idle peer claims worker:0 before the real worker connects and stays in its
// handshake: the real worker is answered all the same, and the idle peer is
// closed at the handshake deadline.
int impostor_first() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("impostor");
  auto o = base_options(token);
  o.handshake_timeout = 3000ms;
  const pid_t p = spawn_ps(spec, o, log);
  EXPECT(p > 0);
  const int fd = dial_from(ps_port(spec));
  EXPECT(fd >= 0);
  EXPECT(send_all(fd, hello_bytes("worker", 0)));
  const auto impostor_start = clock_type::now();

  const auto start = clock_type::now();
  const pid_t w = spawn_worker(spec, token, 10, false);
  EXPECT(succeeded(w, "worker:0"));
  const double took = seconds_since(start);
  EXPECT(took < 20.0);
  std::vector<int> fds{fd};
  EXPECT(wait_all_closed(
             fds, 3000ms + 5000ms -
                      std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - impostor_start)) == 0);
  std::printf("the real worker finished 10 steps in %.2f s beside an impostor; the impostor was closed after %.2f s\n",
              took, seconds_since(impostor_start));
  const pid_t stopper = spawn_worker(spec, token, 1);
  return succeeded(stopper, "worker:0 (stopper)") && succeeded(p, "ps:0") ? 0 : 1;
}

/// Opens `n` connections to `port` from the flood sources, each sending `first`
/// (maybe nothing); returns them (fewer if dialing failed, which is reported).
std::vector<int> open_flood(std::uint16_t port, std::size_t n, std::span<const std::byte> first = {}) {
  std::vector<int> fds;
  std::size_t failed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int fd = dial_from(port, flood_source(i));
    if (fd < 0) {
      ++failed;
      continue;
    }
    if (!first.empty()) (void)send_all(fd, first);
    fds.push_back(fd);
  }
  if (failed != 0) std::printf("%zu of %zu flood connections could not be made\n", failed, n);
  return fds;
}

// Connections that never send a byte: each is closed by the handshake deadline
// (or at once, past the pending caps); a real worker gets through meanwhile.
int handshake_flood() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("flood");
  auto o = base_options(token);
  o.handshake_timeout = 1000ms;
  const pid_t p = spawn_ps(spec, o, log);
  EXPECT(p > 0);
  const auto start = clock_type::now();
  auto fds = open_flood(ps_port(spec), 1000);
  EXPECT(fds.size() >= 900);
  const std::size_t opened = fds.size();
  const pid_t w = spawn_worker(spec, token, 5);
  const std::size_t left = wait_all_closed(fds, 1000ms + 10000ms);
  const double closed_after = seconds_since(start);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  const auto lines = read_log(log);
  std::printf("%zu silent connections: %zu left open after %.2f s; %zu PS log lines\n", opened, left, closed_after,
              lines.size());
  if (!ok || left != 0 || lines.size() > 40) {
    print_log(lines, 60);
    return 1;
  }
  return 0;
}

// Connections that announce a hello meta (64 KiB: above the handshake limit;
// 2 KiB: at it) and stall: the PS holds at most a few KiB for each, and
// closes each at once or at the deadline.
int big_hello_stall() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("stall");
  auto o = base_options(token);
  o.handshake_timeout = 1000ms;
  const pid_t p = spawn_ps(spec, o, log);
  EXPECT(p > 0);
  std::this_thread::sleep_for(200ms);
  const long rss0 = rss_kib(p);
  auto big = hello_bytes("worker", 0);
  wire::store_le<std::uint32_t>(big.data() + 16, 64u << 10);  // meta_len
  auto at_limit = big;
  wire::store_le<std::uint32_t>(at_limit.data() + 16, 2000);
  auto fds = open_flood(ps_port(spec), 500, std::span(big).first(wire::header_size));
  auto more = open_flood(ps_port(spec), 500, std::span(at_limit).first(wire::header_size));
  fds.insert(fds.end(), more.begin(), more.end());
  EXPECT(fds.size() >= 900);
  const std::size_t opened = fds.size();
  const long rss1 = rss_kib(p);
  const std::size_t left = wait_all_closed(fds, 1000ms + 10000ms);
  const long rss2 = rss_kib(p);
  const long growth = std::max(rss1, rss2) - rss0;
  std::printf("%zu stalled hellos: PS RSS %ld KiB before, %ld with them open, %ld after; %zu left open\n", opened, rss0,
              rss1, rss2, left);
  const pid_t w = spawn_worker(spec, token, 3);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  EXPECT(ok);
  EXPECT(left == 0);
  EXPECT(rss_growth_within(growth, 16 * 1024));
  return 0;
}

// The PS runs out of descriptors: accepting fails, and the listener backs off
// and logs a few lines per interval instead of one per failure; once the
// flood is gone, a real worker is served.
int emfile() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("emfile");
  auto o = base_options();
  o.handshake_timeout = 30000ms;
  o.max_pending_handshakes = 100000;
  o.max_pending_per_source = 100000;
  const pid_t p = spawn_ps(spec, o, log, [] {
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = 64;
    ::setrlimit(RLIMIT_NOFILE, &r);
  });
  EXPECT(p > 0);
  const std::size_t before = read_log(log).size();
  auto fds = open_flood(ps_port(spec), 200);
  EXPECT(fds.size() >= 150);
  std::this_thread::sleep_for(3000ms);  // the PS accepts until it runs out, then backs off
  const auto during = read_log(log);
  const std::size_t in_window = during.size() - before;
  const std::size_t accept_failures = count_containing(during, "accept failed");
  std::printf("out of descriptors: %zu log lines in 3 s, %zu of them say accept failed\n", in_window, accept_failures);
  close_all(fds);
  const auto start = clock_type::now();
  const pid_t w = spawn_worker(spec, {}, 3);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  std::printf("after the flood closed, the worker was served within %.2f s\n", seconds_since(start));
  if (!ok || accept_failures == 0 || in_window >= 40) {
    print_log(read_log(log), 60);
    return 1;
  }
  return 0;
}

// A hello whose job name holds a newline and a terminal escape: whatever the PS
// logs about it stays on one line with the bytes escaped, and 500 of them make
// a few lines, not 500.
int newline_job() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("newline");
  const pid_t p = spawn_ps(spec, base_options(), log);
  EXPECT(p > 0);
  const std::string job = "worker\nfusewire rendezvous ps:0: FORGED\x1b[2J";
  const auto hello = hello_bytes(job, 0);
  std::size_t left = 0, opened = 0;
  for (int round = 0; round < 10; ++round) {
    auto fds = open_flood(ps_port(spec), 50, hello);
    opened += fds.size();
    left += wait_all_closed(fds, 15000ms);
  }
  std::this_thread::sleep_for(200ms);
  const auto lines = read_log(log);
  std::size_t raw_control = 0, forged = 0;
  for (const auto& l : lines) {
    if (std::any_of(l.begin(), l.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; })) ++raw_control;
    if (l.rfind("fusewire rendezvous ps:0: FORGED", 0) == 0) ++forged;
  }
  std::printf("%zu hellos with a newline in the job name: %zu left open, %zu log lines, %zu with a raw control byte\n",
              opened, left, lines.size(), raw_control);
  const pid_t w = spawn_worker(spec, {}, 3);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  if (!ok || opened < 450 || left != 0 || raw_control != 0 || forged != 0 || lines.size() > 30) {
    print_log(lines, 60);
    return 1;
  }
  if (!lines.empty()) std::printf("e.g.: %s\n", lines.front().c_str());
  return 0;
}

// A worker with another token: its run() fails with auth_failed within a few
// seconds, not after the connect timeout, and it does not keep reconnecting.
int wrong_token() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("token");
  const pid_t p = spawn_ps(spec, base_options(token), log);
  EXPECT(p > 0);
  const pid_t w = spawn(
      60,
      [&spec] {
        ps::client<transport> cl(w0, spec, model(),
                                 {.options = base_options("another-token"), .step_timeout = 30000ms});
        ps::batch b;
        (void)b.pull("w");
        std::error_code ec;
        const auto start = clock_type::now();
        cl.run(b, ec);
        const double took = seconds_since(start);
        std::printf("worker:0 with another token: run() failed after %.2f s: %s (%s)\n", took, ec.message().c_str(),
                    b.error_message().c_str());
        EXPECT(ec == fw::make_error_code(fw::errc::auth_failed));
        EXPECT(took < 10.0);
        // A second run fails at once: the refusal is permanent for that peer.
        const auto again = clock_type::now();
        cl.run(b, ec);
        EXPECT(ec == fw::make_error_code(fw::errc::auth_failed));
        EXPECT(seconds_since(again) < 2.0);
        return 0;
      },
      "worker:0");
  const bool worker_ok = succeeded(w, "worker:0");
  std::this_thread::sleep_for(1000ms);
  const auto lines = read_log(log);
  const std::size_t refused = count_containing(lines, "refused");
  std::printf("the PS logged %zu refusals (%zu lines)\n", refused, lines.size());
  fusewire::test::kill_and_reap(p);
  if (!worker_ok || refused == 0 || refused > 5) {
    print_log(lines, 60);
    return 1;
  }
  return 0;
}

// A request from worker:0 (loopback, no token: anyone may claim it) that pulls
// the one dense slice 1000 times: refused, naming the repeat, without the PS
// building a reply 1000 slices large.
int duplicate_slice() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("duplicate");
  const pid_t p = spawn_ps(spec, base_options(), log);
  EXPECT(p > 0);
  std::this_thread::sleep_for(200ms);
  const long rss0 = rss_kib(p);
  const pid_t raw = spawn(
      60,
      [&spec] {
        fw::rendezvous::endpoint<transport> ep(w0, spec, {.options = base_options()});
        ps::request_builder rb;
        rb.set_header(7, 1, model().fingerprint(1), 0, 0, 0);
        for (int i = 0; i < 1000; ++i) rb.pull_dense(0, 0);
        EXPECT(!ep.send_sync(ps0, std::string(ps::request_key), rb.finish(), 20s));
        auto r = ep.recv_sync(ps0, std::string(ps::reply_key), 20s);
        EXPECT(!r.ec);
        ps::reply_view reply;
        std::error_code ec;
        std::string why;
        ps::decode_reply(r.buffer.bytes(), reply, ec, why);
        EXPECT(!ec);
        std::printf("reply to 1000 pulls of one slice: status %u, %zu entries: %s\n", reply.status,
                    reply.entries.size(), reply.message.c_str());
        EXPECT(reply.seq == 1);
        EXPECT(reply.status == static_cast<std::uint32_t>(fw::errc::invalid_argument));
        EXPECT(reply.entries.empty());
        EXPECT(reply.message.find("already in entry 0") != std::string::npos);
        return 0;
      },
      "raw worker:0");
  EXPECT(succeeded(raw, "raw worker:0"));
  const long rss1 = rss_kib(p);
  std::printf("PS RSS %ld KiB before, %ld after\n", rss0, rss1);
  const pid_t w = spawn_worker(spec, {}, 3);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  EXPECT(ok);
  EXPECT(rss_growth_within(rss1 - rss0, 4 * 1024));
  return 0;
}

// ---- the receive budget -----------------------------------------------------------

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

/// Small receive budgets, so that a bound on the PS's memory is one a test can
/// tell from the rest of its RSS.
fw::options budget_options() {
  auto o = base_options(token);
  o.recv_budget = 64 * MiB;
  o.recv_peer_budget = 32 * MiB;
  return o;
}

/// The largest RSS of `pid` seen so far, in KiB.
struct rss_peak {
  pid_t pid;
  long kib = 0;
  void sample() { kib = std::max(kib, rss_kib(pid)); }
};

/// Waits until the PS closed `fd` or `limit` passed, sampling its RSS meanwhile;
/// closes `fd`. Returns the seconds it took, or -1 if it was still open.
double closed_within(int fd, std::chrono::milliseconds limit, rss_peak& peak) {
  const auto start = clock_type::now();
  double took = -1;
  while (clock_type::now() - start < limit) {
    peak.sample();
    pollfd q{fd, POLLIN, 0};
    if (::poll(&q, 1, 50) > 0 && drained_to_close(fd)) {
      took = seconds_since(start);
      break;
    }
  }
  peak.sample();
  ::close(fd);
  return took;
}

/// Sends `bytes` in pieces of `piece` bytes, `pause` apart: a slow sender.
bool send_slowly(int fd, std::span<const std::byte> bytes, std::size_t piece, std::chrono::milliseconds pause) {
  for (std::size_t at = 0; at < bytes.size(); at += piece) {
    if (!send_all(fd, bytes.subspan(at, std::min(piece, bytes.size() - at)))) return false;
    std::this_thread::sleep_for(pause);
  }
  return true;
}

// A member of the cluster (it holds the token) announces tensors of 16 GiB and
// 1 GiB and sends little or nothing of them. The 16 GiB ones, as a chunked
// transfer (above max_transfer_bytes) and as one frame (above
// max_frame_bytes), are refused from their head: the connection is closed and
// the line names the limit. The 1 GiB one is below max_transfer_bytes but
// above both receive budgets: with nothing else held it is taken alone, its
// buffer filling only as bytes come, and when the sender stalls it is dropped
// at FUSEWIRE_TRANSFER_IDLE_MS. When that peer already holds a tensor nobody
// received, the same announcement does not fit its budget: its connection is
// not read (not dropped as idle: the wait is ours) until that tensor ages out,
// then the transfer is taken and dropped at the idle deadline. The PS's RSS
// stays within the peer budget throughout, and a real worker is served after.
int huge_announcement() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const std::string log = fresh_log("huge");
  auto o = budget_options();
  o.transfer_idle = 2000ms;
  o.unmatched_max_age = 2500ms;
  const pid_t p = spawn_ps(spec, o, log);
  EXPECT(p > 0);
  std::this_thread::sleep_for(200ms);
  const long rss0 = rss_kib(p);
  rss_peak peak{p, rss0};
  const std::uint16_t port = ps_port(spec);
  const std::vector<std::byte> some(4 * MiB, std::byte{0x42});
  const std::uint64_t chunk = 4 * MiB;
  std::uint64_t incarnation = 0x1000;

  const auto refused = [&](std::vector<std::byte> head, const char* what) {
    const int fd = authenticated_peer(port, 1, token, ++incarnation);
    if (fd < 0) return false;
    head.insert(head.end(), some.begin(), some.begin() + 64 * 1024);
    (void)send_all(fd, head);  // the PS may close before it has all of it
    const double took = closed_within(fd, 5000ms, peak);
    std::printf("%s: closed after %.2f s\n", what, took);
    return took >= 0;
  };
  EXPECT(refused(chunk_head(1, "huge/chunked", 16 * GiB, chunk, 0), "16 GiB chunked transfer"));
  EXPECT(refused(tensor_head("huge/tensor", 16 * GiB), "16 GiB tensor frame"));

  // 1 GiB, nothing else held: 5 MiB of it come slowly, then nothing.
  {
    const int fd = authenticated_peer(port, 1, token, ++incarnation);
    EXPECT(fd >= 0);
    EXPECT(send_all(fd, chunk_head(2, "huge/idle", GiB, chunk, 0)));
    EXPECT(send_slowly(fd, some, 256 * 1024, 20ms));
    EXPECT(send_all(fd, chunk_head(2, "huge/idle", GiB, chunk, 1)));
    EXPECT(send_all(fd, std::span(some).first(MiB)));
    const double took = closed_within(fd, o.transfer_idle + 5000ms, peak);
    std::printf("1 GiB transfer stalled after 5 MiB: closed %.2f s after its last byte\n", took);
    EXPECT(took >= 0);
  }

  // 1 GiB after a tensor nobody receives: parked until that one ages out.
  {
    const int fd = authenticated_peer(port, 1, token, ++incarnation);
    EXPECT(fd >= 0);
    EXPECT(send_all(fd, tensor_bytes("huge/held", std::span(some).first(MiB))));
    EXPECT(send_all(fd, chunk_head(3, "huge/parked", GiB, chunk, 0)));
    EXPECT(send_all(fd, some));
    const double took = closed_within(fd, o.unmatched_max_age + o.transfer_idle + 5000ms, peak);
    std::printf("1 GiB transfer behind a held tensor, stalled after 4 MiB: closed after %.2f s\n", took);
    EXPECT(took >= 0);
  }

  const long rss1 = rss_kib(p);
  const pid_t w = spawn_worker(spec, token, 3);
  const bool ok = succeeded(w, "worker:0") && succeeded(p, "ps:0");
  const auto lines = read_log(log);
  const long growth = peak.kib - rss0;
  std::printf("PS RSS %ld KiB before, at most %ld during, %ld after (peer budget %zu KiB)\n", rss0, peak.kib, rss1,
              o.recv_peer_budget / 1024);
  const bool logged = count_containing(lines, "FUSEWIRE_MAX_TRANSFER_BYTES") >= 2 &&
                      count_containing(lines, "nothing was allocated for it") >= 2 &&
                      count_containing(lines, "partial transfer of key 'huge/idle' (1 of 256 chunks") == 1 &&
                      count_containing(lines, "stopped reading from worker:1") >= 1 &&
                      count_containing(lines, "FUSEWIRE_UNMATCHED_MAX_AGE_MS); the first from worker:1") == 1 &&
                      count_containing(lines, "partial transfer of key 'huge/parked' (1 of 256 chunks") == 1;
  if (!ok || !logged) {
    print_log(lines, 60);
    return 1;
  }
  EXPECT(rss_growth_within(growth, static_cast<long>(o.recv_peer_budget / 1024) + 8 * 1024));
  return 0;
}

// A member of the cluster floods the PS with 1 MiB tensors on keys it never
// receives, far more in all than the receive budget. The PS stops reading that
// connection while the peer's share is full (TCP backpressure, logged), drops
// what waited past FUSEWIRE_UNMATCHED_MAX_AGE_MS and reads on; its RSS stays
// within the peer budget plus slack, and a real worker is served meanwhile.
int unmatched_flood() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const std::string log = fresh_log("flood");
  auto o = budget_options();
  o.unmatched_max_age = 500ms;
  // glibc raises its mmap threshold past the first 1 MiB buffer freed; from
  // then on the tensors come from the heap, and under this churn (a window of
  // held tensors sliding over the heap) about as much again as is held stays
  // resident, freed but kept by the allocator. A fixed threshold maps and
  // unmaps each buffer, so that RSS follows what the budget counts.
  const pid_t p = spawn_ps(spec, o, log, [] { ::mallopt(M_MMAP_THRESHOLD, 128 * 1024); });
  EXPECT(p > 0);
  std::this_thread::sleep_for(200ms);
  const long rss0 = rss_kib(p);
  const int fd = authenticated_peer(ps_port(spec), 1, token, 0xf100d);
  EXPECT(fd >= 0);
  EXPECT(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);

  std::atomic<std::uint64_t> sent{0};
  std::atomic<bool> stop{false}, lost{false};
  rss_peak peak{p, rss0};
  std::thread flood([&] {
    const std::vector<std::byte> payload(MiB, std::byte{0x17});
    auto next = clock_type::now();
    for (std::uint64_t i = 0; !stop.load(); ++i) {
      const auto frame = tensor_bytes("flood/" + std::to_string(i), payload);
      for (std::size_t at = 0; at < frame.size() && !stop.load();) {
        if (clock_type::now() >= next) {
          peak.sample();
          next = clock_type::now() + 50ms;
        }
        pollfd q{fd, POLLOUT, 0};
        if (::poll(&q, 1, 50) <= 0) continue;
        const ssize_t n = ::send(fd, frame.data() + at, frame.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (n <= 0) {
          lost.store(true);
          return;
        }
        at += static_cast<std::size_t>(n);
        sent.fetch_add(static_cast<std::uint64_t>(n));
      }
    }
  });
  const auto start = clock_type::now();
  std::this_thread::sleep_for(1000ms);
  const pid_t w = spawn_worker(spec, token, 3, false);
  const bool served = succeeded(w, "worker:0");
  std::printf("worker:0 served beside the flood after %.2f s\n", seconds_since(start));
  std::this_thread::sleep_for(6000ms - (clock_type::now() - start));
  stop.store(true);
  flood.join();
  peak.sample();
  ::close(fd);
  std::this_thread::sleep_for(200ms);
  const long rss1 = rss_kib(p);
  const pid_t stopper = spawn_worker(spec, token, 1);
  const bool ok = served && succeeded(stopper, "worker:0 (stopper)") && succeeded(p, "ps:0");
  const auto lines = read_log(log);
  const std::uint64_t flooded = sent.load();
  const long growth = peak.kib - rss0;
  std::printf(
      "flooded %llu MiB of unreceived tensors in 6 s (%s); PS RSS %ld KiB before, at most %ld during, %ld after "
      "(peer budget %zu KiB, budget %zu KiB)\n",
      static_cast<unsigned long long>(flooded / MiB), lost.load() ? "the PS closed the connection" : "kept open", rss0,
      peak.kib, rss1, o.recv_peer_budget / 1024, o.recv_budget / 1024);
  const bool logged = count_containing(lines, "stopped reading from worker:1") >= 1 &&
                      count_containing(lines, "FUSEWIRE_UNMATCHED_MAX_AGE_MS); the first from worker:1") >= 1;
  if (!ok || !logged || lost.load() || flooded <= o.recv_budget) {
    print_log(lines, 60);
    return 1;
  }
  EXPECT(rss_growth_within(growth, static_cast<long>(o.recv_peer_budget / 1024) + 8 * 1024));
  return 0;
}

// ---- lost peers -------------------------------------------------------------------

/// One pull and one push of "w" through `cl`; `ec` says how it ended.
void one_step(ps::client<transport>& cl, ps::batch& b, std::error_code& ec) {
  static const std::vector<float> grad(256 * 256, 0.5f);
  b.clear();
  (void)b.pull("w");
  b.push("w", grad);
  cl.run(b, ec);
}

// The PS is SIGKILLed mid-training and comes back without a checkpoint: the
// worker's next run() fails with state_lost naming it, instead of training on
// from freshly initialised values.
int ps_restart_no_checkpoint() {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const std::string log = fresh_log("restart");
  signal_pipe trained, restarted;
  const pid_t p = spawn_ps(spec, base_options(), log);
  EXPECT(p > 0);
  const pid_t w = spawn(
      60,
      [&] {
        ps::client<transport> cl(w0, spec, model(),
                                 {.options = base_options(), .step_timeout = 20000ms, .retry_interval = 500ms});
        ps::batch b;
        std::error_code ec;
        for (int s = 0; s < 3; ++s) {
          one_step(cl, b, ec);
          EXPECT(!ec);
        }
        trained.notify();
        EXPECT(restarted.wait(30000));
        const auto start = clock_type::now();
        one_step(cl, b, ec);
        std::printf("worker:0 after the PS restarted without a checkpoint: run() failed after %.2f s: %s (%s)\n",
                    seconds_since(start), ec.message().c_str(), b.error_message().c_str());
        EXPECT(ec == fw::make_error_code(fw::errc::state_lost));
        EXPECT(b.error_message().find("ps:0") != std::string::npos);
        return 0;
      },
      "worker:0");
  EXPECT(trained.wait(30000));
  fusewire::test::kill_and_reap(p);
  const pid_t p2 = spawn_ps(spec, base_options(), log);
  EXPECT(p2 > 0);
  restarted.notify();
  const bool ok = succeeded(w, "worker:0");
  fusewire::test::kill_and_reap(p2);
  return ok ? 0 : 1;
}

// Sync training, two workers, one SIGKILLed after a few steps: the other's
// next run() fails with peer_lost naming worker:1, well before step_timeout.
int sync_worker_killed() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const std::string log = fresh_log("sync_killed");
  const pid_t p = spawn_ps(spec, base_options(), log, {}, ps::training_mode::sync);
  EXPECT(p > 0);
  const auto sync_worker = [&spec](std::uint32_t index) {
    return [&spec, index] {
      ps::client<transport> cl({"worker", index}, spec, model(),
                               {.options = base_options(),
                                .mode = ps::training_mode::sync,
                                .step_timeout = 30000ms,
                                .retry_interval = 500ms});
      ps::batch b;
      std::error_code ec;
      for (int s = 0; s < 3; ++s) {
        one_step(cl, b, ec);
        EXPECT(!ec);
      }
      if (index == 1) {
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      const auto start = clock_type::now();
      for (int s = 0; s < 5 && !ec; ++s) one_step(cl, b, ec);
      const double took = seconds_since(start);
      std::printf("worker:0 after worker:1 died: run() failed after %.2f s: %s (%s)\n", took, ec.message().c_str(),
                  b.error_message().c_str());
      EXPECT(ec == fw::make_error_code(fw::errc::peer_lost));
      EXPECT(b.error_message().find("worker:1") != std::string::npos);
      EXPECT(took < 15.0);  // step_timeout is 30 s
      return 0;
    };
  };
  const pid_t w0p = spawn(60, sync_worker(0), "worker:0");
  const pid_t w1p = spawn(60, sync_worker(1), "worker:1");
  const bool ok = fusewire::test::died_of_sigkill(w1p, "worker:1") && succeeded(w0p, "worker:0");
  fusewire::test::kill_and_reap(p);
  return ok ? 0 : 1;
}

// Async training: worker:0 waits at barrier() when worker:1 is SIGKILLed before
// it arrives: the barrier fails with peer_lost naming worker:1, well before its
// timeout.
int async_worker_killed() {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const std::string log = fresh_log("async_killed");
  signal_pipe stepped, at_barrier;
  const pid_t p = spawn_ps(spec, base_options(), log);
  EXPECT(p > 0);
  const auto client_for = [&spec](std::uint32_t index) {
    return ps::client<transport>({"worker", index}, spec, model(),
                                 {.options = base_options(), .step_timeout = 30000ms, .retry_interval = 500ms});
  };
  const pid_t w1 = spawn(
      60,
      [&] {
        auto cl = client_for(1);
        ps::batch b;
        std::error_code ec;
        one_step(cl, b, ec);
        EXPECT(!ec);
        stepped.notify();
        ::pause();  // until the driver kills it
        return 0;
      },
      "worker:1");
  const pid_t w0p = spawn(
      60,
      [&] {
        auto cl = client_for(0);
        ps::batch b;
        std::error_code ec;
        one_step(cl, b, ec);
        EXPECT(!ec);
        at_barrier.notify();
        const auto start = clock_type::now();
        try {
          cl.barrier(30000ms);
        } catch (const std::system_error& e) {
          const double took = seconds_since(start);
          std::printf("worker:0 at the barrier after worker:1 died: failed after %.2f s: %s\n", took, e.what());
          EXPECT(e.code() == fw::make_error_code(fw::errc::peer_lost));
          EXPECT(std::string(e.what()).find("worker:1") != std::string::npos);
          EXPECT(took < 15.0);  // the barrier's timeout is 30 s
          return 0;
        }
        std::fprintf(stderr, "worker:0 passed a barrier worker:1 never reached\n");
        return 1;
      },
      "worker:0");
  EXPECT(stepped.wait(30000));
  EXPECT(at_barrier.wait(30000));
  std::this_thread::sleep_for(500ms);  // worker:0's barrier request is at the PS
  fusewire::test::kill_and_reap(w1);
  const bool ok = succeeded(w0p, "worker:0");
  fusewire::test::kill_and_reap(p);
  return ok ? 0 : 1;
}

const std::map<std::string, int (*)()> scenarios{
    {"shutdown_unauthenticated", shutdown_unauthenticated},
    {"impostor_first", impostor_first},
    {"handshake_flood", handshake_flood},
    {"big_hello_stall", big_hello_stall},
    {"emfile", emfile},
    {"newline_job", newline_job},
    {"wrong_token", wrong_token},
    {"duplicate_slice", duplicate_slice},
    {"huge_announcement", huge_announcement},
    {"unmatched_flood", unmatched_flood},
    {"ps_restart_no_checkpoint", ps_restart_no_checkpoint},
    {"sync_worker_killed", sync_worker_killed},
    {"async_worker_killed", async_worker_killed},
};

}  // namespace

int main(int argc, char** argv) {
  const auto it = argc == 2 ? scenarios.find(argv[1]) : scenarios.end();
  if (it == scenarios.end()) {
    std::fprintf(stderr, "usage: %s SCENARIO\nscenarios:", argv[0]);
    for (const auto& [name, fn] : scenarios) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  // The floods hold a thousand descriptors here and in the PS.
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::alarm(120);
  const int rc = it->second();
  std::printf("adversarial %s: %s\n", it->first.c_str(), rc == 0 ? "pass" : "FAIL");
  return rc;
}
