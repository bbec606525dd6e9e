// fusewire's own transports as fwbench backends: `fusewire-uring` (uring_tcp),
// `fusewire-asio` (asio_tcp), `fusewire-shm` (shared memory, every process on
// one host), `fusewire-shm-uring` (the same on io_uring's reactor: uring_shm),
// `fusewire-verbs` (RDMA verbs, where rdma-core
// is built; it needs an RDMA device and a cluster on its interface's address)
// and `fusewire-auto` (whichever the library's transport choice "auto" picks
// for the cluster and this machine, fusewire::with_transport),
// all through the public rendezvous API (rendezvous::endpoint<Transport>), as a
// trainer would use it.
//
// Every process is one endpoint: PS i is task ps:i, worker j is task worker:j,
// all in one cluster spec, which names every task's address: every task needs
// a fixed port before anything starts (`fixed_ports`; the launcher reserves
// them). A PS replies on the connection its worker made (reverse lanes).
//
// Keys, per (worker, PS) pair:
//   "size"     worker -> PS, 8 bytes (little-endian): the size of the requests
//              that follow; sent before the first request and whenever it changes
//              (0: just "hello", sent when the worker connects).
//   "req/<n>"  worker -> PS, the request of n bytes: the iovec buffers as one
//              scatter-gather send (not gathered), or the protobuf encoding.
//   "rep"      PS -> worker: the echo (the received tensor sent back as is), or
//              an 8-byte count; serialized: a fwbench.Payload or fwbench.Ack.
// Because the size is announced, the PS always has a receive with a destination
// of the right size posted for the next request, so requests land in it straight
// from the socket (zero copy); the worker posts its reply destination before it
// sends. Everything after setup runs in completion handlers on the endpoint's
// reactor thread; `client::run` chains the exchanges there too, so no thread
// hand-off sits inside a measured round trip.

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstring>
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/select.hpp>
#include <fusewire/transport/shm.hpp>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif
#if FUSEWIRE_HAS_RDMA
#include <fusewire/transport/verbs.hpp>
#endif

#include "backend.hpp"
#include "serial.hpp"

namespace fusewire::bench {
namespace {

namespace rv = fusewire::rendezvous;
using fw_task = fusewire::task_id;

static_assert(std::endian::native == std::endian::little, "the size and ack tensors are copied as is");

const std::string size_key = "size";
const std::string reply_key = "rep";
std::string request_key(std::size_t n) { return "req/" + std::to_string(n); }

/// How long setup steps (connecting, the verified first exchange) may take.
constexpr auto exchange_timeout = std::chrono::seconds(120);

fusewire::tensor_buffer u64_tensor(std::uint64_t v) {
  fusewire::tensor_buffer t = fusewire::tensor_buffer::allocate(8);
  std::memcpy(t.data(), &v, 8);
  return t;
}

std::uint64_t u64_of(const fusewire::tensor_buffer& t) {
  std::uint64_t v = 0;
  std::memcpy(&v, t.data(), std::min<std::size_t>(8, t.size()));
  return v;
}

/// fusewire options for fwbench's transport settings, on top of what the
/// environment sets for role `r` (TF_RDMA_CHUNK_SIZE, FUSEWIRE_CHUNKING...;
/// fwbench's own flags win); throws system_error naming a setting fusewire
/// cannot take (errc::invalid_argument) or a bad variable (errc::invalid_config).
fusewire::options make_options(const std::string& backend, const transport_settings& t, fusewire::role r) {
  fusewire::options o = fusewire::options::from_env(r);
  switch (t.mode) {
    case wait_mode::poll:
      o.mode = fusewire::reactor_mode::poll;
      break;
    case wait_mode::adaptive:
      o.mode = fusewire::reactor_mode::adaptive;
      break;
    case wait_mode::block:
      o.mode = fusewire::reactor_mode::block;
      break;
  }
  if (t.idle_poll > std::chrono::seconds(1)) {
    throw_error(errc::invalid_argument, "--idle-poll " + std::to_string(t.idle_poll.count()) + ": " + backend +
                                            " takes 0 to 1000000 us (fusewire's FUSEWIRE_IDLE_POLL_US range)");
  }
  o.idle_poll = t.idle_poll;
  o.pin_cores = t.pin;
  o.coalesce = t.fusion;
  // Whole payloads travel as one frame (up to fwbench's 1 GiB), plus protobuf framing.
  o.max_frame_bytes = max_payload_bytes + mib;
  const double ms = std::clamp(t.connect_timeout_s * 1000.0, 1.0, 86400000.0);
  o.connect_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(ms));
  return o;
}

/// The benchmark cluster as fusewire's cluster spec; throws
/// system_error(errc::invalid_argument) for a task without a port.
fusewire::cluster_spec make_spec(const std::string& backend, const std::vector<endpoint>& ps,
                                 const std::vector<endpoint>& workers) {
  auto convert = [&](const std::vector<endpoint>& list, const char* job) {
    std::vector<fusewire::net_address> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i].port == 0) {
        throw_error(
            errc::invalid_argument,
            backend + ": " + job + " " + std::to_string(i) + " has no port (" + list[i].to_string() +
                "); a fusewire cluster spec names every task's address, so every PS and worker needs a fixed port "
                "(the launcher reserves them; by hand: --cluster 'ps=host:port,...;worker=host:port,...')");
      }
      out.push_back({list[i].host, list[i].port});
    }
    return out;
  };
  fusewire::cluster_spec spec;
  spec.add_job("ps", convert(ps, "PS"));
  if (!workers.empty()) spec.add_job("worker", convert(workers, "worker"));
  // As every fusewire program's --cluster: the environment's .endpoint_map applies.
  spec.load_endpoint_map_from_env();
  return spec;
}

std::string error_message(std::error_code ec) { return ec.message(); }

template <class Transport>
Transport make_tcp_transport(const transport_settings& t) {
  typename Transport::config cfg;
  if (t.local_send_buffer) cfg.local_send_buffer = *t.local_send_buffer;
#if FUSEWIRE_HAS_URING
  if constexpr (std::is_same_v<Transport, fusewire::uring_tcp>) {
    if (t.zc_threshold) cfg.zc_threshold = *t.zc_threshold;
  }
#endif
  return Transport(cfg);
}

/// The transport object, with --zc-threshold and --local-send-buffer applied
/// where they mean something. Verbs takes its device, chunk size, write
/// threshold and registered memory from the TF_RDMA_* knobs in `o`.
template <class Transport>
Transport make_transport(const transport_settings& t, [[maybe_unused]] const fusewire::options& o) {
#if FUSEWIRE_HAS_RDMA
  if constexpr (std::is_same_v<Transport, fusewire::verbs>) {
    return fusewire::verbs(fusewire::verbs_config::from(o));
  } else
#endif
      if constexpr (requires { requires std::same_as<typename Transport::config, fusewire::shm_config>; }) {
    return Transport();  // shm on either reactor: no socket options, rings of the default size
  } else if constexpr (std::is_same_v<Transport, fusewire::shm_or_asio>) {
    return fusewire::shm_or_asio(fusewire::shm(),
                                 make_tcp_transport<fusewire::asio_tcp>(t));  // options for its TCP side
#if FUSEWIRE_HAS_URING
  } else if constexpr (std::is_same_v<Transport, fusewire::shm_or_uring>) {
    return fusewire::shm_or_uring(fusewire::uring_shm(), make_tcp_transport<fusewire::uring_tcp>(t));
#endif
  } else {
    return make_tcp_transport<Transport>(t);
  }
}

/// `n` bytes: with --shared-pool, from the transport's shared pool where it
/// has one (as a program that allocates its tensors with allocate_registered
/// has them: a send to a peer on this host is then copied once, by the
/// peer); else from the heap.
template <class Transport>
fusewire::tensor_buffer tensor_for(rv::endpoint<Transport>& ep, const transport_settings& t, std::size_t n) {
  if constexpr (fusewire::shared_memory_transport<Transport>) {
    if (t.shared_pool) return ep.allocate_registered(n);
  }
  return fusewire::tensor_buffer::allocate(n);
}

/// The endpoint's options and transport for a task of role `r`.
template <class Transport>
rv::endpoint_config<Transport> make_endpoint_config(const std::string& backend, const transport_settings& t,
                                                    fusewire::role r) {
  fusewire::options o = make_options(backend, t, r);
  Transport transport = make_transport<Transport>(t, o);
  return {.options = std::move(o), .transport = std::move(transport)};
}

// ---------------------------------------------------------------------------
// PS

template <class Transport>
class fusewire_server final : public server {
 public:
  fusewire_server(const server_config& c, std::string name)
      : config_(c),
        name_(std::move(name)),
        peers_(make_peers(c)),
        ep_(fw_task{"ps", c.task}, spec_for(c, name_),
            make_endpoint_config<Transport>(name_, c.transport, fusewire::role::ps)) {}

  // ep_ goes first (declared last): pending receives complete (cancelled)
  // while it closes, with peers_ still there.
  ~fusewire_server() override { stop(); }

  std::uint16_t port() const override { return config_.listen.port; }

  void run() override {
    for (auto& p : peers_) post_size(*p);
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) break;
      // A worker whose connection broke: listen for it again (it may come back).
      for (auto& p : peers_) {
        if (p->repost.exchange(false)) post_size(*p);
      }
    }
  }

  void stop() override {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    cv_.notify_all();
  }

 private:
  /// One worker as this PS sees it; touched only on the reactor thread (but `repost`).
  struct peer {
    fw_task id;
    std::size_t index = 0;
    std::vector<fusewire::tensor_buffer> free;  ///< request destinations not in use
    std::vector<std::size_t> posted;            ///< request sizes with a receive posted
    std::vector<std::unique_ptr<payload_codec>> codecs;
    std::atomic<bool> repost{false};
  };

 public:
  static fusewire::cluster_spec spec_for(const server_config& c, const std::string& name) {
    if (c.listen.port == 0) {
      throw_error(
          errc::invalid_argument,
          name + ": cannot listen on " + c.listen.to_string() +
              ": needs a fixed port (a fusewire cluster spec names every task's address, so every task's port must "
              "be known before it starts; the launcher reserves them)");
    }
    std::vector<endpoint> ps = c.cluster.ps;
    if (ps.size() <= c.task) ps.resize(c.task + 1, c.listen);
    ps[c.task] = c.listen;
    return make_spec(name, ps, c.cluster.workers);
  }

 private:
  static std::vector<std::unique_ptr<peer>> make_peers(const server_config& c) {
    std::vector<std::unique_ptr<peer>> out;
    for (std::size_t j = 0; j < c.cluster.workers.size(); ++j) {
      out.push_back(std::make_unique<peer>());
      out.back()->id = {"worker", static_cast<std::uint32_t>(j)};
      out.back()->index = j;
    }
    return out;
  }

  bool stopping() {
    std::lock_guard lock(mutex_);
    return stopping_;
  }

  void note(const peer& p, const std::string& what) {
    if (!stopping()) std::fprintf(stderr, "fwbench ps: %s: worker %zu %s\n", name_.c_str(), p.index, what.c_str());
  }

  /// Receive errors: a departed worker is listened for again; the rest is logged.
  void failed(peer& p, std::error_code ec, const char* what) {
    if (ec == make_error_code(errc::cancelled)) return;
    if (ec == make_error_code(errc::connection_reset) || ec == make_error_code(errc::connection_closed)) {
      p.repost.store(true);
      return;
    }
    note(p, std::string(what) + ": " + error_message(ec));
  }

  void post_size(peer& p) {
    ep_.recv(p.id, size_key, [this, pp = &p](std::error_code ec, fusewire::tensor_buffer b) {
      if (ec) return failed(*pp, ec, "size announcement");
      post_size(*pp);
      const std::size_t n = static_cast<std::size_t>(u64_of(b));
      if (n != 0 && std::find(pp->posted.begin(), pp->posted.end(), n) == pp->posted.end()) post_request(*pp, n);
    });
  }

  fusewire::tensor_buffer take_buffer(peer& p, std::size_t n) {
    auto it =
        std::find_if(p.free.begin(), p.free.end(), [n](const fusewire::tensor_buffer& b) { return b.size() == n; });
    if (it == p.free.end()) return tensor_for(ep_, config_.transport, n);
    fusewire::tensor_buffer b = std::move(*it);
    p.free.erase(it);
    return b;
  }

  void post_request(peer& p, std::size_t n) {
    p.posted.push_back(n);
    ep_.recv(
        p.id, request_key(n), take_buffer(p, n),
        [this, pp = &p, n](std::error_code ec, fusewire::tensor_buffer b) { on_request(*pp, n, ec, std::move(b)); });
  }

  void on_request(peer& p, std::size_t n, std::error_code ec, fusewire::tensor_buffer b) {
    std::erase(p.posted, n);
    if (ec) return failed(p, ec, "request");
    // The answer leaves first (the worker waits for it); the next request of
    // this size then gets a fresh destination. Both run before this reactor
    // reads another frame, so that request still lands in it.
    answer(p, n, std::move(b));
    post_request(p, n);
  }

  void answer(peer& p, std::size_t n, fusewire::tensor_buffer b) {
    if (config_.mode == wire_mode::raw) {
      if (config_.reply == reply_kind::echo) {
        fusewire::tensor_buffer out = b.share();
        return ep_.send(p.id, reply_key, std::move(out),
                        [this, pp = &p, keep = std::move(b)](std::error_code e) mutable {
                          if (e) return failed(*pp, e, "echo");
                          pp->free.push_back(std::move(keep));
                        });
      }
      p.free.push_back(std::move(b));
      return ep_.send(p.id, reply_key, u64_tensor(n), [this, pp = &p](std::error_code e) {
        if (e) failed(*pp, e, "ack");
      });
    }
    std::unique_ptr<payload_codec> codec;
    if (p.codecs.empty()) {
      codec = std::make_unique<payload_codec>();
    } else {
      codec = std::move(p.codecs.back());
      p.codecs.pop_back();
    }
    const bool ok = codec->decode(b.bytes());
    p.free.push_back(std::move(b));
    if (!ok) {
      note(p, "sent no serialized fwbench.Payload");
      p.codecs.push_back(std::move(codec));
      // An empty reply: the worker reports that the PS answered for 0 bytes.
      return ep_.send(p.id, reply_key, fusewire::tensor_buffer(), [](std::error_code) {});
    }
    const std::string& wire =
        config_.reply == reply_kind::echo ? codec->encode_decoded() : codec->encode_ack(codec->decoded_bytes());
    const const_buffer body{reinterpret_cast<const std::byte*>(wire.data()), wire.size()};
    ep_.send(p.id, reply_key, std::span(&body, 1), [this, pp = &p, c = std::move(codec)](std::error_code e) mutable {
      pp->codecs.push_back(std::move(c));
      if (e) failed(*pp, e, "serialized reply");
    });
  }

  server_config config_;
  std::string name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<peer>> peers_;
  rv::endpoint<Transport> ep_;  // last: destroyed first
};

// ---------------------------------------------------------------------------
// worker

template <class Transport>
class fusewire_client final : public client {
 public:
  fusewire_client(const client_config& c, std::string name)
      : config_(c),
        name_(std::move(name)),
        ps_(make_ps_states(c)),
        ep_(fw_task{"worker", c.task}, spec_for(c, name_),
            make_endpoint_config<Transport>(name_, c.transport, fusewire::role::worker)) {
    // Connect to every PS now (a send completes once the connection is up and
    // the bytes are in the kernel): "hello" is a size announcement of 0.
    std::vector<std::future<std::error_code>> hellos;
    for (auto& s : ps_) {
      auto done = std::make_shared<std::promise<std::error_code>>();
      hellos.push_back(done->get_future());
      ep_.send(s->id, size_key, u64_tensor(0), [done](std::error_code ec) { done->set_value(ec); });
    }
    for (std::size_t i = 0; i < hellos.size(); ++i) {
      const std::error_code ec = hellos[i].get();
      if (!ec) continue;
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", c.transport.connect_timeout_s);
      throw_error(
          ec == make_error_code(errc::connection_refused) ? errc::connection_refused : errc::connection_reset,
          name_ + ": cannot connect to PS " + c.ps[i].to_string() + " within " + secs + " s: " + error_message(ec));
    }
  }

  // No exchange runs any more; ep_ (declared last) closes first.
  ~fusewire_client() override = default;

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    on_done_ = [&] {
      std::lock_guard lock(m);
      finished = true;
      cv.notify_all();
    };
    start(payload, verify, exchange_timeout);
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return finished; });
    if (!error_.empty()) throw_error(error_code_, error_);
    return replied_;
  }

  std::uint64_t run(const exchange_run& r) override {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    std::atomic<std::uint64_t> count{0};
    std::uint64_t done = 0;
    std::string failure;
    errc failure_code = errc::invalid_argument;
    auto t0 = bench_clock::now();
    auto finish = [&] {
      std::lock_guard lock(m);
      finished = true;
      cv.notify_all();
    };
    // Runs on the reactor thread after each exchange (and starts the next).
    on_done_ = [&] {
      const auto now = bench_clock::now();
      if (error_.empty() && replied_ != r.expected_reply) {
        error_ = replied_problem(replied_, r.expected_reply);
        error_code_ = errc::size_mismatch;
      }
      if (!error_.empty()) {
        failure = error_;
        failure_code = error_code_;
        return finish();
      }
      ++done;
      if (r.samples) r.samples->push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count());
      count.store(done, std::memory_order_relaxed);
      if (now >= r.until) return finish();
      t0 = now;
      start(r.payload, false, rv::no_deadline);
    };
    if (t0 >= r.until) return 0;
    start(r.payload, false, rv::no_deadline);
    std::unique_lock lock(m);
    while (!finished) {
      if (!cv.wait_for(lock, std::chrono::seconds(1), [&] { return finished; }) && r.tick) {
        lock.unlock();
        r.tick(count.load(std::memory_order_relaxed));
        lock.lock();
      }
    }
    if (!failure.empty()) throw_error(failure_code, failure);
    return done;
  }

 private:
  struct ps_state {
    fw_task id;
    std::size_t announced = 0;      ///< request size the PS was last told
    std::string key;                ///< request_key(announced)
    fusewire::tensor_buffer reply;  ///< raw replies land here
  };

 public:
  static fusewire::cluster_spec spec_for(const client_config& c, const std::string& name) {
    if (c.workers.size() <= c.task) {
      throw_error(errc::invalid_argument, name + ": worker " + std::to_string(c.task) +
                                              " is not in the cluster (it names " + std::to_string(c.workers.size()) +
                                              " workers); fusewire PSs reply to the worker addresses in --cluster");
    }
    return make_spec(name, c.ps, c.workers);
  }

 private:
  static std::vector<std::unique_ptr<ps_state>> make_ps_states(const client_config& c) {
    std::vector<std::unique_ptr<ps_state>> out;
    for (std::size_t i = 0; i < c.ps.size(); ++i) {
      out.push_back(std::make_unique<ps_state>());
      out.back()->id = {"ps", static_cast<std::uint32_t>(i)};
    }
    return out;
  }

  /// Starts one exchange with every PS; on_done_ runs on the reactor thread
  /// when every operation completed. Call only when no exchange is running.
  void start(std::span<const const_buffer> payload, bool verify, std::chrono::steady_clock::duration timeout) {
    payload_ = payload;
    verify_ = verify;
    replied_ = 0;
    error_.clear();
    std::size_t total = 0;
    for (const_buffer b : payload) total += b.size();
    std::span<const const_buffer> body = staged(payload);
    if (config_.mode == wire_mode::serialized) {
      const std::string& wire = request_codec_.encode(payload);
      encoded_ = const_buffer{reinterpret_cast<const std::byte*>(wire.data()), wire.size()};
      body = std::span(&encoded_, 1);
    }
    std::size_t body_bytes = 0;
    for (const_buffer b : body) body_bytes += b.size();
    std::size_t ops = 0;
    for (auto& s : ps_) ops += 2 + (s->announced != body_bytes ? 1 : 0);
    pending_ = ops;

    // Requests leave first: posting the reply receives is then off the round
    // trip's critical path. On the reactor thread (every exchange after the
    // first) no reply can be read before this returns, so each lands in its
    // posted destination; from another thread one that wins the race is
    // handed over from the pool instead (correct, a copy slower).
    for (std::size_t i = 0; i < ps_.size(); ++i) {
      ps_state& s = *ps_[i];
      if (s.announced != body_bytes) {
        s.announced = body_bytes;
        s.key = request_key(body_bytes);
        ep_.send(
            s.id, size_key, u64_tensor(body_bytes), [this, i](std::error_code ec) { on_sent(i, ec); }, timeout);
      }
      ep_.send(
          s.id, s.key, body, [this, i](std::error_code ec) { on_sent(i, ec); }, timeout);
    }
    const std::size_t reply_bytes = config_.reply == reply_kind::echo ? total : 8;
    for (std::size_t i = 0; i < ps_.size(); ++i) {
      ps_state& s = *ps_[i];
      auto handler = [this, i](std::error_code ec, fusewire::tensor_buffer b) { on_reply(i, ec, std::move(b)); };
      if (config_.mode == wire_mode::raw) {
        if (s.reply.size() != reply_bytes) s.reply = tensor_for(ep_, config_.transport, reply_bytes);
        ep_.recv(s.id, reply_key, fusewire::tensor_buffer::view(s.reply.data(), s.reply.size()), std::move(handler),
                 timeout);
      } else {
        ep_.recv(s.id, reply_key, std::move(handler), timeout);
      }
    }
  }

  /// The payload as sent: with --shared-pool, a copy of its large buffers in
  /// the pool, made when the payload changes (the driver sends one payload
  /// over and over, as a trainer sends tensors it allocated once).
  std::span<const const_buffer> staged(std::span<const const_buffer> payload) {
    if constexpr (!fusewire::shared_memory_transport<Transport>) {
      return payload;
    } else {
      if (!config_.transport.shared_pool) return payload;
      const auto same = [](const_buffer a, const_buffer b) { return a.data() == b.data() && a.size() == b.size(); };
      if (std::equal(payload.begin(), payload.end(), staged_from_.begin(), staged_from_.end(), same)) return staged_sg_;
      staged_from_.assign(payload.begin(), payload.end());
      staged_.clear();
      staged_sg_.clear();
      for (const_buffer b : payload) {
        if (b.size() < 16 * 1024) {  // the ring carries these anyway
          staged_sg_.push_back(b);
          continue;
        }
        fusewire::tensor_buffer t = ep_.allocate_registered(b.size());
        std::memcpy(t.data(), b.data(), b.size());
        staged_sg_.push_back(t.bytes());
        staged_.push_back(std::move(t));
      }
      return staged_sg_;
    }
  }

  void fail(std::size_t i, errc code, const std::string& what) {
    if (!error_.empty()) return;
    error_code_ = code;
    error_ = name_ + ": PS " + std::to_string(i) + " (" + config_.ps[i].to_string() + ") " + what;
  }

  void fail(std::size_t i, std::error_code ec) {
    if (ec == make_error_code(errc::size_mismatch)) {
      return fail(i, errc::malformed_frame,
                  "sent a reply of another size than expected; does the PS run the same --benchmark and --mode?");
    }
    if (ec == make_error_code(errc::connection_reset) || ec == make_error_code(errc::connection_closed)) {
      return fail(i, errc::connection_reset, "closed the connection");
    }
    if (ec == make_error_code(errc::timed_out)) {
      return fail(i, errc::timed_out, "did not answer within " + std::to_string(exchange_timeout.count()) + " s");
    }
    fail(i, static_cast<errc>(ec.value()), "failed: " + error_message(ec));
  }

  void on_sent(std::size_t i, std::error_code ec) {
    if (ec) fail(i, ec);
    one_done();
  }

  void on_reply(std::size_t i, std::error_code ec, fusewire::tensor_buffer b) {
    if (ec) {
      fail(i, ec);
    } else {
      check_reply(i, b);
    }
    one_done();
  }

  void check_reply(std::size_t i, const fusewire::tensor_buffer& b) {
    auto mismatch = [&](const std::string& what) {
      fail(i, errc::malformed_frame, what + "; does the PS run the same --benchmark and --mode?");
    };
    if (config_.mode == wire_mode::raw) {
      if (config_.reply == reply_kind::ack) {
        replied_ += static_cast<std::size_t>(u64_of(b));
        return;
      }
      if (verify_) {
        std::size_t at = 0;
        for (std::size_t k = 0; k < payload_.size(); ++k) {
          if (std::memcmp(b.data() + at, payload_[k].data(), payload_[k].size()) != 0) {
            return mismatch("echoed different bytes in buffer " + std::to_string(k));
          }
          at += payload_[k].size();
        }
      }
      replied_ += b.size();
      return;
    }
    if (config_.reply == reply_kind::ack) {
      std::uint64_t bytes = 0;
      if (!reply_codec_.decode_ack(b.bytes(), bytes)) return mismatch("sent no fwbench.Ack");
      replied_ += static_cast<std::size_t>(bytes);
      return;
    }
    if (!reply_codec_.decode(b.bytes())) return mismatch("sent no fwbench.Payload");
    if (verify_ && !same_buffers(reply_codec_, payload_)) return mismatch("echoed a different payload");
    replied_ += reply_codec_.decoded_bytes();
  }

  void one_done() {
    if (--pending_ == 0) on_done_();
  }

  client_config config_;
  std::string name_;
  std::vector<std::unique_ptr<ps_state>> ps_;
  // The running exchange: written by the thread that starts it, then only by
  // the reactor's handlers until on_done_ hands it back.
  std::span<const const_buffer> payload_;
  std::vector<const_buffer> staged_from_, staged_sg_;  ///< staged(): the payload seen, and what is sent for it
  std::vector<fusewire::tensor_buffer> staged_;        ///< staged(): the pool's copies
  const_buffer encoded_;
  bool verify_ = false;
  std::size_t pending_ = 0;
  std::size_t replied_ = 0;
  std::string error_;
  errc error_code_ = errc::invalid_argument;
  std::function<void()> on_done_;
  payload_codec request_codec_;
  payload_codec reply_codec_;
  rv::endpoint<Transport> ep_;  // last: destroyed first
};

template <class Transport>
backend_info make_info(const std::string& name, const std::string& summary) {
  backend_info info;
  info.name = name;
  info.summary = summary;
  info.available = true;
  info.fusewire = true;
  info.honours_wait_mode = true;
  info.fixed_ports = true;
  info.make_server = [name](const server_config& c) -> std::unique_ptr<server> {
    return std::make_unique<fusewire_server<Transport>>(c, name);
  };
  info.make_client = [name](const client_config& c) -> std::unique_ptr<client> {
    return std::make_unique<fusewire_client<Transport>>(c, name);
  };
  return info;
}

/// A backend whose processes must all run on this host (the shm ones).
backend_info with_same_host(backend_info info) {
  info.same_host = true;
  return info;
}

/// fusewire-auto: the transport fusewire::with_transport("auto") picks for
/// this task's cluster and options (shm when every task is on this host,
/// verbs when RDMA is enabled and works, else uring or asio); a fallback is
/// logged to stderr once.
backend_info make_auto_info() {
  const std::string name = "fusewire-auto";
  backend_info info;
  info.name = name;
  info.summary =
      "fusewire with the transport picked at run time (transport auto: shm when every process is on this host, "
      "verbs when TF_RDMA_ENABLED and RDMA works, else io_uring or Asio TCP)";
  info.available = true;
  info.fusewire = true;
  info.honours_wait_mode = true;
  info.fixed_ports = true;
  info.picks_transport = true;
  info.make_server = [name](const server_config& c) -> std::unique_ptr<server> {
    const fusewire::cluster_spec spec = fusewire_server<fusewire::asio_tcp>::spec_for(c, name);
    const fusewire::options o = make_options(name, c.transport, fusewire::role::ps);
    return fusewire::with_transport("auto", o, spec, [&]<class T>(T) -> std::unique_ptr<server> {
      return std::make_unique<fusewire_server<T>>(c, name);
    });
  };
  info.make_client = [name](const client_config& c) -> std::unique_ptr<client> {
    const fusewire::cluster_spec spec = fusewire_client<fusewire::asio_tcp>::spec_for(c, name);
    const fusewire::options o = make_options(name, c.transport, fusewire::role::worker);
    return fusewire::with_transport("auto", o, spec, [&]<class T>(T) -> std::unique_ptr<client> {
      return std::make_unique<fusewire_client<T>>(c, name);
    });
  };
  return info;
}

}  // namespace

std::vector<backend_info> fusewire_backends() {
  std::vector<backend_info> out;
  const std::string common =
      " TCP transport: rendezvous send/recv, scatter-gather sends, zero-copy receives (reactor mode, fusion and "
      "pinning apply)";
#if FUSEWIRE_HAS_URING
  out.push_back(make_info<fusewire::uring_tcp>("fusewire-uring", "fusewire io_uring" + common));
#else
  backend_info uring;
  uring.name = "fusewire-uring";
  uring.summary = "fusewire io_uring" + common;
  uring.unavailable_reason = "fusewire-uring: not built (liburing >= 2.2 was not found; Debian: liburing-dev)";
  uring.fusewire = true;
  uring.honours_wait_mode = true;
  uring.fixed_ports = true;
  out.push_back(std::move(uring));
#endif
  out.push_back(make_info<fusewire::asio_tcp>("fusewire-asio", "fusewire Boost.Asio" + common));
  out.push_back(with_same_host(make_info<fusewire::shm>(
      "fusewire-shm",
      "fusewire shared-memory transport (every process on one host): rendezvous send/recv through a ring per "
      "direction in a memfd segment (reactor mode, fusion and pinning apply)")));
#if FUSEWIRE_HAS_URING
  out.push_back(with_same_host(make_info<fusewire::uring_shm>(
      "fusewire-shm-uring",
      "fusewire-shm on io_uring's reactor (what shm+uring runs between the processes of one host; reactor mode, "
      "fusion and pinning apply)")));
#endif
  const std::string verbs_summary =
      "fusewire RDMA verbs transport: rendezvous send/recv over RC queue pairs, RDMA writes for large tensors "
      "(needs an RDMA device; TF_RDMA_* knobs apply)";
#if FUSEWIRE_HAS_RDMA
  backend_info verbs = make_info<fusewire::verbs>("fusewire-verbs", verbs_summary);
#else
  backend_info verbs;
  verbs.name = "fusewire-verbs";
  verbs.summary = verbs_summary;
  verbs.unavailable_reason =
      "fusewire-verbs: not built (rdma-core was not found; Debian: libibverbs-dev librdmacm-dev)";
  verbs.fusewire = true;
  verbs.honours_wait_mode = true;
  verbs.fixed_ports = true;
#endif
  verbs.rdma = true;
  out.push_back(std::move(verbs));
  out.push_back(make_auto_info());
  return out;
}

}  // namespace fusewire::bench
