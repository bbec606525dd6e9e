#pragma once
/// The seam between fwbench and a communication library. A backend is a PS
/// side (`server`: echo or acknowledge each request) and a worker side
/// (`client`: send one iovec payload to every PS and wait for every reply).
/// Adding one is a file that fills a `backend_info` and a line in
/// backends.cpp and bench/meson.build.

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
};

/// What a worker is built with.
struct client_config {
  std::vector<endpoint> ps;  ///< one connection per PS, in this order
  reply_kind reply = reply_kind::echo;
  wire_mode mode = wire_mode::raw;
  transport_settings transport;
};

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
backend_info zmq_backend();
backend_info grpc_backend();
std::vector<backend_info> fusewire_backends();

}  // namespace fusewire::bench
