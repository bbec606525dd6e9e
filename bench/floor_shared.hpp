#pragma once
/// What the two floors share: `floor` (TCP sockets, backend_floor.cpp) and
/// `futex` (shared memory and futex wake-ups, backend_futex.cpp) carry the
/// same frame and answer it the same way, so that the one differs from the
/// other only in how the bytes travel, and holding this once keeps it so.
/// Here: the frame's layout, its writing and checked reading, the PS's answer
/// to a request, the worker's request and its check of a reply, and the POSIX
/// pieces both need (an owned descriptor, errno errors, the TCP listener that
/// `floor` serves on and `futex` holds only to own its port). How the bytes
/// are moved, and how a side waits for them, stays in each backend's file.
///
/// Frame (little-endian): magic u32 (each floor its own, so that one never
/// takes the other's frames), buffer count u32, body length u64, value u64
/// (an ack's byte count), then count u64 buffer sizes, then the body.
///
/// Private to those two files, in a namespace of its own so that no other
/// file of fwbench meets these names.

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "serial.hpp"

namespace fusewire::bench::floors {

static_assert(std::endian::native == std::endian::little, "the floor frame is little-endian and copied as is");

inline constexpr std::size_t frame_header_bytes = 24;
inline constexpr std::size_t max_frame_body_bytes = 2 * gib;

[[noreturn]] inline void throw_errno(errc e, const std::string& what, int err) {
  throw_error(e, what + ": " + std::strerror(err));
}

/// Closes the descriptor it owns.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// What tells one floor's frames and errors from the other's.
struct frame_format {
  std::uint32_t magic;         ///< the frame's first four bytes, its name in ASCII
  std::string_view prefix;     ///< starts every error message: "floor: "
  std::string_view delivered;  ///< what a peer did with a frame, in messages: "sent"
};

struct frame_header {
  std::uint32_t count = 0;
  std::uint64_t body = 0;
  std::uint64_t value = 0;
};

/// Bytes before the body: the header and `count` buffer sizes.
constexpr std::size_t frame_prefix_bytes(std::size_t count) noexcept { return frame_header_bytes + 8 * count; }
constexpr std::size_t frame_bytes(const frame_header& h) noexcept { return frame_prefix_bytes(h.count) + h.body; }

/// Writes the header and the sizes of `sized_buffers` at `out`; returns where the body goes.
inline std::byte* write_frame_prefix(std::byte* out, const frame_format& format, const frame_header& h,
                                     std::span<const const_buffer> sized_buffers) {
  std::memcpy(out, &format.magic, 4);
  std::memcpy(out + 4, &h.count, 4);
  std::memcpy(out + 8, &h.body, 8);
  std::memcpy(out + 16, &h.value, 8);
  out += frame_header_bytes;
  for (const_buffer b : sized_buffers) {
    const std::uint64_t size = b.size();
    std::memcpy(out, &size, 8);
    out += 8;
  }
  return out;
}

/// Reads the header at `in` and checks its magic and its bounds, before
/// anything is read or allocated for the rest of the frame.
inline frame_header read_frame_header(const std::byte* in, const frame_format& format, const std::string& peer) {
  std::uint32_t magic;
  frame_header h;
  std::memcpy(&magic, in, 4);
  std::memcpy(&h.count, in + 4, 4);
  std::memcpy(&h.body, in + 8, 8);
  std::memcpy(&h.value, in + 16, 8);
  if (magic != format.magic) {
    const std::string_view name(reinterpret_cast<const char*>(&format.magic), 4);
    throw_error(errc::bad_magic, std::string(format.prefix) + peer + " " + std::string(format.delivered) +
                                     " a frame without the " + std::string(name) + " magic");
  }
  if (h.count > max_buffer_count || h.body > max_frame_body_bytes) {
    throw_error(errc::frame_too_large, std::string(format.prefix) + peer + " " + std::string(format.delivered) +
                                           " a frame of " + std::to_string(h.count) + " buffers and " +
                                           std::to_string(h.body) + " bytes");
  }
  return h;
}

/// A received frame in its receiver's own memory.
struct frame_view {
  frame_header header;
  const std::byte* sizes = nullptr;  ///< count little-endian u64
  const_buffer body;
  const_buffer whole;

  std::uint64_t size_at(std::size_t i) const {
    std::uint64_t v;
    std::memcpy(&v, sizes + 8 * i, 8);
    return v;
  }
};

/// The whole frame at `in`, whose header `read_frame_header` returned; checks
/// that its buffer sizes add up to its body.
inline frame_view view_frame(const std::byte* in, const frame_header& h, const frame_format& format,
                             const std::string& peer) {
  frame_view f;
  f.header = h;
  f.sizes = in + frame_header_bytes;
  f.body = {in + frame_prefix_bytes(h.count), h.body};
  f.whole = {in, frame_bytes(h)};
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < h.count; ++i) sum += f.size_at(i);
  if (sum != h.body) {
    throw_error(errc::malformed_frame, std::string(format.prefix) + peer + " " + std::string(format.delivered) +
                                           " buffer sizes that do not add up to the body");
  }
  return f;
}

/// The PS's answer to the request `f` that `conn` received: the frame itself
/// back (raw echo), an ack of its body's size, or the decoded payload encoded
/// again or acknowledged (serialized). `Connection` has `peer()`,
/// `send(header, sized_buffers, body)` and `send_bytes(whole_frame)`.
template <class Connection>
void answer_request(Connection& conn, const frame_view& f, const server_config& config, payload_codec& codec,
                    const frame_format& format) {
  if (config.mode == wire_mode::raw) {
    if (config.reply == reply_kind::echo) {
      conn.send_bytes(f.whole);
    } else {
      conn.send({0, 0, f.header.body}, {}, {});
    }
    return;
  }
  if (f.header.count != 1 || !codec.decode(f.body)) {
    throw_error(errc::malformed_frame,
                std::string(format.prefix) + conn.peer() + " sent no serialized fwbench.Payload");
  }
  const std::string& out =
      config.reply == reply_kind::echo ? codec.encode_decoded() : codec.encode_ack(codec.decoded_bytes());
  const const_buffer body{reinterpret_cast<const std::byte*>(out.data()), out.size()};
  conn.send({1, out.size(), 0}, std::span(&body, 1), std::span(&body, 1));
}

/// A worker's frames: the request that carries a payload to every PS, and the
/// check of each PS's reply to it. One per client: it holds the codec and the
/// payload last requested, which each reply is checked against.
class request_frames {
 public:
  /// What `send(header, sized_buffers, body)` takes, valid until the next `make`.
  struct request {
    frame_header header;
    std::span<const const_buffer> sized_buffers;
    std::span<const const_buffer> body;
  };

  request_frames(const client_config& config, const frame_format& format)
      : mode_(config.mode), reply_(config.reply), format_(format) {}

  /// The payload's buffers as they are (raw), or encoded into one fwbench.Payload.
  request make(std::span<const const_buffer> payload) {
    payload_ = payload;
    total_ = 0;
    for (const_buffer b : payload) total_ += b.size();
    if (mode_ == wire_mode::raw) return {{static_cast<std::uint32_t>(payload.size()), total_, 0}, payload, payload};
    const std::string& wire = codec_.encode(payload);
    wire_ = {reinterpret_cast<const std::byte*>(wire.data()), wire.size()};
    return {{1, wire.size(), 0}, std::span(&wire_, 1), std::span(&wire_, 1)};
  }

  /// The bytes that `peer`'s reply `f` to the last request answers for, after
  /// checking that it is the reply this mode expects (and, with `verify`, that
  /// an echo holds the payload's bytes).
  std::size_t check_reply(const std::string& peer, const frame_view& f, bool verify) {
    const std::span<const const_buffer> payload = payload_;
    const std::size_t total = total_;
    auto mismatch = [&](const std::string& what) {
      throw_error(errc::malformed_frame, std::string(format_.prefix) + peer + " " + what +
                                             "; does the PS run the same --benchmark and --mode?");
    };
    if (mode_ == wire_mode::raw) {
      if (reply_ == reply_kind::ack) {
        if (f.header.count != 0) mismatch("sent a payload where an ack was expected");
        return f.header.value;
      }
      if (f.header.count != payload.size() || f.header.body != total) mismatch("sent something other than the echo");
      std::size_t at = 0;
      for (std::size_t i = 0; i < payload.size(); ++i) {
        if (f.size_at(i) != payload[i].size()) mismatch("echoed buffers of other sizes");
        if (verify && std::memcmp(f.body.data() + at, payload[i].data(), payload[i].size()) != 0) {
          mismatch("echoed different bytes in buffer " + std::to_string(i));
        }
        at += payload[i].size();
      }
      return total;
    }
    if (f.header.count != 1) mismatch("sent no serialized reply");
    if (reply_ == reply_kind::ack) {
      std::uint64_t bytes = 0;
      if (!codec_.decode_ack(f.body, bytes)) mismatch("sent no fwbench.Ack");
      return bytes;
    }
    if (!codec_.decode(f.body)) mismatch("sent no fwbench.Payload");
    if (verify && !same_buffers(codec_, payload)) mismatch("echoed a different payload");
    return codec_.decoded_bytes();
  }

 private:
  wire_mode mode_;
  reply_kind reply_;
  frame_format format_;
  payload_codec codec_;
  const_buffer wire_;  ///< the encoded payload (serialized): the request's one buffer
  std::span<const const_buffer> payload_;
  std::size_t total_ = 0;
};

/// What a PS's connection thread does with the error that ended it: a worker
/// leaving, or the PS stopping, is how a connection ends; anything else is
/// worth a line.
inline void report_connection_end(const std::system_error& e, bool stopping) {
  if (e.code() != make_error_code(errc::connection_closed) && e.code() != make_error_code(errc::cancelled) &&
      !stopping) {
    std::fprintf(stderr, "fwbench ps: %s\n", e.what());
  }
}

/// The addresses of `ep` for a stream socket; passive ones to listen on.
inline addrinfo* resolve(const endpoint& ep, bool passive, std::string_view prefix) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string port = std::to_string(ep.port);
  const int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    throw_error(errc::invalid_argument,
                std::string(prefix) + "cannot resolve host '" + ep.host + "': " + ::gai_strerror(rc));
  }
  return result;
}

/// A TCP socket listening on `at` (port 0: one the kernel picks), and its port.
struct tcp_listener {
  unique_fd fd;
  std::uint16_t port = 0;
};

inline tcp_listener listen_tcp(const endpoint& at, int backlog, std::string_view prefix) {
  tcp_listener l;
  addrinfo* list = resolve(at, true, prefix);
  int last_error = 0;
  for (addrinfo* a = list; a && l.fd.get() < 0; a = a->ai_next) {
    unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last_error = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last_error = errno;
      continue;
    }
    l.fd = std::move(fd);
  }
  ::freeaddrinfo(list);
  if (l.fd.get() < 0) {
    throw_errno(errc::invalid_argument, std::string(prefix) + "cannot listen on " + at.to_string(), last_error);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  l.port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return l;
}

/// Joins a PS's connection threads, taken out from under `mu` first, so that
/// no lock is held while joining (a thread may take it on its way out).
inline void join_all(std::mutex& mu, std::vector<std::thread>& threads) {
  std::vector<std::thread> taken;
  {
    std::lock_guard lock(mu);
    taken.swap(threads);
  }
  for (auto& t : taken) t.join();
}

}  // namespace fusewire::bench::floors
