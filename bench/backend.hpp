#pragma once
/// The seam between fwbench and a communication library. A backend is a PS
/// side (`server`: echo or acknowledge each request) and a worker side
/// (`client`: send one iovec payload to every PS and wait for every reply).
/// Adding one is a file that fills a `backend_info` and a line in
/// backends.cpp and bench/meson.build.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "config.hpp"
#include "payload.hpp"

namespace fusewire::bench {

/// What a PS is built with.
struct server_config {
  endpoint listen;  ///< port 0: bind any free port, reported by `server::port()`
  reply_kind reply = reply_kind::echo;
  wire_mode mode = wire_mode::raw;
  transport_settings transport;
  /// The whole cluster and this PS's index in it. Only backends with
  /// `backend_info::fixed_ports` use it (their PS connects back to each
  /// worker, so it must know every worker's address); the others ignore it.
  cluster_spec cluster;
  unsigned task = 0;
};

/// What a worker is built with.
struct client_config {
  std::vector<endpoint> ps;  ///< one connection per PS, in this order
  reply_kind reply = reply_kind::echo;
  wire_mode mode = wire_mode::raw;
  transport_settings transport;
  /// Every worker's address and this worker's index (see server_config::cluster).
  std::vector<endpoint> workers;
  unsigned task = 0;
};

using bench_clock = std::chrono::steady_clock;

/// One phase of a worker's run (warmup or measurement): exchanges back to back
/// until `until`.
struct exchange_run {
  std::span<const const_buffer> payload;
  std::size_t expected_reply = 0;  ///< what every exchange must return (else errc::size_mismatch)
  bench_clock::time_point until;
  std::vector<std::int64_t>* samples = nullptr;  ///< when set: each round trip in ns
  /// Called on the caller's thread about once a second with the exchanges so far.
  std::function<void(std::uint64_t exchanges)> tick;
};

/// Throws `system_error(errc::size_mismatch)` when the PSs did not answer for `expected` bytes.
void check_replied(std::size_t replied, std::size_t expected);
/// check_replied's message, or "" when `replied == expected`.
std::string replied_problem(std::size_t replied, std::size_t expected);

/// PS side. Constructed listening (throws `system_error` when it cannot bind);
/// `run()` serves any number of workers until `stop()`.
class server {
 public:
  virtual ~server() = default;
  /// The port it listens on (the chosen one when asked for port 0).
  virtual std::uint16_t port() const = 0;
  /// Serves on the calling thread until `stop()`; errors of one connection
  /// close that connection only.
  virtual void run() = 0;
  /// Makes `run()` return soon; safe from any thread, more than once.
  virtual void stop() = 0;
};

/// Worker side: one thread uses it. Constructed connected to every PS
/// (throws `system_error(errc::connection_refused)` after the connect timeout).
class client {
 public:
  virtual ~client() = default;
  /// Sends `payload` to every PS (all in flight together), waits for every
  /// reply, and returns the sum of what the PSs report: the echoed bytes, or
  /// the byte counts in their acks. With `verify` an echo is compared byte
  /// for byte (throws `system_error(errc::malformed_frame)` on a mismatch).
  /// Serialized mode encodes and decodes inside this call. Throws on errors.
  virtual std::size_t exchange(std::span<const const_buffer> payload, bool verify) = 0;

  /// Runs `r`: exchanges without verification until `r.until`, each checked
  /// with check_replied; returns how many. The default calls `exchange` in a
  /// loop on the calling thread; a backend may drive the loop on its own
  /// thread (fusewire runs it in completion handlers on its reactor) as long
  /// as it times each exchange the same way and calls `tick` on the caller's thread.
  virtual std::uint64_t run(const exchange_run& r);
};

/// A backend as the registry knows it.
struct backend_info {
  std::string name;     ///< "floor", "zmq", "grpc", "fusewire-uring", ...
  std::string summary;  ///< one line for `fwbench list`
  bool available = false;
  std::string unavailable_reason;  ///< e.g. "fusewire: not built yet"
  bool fusewire = false;           ///< a fusewire transport (the subject of `compare`)
  bool honours_wait_mode = false;  ///< uses transport_settings::mode
  bool serialized = true;          ///< supports wire_mode::serialized
  /// Needs every task's port before any process starts (the PS connects back
  /// to the workers): the launcher reserves ports for all of them, and a
  /// cluster given by hand must name the workers' ports.
  bool fixed_ports = false;
  /// Runs over RDMA, not TCP: `compare` never picks it as "fusewire's best TCP
  /// transport", and it needs an RDMA device and a cluster on its interface.
  bool rdma = false;
  /// Every process must run on one host (shared memory): used only when
  /// named, never in the default set or as `compare`'s subject.
  bool same_host = false;
  /// Picks its transport at run time (fusewire-auto): used only when named,
  /// never in the default set or as `compare`'s subject.
  bool picks_transport = false;
  std::function<std::unique_ptr<server>(const server_config&)> make_server;
  std::function<std::unique_ptr<client>(const client_config&)> make_client;
};

/// Every backend fwbench knows, built or not, in display order.
const std::vector<backend_info>& backends();

/// The backend named `name`, or nullptr.
const backend_info* find_backend(std::string_view name);

/// Throws `system_error(errc::invalid_argument)` naming the backend and the
/// known ones when `choice` cannot run here.
const backend_info& require_backend(const backend_choice& choice);

// Each backend file provides one of these (registered in backends.cpp).
backend_info floor_backend();
backend_info futex_backend();
backend_info zmq_backend();
backend_info grpc_backend();
std::vector<backend_info> fusewire_backends();
std::vector<backend_info> tensorpipe_backends();

}  // namespace fusewire::bench
