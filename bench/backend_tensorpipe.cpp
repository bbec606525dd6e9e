// TensorPipe (the tensor transport under PyTorch's RPC framework) as fwbench
// backends: one per transport and channel, so that several run side by side
// in one invocation.
//
//   tensorpipe-uv-basic    uv transport (libuv TCP sockets), basic channel
//   tensorpipe-uv-cma      uv transport, cma channel (process_vm_readv)
//   tensorpipe-shm-basic   shm transport (shared-memory rings), basic channel
//   tensorpipe-shm-cma     shm transport, cma channel
//
// Each process's context registers exactly that transport and channel, so
// TensorPipe cannot pick another. A request is one message whose tensors are
// the iovec buffers (CPU tensors: they go through the channel; the transport
// carries the descriptor); serialized mode sends the protobuf encoding as one
// tensor. The PS echoes the received tensors as they are, or acknowledges
// with the byte count in the reply's metadata. The worker posts its
// readDescriptor for the reply before it writes the request; a measured run
// chains the exchanges in TensorPipe's callbacks (the last completion of one
// starts the next), as the fusewire backends chain theirs on their reactor.
// There is no wait mode to choose: TensorPipe's threads wait as TensorPipe
// does (uv: epoll; shm: its reactor busy-polls).
//
// The shm transport and the cma channel need every process on one host. The
// shm transport listens on an abstract socket named after --host and the
// PS's port, so its ports are fixed before anything starts, as for
// fusewire-shm.

#include <tensorpipe/tensorpipe.h>

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "serial.hpp"

namespace fusewire::bench {
namespace {

namespace tp = tensorpipe;
using clock_type = std::chrono::steady_clock;

struct variant {
  std::string transport;  // "uv" or "shm"
  std::string channel;    // "basic" or "cma"
  std::string name() const { return "tensorpipe-" + transport + "-" + channel; }
};

constexpr const char* hello = "hello";
constexpr const char* request = "req";

/// A context with exactly `v`'s transport and channel; throws when either
/// cannot work on this host (TensorPipe would otherwise fail later, on the
/// first message, with a less telling error).
std::shared_ptr<tp::Context> make_context(const variant& v, const std::string& process) {
  std::shared_ptr<tp::transport::Context> transport =
      v.transport == "uv" ? tp::transport::uv::create() : tp::transport::shm::create();
  std::shared_ptr<tp::channel::Context> channel =
      v.channel == "basic" ? tp::channel::basic::create() : tp::channel::cma::create();
  if (!transport->isViable()) {
    throw_error(errc::not_supported,
                v.name() + ": TensorPipe's " + v.transport + " transport cannot work on this host (not viable)");
  }
  if (!channel->isViable()) {
    throw_error(errc::not_supported, v.name() + ": TensorPipe's " + v.channel +
                                         " channel cannot work on this host (not viable; cma needs "
                                         "process_vm_readv between the processes, see ptrace_scope)");
  }
  auto ctx = std::make_shared<tp::Context>(tp::ContextOptions().name(process));
  ctx->registerTransport(0, v.transport, std::move(transport));
  ctx->registerChannel(0, v.channel, std::move(channel));
  return ctx;
}

/// The URL a PS listens on and its workers connect to.
std::string url_of(const variant& v, const endpoint& ep) {
  if (v.transport == "shm") return "shm://fwbench-tp-" + ep.host + "-" + std::to_string(ep.port);
  const bool v6 = ep.host.find(':') != std::string::npos;
  return "uv://" + (v6 ? "[" + ep.host + "]" : ep.host) + ":" + std::to_string(ep.port);
}

/// A CPU tensor over `size` bytes at `data` (TensorPipe takes non-const pointers for reads and writes alike).
tp::Message::Tensor tensor_of(const void* data, std::size_t size) {
  tp::Message::Tensor t;
  t.buffer = tp::CpuBuffer{const_cast<void*>(data)};
  t.length = size;
  return t;
}

/// The uv transport takes numeric addresses only, and a listener that cannot
/// bind throws on TensorPipe's loop thread, which ends the process: check
/// both first, so that a bad --host or a taken port is an error that says so.
void check_uv_address(const variant& v, const endpoint& ep, bool listen) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(ep.port);
  if (::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &list) != 0 || !list) {
    throw_error(errc::invalid_argument, v.name() + ": '" + ep.host +
                                            "' is not a numeric IPv4 or IPv6 address (TensorPipe's uv transport "
                                            "takes no host names)");
  }
  int err = 0;
  if (listen && ep.port != 0) {
    const int fd = ::socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) {
      err = errno;
    } else {
      // libuv binds with SO_REUSEADDR too; a port some socket listens on still fails.
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, list->ai_addr, list->ai_addrlen) != 0) err = errno;
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  if (err != 0) {
    throw_error(errc::invalid_argument, v.name() + ": cannot listen on " + ep.to_string() + ": " + std::strerror(err));
  }
}

/// A second listener on a taken shm name throws on TensorPipe's loop thread,
/// which ends the process: try the name first.
void check_shm_name(const variant& v, const endpoint& ep, const std::string& url) {
  const std::string name = url.substr(std::string_view("shm://").size());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof addr.sun_path) {
    throw_error(errc::invalid_argument, v.name() + ": --host '" + ep.host + "' is too long for a socket name");
  }
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: a leading NUL, as TensorPipe's
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) err = errno;
    ::close(fd);
  }
  if (err != 0) {
    throw_error(errc::invalid_argument,
                v.name() + ": cannot listen on " + ep.to_string() + " (" + url + "): " + std::strerror(err));
  }
}

std::string ack_metadata(std::uint64_t bytes) {
  std::string out(sizeof bytes, '\0');
  std::memcpy(out.data(), &bytes, sizeof bytes);
  return out;
}

/// Counts outstanding callbacks and lets one thread wait for them.
class completion {
 public:
  void arm(int n) {
    std::lock_guard lock(mutex_);
    pending_ = n;
  }

  /// Called once per completed operation, from any thread.
  void done() {
    std::lock_guard lock(mutex_);
    if (--pending_ == 0) cv_.notify_all();
  }

  /// Waits until every armed operation is done or `deadline`; false on the deadline.
  bool wait(clock_type::time_point deadline = clock_type::time_point::max()) {
    std::unique_lock lock(mutex_);
    auto finished = [&] { return pending_ <= 0; };
    if (deadline == clock_type::time_point::max()) {
      cv_.wait(lock, finished);
      return true;
    }
    return cv_.wait_until(lock, deadline, finished);
  }

 private:
  int pending_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
};

using buffer_set = std::vector<std::vector<std::byte>>;

// ---- PS ----------------------------------------------------------------------

/// One worker's pipe as the PS serves it. Its callbacks keep it alive.
class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(std::shared_ptr<tp::Pipe> pipe, const server_config& config, std::string name,
             const std::atomic<bool>& stopping)
      : pipe_(std::move(pipe)), config_(config), name_(std::move(name)), stopping_(stopping) {}

  void read_next() {
    pipe_->readDescriptor([self = shared_from_this()](const tp::Error& e, tp::Descriptor d) {
      if (e) return self->fail(e);
      self->on_descriptor(std::move(d));
    });
  }

 private:
  void on_descriptor(tp::Descriptor d) {
    if (d.metadata == hello) {
      pipe_->read(tp::Allocation{}, [self = shared_from_this()](const tp::Error& e) {
        if (e) return self->fail(e);
        tp::Message m;
        m.metadata = hello;
        self->pipe_->write(std::move(m), [self](const tp::Error& we) {
          if (we) self->fail(we);
        });
        self->read_next();
      });
      return;
    }
    if (d.metadata != request || !d.payloads.empty() ||
        (config_.mode == wire_mode::serialized && d.tensors.size() != 1)) {
      return fail("sent something other than an fwbench request; does it run the same --mode?");
    }
    std::shared_ptr<buffer_set> set = take(d);
    tp::Allocation a;
    for (auto& b : *set) a.tensors.push_back({tp::CpuBuffer{b.data()}});
    pipe_->read(std::move(a), [self = shared_from_this(), set](const tp::Error& e) {
      if (e) return self->fail(e);
      self->reply(set);
      self->read_next();
    });
  }

  void reply(const std::shared_ptr<buffer_set>& set) {
    std::uint64_t received = 0;
    for (const auto& b : *set) received += b.size();
    tp::Message m;
    if (config_.mode == wire_mode::raw) {
      if (config_.reply == reply_kind::ack) {
        give_back(set);
        m.metadata = ack_metadata(received);
        pipe_->write(std::move(m), [self = shared_from_this()](const tp::Error& e) {
          if (e) self->fail(e);
        });
        return;
      }
      for (auto& b : *set) m.tensors.push_back(tensor_of(b.data(), b.size()));
      pipe_->write(std::move(m), [self = shared_from_this(), set](const tp::Error& e) {
        self->give_back(set);
        if (e) self->fail(e);
      });
      return;
    }
    const auto& wire = (*set)[0];
    if (!codec_.decode(const_buffer(wire.data(), wire.size()))) {
      give_back(set);
      return fail("sent no serialized fwbench.Payload; does it run the same --mode?");
    }
    auto out = std::make_shared<std::string>(
        config_.reply == reply_kind::echo ? codec_.encode_decoded() : codec_.encode_ack(codec_.decoded_bytes()));
    give_back(set);
    m.tensors.push_back(tensor_of(out->data(), out->size()));
    pipe_->write(std::move(m), [self = shared_from_this(), out](const tp::Error& e) {
      if (e) self->fail(e);
    });
  }

  /// Destinations of the descriptor's sizes: a free set from an earlier
  /// request when one matches (the echo of the previous one may still be
  /// being written), else a new one.
  std::shared_ptr<buffer_set> take(const tp::Descriptor& d) {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      bool same = (*it)->size() == d.tensors.size();
      for (std::size_t i = 0; same && i < d.tensors.size(); ++i) same = (**it)[i].size() == d.tensors[i].length;
      if (same) {
        auto set = std::move(*it);
        free_.erase(it);
        return set;
      }
    }
    auto set = std::make_shared<buffer_set>(d.tensors.size());
    for (std::size_t i = 0; i < d.tensors.size(); ++i) (*set)[i].resize(d.tensors[i].length);
    return set;
  }

  void give_back(const std::shared_ptr<buffer_set>& set) {
    std::lock_guard lock(mutex_);
    if (free_.size() < 4) free_.push_back(set);
  }

  void fail(const tp::Error& e) {
    // A worker that finished closes its pipe: not worth a line (the uv
    // transport reports that as libuv's UV_EOF, "EOF: end of file").
    const bool eof = e.isOfType<tp::EOFError>() || e.isOfType<tp::PipeClosedError>() ||
                     (e.isOfType<tp::transport::uv::UVError>() && e.what().rfind("EOF", 0) == 0);
    if (eof) return close();
    fail(e.what());
  }

  void fail(const std::string& what) {
    if (!failed_.exchange(true) && !stopping_.load()) {
      std::fprintf(stderr, "fwbench ps: %s: worker connection: %s\n", name_.c_str(), what.c_str());
    }
    close();
  }

  void close() { pipe_->close(); }

  std::shared_ptr<tp::Pipe> pipe_;
  const server_config& config_;
  std::string name_;
  const std::atomic<bool>& stopping_;
  payload_codec codec_;  // used on the context's loop only (one callback at a time per pipe)
  std::mutex mutex_;
  std::vector<std::shared_ptr<buffer_set>> free_;
  std::atomic<bool> failed_{false};
};

class tp_server final : public server {
 public:
  tp_server(const server_config& config, variant v) : config_(config), v_(std::move(v)) {
    if (v_.transport == "shm" && config.listen.port == 0) {
      throw_error(errc::invalid_argument, v_.name() + ": cannot listen on " + config.listen.to_string() +
                                              ": the shm transport's socket is named after the port, so it needs a "
                                              "fixed one (the launcher reserves them; by hand: --cluster "
                                              "'ps=host:port,...')");
    }
    if (v_.transport == "uv") check_uv_address(v_, config.listen, true);
    context_ = make_context(v_, "ps:" + std::to_string(config.task));
    const std::string url = url_of(v_, config.listen);
    if (v_.transport == "shm") check_shm_name(v_, config.listen, url);
    listener_ = context_->listen({url});
    port_ = config.listen.port;
    if (v_.transport == "uv") {
      // The bound address ("host:port"); empty or portless when the bind failed.
      std::string bound;
      try {
        bound = listener_->address("uv");
      } catch (const std::exception&) {
      }
      const std::size_t colon = bound.rfind(':');
      const long got = colon == std::string::npos ? 0 : std::strtol(bound.c_str() + colon + 1, nullptr, 10);
      if (got <= 0 || got > 65535) {
        shutdown();
        throw_error(errc::invalid_argument, v_.name() + ": cannot listen on " + config.listen.to_string());
      }
      port_ = static_cast<std::uint16_t>(got);
    }
    accept();
  }

  ~tp_server() override { shutdown(); }

  std::uint16_t port() const override { return port_; }

  void run() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return stopping_.load(); });
  }

  void stop() override {
    {
      std::lock_guard lock(mutex_);
      stopping_.store(true);
    }
    cv_.notify_all();
  }

 private:
  void accept() {
    listener_->accept([this](const tp::Error& e, std::shared_ptr<tp::Pipe> pipe) {
      if (e) {
        if (!stopping_.load() && !e.isOfType<tp::ListenerClosedError>()) {
          std::fprintf(stderr, "fwbench ps: %s: accepting: %s\n", v_.name().c_str(), e.what().c_str());
        }
        return;
      }
      std::make_shared<connection>(std::move(pipe), config_, v_.name(), stopping_)->read_next();
      accept();
    });
  }

  void shutdown() {
    stopping_.store(true);
    if (!context_) return;
    context_->close();
    context_->join();
    listener_.reset();
    context_.reset();
  }

  server_config config_;
  variant v_;
  std::shared_ptr<tp::Context> context_;
  std::shared_ptr<tp::Listener> listener_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

// ---- worker ------------------------------------------------------------------

class tp_client final : public client {
 public:
  tp_client(const client_config& config, variant v) : config_(config), v_(std::move(v)), replies_(config.ps.size()) {
    if (v_.transport == "uv") {
      for (const endpoint& ep : config.ps) check_uv_address(v_, ep, false);
    }
    context_ = make_context(v_, "worker:" + std::to_string(config.task));
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(config.transport.connect_timeout_s));
    try {
      for (const endpoint& ep : config.ps) pipes_.push_back(connect(ep, deadline));
    } catch (...) {
      shutdown();
      throw;
    }
  }

  ~tp_client() override { shutdown(); }

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    const tp::Message m = request_for(payload);
    error_.clear();
    done_.arm(static_cast<int>(2 * pipes_.size()));
    post(m);
    done_.wait();
    if (!error_.empty()) throw_error(errc::connection_reset, v_.name() + ": " + error_);
    std::size_t replied = 0;
    for (std::size_t p = 0; p < pipes_.size(); ++p) replied += check_reply(p, payload, verify);
    return replied;
  }

  /// Chains the exchanges in TensorPipe's callbacks, as fusewire's backends
  /// chain theirs in completion handlers: the last completion of one
  /// exchange starts the next, so no hand-off to this thread sits inside a
  /// measured round trip. This thread only ticks and waits for the end.
  std::uint64_t run(const exchange_run& r) override {
    chain_.run = &r;
    chain_.message = request_for(r.payload);
    chain_.count.store(0);
    chain_.finished = false;
    chain_.problem.clear();
    error_.clear();
    chaining_ = true;
    if (bench_clock::now() < r.until) {
      start_chained();
      std::unique_lock lock(chain_.mutex);
      while (!chain_.cv.wait_for(lock, std::chrono::seconds(1), [&] { return chain_.finished; })) {
        lock.unlock();
        if (r.tick) r.tick(chain_.count.load());
        lock.lock();
      }
    }
    chaining_ = false;
    if (!error_.empty()) throw_error(errc::connection_reset, v_.name() + ": " + error_);
    if (!chain_.problem.empty()) throw_error(errc::size_mismatch, chain_.problem);
    return chain_.count.load();
  }

 private:
  struct reply {
    std::string metadata;
    buffer_set buffers;
  };

  std::shared_ptr<tp::Pipe> connect(const endpoint& ep, clock_type::time_point deadline) {
    const std::string url = url_of(v_, ep);
    std::string last;
    while (true) {
      auto pipe = context_->connect(url);
      error_.clear();
      done_.arm(2);
      pipe->readDescriptor([this, pipe](const tp::Error& e, tp::Descriptor d) {
        if (e) {
          fail(e.what());
          return done_.done();
        }
        if (d.metadata != hello) fail("the PS answered the hello with something else; is it a " + v_.name() + " PS?");
        pipe->read(tp::Allocation{}, [this](const tp::Error& re) {
          if (re) fail(re.what());
          done_.done();
        });
      });
      tp::Message m;
      m.metadata = hello;
      pipe->write(std::move(m), [this](const tp::Error& e) {
        if (e) fail(e.what());
        done_.done();
      });
      const bool in_time = done_.wait(deadline);
      if (in_time && error_.empty()) return pipe;
      if (in_time) {
        last = error_;
      } else if (last.empty()) {
        last = "no answer";
      }
      pipe->close();  // its callbacks run now, with errors
      done_.wait();
      if (clock_type::now() >= deadline) {
        throw_error(errc::connection_refused,
                    v_.name() + ": cannot connect to PS " + ep.to_string() + " (" + url + ") within " +
                        std::to_string(static_cast<int>(config_.transport.connect_timeout_s)) + " s: " + last);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  /// The request message for `payload`: its buffers as tensors, or its
  /// encoding as one (by `encoder_`, so that decoding replies keeps it).
  tp::Message request_for(std::span<const const_buffer> payload) {
    tp::Message m;
    m.metadata = request;
    if (config_.mode == wire_mode::raw) {
      m.tensors.reserve(payload.size());
      for (const const_buffer& b : payload) m.tensors.push_back(tensor_of(b.data(), b.size()));
    } else {
      const std::string& wire = encoder_.encode(payload);
      m.tensors.push_back(tensor_of(wire.data(), wire.size()));
    }
    return m;
  }

  /// Posts the read of every PS's reply, then writes `m` to each.
  void post(const tp::Message& m) {
    for (std::size_t p = 0; p < pipes_.size(); ++p) {
      pipes_[p]->readDescriptor([this, p](const tp::Error& e, tp::Descriptor d) { on_reply(p, e, std::move(d)); });
      pipes_[p]->write(m, [this](const tp::Error& e) {
        if (e) fail("sending: " + e.what());
        op_done();
      });
    }
  }

  void start_chained() {
    chain_.pending.store(static_cast<int>(2 * pipes_.size()));
    chain_.t0 = bench_clock::now();
    post(chain_.message);
  }

  /// One of an exchange's operations completed (on a TensorPipe thread).
  void op_done() {
    if (!chaining_) return done_.done();
    if (chain_.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    const exchange_run& r = *chain_.run;
    const auto now = bench_clock::now();
    bool stop = !error_.empty() || now >= r.until;
    if (error_.empty()) {
      std::size_t replied = 0;
      try {
        for (std::size_t p = 0; p < pipes_.size(); ++p) replied += check_reply(p, r.payload, false);
        chain_.problem = replied_problem(replied, r.expected_reply);
      } catch (const std::system_error& e) {
        chain_.problem = e.what();
      }
      if (chain_.problem.empty()) {
        chain_.count.fetch_add(1);
        if (r.samples)
          r.samples->push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - chain_.t0).count());
      } else {
        stop = true;
      }
    }
    if (!stop) return start_chained();
    {
      std::lock_guard lock(chain_.mutex);
      chain_.finished = true;
    }
    chain_.cv.notify_all();
  }

  void on_reply(std::size_t p, const tp::Error& e, tp::Descriptor d) {
    if (e) {
      fail("receiving from PS " + config_.ps[p].to_string() + ": " + e.what());
      return op_done();
    }
    reply& r = replies_[p];
    r.metadata = std::move(d.metadata);
    r.buffers.resize(d.tensors.size());
    tp::Allocation a;
    for (std::size_t i = 0; i < d.tensors.size(); ++i) {
      r.buffers[i].resize(d.tensors[i].length);
      a.tensors.push_back({tp::CpuBuffer{r.buffers[i].data()}});
    }
    if (!d.payloads.empty()) {
      fail("PS " + config_.ps[p].to_string() + " sent payloads; is it a " + v_.name() + " PS?");
      a.payloads.resize(d.payloads.size());  // read() wants one entry each; the reply is rejected anyway
      scratch_.resize(d.payloads.size());
      for (std::size_t i = 0; i < d.payloads.size(); ++i) {
        scratch_[i].resize(d.payloads[i].length);
        a.payloads[i].data = scratch_[i].data();
      }
    }
    pipes_[p]->read(std::move(a), [this, p](const tp::Error& re) {
      if (re) fail("receiving from PS " + config_.ps[p].to_string() + ": " + re.what());
      op_done();
    });
  }

  std::size_t check_reply(std::size_t p, std::span<const const_buffer> payload, bool verify) {
    const reply& r = replies_[p];
    auto mismatch = [&](const std::string& what) {
      throw_error(errc::malformed_frame, v_.name() + ": PS " + std::to_string(p) + " (" + config_.ps[p].to_string() +
                                             ") " + what + "; does the PS run the same --benchmark and --mode?");
    };
    if (config_.mode == wire_mode::serialized) {
      if (r.buffers.size() != 1) mismatch("sent " + std::to_string(r.buffers.size()) + " tensors, not one");
      const const_buffer wire(r.buffers[0].data(), r.buffers[0].size());
      if (config_.reply == reply_kind::ack) {
        std::uint64_t bytes = 0;
        if (!codec_.decode_ack(wire, bytes)) mismatch("sent no fwbench.Ack");
        return bytes;
      }
      if (!codec_.decode(wire)) mismatch("sent no fwbench.Payload");
      if (verify && !same_buffers(codec_, payload)) mismatch("echoed a different payload");
      return codec_.decoded_bytes();
    }
    if (config_.reply == reply_kind::ack) {
      std::uint64_t bytes = 0;
      if (!r.buffers.empty() || r.metadata.size() != sizeof bytes) mismatch("sent something other than an ack");
      std::memcpy(&bytes, r.metadata.data(), sizeof bytes);
      return bytes;
    }
    if (r.buffers.size() != payload.size()) {
      mismatch("echoed " + std::to_string(r.buffers.size()) + " buffers, not " + std::to_string(payload.size()));
    }
    std::size_t total = 0;
    for (std::size_t i = 0; i < payload.size(); ++i) {
      if (r.buffers[i].size() != payload[i].size()) mismatch("echoed buffer " + std::to_string(i) + " at another size");
      if (verify && std::memcmp(r.buffers[i].data(), payload[i].data(), payload[i].size()) != 0) {
        mismatch("echoed different bytes in buffer " + std::to_string(i));
      }
      total += payload[i].size();
    }
    return total;
  }

  void fail(const std::string& what) {
    std::lock_guard lock(error_mutex_);
    if (error_.empty()) error_ = what;
  }

  void shutdown() {
    if (!context_) return;
    for (auto& pipe : pipes_) pipe->close();
    context_->close();
    context_->join();
    pipes_.clear();
    context_.reset();
  }

  client_config config_;
  variant v_;
  std::shared_ptr<tp::Context> context_;
  std::vector<std::shared_ptr<tp::Pipe>> pipes_;
  std::vector<reply> replies_;  // written by one pipe's callbacks, read after the wait
  buffer_set scratch_;
  completion done_;
  std::mutex error_mutex_;
  std::string error_;      // written under error_mutex_, read after the wait
  payload_codec codec_;    // decodes replies
  payload_codec encoder_;  // encodes requests (serialized mode)
  /// run()'s state: set before the first exchange is posted, then touched
  /// by TensorPipe's callbacks (one exchange at a time) until `finished`.
  struct {
    const exchange_run* run = nullptr;
    tp::Message message;
    std::atomic<int> pending{0};
    std::atomic<std::uint64_t> count{0};
    bench_clock::time_point t0;
    std::string problem;
    std::mutex mutex;
    std::condition_variable cv;
    bool finished = false;  // under mutex
  } chain_;
  std::atomic<bool> chaining_{false};  // op_done's path: run()'s chain or exchange()'s wait
};

backend_info make_info(variant v, std::string summary) {
  backend_info info;
  info.name = v.name();
  info.summary = std::move(summary);
  info.available = true;
  info.honours_wait_mode = false;  // TensorPipe's threads wait as TensorPipe does
  // shm's socket is named after the port; cma reads the peer's memory (and a
  // host whose ptrace rules forbid that fails it): both only when named.
  info.same_host = v.transport == "shm" || v.channel == "cma";
  info.fixed_ports = v.transport == "shm";
  info.make_server = [v](const server_config& c) -> std::unique_ptr<server> {
    return std::make_unique<tp_server>(c, v);
  };
  info.make_client = [v](const client_config& c) -> std::unique_ptr<client> {
    return std::make_unique<tp_client>(c, v);
  };
  return info;
}

}  // namespace

std::vector<backend_info> tensorpipe_backends() {
  std::vector<backend_info> out;
  out.push_back(make_info({"uv", "basic"}, "TensorPipe, uv transport (TCP), basic channel: one tensor per buffer"));
  out.push_back(make_info({"uv", "cma"},
                          "TensorPipe, uv transport (TCP), cma channel (process_vm_readv; every process on one host)"));
  out.push_back(
      make_info({"shm", "basic"}, "TensorPipe, shm transport (shared-memory rings, busy polling), basic channel"));
  out.push_back(make_info({"shm", "cma"}, "TensorPipe, shm transport (shared-memory rings), cma channel"));
  return out;
}

}  // namespace fusewire::bench
