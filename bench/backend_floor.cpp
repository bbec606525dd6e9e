// The floor: plain TCP sockets and no library, so the reference for what
// this network path can do. One thread per connection on the PS; one frame
// per payload, sent with one sendmsg of the iovec buffers.
//
// Frame (little-endian): magic "FWB1" u32, buffer count u32, body length u64,
// value u64 (an ack's byte count), then count u64 buffer sizes, then the body.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "backend.hpp"
#include "serial.hpp"

namespace fusewire::bench {
namespace {

static_assert(std::endian::native == std::endian::little, "the floor frame is little-endian and copied as is");

constexpr std::uint32_t frame_magic = 0x31425746;  // "FWB1"
constexpr std::size_t header_bytes = 24;
constexpr std::size_t max_body_bytes = 2 * gib;
constexpr int max_iov = 1024;

using clock_type = std::chrono::steady_clock;

[[noreturn]] void throw_errno(errc e, const std::string& what, int err) {
  throw_error(e, what + ": " + std::strerror(err));
}

struct frame_header {
  std::uint32_t count = 0;
  std::uint64_t body = 0;
  std::uint64_t value = 0;
};

void write_header(std::byte* out, const frame_header& h) {
  std::memcpy(out, &frame_magic, 4);
  std::memcpy(out + 4, &h.count, 4);
  std::memcpy(out + 8, &h.body, 8);
  std::memcpy(out + 16, &h.value, 8);
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

void set_socket_options(int fd, wait_mode mode) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int flags = ::fcntl(fd, F_GETFL);
  if (mode == wait_mode::block) {
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  } else {
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }
}

/// What a thread does when a socket is not ready: spin (poll), spin up to
/// idle_poll then sleep in poll(2) (adaptive), or nothing (block: the socket
/// itself blocks).
class waiter {
 public:
  waiter(wait_mode mode, std::chrono::microseconds idle_poll) : mode_(mode), idle_poll_(idle_poll) {}

  void reset() noexcept { spinning_ = false; }

  void wait(int fd, short events) {
    if (mode_ == wait_mode::poll) return;
    if (mode_ == wait_mode::adaptive) {
      const auto now = clock_type::now();
      if (!spinning_) {
        spinning_ = true;
        spin_start_ = now;
        return;
      }
      if (now - spin_start_ < idle_poll_) return;
    }
    pollfd p{fd, events, 0};
    ::poll(&p, 1, -1);
    spinning_ = false;
  }

 private:
  wait_mode mode_;
  std::chrono::microseconds idle_poll_;
  bool spinning_ = false;
  clock_type::time_point spin_start_{};
};

/// A received frame inside the connection's buffer.
struct frame_view {
  frame_header header;
  const std::byte* sizes = nullptr;  ///< count little-endian u64
  const_buffer body;
  std::size_t frame_bytes = 0;
  const_buffer whole;

  std::uint64_t size_at(std::size_t i) const {
    std::uint64_t v;
    std::memcpy(&v, sizes + 8 * i, 8);
    return v;
  }
};

/// One TCP connection with fwbench framing.
class connection {
 public:
  connection(unique_fd fd, const transport_settings& t, std::string peer)
      : fd_(std::move(fd)), waiter_(t.mode, t.idle_poll), peer_(std::move(peer)) {}

  int fd() const noexcept { return fd_.get(); }
  const std::string& peer() const noexcept { return peer_; }

  /// Sends header + sizes + body buffers in as few sendmsg calls as the kernel allows.
  void send(const frame_header& h, std::span<const const_buffer> sized_buffers, std::span<const const_buffer> body) {
    const std::size_t prefix = header_bytes + 8 * sized_buffers.size();
    if (tx_.size() < prefix) tx_.resize(prefix);
    write_header(tx_.data(), h);
    for (std::size_t i = 0; i < sized_buffers.size(); ++i) {
      const std::uint64_t size = sized_buffers[i].size();
      std::memcpy(tx_.data() + header_bytes + 8 * i, &size, 8);
    }
    iov_.clear();
    iov_.push_back({tx_.data(), prefix});
    for (const_buffer b : body) {
      if (!b.empty()) iov_.push_back({const_cast<std::byte*>(b.data()), b.size()});
    }
    send_iov();
  }

  /// Sends bytes that already are a whole frame (the PS's raw echo).
  void send_bytes(const_buffer bytes) {
    iov_.clear();
    iov_.push_back({const_cast<std::byte*>(bytes.data()), bytes.size()});
    send_iov();
  }

  /// Receives one whole frame; throws `connection_closed` at end of stream.
  frame_view receive(const std::atomic<bool>* stop) {
    fill(header_bytes, stop);
    std::uint32_t magic;
    frame_header h;
    std::memcpy(&magic, rx_.get(), 4);
    std::memcpy(&h.count, rx_.get() + 4, 4);
    std::memcpy(&h.body, rx_.get() + 8, 8);
    std::memcpy(&h.value, rx_.get() + 16, 8);
    if (magic != frame_magic) {
      throw_error(errc::bad_magic, "floor: " + peer_ + " sent a frame without the FWB1 magic");
    }
    if (h.count > max_buffer_count || h.body > max_body_bytes) {
      throw_error(errc::frame_too_large, "floor: " + peer_ + " sent a frame of " + std::to_string(h.count) +
                                             " buffers and " + std::to_string(h.body) + " bytes");
    }
    const std::size_t frame_bytes = header_bytes + 8 * h.count + h.body;
    fill(frame_bytes, stop);
    frame_view f;
    f.header = h;
    f.sizes = rx_.get() + header_bytes;
    f.body = {rx_.get() + header_bytes + 8 * h.count, h.body};
    f.frame_bytes = frame_bytes;
    f.whole = {rx_.get(), frame_bytes};
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < h.count; ++i) sum += f.size_at(i);
    if (sum != h.body) {
      throw_error(errc::malformed_frame, "floor: " + peer_ + " sent buffer sizes that do not add up to the body");
    }
    return f;
  }

  /// Drops the frame `receive` returned (keeps bytes that came after it).
  void consume(const frame_view& f) {
    const std::size_t rest = have_ - f.frame_bytes;
    if (rest) std::memmove(rx_.get(), rx_.get() + f.frame_bytes, rest);
    have_ = rest;
  }

 private:
  void send_iov() {
    std::size_t first = 0;
    waiter_.reset();
    while (first < iov_.size()) {
      msghdr msg{};
      msg.msg_iov = iov_.data() + first;
      msg.msg_iovlen = std::min<std::size_t>(iov_.size() - first, max_iov);
      const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          waiter_.wait(fd_.get(), POLLOUT);
          continue;
        }
        throw_errno(errc::connection_reset, "floor: sending to " + peer_, errno);
      }
      waiter_.reset();
      std::size_t sent = static_cast<std::size_t>(n);
      while (first < iov_.size() && sent >= iov_[first].iov_len) {
        sent -= iov_[first].iov_len;
        ++first;
      }
      if (sent) {
        iov_[first].iov_base = static_cast<char*>(iov_[first].iov_base) + sent;
        iov_[first].iov_len -= sent;
      }
    }
  }

  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    const std::size_t grown = std::max(bytes, capacity_ * 2);
    auto bigger = std::make_unique_for_overwrite<std::byte[]>(grown);
    if (have_) std::memcpy(bigger.get(), rx_.get(), have_);
    rx_ = std::move(bigger);
    capacity_ = grown;
  }

  void fill(std::size_t need, const std::atomic<bool>* stop) {
    reserve(std::max<std::size_t>(need, 64 * kib));
    waiter_.reset();
    while (have_ < need) {
      const ssize_t n = ::recv(fd_.get(), rx_.get() + have_, capacity_ - have_, 0);
      if (n > 0) {
        have_ += static_cast<std::size_t>(n);
        waiter_.reset();
        continue;
      }
      if (n == 0) throw_error(errc::connection_closed, "floor: " + peer_ + " closed the connection");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (stop && stop->load(std::memory_order_relaxed)) {
          throw_error(errc::cancelled, "floor: stopping");
        }
        waiter_.wait(fd_.get(), POLLIN);
        continue;
      }
      throw_errno(errc::connection_reset, "floor: receiving from " + peer_, errno);
    }
  }

  unique_fd fd_;
  waiter waiter_;
  std::string peer_;
  std::vector<std::byte> tx_;
  std::vector<iovec> iov_;
  std::unique_ptr<std::byte[]> rx_;
  std::size_t capacity_ = 0;
  std::size_t have_ = 0;
};

addrinfo* resolve(const endpoint& ep, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string port = std::to_string(ep.port);
  const int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    throw_error(errc::invalid_argument, "floor: cannot resolve host '" + ep.host + "': " + ::gai_strerror(rc));
  }
  return result;
}

class floor_server final : public server {
 public:
  explicit floor_server(const server_config& config) : config_(config) {
    addrinfo* list = resolve(config.listen, true);
    int last_error = 0;
    for (addrinfo* a = list; a && listen_fd_.get() < 0; a = a->ai_next) {
      unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) {
        last_error = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
        last_error = errno;
        continue;
      }
      listen_fd_ = std::move(fd);
    }
    ::freeaddrinfo(list);
    if (listen_fd_.get() < 0) {
      throw_errno(errc::invalid_argument, "floor: cannot listen on " + config.listen.to_string(), last_error);
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }

  ~floor_server() override {
    stop();
    join_all();
  }

  std::uint16_t port() const override { return port_; }

  void run() override {
    while (!stopping_.load()) {
      const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        break;  // shut down by stop(), or the socket failed
      }
      std::lock_guard lock(mutex_);
      if (stopping_.load()) {
        ::close(fd);
        break;
      }
      set_socket_options(fd, config_.transport.mode);
      auto conn = std::make_shared<connection>(unique_fd(fd), config_.transport,
                                               "worker connection " + std::to_string(connections_.size()));
      connections_.push_back(conn);
      threads_.emplace_back([this, conn] { serve(*conn); });
    }
    join_all();
  }

  void stop() override {
    std::lock_guard lock(mutex_);
    if (stopping_.exchange(true)) return;
    ::shutdown(listen_fd_.get(), SHUT_RDWR);
    for (auto& conn : connections_) ::shutdown(conn->fd(), SHUT_RDWR);
  }

 private:
  void join_all() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  void serve(connection& conn) {
    payload_codec codec;
    try {
      while (!stopping_.load(std::memory_order_relaxed)) {
        const frame_view f = conn.receive(&stopping_);
        if (config_.mode == wire_mode::raw) {
          if (config_.reply == reply_kind::echo) {
            conn.send_bytes(f.whole);
          } else {
            conn.send({0, 0, f.header.body}, {}, {});
          }
        } else {
          if (f.header.count != 1 || !codec.decode(f.body)) {
            throw_error(errc::malformed_frame, "floor: " + conn.peer() + " sent no serialized fwbench.Payload");
          }
          const std::string& out =
              config_.reply == reply_kind::echo ? codec.encode_decoded() : codec.encode_ack(codec.decoded_bytes());
          const const_buffer body{reinterpret_cast<const std::byte*>(out.data()), out.size()};
          conn.send({1, out.size(), 0}, std::span(&body, 1), std::span(&body, 1));
        }
        conn.consume(f);
      }
    } catch (const std::system_error& e) {
      // A worker leaving ends its connection; anything else is worth a line.
      if (e.code() != make_error_code(errc::connection_closed) && e.code() != make_error_code(errc::cancelled) &&
          !stopping_.load()) {
        std::fprintf(stderr, "fwbench ps: %s\n", e.what());
      }
    }
  }

  server_config config_;
  unique_fd listen_fd_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<std::shared_ptr<connection>> connections_;
  std::vector<std::thread> threads_;
};

unique_fd connect_to(const endpoint& ep, const transport_settings& t) {
  const auto deadline = clock_type::now() + std::chrono::duration<double>(t.connect_timeout_s);
  int last_error = 0;
  while (true) {
    addrinfo* list = resolve(ep, false);
    for (addrinfo* a = list; a; a = a->ai_next) {
      unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) {
        last_error = errno;
        continue;
      }
      if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(list);
        set_socket_options(fd.get(), t.mode);
        return fd;
      }
      last_error = errno;
    }
    ::freeaddrinfo(list);
    if (clock_type::now() >= deadline) {
      throw_error(errc::connection_refused, "floor: cannot connect to PS " + ep.to_string() + " within " +
                                                std::to_string(static_cast<int>(t.connect_timeout_s)) +
                                                " s: " + std::strerror(last_error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

class floor_client final : public client {
 public:
  explicit floor_client(const client_config& config) : config_(config) {
    for (std::size_t i = 0; i < config.ps.size(); ++i) {
      conns_.push_back(std::make_unique<connection>(connect_to(config.ps[i], config.transport), config.transport,
                                                    "PS " + std::to_string(i) + " (" + config.ps[i].to_string() + ")"));
    }
  }

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    std::size_t total = 0;
    for (const_buffer b : payload) total += b.size();
    if (config_.mode == wire_mode::raw) {
      for (auto& c : conns_) c->send({static_cast<std::uint32_t>(payload.size()), total, 0}, payload, payload);
    } else {
      const std::string& wire = codec_.encode(payload);
      const const_buffer body{reinterpret_cast<const std::byte*>(wire.data()), wire.size()};
      for (auto& c : conns_) c->send({1, wire.size(), 0}, std::span(&body, 1), std::span(&body, 1));
    }
    std::size_t replied = 0;
    for (auto& c : conns_) {
      const frame_view f = c->receive(nullptr);
      replied += check_reply(*c, f, payload, total, verify);
      c->consume(f);
    }
    return replied;
  }

 private:
  std::size_t check_reply(const connection& c, const frame_view& f, std::span<const const_buffer> payload,
                          std::size_t total, bool verify) {
    auto mismatch = [&](const std::string& what) {
      throw_error(errc::malformed_frame,
                  "floor: " + c.peer() + " " + what + "; does the PS run the same --benchmark and --mode?");
    };
    if (config_.mode == wire_mode::raw) {
      if (config_.reply == reply_kind::ack) {
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
    if (config_.reply == reply_kind::ack) {
      std::uint64_t bytes = 0;
      if (!codec_.decode_ack(f.body, bytes)) mismatch("sent no fwbench.Ack");
      return bytes;
    }
    if (!codec_.decode(f.body)) mismatch("sent no fwbench.Payload");
    if (verify && !same_buffers(codec_, payload)) mismatch("echoed a different payload");
    return codec_.decoded_bytes();
  }

  client_config config_;
  std::vector<std::unique_ptr<connection>> conns_;
  payload_codec codec_;
};

}  // namespace

backend_info floor_backend() {
  backend_info info;
  info.name = "floor";
  info.summary = "plain TCP sockets, no library: busy-polling (poll), spin-then-sleep (adaptive) or blocking (block)";
  info.available = true;
  info.honours_wait_mode = true;
  info.make_server = [](const server_config& c) -> std::unique_ptr<server> {
    return std::make_unique<floor_server>(c);
  };
  info.make_client = [](const client_config& c) -> std::unique_ptr<client> {
    return std::make_unique<floor_client>(c);
  };
  return info;
}

}  // namespace fusewire::bench
