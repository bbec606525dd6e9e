#pragma once
/// What configures and what counts a uring_tcp connection (zero_copy_policy,
/// uring_options, uring_tcp_stats), and the io_uring flags older liburing
/// headers lack.

#include <liburing.h>

#include <cstddef>
#include <cstdint>

#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)  // kernel 6.2; not in liburing 2.3's headers
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

namespace fusewire {
inline namespace v0 {

/// When uring_tcp sends large writes with SENDMSG_ZC (see uring_tcp::config::zero_copy).
enum class zero_copy_policy {
  /// Zero copy unless the peer is on this host (a loopback address, or the
  /// connection's own local address), and only until a notification says the
  /// kernel copied the bytes anyway. The default.
  automatic,
  /// Zero copy for every write of at least zc_threshold bytes, whatever the route.
  always,
  /// Plain sends only.
  never,
};

/// What one uring_tcp connection did; for tests, benchmarks and diagnostics.
struct uring_tcp_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t sends = 0;  ///< sendmsg SQEs (plain)
  std::uint64_t speculative_sends =
      0;                               ///< direct non-blocking sendmsg calls (small writes, nothing unsent before them)
  std::uint64_t zc_sends = 0;          ///< SENDMSG_ZC SQEs
  std::uint64_t zc_notifications = 0;  ///< IORING_CQE_F_NOTIF CQEs received
  std::uint64_t zc_copied = 0;         ///< notifications saying the kernel copied anyway (e.g. loopback)
  std::uint64_t multishot_arms = 0;    ///< multishot recvs armed
  std::uint64_t multishot_disarms = 0;  ///< armed multishot recvs cancelled because spin reads serve the connection
  std::uint64_t ring_buffers = 0;       ///< provided buffers received
  std::uint64_t direct_recvs = 0;       ///< plain recvs straight into a destination
  std::uint64_t fallback_recvs = 0;     ///< plain recvs into a heap buffer (no ring, or ring empty)
  std::uint64_t spin_reads = 0;         ///< plain non-blocking recvs of a spinning reactor that got bytes
  std::uint64_t bytes_copied_to_destination = 0;  ///< read-ahead bytes copied into async_read destinations
};

namespace detail {

struct uring_options {
  zero_copy_policy zero_copy;
  std::size_t zc_threshold;
  std::size_t speculative_send;
  std::size_t copy_threshold;
  std::size_t read_ahead;
  std::size_t fallback_read;
  std::size_t local_send_buffer;
  bool keepalive;
  bool multishot;
};

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
