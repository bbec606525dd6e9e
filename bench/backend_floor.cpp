// The floor: plain TCP sockets and no library, so the reference for what
// this network path can do. One thread per connection on the PS; one frame
// per payload, sent with one sendmsg of the iovec buffers.
//
// The frame (floor_shared.hpp, shared with the futex floor) has the magic
// "FWB1".

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
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "backend.hpp"
#include "floor_shared.hpp"
#include "serial.hpp"

namespace fusewire::bench {
namespace {

using namespace floors;

/// The frame's magic, "FWB1", and how errors name this backend and a peer's frame.
constexpr frame_format format{0x31425746, "floor: ", "sent"};
constexpr int max_iov = 1024;

using clock_type = std::chrono::steady_clock;

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

/// One TCP connection with fwbench framing.
class connection {
 public:
  connection(unique_fd fd, const transport_settings& t, std::string peer)
      : fd_(std::move(fd)), waiter_(t.mode, t.idle_poll), peer_(std::move(peer)) {}

  int fd() const noexcept { return fd_.get(); }
  const std::string& peer() const noexcept { return peer_; }

  /// Sends header + sizes + body buffers in as few sendmsg calls as the kernel allows.
  void send(const frame_header& h, std::span<const const_buffer> sized_buffers, std::span<const const_buffer> body) {
    const std::size_t prefix = frame_prefix_bytes(sized_buffers.size());
    if (tx_.size() < prefix) tx_.resize(prefix);
    write_frame_prefix(tx_.data(), format, h, sized_buffers);
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
    fill(frame_header_bytes, stop);
    const frame_header h = read_frame_header(rx_.get(), format, peer_);
    fill(frame_bytes(h), stop);  // may move the buffer: the view comes after
    return view_frame(rx_.get(), h, format, peer_);
  }

  /// Drops the frame `receive` returned (keeps bytes that came after it).
  void consume(const frame_view& f) {
    const std::size_t rest = have_ - f.whole.size();
    if (rest) std::memmove(rx_.get(), rx_.get() + f.whole.size(), rest);
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

class floor_server final : public server {
 public:
  explicit floor_server(const server_config& config) : config_(config) {
    tcp_listener l = listen_tcp(config.listen, 128, format.prefix);
    listen_fd_ = std::move(l.fd);
    port_ = l.port;
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
  void join_all() { floors::join_all(mutex_, threads_); }

  void serve(connection& conn) {
    payload_codec codec;
    try {
      while (!stopping_.load(std::memory_order_relaxed)) {
        const frame_view f = conn.receive(&stopping_);
        answer_request(conn, f, config_, codec, format);
        conn.consume(f);
      }
    } catch (const std::system_error& e) {
      report_connection_end(e, stopping_.load());
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
    addrinfo* list = resolve(ep, false, format.prefix);
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
  explicit floor_client(const client_config& config) : frames_(config, format) {
    for (std::size_t i = 0; i < config.ps.size(); ++i) {
      conns_.push_back(std::make_unique<connection>(connect_to(config.ps[i], config.transport), config.transport,
                                                    "PS " + std::to_string(i) + " (" + config.ps[i].to_string() + ")"));
    }
  }

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    const request_frames::request r = frames_.make(payload);
    for (auto& c : conns_) c->send(r.header, r.sized_buffers, r.body);
    std::size_t replied = 0;
    for (auto& c : conns_) {
      const frame_view f = c->receive(nullptr);
      replied += frames_.check_reply(c->peer(), f, verify);
      c->consume(f);
    }
    return replied;
  }

 private:
  request_frames frames_;
  std::vector<std::unique_ptr<connection>> conns_;
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
