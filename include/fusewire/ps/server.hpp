#pragma once
/// ps::server: one parameter-server task. It owns a rendezvous endpoint and a
/// ps::shard; requests arrive on key request_key from each worker (one
/// receive posted per worker at a time, re-posted as each request arrives, so
/// a worker's requests are handled in the order it sent them) and replies
/// leave on key reply_key.
///
/// Lanes: a PS task runs server_config::lanes shards, share-nothing: each
/// holds the slices and rows that placement gives it as one PS of num_ps x
/// lanes (lane l of PS p is placement index p * lanes + l). A worker learns
/// the lane count from its first request (request_flags::hello) and sends
/// each lane its own request, on key request_key (lane 0) or
/// "fusewire.ps/req/<l>"; replies come back on reply_key or "fusewire.ps/rep/<l>".
///
/// Where a lane runs: a request arrives on the reactor of its worker's
/// connection, and everything that touches a lane (its requests, its timers)
/// goes through the lane's util::strand: one job at a time, in order, run by
/// the reactor that hands one in while the lane is idle, else queued for the
/// reactor busy with the lane (which passes a long queue on to the lane's home
/// reactor, l % reactors()). So a small request needs no hand-off between
/// reactors unless its lane is busy, and a reactor never waits for a lane. A
/// large request (above inline_request_bytes) starts on the lane's home
/// reactor, so that one worker's large requests to several lanes are applied
/// on several cores at once. Replies to a
/// worker are started on its connection's reactor, in the order its lanes
/// made them (a per-worker queue when a lane ran elsewhere).
///
/// A small housekeeping thread re-posts the receive of a worker whose
/// connection broke (the endpoint fails receives from a disconnected peer at
/// once until it connects again), every 20 ms; it never touches a shard. A
/// broken connection is not yet a lost worker: the shard is told only once
/// server_config::reconnect_grace has passed since the worker's last request
/// (to any lane) without a new one (a timer whose check runs in the lane's
/// strand). Each lane writes its own checkpoint file in its strand (between requests), so
/// each file is a consistent cut of its lane.
///
/// Stall reports (options.stall_report, FUSEWIRE_STALL_MS; 0 = off), kept by
/// each lane for its own shard (the barrier is lane 0's): a sync step or a barrier generation that has waited that long for some workers
/// is logged (the log sink, else stderr) as one block naming the workers it
/// waits for, those that arrived, and what the PS knows of each missing one;
/// again each time the wait doubles. SIGUSR1 (rendezvous::request_report())
/// logs the same, however short the wait, at the next check: a timer (its
/// check runs in the lane's strand), every stall_report / 4 (10 ms to 1 s; every second when
/// stall reports are off, for snapshots only), running from the first
/// request on (detail/server_stall.hpp).

#include <algorithm>
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
#include <fusewire/util/strand.hpp>
#include <fusewire/util/timer_queue.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

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
    grace_ = config.reconnect_grace;
    if (grace_.count() < 0) {
      throw_error(errc::invalid_argument, "ps server: reconnect_grace = " + std::to_string(grace_.count()) +
                                              " ms (allowed: 0 = none, or more)");
    }
    if (!spec.contains(self))
      throw_error(errc::invalid_argument, "ps server: task " + self.to_string() + " is not in the cluster spec");
    const std::size_t num_ps = spec.job(self.job).size();
    for (std::uint32_t i = 0; i < spec.job(sopts.worker_job).size(); ++i) workers_.push_back({sopts.worker_job, i});
    if (workers_.empty()) {
      throw_error(errc::invalid_argument,
                  "ps server: the cluster spec has no tasks in worker job '" + sopts.worker_job + "'");
    }
    lanes_ = config.lanes != 0 ? config.lanes : default_lanes(opts, workers_.size());
    if (lanes_ > max_lanes) {
      throw_error(errc::invalid_argument, "ps server: lanes = " + std::to_string(lanes_) + " (allowed: 1 to " +
                                              std::to_string(max_lanes) + ", 0 = automatic)");
    }
    sopts.lanes = lanes_;
    watch_.resize(lanes_);
    for (lane_watch& lw : watch_) {
      lw.last_request.resize(workers_.size());
      lw.links.resize(workers_.size());
      lw.seen_reports = rendezvous::detail::report_requests().load(std::memory_order_relaxed);  // from now on
    }
    std::random_device rd;
    const std::uint64_t incarnation = (std::uint64_t{rd()} << 32) ^ rd();
    down_ = std::make_unique<std::atomic<bool>[]>(workers_.size() * lanes_);
    left_ = std::make_unique<std::atomic<bool>[]>(workers_.size());
    heard_ = std::make_unique<std::atomic<clock::rep>[]>(workers_.size());
    lane_steps_ = std::make_unique<std::atomic<std::uint64_t>[]>(lanes_);
    lane_shut_ = std::make_unique<std::atomic<bool>[]>(lanes_);
    for (std::uint32_t l = 0; l < lanes_; ++l) {
      shards_.push_back(std::make_unique<shard>(
          model, self.index * lanes_ + l, num_ps * lanes_, sopts, workers_.size(),
          [this, l](std::uint32_t w, reply_message reply) { send_reply(l, w, std::move(reply)); }, incarnation,
          value_allocator(t)));
      lane_steps_[l].store(shards_.back()->global_step());
    }
    shard_ = shards_[0].get();
    strands_ = std::make_unique<util::strand[]>(lanes_);
    for (std::uint32_t w = 0; w < workers_.size(); ++w) outboxes_.push_back(std::make_unique<outbox>());
    owner_ = std::make_unique<std::atomic<unsigned>[]>(workers_.size());
    std::vector<std::string> idle;
    for (std::uint32_t l = 0; l < lanes_; ++l) idle.push_back(request_key_of(l));
    // One reactor per lane (the endpoint caps it by its peers); lanes share
    // home reactors round-robin when there are fewer.
    ep_ = std::make_unique<endpoint_type>(
        std::move(self), std::move(spec),
        rendezvous::endpoint_config<Transport>{.options = std::move(opts),
                                               .tuning = {.reactors = lanes_, .idle_keys = std::move(idle)},
                                               .transport = std::move(t),
                                               .log = std::move(log)});
    for (std::uint32_t w = 0; w < workers_.size(); ++w) {
      for (std::uint32_t l = 0; l < lanes_; ++l) post_recv(w, l);
    }
    housekeeping_ = std::thread([this] { housekeep(); });
  }

  /// Lanes when server_config::lanes is 0: as many as the endpoint would run
  /// reactors for one connection per worker (options::reactor_count):
  /// min(NETWORK_PS_CORE_NUMBER, workers), or min(16, workers) when it is unset.
  static std::uint32_t default_lanes(const options& o, std::size_t workers) {
    return static_cast<std::uint32_t>(std::clamp<std::size_t>(o.reactor_count(workers), 1, max_lanes));
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

  /// Lane `lane`'s shard, for inspection and save() once the server stopped
  /// (stop() first: while it runs, only its strand may touch it).
  shard& state(std::uint32_t lane = 0) { return *shards_.at(lane); }
  /// Lanes (shards) this PS task runs.
  std::uint32_t lanes() const noexcept { return lanes_; }
  /// Steps applied (any thread): the most any lane applied (async: push
  /// requests; sync: completed steps, the same on every lane).
  std::uint64_t global_step() const noexcept {
    std::uint64_t n = 0;
    for (std::uint32_t l = 0; l < lanes_; ++l) n = std::max(n, lane_steps_[l].load(std::memory_order_relaxed));
    return n;
  }
  server_stats stats() const noexcept {
    return {requests_.load(std::memory_order_relaxed), replies_failed_.load(std::memory_order_relaxed), global_step()};
  }
  endpoint_type& endpoint() noexcept { return *ep_; }

 private:
  /// Dense slices in the transport's shared pool where it has one (a worker
  /// on this host then copies a pulled slice once, straight out of it).
  static shard::value_allocator value_allocator(const Transport& t) {
    if constexpr (shared_memory_transport<Transport>) {
      return [t](std::size_t n) { return t.allocate_shared(n); };
    } else {
      (void)t;
      return {};
    }
  }

  void post_recv(std::uint32_t w, std::uint32_t l) {
    ep_->recv(workers_[w], request_key_of(l), [this, w, l](std::error_code ec, tensor_buffer request) {
      if (ec) {
        // cancelled: shutting down. Anything else: the worker's connection broke; housekeeping re-posts.
        if (ec != make_error_code(errc::cancelled)) {
          // The receive says only that the connection broke; the endpoint says why.
          std::string why = ep_->why_lost(workers_[w]);
          if (why.empty()) why = ec.message();
          on_lane(l, [this, w, l, why = std::move(why)] { lost(w, l, why); });
        }
        return;
      }
      requests_.fetch_add(1, std::memory_order_relaxed);
      // The same every time: written once, so that the line other reactors
      // read in send_reply is not dirtied per request.
      if (const unsigned r = reactor_type::current()->index(); owner_[w].load(std::memory_order_relaxed) != r) {
        owner_[w].store(r, std::memory_order_relaxed);
      }
      post_recv(w, l);
      const bool here = request.size() <= inline_request_bytes || ep_->reactors() == 1;
      on_lane(
          l, [this, w, l, request = std::move(request)]() mutable { handle(w, l, std::move(request)); }, here);
    });
  }

  /// Runs `fn` in lane `l`'s strand, after the lane's earlier jobs: with
  /// `here`, on this reactor at once when the lane is idle; else (a large
  /// request, worth a hand-off) on the lane's home reactor when it is idle.
  /// When the lane is busy, on the reactor running it. Called on one of the
  /// endpoint's reactors (its completion handlers and timers), whose group
  /// is the endpoint's (reactor index = the endpoint's reactor number).
  template <class F>
  void on_lane(std::uint32_t l, F&& fn, bool here = true) {
    if (here) return strands_[l].run(std::forward<F>(fn), passer(l));
    strands_[l].post(std::forward<F>(fn), passer(l));
  }
  /// The `pass` of lane `l`'s strand.
  auto passer(std::uint32_t l) {
    return [this, l] { return pass_lane(l); };
  }

  /// Lane `l`'s strand goes on on its home reactor (l % reactors), after
  /// what that has queued: a runner ran a batch of jobs, or met an exception,
  /// or a large request arrived. A task for a reactor that has stopped is
  /// dropped with it (the endpoint is closing: nothing runs the lane again).
  bool pass_lane(std::uint32_t l) {
    auto& group = reactor_type::current()->group();
    return !group.submit_to(l % group.size(), [this, l] { strands_[l].resume(passer(l)); });
  }
  /// Requests up to this size run on the reactor they arrived on when their
  /// lane is idle; a larger one (its optimizer pass takes longer than a
  /// hand-off) runs on its lane's home reactor, so that one worker's large
  /// requests to several lanes are applied on several cores at once.
  static constexpr std::size_t inline_request_bytes = 64 * 1024;

  /// Lane `l`'s strand: one request of worker `w`.
  void handle(std::uint32_t w, std::uint32_t l, tensor_buffer request) {
    came_back(w, l);
    shards_[l]->handle(w, std::move(request));
    if (l == 0) left_[w].store(shards_[0]->worker_left(w), std::memory_order_release);  // byes go to lane 0
    lane_steps_[l].store(shards_[l]->global_step(), std::memory_order_relaxed);
    // Also with stall reports off: SIGUSR1 snapshots still say what waits.
    const auto now = util::coarse_now();  // a stamp per request: no TSC read, ms are plenty
    watch_[l].last_request[w] = now;
    // Any lane's request says the worker is alive; written only when the
    // coarse clock moved, so lanes on other cores rarely touch the line.
    const clock::rep at = now.time_since_epoch().count();
    if (heard_[w].load(std::memory_order_relaxed) < at) heard_[w].store(at, std::memory_order_relaxed);
    note_waits(l, now);
    start_checks(l);
  }

  /// Lane `l`'s strand: worker `w`'s connection broke. Called again every
  /// housekeeping round while it stays down (its re-posted receive fails at
  /// once). A worker that said bye is lost at once; another one is lost when
  /// reconnect_grace has passed since its last request (to any lane) without
  /// a new one on this lane (at once if that is so already: a connection
  /// dropped for silence by the keepalive has had its chance).
  void lost(std::uint32_t w, std::uint32_t l, const std::string& why) {
    down_[w * lanes_ + l].store(true, std::memory_order_release);
    link_watch& link = watch_[l].links[w];
    if (link.state != link_state::up) return;
    // A worker that said bye closed its client: its connections' end is a
    // departure, said as such (a sync step that still needed it fails all the same).
    if (left_[w].load(std::memory_order_acquire)) return give_up(w, l, "it left (closed its client)");
    const auto now = util::coarse_now();  // as the request stamps
    const clock::time_point heard = last_heard(w);
    const std::string gone =
        why +
        (grace_.count() == 0 ? std::string() : "; no request from it for " + std::to_string(grace_.count()) + " ms");
    if (heard == clock::time_point{} || now - heard >= grace_) return give_up(w, l, gone);
    link.state = link_state::broken;
    link.since = now;
    link.why = why;
    if (l == 0) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(heard + grace_ - now);
      say("ps server: " + workers_[w].to_string() + "'s connection broke (" + why + "); waiting up to " +
          std::to_string(wait.count()) + " ms for it to come back");
    }
    wait_for_return(w, l, ++link.epoch, gone);
  }

  /// Lane `l`'s strand: gives up on worker `w` reconnect_grace after its
  /// last request, unless this lane has one from it first (the epoch moves).
  /// A request to another lane meanwhile (it is back, but has nothing for
  /// this lane yet) moves the deadline.
  void wait_for_return(std::uint32_t w, std::uint32_t l, std::uint64_t epoch, std::string gone) {
    const clock::time_point until = last_heard(w) + grace_;
    const auto wait = std::max<clock::duration>(until - util::coarse_now(), std::chrono::milliseconds(1));
    reactor_type::current()->run_after(wait, [this, w, l, epoch, gone = std::move(gone)](std::error_code ec) mutable {
      if (ec) return;  // stopping
      on_lane(l, [this, w, l, epoch, gone = std::move(gone)]() mutable {
        const link_watch& lk = watch_[l].links[w];
        if (lk.epoch != epoch || lk.state != link_state::broken) return;  // it came back
        if (util::coarse_now() - last_heard(w) < grace_) return wait_for_return(w, l, epoch, std::move(gone));
        give_up(w, l, gone);
      });
    });
  }

  /// When any lane last had a request of worker `w` (epoch = never).
  std::chrono::steady_clock::time_point last_heard(std::uint32_t w) const noexcept {
    return clock::time_point(clock::duration(heard_[w].load(std::memory_order_relaxed)));
  }

  /// Lane `l`'s strand: the shard counts worker `w` lost (its waiting step or barrier fails).
  void give_up(std::uint32_t w, std::uint32_t l, const std::string& why) {
    watch_[l].links[w].state = link_state::lost;
    if (l == 0 && !shards_[0]->worker_is_lost(w)) {
      say("ps server: " + workers_[w].to_string() +
          (left_[w].load(std::memory_order_acquire) ? " left (it closed its client)" : " lost: " + why));
    }
    shards_[l]->worker_lost(w, why);
    note_waits(l, util::coarse_now());
    start_checks(l);
  }

  /// Lane `l`'s strand: a request of worker `w` arrived; a broken connection is over.
  void came_back(std::uint32_t w, std::uint32_t l) {
    link_watch& link = watch_[l].links[w];
    if (link.state == link_state::up) return;
    if (link.state == link_state::broken && l == 0) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(util::coarse_now() - link.since).count();
      say("ps server: " + workers_[w].to_string() + " is back, " + std::to_string(ms) +
          " ms after its connection broke");
    }
    link.state = link_state::up;
    ++link.epoch;
  }

  // ---- stall reports (detail/server_stall.hpp); the lane's strand ----
  using clock = std::chrono::steady_clock;
  using reactor_type = typename endpoint_type::reactor_type;
  /// A sync step or barrier generation in progress, as the stall reports time it.
  struct wait_clock {
    bool active = false;
    std::uint64_t number = 0;     ///< the step or the generation
    clock::time_point since{};    ///< when it began (its first push, waiting pull or arrival)
    clock::duration report_at{};  ///< the wait at which it is reported next
  };
  /// A worker's connection as one lane sees it: up; broken (within
  /// reconnect_grace, a timer pending); lost (the shard was told). Any
  /// request of the worker makes it up again.
  enum class link_state : std::uint8_t { up, broken, lost };
  struct link_watch {
    link_state state = link_state::up;
    std::uint64_t epoch = 0;    ///< bumped on each change: a grace timer of an earlier break does nothing
    clock::time_point since{};  ///< broken: since when
    std::string why;
  };
  /// Lane `l`'s stall watch: the clocks of its sync step and barrier, its
  /// workers' last requests, its timer; touched only in its strand. A lane
  /// may wait for a step the others completed (a worker stopped between its
  /// requests to two lanes), so each lane watches its own.
  struct lane_watch {
    reactor_type* reactor = nullptr;  ///< the reactor that first ran the lane (its check timer)
    wait_clock step_clock, barrier_clock;
    std::vector<clock::time_point> last_request;  ///< per worker; epoch = none yet
    std::vector<link_watch> links;                ///< per worker
    unsigned seen_reports = 0;                    ///< rendezvous::detail::report_requests() answered
  };
  /// Starts or ends lane `l`'s clocks of the step and the barrier from its shard's state.
  void note_waits(std::uint32_t l, clock::time_point now);
  /// Arms lane `l`'s periodic check on the calling reactor thread, once.
  void start_checks(std::uint32_t l);
  void arm_check(std::uint32_t l);
  void check_stalls(std::uint32_t l);

  void say(const std::string& line) { rendezvous::write_log(log_, line); }

  /// In lane `l`'s strand: its shard's reply to worker `w`. Started here when
  /// this is the reactor of w's connection and none of w's replies wait to be
  /// started, else queued in w's outbox, which that reactor empties in order:
  /// the endpoint keeps a key's order only among sends started in order on
  /// one thread, and the lane may have run elsewhere before.
  void send_reply(std::uint32_t l, std::uint32_t w, reply_message reply) {
    const bool last = shards_[l]->shutdown_requested();
    const unsigned owner = owner_[w].load(std::memory_order_relaxed);
    reactor_type* here = reactor_type::current();
    outbox& box = *outboxes_[w];
    const bool on_owner = here->index() == owner;
    std::unique_lock lock(box.mutex);
    const bool first = box.replies.empty();
    if (on_owner && first) {
      lock.unlock();
      replies_in_flight_.fetch_add(1, std::memory_order_acq_rel);
      return start_reply(l, w, last, std::move(reply));
    }
    box.replies.push_back({l, last, std::move(reply)});
    replies_in_flight_.fetch_add(1, std::memory_order_acq_rel);
    lock.unlock();
    if (on_owner) return flush_replies(w);
    // The first of a batch schedules the flush that takes them all. A reactor
    // that stopped drops it: the endpoint is closing, the replies could not
    // leave anyway, and ~server frees them.
    if (first) (void)here->group().submit_to(owner, [this, w] { flush_replies(w); });
  }

  /// The reactor of worker `w`'s connection: starts its queued replies, oldest first.
  void flush_replies(std::uint32_t w) {
    std::vector<queued_reply> replies;
    {
      std::lock_guard lock(outboxes_[w]->mutex);
      replies.swap(outboxes_[w]->replies);
    }
    for (queued_reply& r : replies) start_reply(r.lane, w, r.last, std::move(r.reply));
  }

  // A reply that shares dense slices leaves scatter-gather; its handler
  // holds every part (the slices' values among them) until the bytes were
  // handed to the transport, and drops them when it runs, so that the shard
  // updates those slices in place again (copy-on-write while they are held).
  // `last`: the lane had its shutdown request when it made the reply.
  void start_reply(std::uint32_t l, std::uint32_t w, bool last, reply_message reply) {
    auto done = [this, l, last](std::error_code ec) {
      if (ec) replies_failed_.fetch_add(1, std::memory_order_relaxed);
      if (last) lane_shut_[l].store(true, std::memory_order_release);
      replies_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      maybe_stop(false);
    };
    if (reply.owners.size() == 1 && reply.sg.size() == 1 && reply.sg[0].size() == reply.owners[0].size()) {
      ep_->send(workers_[w], reply_key_of(l), std::move(reply.owners.front()), std::move(done));
      return;
    }
    // The endpoint copies the list itself before send() returns.
    const std::vector<const_buffer> sg = std::move(reply.sg);
    ep_->send(workers_[w], reply_key_of(l), std::span<const const_buffer>(sg),
              [done = std::move(done), owners = std::move(reply.owners)](std::error_code ec) mutable {
                owners.clear();
                done(ec);
              });
  }

  /// Stops serving once every lane answered a shutdown request and no other
  /// reply is still being sent (a barrier's reply to another worker, sent
  /// just before, must not be cut off by closing the endpoint) — or, with
  /// `late`, when replies are still in flight shutdown_grace after the lanes
  /// answered (a worker that is gone does not keep the PS up).
  void maybe_stop(bool late) {
    for (std::uint32_t i = 0; i < lanes_; ++i) {
      if (!lane_shut_[i].load(std::memory_order_acquire)) return;
    }
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    const auto now = clock::now();
    if (shut_at_ == clock::time_point{}) shut_at_ = now;
    if (replies_in_flight_.load(std::memory_order_acquire) != 0 && (!late || now - shut_at_ < shutdown_grace)) return;
    stopping_ = true;
    cv_.notify_all();
  }
  static constexpr std::chrono::seconds shutdown_grace{2};

  void housekeep() {
    using namespace std::chrono_literals;
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, 20ms, [this] { return stopping_; })) {
      lock.unlock();
      maybe_stop(true);
      for (std::uint32_t w = 0; w < workers_.size(); ++w) {
        for (std::uint32_t l = 0; l < lanes_; ++l) {
          if (down_[w * lanes_ + l].exchange(false, std::memory_order_acq_rel)) post_recv(w, l);
        }
      }
      lock.lock();
    }
  }

  std::vector<task_id> workers_;
  rendezvous::log_sink log_;  ///< a copy of the endpoint's
  std::uint32_t lanes_ = 1;
  std::unique_ptr<std::atomic<bool>[]> down_;  ///< [worker * lanes + lane]: its receive needs posting again
  std::unique_ptr<std::atomic<bool>[]> left_;  ///< [worker]: lane 0 had its bye (shard::worker_left)
  /// [worker]: when any lane last had a request of it (coarse clock ticks; 0 = never).
  std::unique_ptr<std::atomic<clock::rep>[]> heard_;
  std::vector<std::unique_ptr<shard>> shards_;  ///< one per lane
  shard* shard_ = nullptr;                      ///< lane 0's: the barrier
  std::unique_ptr<std::atomic<std::uint64_t>[]> lane_steps_;
  std::unique_ptr<std::atomic<bool>[]> lane_shut_;  ///< the lane answered a shutdown request
  std::atomic<std::uint64_t> requests_{0}, replies_failed_{0};
  std::atomic<std::uint64_t> replies_in_flight_{0};
  clock::time_point shut_at_{};  ///< when every lane had answered a shutdown (mutex_)
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::chrono::milliseconds stall_{};  ///< options.stall_report (FUSEWIRE_STALL_MS); 0 = off
  std::chrono::milliseconds grace_{};  ///< server_config::reconnect_grace
  std::vector<lane_watch> watch_;      ///< per lane; each touched only in its lane's strand
  std::unique_ptr<util::strand[]> strands_;  ///< per lane: every job that touches the lane
  /// A reply waiting in a worker's outbox for its connection's reactor.
  struct queued_reply {
    std::uint32_t lane = 0;
    bool last = false;  ///< the lane had its shutdown request
    reply_message reply;
  };
  struct outbox {
    std::mutex mutex;
    std::vector<queued_reply> replies;
  };
  std::vector<std::unique_ptr<outbox>> outboxes_;  ///< per worker
  /// [worker]: the endpoint's reactor of its connection (set by its first request; it never changes).
  std::unique_ptr<std::atomic<unsigned>[]> owner_;
  std::unique_ptr<endpoint_type> ep_;
  std::thread housekeeping_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire

#include <fusewire/ps/detail/server_stall.hpp>
