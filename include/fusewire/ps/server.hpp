#pragma once
/// ps::server: one parameter-server task. It owns a rendezvous endpoint and a
/// ps::shard; requests arrive on key request_key from each worker (one
/// receive posted per worker at a time, re-posted as each request arrives, so
/// a worker's requests are handled in the order it sent them) and replies
/// leave on key reply_key.
///
/// Threads: the shard (values, optimizer slots, sync step) is touched only on
/// the endpoint's reactor thread, inside its completion handlers — no lock on
/// the request path. A small housekeeping thread re-posts the receive of a
/// worker whose connection broke (the endpoint fails receives from a
/// disconnected peer at once until it connects again), every 20 ms; it never
/// touches the shard. Checkpoints are written on the reactor thread (between
/// requests), so the file is a consistent cut.
///
/// Stall reports (options.stall_report, FUSEWIRE_STALL_MS; 0 = off): a sync
/// step or a barrier generation that has waited that long for some workers
/// is logged (the log sink, else stderr) as one block naming the workers it
/// waits for, those that arrived, and what the PS knows of each missing one;
/// again each time the wait doubles. SIGUSR1 (rendezvous::request_report())
/// logs the same, however short the wait, at the next check: a timer on the
/// reactor thread, every stall_report / 4 (10 ms to 1 s; every second when
/// stall reports are off, for snapshots only), running from the first
/// request on (detail/server_stall.hpp).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/config.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/shard.hpp>
#include <fusewire/rendezvous/detail/report_signal.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/util/timer_queue.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

/// Rendezvous key of requests (worker -> PS).
inline constexpr std::string_view request_key = "fusewire.ps/req";
/// Rendezvous key of replies (PS -> worker).
inline constexpr std::string_view reply_key = "fusewire.ps/rep";

/// Counters of a running server; any thread (approximate while it runs).
struct server_stats {
  std::uint64_t requests = 0;        ///< requests received
  std::uint64_t replies_failed = 0;  ///< replies whose send failed (worker gone)
  std::uint64_t global_step = 0;     ///< steps applied
};

/// One PS task serving `model`'s slices and rows that placement gives it; see the file comment.
template <transport Transport>
class server {
 public:
  using endpoint_type = rendezvous::endpoint<Transport>;

  /// Builds the shard (restoring its checkpoint if `config` says so), then
  /// listens as task `self` ("ps:<i>", its job's task count = num_ps). Throws
  /// std::system_error: errc::invalid_argument for a bad model, a self that is
  /// not in `spec`, an unusable checkpoint; the endpoint's errors (listen).
  server(task_id self, cluster_spec spec, model_spec model, server_config<Transport> config = {}) {
    server_options sopts = config.shard_options();
    options& opts = config.options;
    Transport& t = config.transport;
    rendezvous::log_sink& log = config.log;
    log_ = log;
    stall_ = opts.stall_report;
    seen_reports_ = rendezvous::detail::report_requests().load(std::memory_order_relaxed);  // requests from now on
    if (!spec.contains(self))
      throw_error(errc::invalid_argument, "ps server: task " + self.to_string() + " is not in the cluster spec");
    const std::size_t num_ps = spec.job(self.job).size();
    for (std::uint32_t i = 0; i < spec.job(sopts.worker_job).size(); ++i) workers_.push_back({sopts.worker_job, i});
    if (workers_.empty()) {
      throw_error(errc::invalid_argument,
                  "ps server: the cluster spec has no tasks in worker job '" + sopts.worker_job + "'");
    }
    last_request_.resize(workers_.size());
    std::random_device rd;
    const std::uint64_t incarnation = (std::uint64_t{rd()} << 32) ^ rd();
    down_ = std::make_unique<std::atomic<bool>[]>(workers_.size());
    shard_ = std::make_unique<shard>(
        std::move(model), self.index, num_ps, std::move(sopts), workers_.size(),
        [this](std::uint32_t w, reply_message reply) { send_reply(w, std::move(reply)); }, incarnation);
    step_.store(shard_->global_step());
    // One reactor: the shard is touched without a lock, so every worker's
    // handlers must run on the same thread (NETWORK_PS_CORE_NUMBER does not apply).
    ep_ = std::make_unique<endpoint_type>(
        std::move(self), std::move(spec),
        rendezvous::endpoint_config<Transport>{.options = std::move(opts),
                                               .tuning = {.reactors = 1, .idle_keys = {std::string(request_key)}},
                                               .transport = std::move(t),
                                               .log = std::move(log)});
    for (std::uint32_t w = 0; w < workers_.size(); ++w) post_recv(w);
    housekeeping_ = std::thread([this] { housekeep(); });
  }

  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// stop(), then releases the endpoint and the shard.
  ~server() {
    stop();
    if (housekeeping_.joinable()) housekeeping_.join();
    ep_.reset();
  }

  /// Blocks until a worker asked for shutdown (client::shutdown_servers) or stop() ran.
  /// To also stop on SIGINT/SIGTERM, serve with ps::serve_until_signal (ps/serve.hpp).
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return stopping_; });
  }

  /// wait() bounded by `d`; true if the server was asked to stop.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, d, [this] { return stopping_; });
  }

  /// Stops serving: closes the endpoint (pending receives end). Idempotent; any thread but the reactor's.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (ep_) ep_->close();
  }

  /// The shard, for inspection and save() once the server stopped (stop() first:
  /// while it runs, only the reactor thread may touch it).
  shard& state() noexcept { return *shard_; }
  /// Steps the shard applied (any thread).
  std::uint64_t global_step() const noexcept { return step_.load(std::memory_order_relaxed); }
  server_stats stats() const noexcept {
    return {requests_.load(std::memory_order_relaxed), replies_failed_.load(std::memory_order_relaxed), global_step()};
  }
  endpoint_type& endpoint() noexcept { return *ep_; }

 private:
  void post_recv(std::uint32_t w) {
    ep_->recv(workers_[w], std::string(request_key), [this, w](std::error_code ec, tensor_buffer request) {
      if (ec) {
        // cancelled: shutting down. Anything else: the worker's connection broke; housekeeping re-posts.
        if (ec != make_error_code(errc::cancelled)) {
          if (!shard_->worker_is_lost(w)) say("ps server: " + workers_[w].to_string() + " lost: " + ec.message());
          shard_->worker_lost(w, ec.message());
          down_[w].store(true, std::memory_order_release);
          note_waits(util::coarse_now());
          start_checks();
        }
        return;
      }
      requests_.fetch_add(1, std::memory_order_relaxed);
      post_recv(w);
      shard_->handle(w, std::move(request));
      step_.store(shard_->global_step(), std::memory_order_relaxed);
      // Also with stall reports off: SIGUSR1 snapshots still say what waits.
      const auto now = util::coarse_now();  // a stamp per request: no TSC read, ms are plenty
      last_request_[w] = now;
      note_waits(now);
      start_checks();
    });
  }

  // ---- stall reports (detail/server_stall.hpp); reactor thread ----
  using clock = std::chrono::steady_clock;
  using reactor_type = typename endpoint_type::reactor_type;
  /// A sync step or barrier generation in progress, as the stall reports time it.
  struct wait_clock {
    bool active = false;
    std::uint64_t number = 0;     ///< the step or the generation
    clock::time_point since{};    ///< when it began (its first push, waiting pull or arrival)
    clock::duration report_at{};  ///< the wait at which it is reported next
  };
  /// Starts or ends the clocks of the step and the barrier from the shard's state.
  void note_waits(clock::time_point now);
  /// Arms the periodic check on the calling reactor thread, once.
  void start_checks();
  void arm_check();
  void check_stalls();

  void say(const std::string& line) { rendezvous::write_log(log_, line); }

  // A reply that shares dense slices leaves scatter-gather; its handler
  // holds every part (the slices' values among them) until the bytes were
  // handed to the transport, and drops them when it runs, so that the shard
  // updates those slices in place again (copy-on-write while they are held).
  void send_reply(std::uint32_t w, reply_message reply) {
    const bool last = shard_->shutdown_requested();
    auto done = [this, last](std::error_code ec) {
      if (ec) replies_failed_.fetch_add(1, std::memory_order_relaxed);
      if (last) {
        std::lock_guard lock(mutex_);
        stopping_ = true;
        cv_.notify_all();
      }
    };
    if (reply.owners.size() == 1 && reply.sg.size() == 1 && reply.sg[0].size() == reply.owners[0].size()) {
      ep_->send(workers_[w], std::string(reply_key), std::move(reply.owners.front()), std::move(done));
      return;
    }
    // The endpoint copies the list itself before send() returns.
    const std::vector<const_buffer> sg = std::move(reply.sg);
    ep_->send(workers_[w], std::string(reply_key), std::span<const const_buffer>(sg),
              [done = std::move(done), owners = std::move(reply.owners)](std::error_code ec) mutable {
                owners.clear();
                done(ec);
              });
  }

  void housekeep() {
    using namespace std::chrono_literals;
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, 20ms, [this] { return stopping_; })) {
      lock.unlock();
      for (std::uint32_t w = 0; w < workers_.size(); ++w) {
        if (down_[w].exchange(false, std::memory_order_acq_rel)) post_recv(w);
      }
      lock.lock();
    }
  }

  std::vector<task_id> workers_;
  rendezvous::log_sink log_;  ///< a copy of the endpoint's
  std::unique_ptr<std::atomic<bool>[]> down_;
  std::unique_ptr<shard> shard_;
  std::atomic<std::uint64_t> requests_{0}, replies_failed_{0}, step_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::chrono::milliseconds stall_{};  ///< options.stall_report (FUSEWIRE_STALL_MS); 0 = off
  // Reactor thread only:
  reactor_type* reactor_ = nullptr;  ///< the endpoint's reactor, once a handler ran (its timers)
  wait_clock step_clock_, barrier_clock_;
  std::vector<clock::time_point> last_request_;  ///< per worker; epoch = none yet
  unsigned seen_reports_ = 0;                    ///< rendezvous::detail::report_requests() answered
  std::unique_ptr<endpoint_type> ep_;
  std::thread housekeeping_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire

#include <fusewire/ps/detail/server_stall.hpp>
