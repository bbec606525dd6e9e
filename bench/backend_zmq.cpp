// ZeroMQ (libzmq, the transport ps-lite uses): DEALER workers, a ROUTER PS,
// one frame per iovec buffer, zero-copy sends (zmq_msg_init_data without a
// free function: the payload outlives the call, which waits for the reply).

#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <string>
#include <thread>

#include "backend.hpp"
#include "serial.hpp"

namespace fusewire::bench {
namespace {

using clock_type = std::chrono::steady_clock;

[[noreturn]] void throw_zmq(errc e, const std::string& what) {
  throw_error(e, "zmq: " + what + ": " + zmq_strerror(zmq_errno()));
}

/// A zmq_msg_t that closes itself.
class message {
 public:
  message() { zmq_msg_init(&msg_); }
  ~message() { zmq_msg_close(&msg_); }
  message(const message&) = delete;
  message& operator=(const message&) = delete;

  zmq_msg_t* get() noexcept { return &msg_; }
  const_buffer bytes() noexcept { return {static_cast<const std::byte*>(zmq_msg_data(&msg_)), zmq_msg_size(&msg_)}; }
  bool more() noexcept { return zmq_msg_more(&msg_) != 0; }

 private:
  zmq_msg_t msg_;
};

std::string zmq_address(const endpoint& ep, bool bind) {
  const bool v6 = ep.host.find(':') != std::string::npos;
  const std::string host = v6 ? "[" + ep.host + "]" : ep.host;
  if (bind && ep.port == 0) return "tcp://" + host + ":*";
  return "tcp://" + host + ":" + std::to_string(ep.port);
}

/// Receives one frame, waiting as `mode` says; false when the context was shut down.
bool receive_frame(void* socket, zmq_msg_t* msg, wait_mode mode, std::chrono::microseconds idle_poll,
                   const std::atomic<bool>* stop) {
  if (mode == wait_mode::block) {
    while (true) {
      if (zmq_msg_recv(msg, socket, 0) >= 0) return true;
      if (zmq_errno() == EINTR) continue;
      if (zmq_errno() == ETERM) return false;
      throw_zmq(errc::connection_reset, "receiving");
    }
  }
  const auto start = clock_type::now();
  while (true) {
    if (zmq_msg_recv(msg, socket, ZMQ_DONTWAIT) >= 0) return true;
    const int err = zmq_errno();
    if (err == ETERM) return false;
    if (err != EAGAIN && err != EINTR) throw_zmq(errc::connection_reset, "receiving");
    if (stop && stop->load(std::memory_order_relaxed)) return false;
    if (mode == wait_mode::adaptive && clock_type::now() - start >= idle_poll) {
      zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, -1) < 0 && zmq_errno() == ETERM) return false;
    }
  }
}

void send_frame(void* socket, zmq_msg_t* msg, bool more) {
  while (zmq_msg_send(msg, socket, more ? ZMQ_SNDMORE : 0) < 0) {
    if (zmq_errno() == EINTR) continue;
    throw_zmq(errc::connection_reset, "sending");
  }
}

void send_copy(void* socket, const void* data, std::size_t size, bool more) {
  zmq_msg_t msg;
  zmq_msg_init_size(&msg, size);
  if (size) std::memcpy(zmq_msg_data(&msg), data, size);
  send_frame(socket, &msg, more);
}

class zmq_server final : public server {
 public:
  explicit zmq_server(const server_config& config) : config_(config), context_(zmq_ctx_new()) {
    socket_ = zmq_socket(context_, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(socket_, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(socket_, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(socket_, ZMQ_RCVHWM, &zero, sizeof zero);
    std::int64_t unlimited = -1;
    zmq_setsockopt(socket_, ZMQ_MAXMSGSIZE, &unlimited, sizeof unlimited);
    if (config.listen.host.find(':') != std::string::npos) {
      int one = 1;
      zmq_setsockopt(socket_, ZMQ_IPV6, &one, sizeof one);
    }
    if (zmq_bind(socket_, zmq_address(config.listen, true).c_str()) != 0) {
      const std::string why = zmq_strerror(zmq_errno());
      zmq_close(socket_);
      zmq_ctx_term(context_);
      throw_error(errc::invalid_argument, "zmq: cannot listen on " + config.listen.to_string() + ": " + why);
    }
    char last[256] = {};
    std::size_t len = sizeof last;
    zmq_getsockopt(socket_, ZMQ_LAST_ENDPOINT, last, &len);
    const char* colon = std::strrchr(last, ':');
    port_ = colon ? static_cast<std::uint16_t>(std::atoi(colon + 1)) : config.listen.port;
  }

  ~zmq_server() override {
    stop();
    if (socket_) zmq_close(socket_);
    zmq_ctx_term(context_);
  }

  std::uint16_t port() const override { return port_; }

  void run() override {
    payload_codec codec;
    std::vector<std::unique_ptr<message>> frames;
    while (!stopping_.load()) {
      message identity;
      if (!receive_frame(socket_, identity.get(), config_.transport.mode, config_.transport.idle_poll, &stopping_))
        break;
      frames.clear();
      bool more = identity.more();
      bool stopped = false;
      while (more) {
        frames.push_back(std::make_unique<message>());
        if (!receive_frame(socket_, frames.back()->get(), wait_mode::block, {}, nullptr)) {
          stopped = true;
          break;
        }
        more = frames.back()->more();
      }
      if (stopped) break;
      try {
        reply(identity, frames, codec);
      } catch (const std::system_error& e) {
        if (stopping_.load()) break;
        std::fprintf(stderr, "fwbench ps: %s\n", e.what());
      }
    }
    // The socket belongs to this thread; close it here so that stop()'s
    // context shutdown can finish.
    zmq_close(socket_);
    socket_ = nullptr;
  }

  void stop() override {
    if (stopping_.exchange(true)) return;
    zmq_ctx_shutdown(context_);
  }

 private:
  void reply(message& identity, std::vector<std::unique_ptr<message>>& frames, payload_codec& codec) {
    std::uint64_t received = 0;
    for (auto& f : frames) received += f->bytes().size();
    if (config_.mode == wire_mode::raw) {
      if (config_.reply == reply_kind::ack) {
        send_frame(socket_, identity.get(), true);
        send_copy(socket_, &received, sizeof received, false);
        return;
      }
      send_frame(socket_, identity.get(), !frames.empty());
      for (std::size_t i = 0; i < frames.size(); ++i) send_frame(socket_, frames[i]->get(), i + 1 < frames.size());
      return;
    }
    if (frames.size() != 1 || !codec.decode(frames[0]->bytes())) {
      throw_error(errc::malformed_frame, "zmq: a worker sent no serialized fwbench.Payload");
    }
    const std::string& out =
        config_.reply == reply_kind::echo ? codec.encode_decoded() : codec.encode_ack(codec.decoded_bytes());
    // Hand zmq a heap copy of the encoding that it frees after sending.
    auto* owned = new std::string(out);
    zmq_msg_t msg;
    zmq_msg_init_data(
        &msg, owned->data(), owned->size(), [](void*, void* hint) { delete static_cast<std::string*>(hint); }, owned);
    send_frame(socket_, identity.get(), true);
    send_frame(socket_, &msg, false);
  }

  server_config config_;
  void* context_ = nullptr;
  void* socket_ = nullptr;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
};

class zmq_client final : public client {
 public:
  explicit zmq_client(const client_config& config) : config_(config), context_(zmq_ctx_new()) {
    std::vector<void*> monitors;
    for (std::size_t p = 0; p < config.ps.size(); ++p) {
      const endpoint& ep = config.ps[p];
      void* s = zmq_socket(context_, ZMQ_DEALER);
      sockets_.push_back(s);
      int zero = 0;
      zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
      if (ep.host.find(':') != std::string::npos) {
        int one = 1;
        zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
      }
      // Watch for the connection before starting it, so the event cannot be missed.
      const std::string address = "inproc://fwbench-monitor-" + std::to_string(p);
      zmq_socket_monitor(s, address.c_str(), ZMQ_EVENT_CONNECTED);
      void* mon = zmq_socket(context_, ZMQ_PAIR);
      zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero);
      zmq_connect(mon, address.c_str());
      monitors.push_back(mon);
      if (zmq_connect(s, zmq_address(ep, false).c_str()) != 0) {
        const std::string why = zmq_strerror(zmq_errno());
        for (void* m : monitors) zmq_close(m);
        close_all();
        throw_error(errc::invalid_argument, "zmq: cannot connect to " + ep.to_string() + ": " + why);
      }
    }
    try {
      wait_connected(monitors);
    } catch (...) {
      for (void* m : monitors) zmq_close(m);
      close_all();
      throw;
    }
    for (std::size_t p = 0; p < sockets_.size(); ++p) {
      zmq_socket_monitor(sockets_[p], nullptr, 0);
      zmq_close(monitors[p]);
    }
  }

  ~zmq_client() override { close_all(); }

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    if (config_.mode == wire_mode::raw) {
      for (void* s : sockets_) {
        for (std::size_t i = 0; i < payload.size(); ++i) {
          zmq_msg_t msg;
          zmq_msg_init_data(&msg, const_cast<std::byte*>(payload[i].data()), payload[i].size(), nullptr, nullptr);
          send_frame(s, &msg, i + 1 < payload.size());
        }
      }
    } else {
      const std::string& wire = codec_.encode(payload);
      for (void* s : sockets_) {
        zmq_msg_t msg;
        zmq_msg_init_data(&msg, const_cast<char*>(wire.data()), wire.size(), nullptr, nullptr);
        send_frame(s, &msg, false);
      }
    }
    std::size_t replied = 0;
    for (std::size_t p = 0; p < sockets_.size(); ++p) replied += receive_reply(p, payload, verify);
    return replied;
  }

 private:
  void close_all() {
    for (void* s : sockets_) zmq_close(s);
    sockets_.clear();
    if (context_) zmq_ctx_term(context_);
    context_ = nullptr;
  }

  /// zmq connects in the background; a worker should not start its clock
  /// before every PS is there, so wait until each DEALER reports its peer.
  void wait_connected(const std::vector<void*>& monitors) {
    const auto deadline = clock_type::now() + std::chrono::duration<double>(config_.transport.connect_timeout_s);
    for (std::size_t p = 0; p < monitors.size(); ++p) {
      bool connected = false;
      while (!connected && clock_type::now() < deadline) {
        zmq_pollitem_t item{monitors[p], 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 100) <= 0) continue;
        message event;
        if (zmq_msg_recv(event.get(), monitors[p], 0) < 0) continue;
        std::uint16_t id = 0;
        if (event.bytes().size() >= 2) std::memcpy(&id, event.bytes().data(), 2);
        bool more = event.more();
        while (more) {
          message rest;
          zmq_msg_recv(rest.get(), monitors[p], 0);
          more = rest.more();
        }
        connected = (id == ZMQ_EVENT_CONNECTED);
      }
      if (!connected) {
        throw_error(errc::connection_refused,
                    "zmq: cannot connect to PS " + config_.ps[p].to_string() + " within " +
                        std::to_string(static_cast<int>(config_.transport.connect_timeout_s)) + " s");
      }
    }
  }

  std::size_t receive_reply(std::size_t p, std::span<const const_buffer> payload, bool verify) {
    auto mismatch = [&](const std::string& what) {
      throw_error(errc::malformed_frame, "zmq: PS " + std::to_string(p) + " (" + config_.ps[p].to_string() + ") " +
                                             what + "; does the PS run the same --benchmark and --mode?");
    };
    auto next = [&](message& m) {
      if (!receive_frame(sockets_[p], m.get(), config_.transport.mode, config_.transport.idle_poll, nullptr)) {
        throw_error(errc::cancelled, "zmq: context shut down");
      }
    };
    if (config_.mode == wire_mode::serialized) {
      message m;
      next(m);
      if (m.more()) mismatch("sent more than one frame");
      if (config_.reply == reply_kind::ack) {
        std::uint64_t bytes = 0;
        if (!codec_.decode_ack(m.bytes(), bytes)) mismatch("sent no fwbench.Ack");
        return bytes;
      }
      if (!codec_.decode(m.bytes())) mismatch("sent no fwbench.Payload");
      if (verify && !same_buffers(codec_, payload)) mismatch("echoed a different payload");
      return codec_.decoded_bytes();
    }
    if (config_.reply == reply_kind::ack) {
      message m;
      next(m);
      std::uint64_t bytes = 0;
      if (m.more() || m.bytes().size() != sizeof bytes) mismatch("sent something other than an ack");
      std::memcpy(&bytes, m.bytes().data(), sizeof bytes);
      return bytes;
    }
    std::size_t total = 0;
    for (std::size_t i = 0;; ++i) {
      message m;
      next(m);
      if (i >= payload.size() || m.bytes().size() != payload[i].size()) mismatch("sent something other than the echo");
      if (verify && std::memcmp(m.bytes().data(), payload[i].data(), payload[i].size()) != 0) {
        mismatch("echoed different bytes in buffer " + std::to_string(i));
      }
      total += m.bytes().size();
      if (!m.more()) {
        if (i + 1 != payload.size()) mismatch("echoed fewer buffers");
        break;
      }
    }
    return total;
  }

  client_config config_;
  void* context_ = nullptr;
  std::vector<void*> sockets_;
  payload_codec codec_;
};

}  // namespace

backend_info zmq_backend() {
  backend_info info;
  info.name = "zmq";
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  info.summary = "ZeroMQ " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch) +
                 ": DEALER/ROUTER, one frame per buffer, zero-copy sends";
  info.available = true;
  info.honours_wait_mode = true;
  info.make_server = [](const server_config& c) -> std::unique_ptr<server> { return std::make_unique<zmq_server>(c); };
  info.make_client = [](const client_config& c) -> std::unique_ptr<client> { return std::make_unique<zmq_client>(c); };
  return info;
}

}  // namespace fusewire::bench
