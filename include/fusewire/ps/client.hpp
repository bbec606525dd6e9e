#pragma once
/// ps::client: a worker's view of the parameter servers. A ps::batch collects
/// the pulls and pushes of one step; client::run() sends ONE fused request to
/// each PS involved (all of that PS's dense slices and embedding rows), waits
/// for every reply and scatters the pulled values into the batch.
///
/// Requests travel on rendezvous key request_key with a per-PS sequence
/// number inside; replies come back on reply_key carrying it, so a late reply
/// to an earlier attempt is recognised and dropped. A request without an
/// answer after client_config::retry_interval — or whose PS connection broke
/// (PS restarted) — is sent again; the PS skips the pushes of a request it
/// already applied (same client incarnation and sequence number), so a resend
/// never applies a gradient twice on a PS that kept running. A PS that stays
/// silent fails run() with errc::timed_out after step_timeout, naming it.
///
/// barrier() is a request to PS 0 carrying the barrier's generation; PS 0
/// answers every worker's once all of them arrived. It is resent like any
/// request (PS 0 counts a worker once per generation) and fails with
/// errc::timed_out after its own timeout, so a worker that is gone cannot
/// hang the others.
///
/// Threads: one thread at a time calls a client's members (they block); the
/// endpoint's reactor thread only queues completions for it.
///
/// The members are defined by idea in detail/: client_plan (routing a batch
/// to the PS tasks), client_step (a step's requests and replies),
/// client_exchange (sending, resending, matching replies) and client_control
/// (barrier, save, shutdown).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/batch.hpp>
#include <fusewire/ps/config.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

/// Counters of one client.
struct client_stats {
  std::uint64_t runs = 0;            ///< run() calls (batches)
  std::uint64_t requests = 0;        ///< fused requests sent, first attempts
  std::uint64_t resends = 0;         ///< requests sent again
  std::uint64_t bytes_sent = 0;      ///< request bytes, first attempts
  std::uint64_t bytes_received = 0;  ///< reply bytes accepted
  std::uint64_t stale = 0;           ///< sync: pushes a PS dropped as stale
  /// Pulled dense slices received straight into their destination (a reply
  /// whose last slice has at least 64 KiB), with no copy.
  std::uint64_t direct_pulls = 0;
};

/// A worker's connection to every PS task; see the file comment.
template <transport Transport>
class client {
 public:
  using endpoint_type = rendezvous::endpoint<Transport>;

  /// Listens as task `self` (replies come to it). Throws std::system_error:
  /// errc::invalid_argument for a bad model, no PS tasks, or the endpoint's errors.
  client(task_id self, cluster_spec spec, model_spec model, client_config<Transport> config = {})
      : model_(std::move(model)), copts_(std::move(config)) {
    options& opts = copts_.options;
    Transport& t = copts_.transport;
    rendezvous::log_sink& log = copts_.log;
    const std::size_t num_ps = spec.job(copts_.ps_job).size();
    if (num_ps == 0)
      throw_error(errc::invalid_argument, "ps client: the cluster spec has no tasks in job '" + copts_.ps_job + "'");
    if (!copts_.fuse && copts_.mode == training_mode::sync) {
      throw_error(errc::invalid_argument,
                  "ps client: fuse = false needs async training (a sync step is one request per PS)");
    }
    if (copts_.step_timeout.count() <= 0 || copts_.retry_interval.count() <= 0) {
      throw_error(errc::invalid_argument, "ps client: step_timeout and retry_interval must be > 0 ms");
    }
    num_tasks_ = num_ps;
    base_fingerprint_ = model_.fingerprint(num_ps);
    for (std::uint32_t i = 0; i < model_.variables.size(); ++i) names_.emplace(model_.variables[i].name, i);
    set_lanes(1);  // lane 0 of each PS until the hello says how many they run
    std::random_device rd;
    incarnation_ =
        (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
    events_ = std::make_shared<event_queue>(opts);
    log_ = log;
    stall_ = opts.stall_report;
    ep_ = std::make_unique<endpoint_type>(
        std::move(self), std::move(spec),
        rendezvous::endpoint_config<Transport>{
            .options = std::move(opts), .transport = std::move(t), .log = std::move(log)});
  }

  client(const client&) = delete;
  client& operator=(const client&) = delete;
  /// Tells every PS this worker is leaving (say_goodbye), then closes.
  ~client() {
    say_goodbye();
    ep_.reset();
  }

  /// Runs one step: fused request per PS, waits for all replies. Throws
  /// std::system_error whose what() is b.error_message().
  void run(batch& b) {
    std::error_code ec;
    run(b, ec);
    if (ec) throw std::system_error(ec, b.error_message());
  }

  /// As run(b), reporting failure through `ec` and b.error_message().
  void run(batch& b, std::error_code& ec) { run_impl(b, 0, false, ec, copts_.step_timeout, false); }

  /// Pulls the whole dense variable `name`. Throws std::system_error.
  std::vector<float> pull(std::string_view name) {
    batch b;
    const auto h = b.pull(name);
    run(b);
    return b.take(h);
  }
  /// Pushes a dense gradient. Throws std::system_error.
  void push(std::string_view name, std::span<const float> grad) {
    batch b;
    b.push(name, grad);
    run(b);
  }
  /// Pulls embedding rows. Throws std::system_error.
  std::vector<float> pull_rows(std::string_view name, std::span<const std::int64_t> ids) {
    batch b;
    const auto h = b.pull_rows(name, ids);
    run(b);
    return b.take(h);
  }
  /// Pushes embedding-row gradients. Throws std::system_error.
  void push_rows(std::string_view name, std::span<const std::int64_t> ids, std::span<const float> grads) {
    batch b;
    b.push_rows(name, ids, grads);
    run(b);
  }

  /// The variable `name` of the model, resolved once so that a step names it
  /// by index (batch::push(handle, ...), pull_into(handle, out), ...). Throws
  /// std::system_error(errc::invalid_argument) naming an unknown variable.
  variable_handle variable(std::string_view name) const {
    auto found = names_.find(std::string(name));
    if (found == names_.end()) {
      throw_error(errc::invalid_argument,
                  "ps client: unknown variable '" + std::string(name) + "' (model has: " + known_names() + ")");
    }
    const variable_spec& v = model_.variables[found->second];
    const auto size = static_cast<std::size_t>(v.kind == variable_kind::dense ? v.num_elements() : v.row_size());
    return variable_handle(found->second, v.kind, size, base_fingerprint_);
  }

  /// Waits until every PS answers (each is up, serves this model and PS
  /// count, and accepts this worker), retrying refused connections, or
  /// `timeout` passed: then throws std::system_error(errc::timed_out) naming
  /// the PS tasks that did not answer. A PS serving another model fails it at
  /// once with errc::invalid_argument. run() needs no such call; it is for
  /// programs that start their tasks in any order and want to know when the
  /// job can begin.
  void wait_ready(std::chrono::milliseconds timeout = default_ready_timeout) {
    std::error_code ec;
    std::string why;
    wait_ready(timeout, ec, why);
    if (ec) throw std::system_error(ec, why);
  }
  /// As wait_ready(timeout), reporting failure through `ec` and `why`.
  void wait_ready(std::chrono::milliseconds timeout, std::error_code& ec, std::string& why) {
    batch b;
    if (timeout.count() <= 0) {
      ec = make_error_code(errc::invalid_argument);
      why = "wait_ready: timeout must be > 0 ms, got " + std::to_string(timeout.count());
      return;
    }
    run_impl(b, 0, true, ec, timeout, true);
    why = ec ? "wait_ready: " + b.error_message() : std::string();
  }
  /// Long enough for PS processes started at the same time to come up on a loaded host.
  static constexpr std::chrono::milliseconds default_ready_timeout = std::chrono::minutes(2);

  /// Every PS writes its checkpoint now (server_options::checkpoint_dir). Throws std::system_error.
  void save_checkpoint() { control(request_flags::save); }
  /// Every PS replies, then its server::wait() returns. Throws std::system_error.
  void shutdown_servers() {
    control(request_flags::shutdown);
    servers_shut_ = true;  // they are going: no bye to send them
  }

  /// Waits until every worker of the job (server_config::worker_job) called
  /// barrier() as often as this one, or `timeout` passed: then throws
  /// std::system_error(errc::timed_out) naming the barrier — a worker that is
  /// gone or never came makes the others fail here, not hang. Reusable: each
  /// call is the next generation; after a failure, calling again retries the
  /// same generation (this worker's arrival still counts). Kept by PS 0.
  void barrier(std::chrono::milliseconds timeout = default_barrier_timeout) {
    std::error_code ec;
    std::string why;
    barrier_impl(timeout, ec, why);
    if (ec) throw std::system_error(ec, why);
  }
  /// As barrier(timeout), reporting failure through `ec`.
  void barrier(std::chrono::milliseconds timeout, std::error_code& ec) {
    std::string why;
    barrier_impl(timeout, ec, why);
  }
  /// Long enough for the slowest worker to finish its share of training.
  static constexpr std::chrono::milliseconds default_barrier_timeout = std::chrono::minutes(5);
  /// Barriers this worker passed.
  std::uint64_t barrier_generation() const noexcept { return barrier_generation_; }

  /// The highest global step a PS reported so far.
  std::uint64_t global_step() const noexcept { return *std::max_element(ps_step_.begin(), ps_step_.end()); }
  /// The global step PS `p` reported last (the most any of its lanes reported).
  std::uint64_t global_step(std::uint32_t p) const {
    if (p >= num_tasks_) throw std::out_of_range("ps client: global_step(" + std::to_string(p) + ")");
    const auto first = ps_step_.begin() + static_cast<std::ptrdiff_t>(p * lanes_);
    return *std::max_element(first, first + lanes_);
  }
  const model_spec& model() const noexcept { return model_; }
  /// Where the variables live: over num_ps() x lanes() places, place p * lanes() + l
  /// being lane l of PS p (before the first exchange, lanes() is 1).
  const placement& place() const noexcept { return place_; }
  std::size_t num_ps() const noexcept { return num_tasks_; }
  /// Lanes each PS runs, as its hello said; 1 until the first run(), wait_ready() or barrier().
  std::uint32_t lanes() const noexcept { return lanes_; }
  const client_stats& stats() const noexcept { return stats_; }
  endpoint_type& endpoint() noexcept { return *ep_; }

 private:
  using clock = std::chrono::steady_clock;

  struct event {
    bool is_send = false;
    std::uint32_t ps = 0;  ///< send: attempt index; receive: PS index
    std::uint64_t seq = 0;
    std::error_code ec;
    tensor_buffer buffer;
    bool landed = false;  ///< receive: a split receive's tail took the reply's last values
  };

  /// Completions from the reactor threads to the thread in run(). A send that
  /// completed without error changes nothing the exchange acts on, so it wakes
  /// that thread only while settle_sends() waits for it. Nor does a reply
  /// while others of the step are still to come (take()'s `replies`): the
  /// exchange only records a reply, so a step to P servers costs the caller
  /// one wake-up, not P. An error wakes it at once.
  ///
  /// take() follows the reactor mode, as the reactors do: in poll mode it
  /// spins until an event is there, in adaptive mode for the options'
  /// idle_poll first, then sleeps on the condition variable; in block mode it
  /// sleeps at once. A reply that comes while the caller spins then costs no
  /// futex wake-up on either side.
  struct event_queue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<event> events;
    std::size_t wakeful = 0;         ///< events in `events` that someone waits for
    std::size_t replies_wanted = 0;  ///< replies to come before one wakes the caller (0, 1: the next)
    bool settling = false;           ///< settle_sends() waits for send completions
    std::atomic<bool> ready{false};  ///< wakeful != 0, readable without the lock
    /// How long take() spins before it sleeps; max(): until `until` (poll mode).
    std::chrono::steady_clock::duration spin{};

    explicit event_queue(const options& o)
        : spin(o.mode == reactor_mode::poll       ? std::chrono::steady_clock::duration::max()
               : o.mode == reactor_mode::adaptive ? std::chrono::steady_clock::duration(o.idle_poll)
                                                  : std::chrono::steady_clock::duration::zero()) {}

    void push(event e) {
      bool wake;
      {
        std::lock_guard lock(mutex);
        wake = settling || e.ec || (!e.is_send && replies_wanted <= 1);
        if (!e.is_send && !wake) --replies_wanted;
        events.push_back(std::move(e));
        if (wake) {
          ++wakeful;
          ready.store(true, std::memory_order_release);
        }
      }
      if (wake) cv.notify_one();
    }
    /// Waits until an event wakes us (or `until`), then moves every queued
    /// event into `got`. `replies`: the replies the caller waits for (a reply
    /// before the last of them does not wake it; a stale one only wakes it
    /// early). `settle` (settle_sends()): any event wakes us, send
    /// completions included, and there is no spin first.
    void take(std::deque<event>& got, std::chrono::steady_clock::time_point until, std::size_t replies,
              bool settle = false) {
      {
        std::lock_guard lock(mutex);
        replies_wanted = replies;
      }
      if (!settle && spin != std::chrono::steady_clock::duration::zero() && !ready.load(std::memory_order_acquire)) {
        const auto start = std::chrono::steady_clock::now();
        const auto stop =
            spin == std::chrono::steady_clock::duration::max() || until - start < spin ? until : start + spin;
        // Yields while it spins: on a host with fewer cores than threads, the
        // reactor that would deliver the reply may be waiting for this CPU.
        while (!ready.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < stop) {
          std::this_thread::yield();
        }
      }
      std::unique_lock lock(mutex);
      settling = settle;
      const auto woken = [&] { return wakeful != 0 || (settle && !events.empty()); };
      if (until == std::chrono::steady_clock::time_point::max()) {
        cv.wait(lock, woken);
      } else {
        cv.wait_until(lock, until, woken);
      }
      settling = false;
      drain(got);
    }
    /// Moves every queued event into `got`; under the lock.
    void drain(std::deque<event>& got) {
      got.swap(events);
      wakeful = 0;
      replies_wanted = 0;
      ready.store(false, std::memory_order_relaxed);
    }
  };

  /// Where one pull entry's reply values go.
  /// rows: (position of an id in the batch's ids, row of the reply that holds
  /// it). An id the batch names twice is asked for once: a reply row may fill
  /// several positions.
  using row_targets = std::vector<std::pair<std::size_t, std::size_t>>;

  struct sink {
    op kind;
    std::uint32_t var;
    std::uint32_t slice;
    float* out = nullptr;                    ///< the pull's result or its pull_into() destination
    std::size_t offset = 0;                  ///< dense: first element in `out`
    std::size_t count = 0;                   ///< values expected
    const row_targets* positions = nullptr;  ///< rows: where each of the batch's ids comes from
    std::size_t dim = 0;
  };

  /// A second pull of a slice the same request already pulls: its values are
  /// copied from the first one's destination.
  struct repeat {
    std::size_t sink;  ///< the first pull's sink
    float* out;
  };

  struct ps_plan {
    request_builder rb;
    std::vector<sink> sinks;
    std::vector<repeat> repeats;
    std::vector<std::uint32_t> vars;  ///< the variables it pulls or pushes (stall reports)
  };

  struct attempt {
    std::uint32_t ps = 0;
    ps_plan* plan = nullptr;
    bool done = false;
    request_builder::encoded request;  ///< large gradients stay in the caller's memory
    unsigned sending = 0;              ///< its sends not completed yet (they may read the caller's memory)
    std::uint64_t seq = 0;
    bool need_send = true;
    bool first_send = true;
    bool reset_resent = false;
    clock::time_point next_send{};
    clock::time_point last_send{};
    std::error_code last_error;
    tensor_buffer reply;
    /// A pull whose reply ends in one large dense slice receives it split: the
    /// first split_head bytes into a buffer, the slice's values straight into
    /// their destination (`tail`), when the reply has the size expected.
    std::size_t split_head = 0;
    mutable_buffer tail;
    bool landed = false;  ///< the reply came split: its last values are in `tail`
  };

  // ---- routing (detail/client_plan.hpp) ----
  static bool fail(batch& b, std::error_code& ec, errc e, std::string why);
  /// Validates `b` against the model and splits it into one request per PS.
  bool plan(batch& b, std::size_t first_item, std::size_t last_item, std::vector<ps_plan>& plans,
            std::deque<std::vector<std::int64_t>>& id_store, std::deque<std::vector<float>>& grad_store,
            std::deque<row_targets>& pos_store, std::error_code& ec);

  /// Gradients of at least this many bytes are sent from the caller's memory
  /// (a scatter-gather send); smaller ones are copied into the request's
  /// header buffer, where a copy costs less than another buffer to the kernel.
  static constexpr std::size_t gather_from = 16 * 1024;
  /// A pulled dense slice of at least this many bytes at the end of a reply
  /// is received straight into its destination (attempt::tail); a smaller
  /// one is copied there from the reply, which costs less than a second read.
  static constexpr std::size_t split_from = 64 * 1024;
  /// Sets a's split receive up when its reply qualifies (see split_from).
  static void plan_split(attempt& a);

  // ---- one step (detail/client_step.hpp) ----
  /// Plans `b` (fused: one request per PS; else one per pull/push), exchanges
  /// the requests and scatters the replies into `b`. `control_flags` go on every
  /// request; with them or `all_ps`, every PS gets one even if `b` has nothing for it.
  /// `ping`: an empty request that neither contributes to nor waits for a sync step.
  void run_impl(batch& b, std::uint32_t control_flags, bool all_ps, std::error_code& ec,
                std::chrono::milliseconds timeout, bool ping);
  std::string known_names() const {
    std::string known;
    for (const auto& v : model_.variables) known += (known.empty() ? "" : ", ") + v.name;
    return known;
  }
  /// PS `p` answered from a new process at `step`, `fresh` if it restored no
  /// checkpoint. Returns whether training may go on (logging what happened).
  bool ps_restarted(std::uint32_t p, std::uint64_t step, bool fresh) {
    const std::string who = target_name(p);
    // Lost only if it had state: a PS that restarts before any step loses nothing.
    if (fresh && ps_step_[p] > 0) {
      if (!copts_.allow_reinitialized_ps) return false;
      say("ps client: " + who + " restarted without a checkpoint (it was at step " + std::to_string(ps_step_[p]) +
          "); training goes on from its re-initialised values (allow_reinitialized_ps)");
      return true;
    }
    if (!fresh) {
      say("ps client: " + who + " restarted from its checkpoint at step " + std::to_string(step) + " (it was at " +
          std::to_string(ps_step_[p]) + ")");
    }
    return true;
  }
  void say(const std::string& line) {
    if (log_) rendezvous::write_log(log_, line);
  }

  // ---- sending and resending (detail/client_exchange.hpp) ----
  /// Sends every attempt and waits for its reply; see the file comment. Replies
  /// are matched to attempts by (PS, sequence number); one receive per PS is
  /// posted at a time.
  bool exchange(std::vector<attempt>& attempts, std::chrono::milliseconds timeout, std::error_code& ec,
                std::string& why);
  bool exchange_until_answered(std::vector<attempt>& attempts, std::chrono::milliseconds timeout, std::error_code& ec,
                               std::string& why);
  /// Waits until no send of `attempts` is in flight: they read the caller's
  /// gradients, which are the caller's again once run() returns. Each send has
  /// a deadline (the step's), and closing the endpoint ends them, so this ends.
  void settle_sends(std::vector<attempt>& attempts);
  /// Logs which PS tasks (and variables) the exchange begun at `start` still waits for.
  void report_stall(const std::vector<attempt>& attempts, clock::time_point start, clock::time_point now);

  // ---- lanes (detail/client_control.hpp) ----
  /// The request targets become lane l of PS p at index p * lanes + l, with
  /// their keys; placement and fingerprint follow. Only with no receive posted.
  void set_lanes(std::uint32_t lanes);
  /// Before the first request: asks every PS its lane count (request_flags::hello).
  bool ensure_lanes(std::chrono::milliseconds timeout, std::error_code& ec, std::string& why);
  /// "ps:1", or "ps:1 lane 2" when the PS runs lanes.
  std::string target_name(std::size_t t) const {
    return lanes_ == 1 ? ps_tasks_[t].to_string() : ps_tasks_[t].to_string() + " lane " + std::to_string(t % lanes_);
  }

  // ---- control requests (detail/client_control.hpp) ----
  /// save_checkpoint() and shutdown_servers(): a request with `flags` to every PS.
  void control(std::uint32_t flags);
  /// A bye (request_flags::bye) to lane 0 of every PS that answered a hello,
  /// so that its log says this worker left rather than was lost; waits for
  /// the sends at most goodbye_timeout. Never throws.
  void say_goodbye() noexcept;
  /// How long a closing client waits for its byes to be sent.
  static constexpr std::chrono::milliseconds goodbye_timeout{1000};
  /// One barrier request to PS 0, carrying the generation; its reply comes once every worker arrived.
  void barrier_impl(std::chrono::milliseconds timeout, std::error_code& ec, std::string& why);

  model_spec model_;
  client_config<Transport> copts_;  ///< options, transport and log are moved into the endpoint
  placement place_;
  std::uint64_t fingerprint_ = 0;
  std::unordered_map<std::string, std::uint32_t> names_;
  std::size_t num_tasks_ = 0;           ///< PS tasks
  std::uint32_t lanes_ = 1;             ///< lanes per PS task
  bool lanes_known_ = false;            ///< a hello was answered
  bool servers_shut_ = false;           ///< shutdown_servers() was answered
  std::uint64_t base_fingerprint_ = 0;  ///< the model's for num_tasks_ (hello, handles)
  /// Per request target (lane l of PS p at p * lanes_ + l): its task and keys.
  std::vector<task_id> ps_tasks_;
  std::vector<std::string> req_keys_, rep_keys_;
  std::vector<std::uint64_t> seq_, ps_step_, want_;
  std::vector<std::uint64_t> ps_incarnation_;  ///< each PS's process as last seen; 0 = no reply yet
  rendezvous::log_sink log_;                   ///< a copy of the endpoint's
  std::chrono::milliseconds stall_{};          ///< options.stall_report (FUSEWIRE_STALL_MS); 0 = off
  /// The receive posted on a request target, if any. A split one may still
  /// write into a caller's destination, so run() does not return before it completed.
  enum class posted_recv : std::uint8_t { none, reply, split };
  std::vector<posted_recv> recv_posted_;
  std::uint64_t incarnation_ = 0;
  std::uint64_t barrier_generation_ = 0;
  client_stats stats_;
  std::shared_ptr<event_queue> events_;
  std::unique_ptr<endpoint_type> ep_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire

// The client's member definitions, by idea. Each includes this header, so
// each compiles on its own.
#include <fusewire/ps/detail/client_control.hpp>
#include <fusewire/ps/detail/client_exchange.hpp>
#include <fusewire/ps/detail/client_plan.hpp>
#include <fusewire/ps/detail/client_step.hpp>
