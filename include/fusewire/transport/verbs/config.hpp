#pragma once
/// How the verbs transport uses a device (`verbs_config`) and the counters of
/// one verbs connection (`verbs_stats`).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fusewire/core/env.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>

namespace fusewire {
inline namespace v0 {

/// How the verbs transport uses a device; fixed per reactor by the first
/// transport that listens or connects on it.
struct verbs_config {
  std::string device = "mlx5_0";            ///< TF_RDMA_DEV_NAME; absent: first active device (warning)
  std::size_t message_size = 64 * 1024;     ///< bytes per SEND slot (header + data); a power of two >= 4096
  unsigned credits = 16;                    ///< receive credits granted to each connection (>= 4)
  unsigned max_connections = 64;            ///< QPs per reactor; fixes the SRQ, CQ and slot budget
  unsigned sq_depth = 64;                   ///< send work requests per QP
  unsigned send_slots = 256;                ///< registered send slots per reactor, shared by its QPs
  std::size_t rx_buffer_limit = 4u << 20;   ///< unread bytes per connection before credits are withheld
  std::size_t rdma_write_threshold = 8192;  ///< writes larger than this go by RDMA write (TF_RDMA_ACC_SIZE); 0 = never
  std::size_t chunk_size = 4u << 20;        ///< RDMA write chunk (TF_RDMA_CHUNK_SIZE, rounded up to a power of two)
  unsigned staging_blocks = 16;             ///< chunk buffers per reactor (peers' windows, outgoing copies)
  unsigned max_grants = 2;                  ///< chunk grants each bulk-writing peer holds ahead (the window)
  int backlog = 256;                        ///< rdma_listen backlog
  int resolve_timeout_ms = 5000;            ///< rdma_resolve_addr / rdma_resolve_route timeout
  /// TF_RDMA_BUF_SIZE: bytes of memory registered (locked) with the device per
  /// reactor, at most: the message slots and staging blocks above (see
  /// fixed_registered_bytes()) plus every registered pool made on it
  /// (make_registered_pool, endpoint::allocate_registered). A registration
  /// past it fails with errc::out_of_memory before anything is locked.
  std::size_t registered_limit = std::size_t{1} << 30;

  /// Device and sizes from fusewire's options: TF_RDMA_DEV_NAME, TF_RDMA_ACC_SIZE
  /// (the RDMA write threshold), TF_RDMA_CHUNK_SIZE, TF_RDMA_BUF_SIZE (registered_limit).
  static verbs_config from(const options& o) {
    verbs_config c;
    c.device = o.rdma_device;
    c.registered_limit = o.rdma_buf_size;
    c.rdma_write_threshold = o.acc_size;
    std::size_t chunk = 4096;
    while (chunk < o.chunk_size && chunk < (std::size_t{1} << 30)) chunk <<= 1;
    c.chunk_size = chunk;
    return c;
  }

  /// from() with the RDMA knobs of the environment read as options::from_env
  /// reads them (TF_RDMA_DEV_NAME, TF_RDMA_ACC_SIZE, TF_RDMA_CHUNK_SIZE,
  /// TF_RDMA_BUF_SIZE) and the other fields at their defaults. A bad value
  /// throws std::system_error(errc::invalid_config) naming the variable.
  static verbs_config from_env(const env_lookup& lookup = process_env()) {
    options o;
    auto get = [&](std::string_view name) -> std::optional<std::string> {
      std::optional<std::string> v = lookup(name);
      if (v && v->empty()) return std::nullopt;
      return v;
    };
    if (auto v = get("TF_RDMA_DEV_NAME")) o.rdma_device = *v;
    if (auto v = get("TF_RDMA_ACC_SIZE")) o.acc_size = detail::env_uint("TF_RDMA_ACC_SIZE", *v, detail::acc_rule);
    if (auto v = get("TF_RDMA_CHUNK_SIZE")) {
      o.chunk_size = detail::env_uint("TF_RDMA_CHUNK_SIZE", *v, detail::chunk_rule);
    }
    if (auto v = get("TF_RDMA_BUF_SIZE")) o.rdma_buf_size = detail::env_uint("TF_RDMA_BUF_SIZE", *v, detail::buf_rule);
    return from(o);
  }

  /// Throws std::system_error(errc::invalid_argument) naming the bad field.
  void validate() const {
    auto bad = [](const std::string& what) { throw_error(errc::invalid_argument, "verbs_config." + what); };
    if (message_size < 4096 || (message_size & (message_size - 1)) != 0 || message_size > (1u << 30)) {
      bad("message_size = " + std::to_string(message_size) + ": must be a power of two from 4096 to 1073741824");
    }
    if (credits < 4 || credits > 4096) bad("credits = " + std::to_string(credits) + ": must be 4..4096");
    if (max_connections == 0 || max_connections > 65536) {
      bad("max_connections = " + std::to_string(max_connections) + ": must be 1..65536");
    }
    if (sq_depth < 2 || sq_depth > 16384) bad("sq_depth = " + std::to_string(sq_depth) + ": must be 2..16384");
    if (send_slots == 0) bad("send_slots = 0: must be at least 1");
    if (chunk_size < 4096 || (chunk_size & (chunk_size - 1)) != 0 || chunk_size > (std::size_t{1} << 30)) {
      bad("chunk_size = " + std::to_string(chunk_size) + ": must be a power of two from 4096 to 1073741824");
    }
    if (rdma_write_threshold != 0 && staging_blocks == 0) bad("staging_blocks = 0: must be at least 1");
    if (max_grants == 0 || max_grants > 64) bad("max_grants = " + std::to_string(max_grants) + ": must be 1..64");
    if (backlog < 1) bad("backlog = " + std::to_string(backlog) + ": must be at least 1");
    if (resolve_timeout_ms < 1) bad("resolve_timeout_ms = " + std::to_string(resolve_timeout_ms) + ": must be >= 1");
    if (fixed_registered_bytes() > registered_limit) {
      bad("registered_limit = " + std::to_string(registered_limit) +
          " (TF_RDMA_BUF_SIZE): the message slots and staging blocks of a reactor alone register " +
          std::to_string(fixed_registered_bytes()) +
          " bytes; raise it, or lower credits, max_connections, send_slots, message_size, staging_blocks or "
          "chunk_size");
    }
  }

  /// Bytes a reactor registers before any registered pool: its message slots,
  /// (credits x max_connections + send_slots) x message_size, and, when RDMA
  /// writes are on, its staging blocks, staging_blocks x chunk_size.
  std::size_t fixed_registered_bytes() const noexcept {
    const std::size_t slots =
        (std::size_t{credits} * std::size_t{max_connections} + std::size_t{send_slots}) * message_size;
    return slots + (rdma_write_threshold != 0 ? std::size_t{staging_blocks} * chunk_size : 0);
  }
};

namespace detail {

/// The bytes registered with one reactor's device, held to
/// verbs_config::registered_limit (TF_RDMA_BUF_SIZE). Every slab registration
/// takes its size first and gives it back once deregistered; any thread (a
/// registered pool may be released after its reactor has gone).
class registered_budget {
 public:
  explicit registered_budget(std::size_t limit) noexcept : limit_(limit) {}
  registered_budget(const registered_budget&) = delete;
  registered_budget& operator=(const registered_budget&) = delete;

  /// Takes `n` bytes, or takes nothing and throws
  /// std::system_error(errc::out_of_memory) naming TF_RDMA_BUF_SIZE.
  void take(std::size_t n) {
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ || used > limit_ - n) {
        throw_error(errc::out_of_memory,
                    "verbs: registering " + std::to_string(n) +
                        " more bytes would pass TF_RDMA_BUF_SIZE = " + std::to_string(limit_) +
                        " bytes of registered memory for this reactor (" + std::to_string(used) +
                        " registered: message slots, staging blocks, registered pools); raise TF_RDMA_BUF_SIZE "
                        "(a multiple of 1073741824) and the memlock limit with it, or release registered pools");
      }
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  }

  /// Returns `n` bytes taken before.
  void give_back(std::size_t n) noexcept { used_.fetch_sub(n, std::memory_order_relaxed); }

  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  std::size_t limit() const noexcept { return limit_; }

 private:
  std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace detail

/// Counters of one verbs connection (reactor thread).
struct verbs_stats {
  std::uint64_t messages_sent = 0;  ///< SEND work requests posted
  std::uint64_t messages_received = 0;
  std::uint64_t credit_updates = 0;  ///< header-only messages that only returned credits
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t credit_stalls = 0;  ///< times sending waited for credits
  std::uint64_t slot_stalls = 0;    ///< times sending waited for a free send slot
  std::uint64_t rdma_writes = 0;    ///< RDMA writes posted (WITH_IMM pieces of the stream, and one-sided)
  std::uint64_t bytes_rdma_written = 0;
  std::uint64_t grants_sent = 0;   ///< chunk buffers offered to the peer
  std::uint64_t announces = 0;     ///< bulk announcements (RTS) sent: round trips paid for a window
  std::uint64_t revokes_sent = 0;  ///< windows taken back from the peer because staging ran short
};

}  // namespace v0
}  // namespace fusewire
