#pragma once
/// What configures and what counts an asio_tcp connection (asio_options,
/// asio_tcp_stats), and Asio's errors in fusewire's terms.

#include <cstddef>
#include <cstdint>
#include <system_error>

#include <boost/asio/error.hpp>
#include <boost/system/error_code.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/transport/detail/socket.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// Asio's errors in the transports' terms; every error after a local close is errc::cancelled.
inline std::error_code from_asio(const boost::system::error_code& ec, bool closed_locally) {
  if (!ec) return {};
  if (closed_locally || ec == boost::asio::error::operation_aborted) return make_error_code(errc::cancelled);
  if (ec == boost::asio::error::eof) return make_error_code(errc::connection_closed);
  if (ec.category() == boost::system::system_category()) return from_errno(ec.value());
  return ec;  // Boost.System converts to std::error_code
}

/// Asio's composed read completion condition without its 64 KiB cap per system
/// call (transfer_all hands the kernel at most 64 KiB per readv, so a payload
/// of megabytes costs a system call and a reactor turn per 64 KiB).
struct transfer_everything {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::size_t{1} << 30;
  }
};

}  // namespace detail

/// What one asio_tcp connection did; for tests, benchmarks and diagnostics.
struct asio_tcp_stats {
  std::uint64_t bytes_sent = 0;  ///< handed to the kernel (sendmsg)
  std::uint64_t bytes_received = 0;
  std::uint64_t recvs = 0;         ///< plain non-blocking recvs into the read chunk that got bytes (spinning reactor)
  std::uint64_t spin_reads = 0;    ///< of those, the ones made from the reactor's spin (asio_engine::watch())
  std::uint64_t waits = 0;         ///< waits for the socket to be readable (spinning reactor)
  std::uint64_t detaches = 0;      ///< times the socket left Asio's epoll set for plain recvs (spinning reactor)
  std::uint64_t chunk_reads = 0;   ///< Asio reads into the read chunk (a reactor that never spins)
  std::uint64_t direct_reads = 0;  ///< Asio reads straight into an exact read's destination
};

namespace detail {

struct asio_options {
  std::size_t read_chunk;
  bool keepalive;
  std::size_t read_ahead_below;
  std::size_t local_send_buffer;
};

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
