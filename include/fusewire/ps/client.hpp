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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
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
#include <fusewire/ps/server.hpp>
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
    place_ = placement(model_, num_ps);
    fingerprint_ = model_.fingerprint(num_ps);
    for (std::uint32_t i = 0; i < model_.variables.size(); ++i) names_.emplace(model_.variables[i].name, i);
    for (std::uint32_t p = 0; p < num_ps; ++p) ps_tasks_.push_back({copts_.ps_job, p});
    seq_.assign(num_ps, 0);
    ps_step_.assign(num_ps, 0);
    want_.assign(num_ps, 0);
    recv_outstanding_.assign(num_ps, false);
    std::random_device rd;
    incarnation_ =
        (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
    events_ = std::make_shared<event_queue>();
    ep_ = std::make_unique<endpoint_type>(
        std::move(self), std::move(spec),
        rendezvous::endpoint_config<Transport>{
            .options = std::move(opts), .transport = std::move(t), .log = std::move(log)});
  }

  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client() { ep_.reset(); }

  /// Runs one step: fused request per PS, waits for all replies. Throws
  /// std::system_error whose what() is b.error_message().
  void run(batch& b) {
    std::error_code ec;
    run(b, ec);
    if (ec) throw std::system_error(ec, b.error_message());
  }

  /// As run(b), reporting failure through `ec` and b.error_message().
  void run(batch& b, std::error_code& ec) { run_impl(b, 0, false, ec); }

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

  /// Every PS writes its checkpoint now (server_options::checkpoint_dir). Throws std::system_error.
  void save_checkpoint() { control(request_flags::save); }
  /// Every PS replies, then its server::wait() returns. Throws std::system_error.
  void shutdown_servers() { control(request_flags::shutdown); }

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
  /// The global step PS `p` reported last.
  std::uint64_t global_step(std::uint32_t p) const { return ps_step_.at(p); }
  const model_spec& model() const noexcept { return model_; }
  const placement& place() const noexcept { return place_; }
  std::size_t num_ps() const noexcept { return ps_tasks_.size(); }
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
  };

  struct event_queue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<event> events;

    void push(event e) {
      {
        std::lock_guard lock(mutex);
        events.push_back(std::move(e));
      }
      cv.notify_one();
    }
  };

  /// Where one pull entry's reply values go.
  struct sink {
    op kind;
    std::uint32_t var;
    std::uint32_t slice;
    batch::handle result;
    std::size_t offset = 0;                               ///< dense: first element in the result
    std::size_t count = 0;                                ///< values expected
    const std::vector<std::size_t>* positions = nullptr;  ///< rows: position of each id in the batch's ids
    std::size_t dim = 0;
  };

  struct ps_plan {
    request_builder rb;
    std::vector<sink> sinks;
  };

  struct attempt {
    std::uint32_t ps = 0;
    ps_plan* plan = nullptr;
    bool done = false;
    tensor_buffer request;
    std::uint64_t seq = 0;
    bool need_send = true;
    bool first_send = true;
    bool reset_resent = false;
    clock::time_point next_send{};
    clock::time_point last_send{};
    std::error_code last_error;
    tensor_buffer reply;
  };

  void control(std::uint32_t flags) {
    batch b;
    std::error_code ec;
    run_impl(b, flags, true, ec);
    if (ec) throw std::system_error(ec, b.error_message());
  }

  /// One barrier request to PS 0, carrying the generation; its reply comes once every worker arrived.
  void barrier_impl(std::chrono::milliseconds timeout, std::error_code& ec, std::string& why) {
    ec.clear();
    why.clear();
    const std::string name = "barrier " + std::to_string(barrier_generation_);
    if (timeout.count() <= 0) {
      ec = make_error_code(errc::invalid_argument);
      why = name + ": timeout must be > 0 ms, got " + std::to_string(timeout.count());
      return;
    }
    request_builder rb;
    const std::uint32_t flags =
        request_flags::barrier | (copts_.mode == training_mode::sync ? request_flags::sync : 0u);
    rb.set_header(incarnation_, ++seq_[0], fingerprint_, barrier_generation_, 0, flags);
    std::vector<attempt> attempts(1);
    attempt& a = attempts[0];
    a.seq = seq_[0];
    a.request = rb.finish();
    stats_.bytes_sent += a.request.size();
    ++stats_.requests;
    if (!exchange(attempts, timeout, ec, why)) {
      if (ec == make_error_code(errc::timed_out)) {
        why = name + ": not every worker arrived within " + std::to_string(timeout.count()) + " ms (" + why + ")";
      } else {
        why = name + ": " + why;
      }
      return;
    }
    reply_view r;
    std::string dwhy;
    decode_reply(a.reply.bytes(), r, ec, dwhy);
    if (ec) {
      why = name + ": " + ps_tasks_[0].to_string() + ": bad reply: " + dwhy;
      return;
    }
    stats_.bytes_received += a.reply.size();
    ps_step_[0] = copts_.mode == training_mode::sync ? r.step : std::max(ps_step_[0], r.step);
    if (r.status != 0) {
      ec = make_error_code(static_cast<errc>(r.status));
      why = name + ": " + r.message;
      return;
    }
    ++barrier_generation_;
  }

  static bool fail(batch& b, std::error_code& ec, errc e, std::string why) {
    ec = make_error_code(e);
    b.error_ = std::move(why);
    return false;
  }

  /// Validates `b` against the model and splits it into one request per PS.
  bool plan(batch& b, std::size_t first_item, std::size_t last_item, std::vector<ps_plan>& plans,
            std::deque<std::vector<std::int64_t>>& id_store, std::deque<std::vector<float>>& grad_store,
            std::deque<std::vector<std::size_t>>& pos_store, std::error_code& ec) {
    const std::size_t num_ps = ps_tasks_.size();
    std::vector<std::vector<std::int64_t>*> ids_of(num_ps);
    std::vector<std::vector<float>*> grads_of(num_ps);
    std::vector<std::vector<std::size_t>*> pos_of(num_ps);
    for (std::size_t item_index = first_item; item_index < last_item; ++item_index) {
      const batch::item& it = b.items_[item_index];
      auto found = names_.find(it.var);
      if (found == names_.end()) {
        std::string known;
        for (const auto& v : model_.variables) known += (known.empty() ? "" : ", ") + v.name;
        return fail(b, ec, errc::invalid_argument,
                    std::string(to_string(it.kind)) + ": unknown variable '" + it.var + "' (model has: " + known + ")");
      }
      const std::uint32_t var = found->second;
      const variable_spec& v = model_.variables[var];
      const std::string what = std::string(to_string(it.kind)) + " of '" + v.name + "'";
      if (is_rows(it.kind) != (v.kind == variable_kind::embedding)) {
        return fail(b, ec, errc::invalid_argument,
                    what + ": the variable is " +
                        (v.kind == variable_kind::embedding ? "an embedding (use pull_rows/push_rows)"
                                                            : "dense (use pull/push)"));
      }
      if (!is_rows(it.kind)) {
        const auto n = static_cast<std::size_t>(v.num_elements());
        if (it.kind == op::push_dense && it.values.size() != n) {
          return fail(b, ec, errc::size_mismatch,
                      what + ": gradient has " + std::to_string(it.values.size()) + " values, the variable has " +
                          std::to_string(n));
        }
        if (it.kind == op::pull_dense) b.results_[it.result].resize(n);  // every element is overwritten
        const auto slices = place_.slices(var);
        for (std::uint32_t s = 0; s < slices.size(); ++s) {
          const slice_info& si = slices[s];
          ps_plan& pl = plans[si.ps];
          const auto first = static_cast<std::size_t>(si.element_begin),
                     count = static_cast<std::size_t>(si.element_count);
          if (it.kind == op::pull_dense) {
            pl.rb.pull_dense(var, s);
            pl.sinks.push_back({op::pull_dense, var, s, it.result, first, count, nullptr, 0});
          } else {
            pl.rb.push_dense(var, s, it.values.subspan(first, count));
          }
        }
        continue;
      }
      const auto dim = static_cast<std::size_t>(v.row_size());
      const std::int64_t num_ids = v.shape[0];
      for (std::int64_t id : it.ids) {
        if (num_ids > 0 && (id < 0 || id >= num_ids)) {
          return fail(b, ec, errc::invalid_argument,
                      what + ": id " + std::to_string(id) + " out of range [0, " + std::to_string(num_ids) + ")");
        }
      }
      if (it.kind == op::push_rows && it.values.size() != it.ids.size() * dim) {
        return fail(b, ec, errc::size_mismatch,
                    what + ": " + std::to_string(it.values.size()) + " gradient values for " +
                        std::to_string(it.ids.size()) + " ids of dim " + std::to_string(dim) + " (expected " +
                        std::to_string(it.ids.size() * dim) + ")");
      }
      if (it.kind == op::pull_rows) b.results_[it.result].resize(it.ids.size() * dim);
      if (num_ps == 1) {
        if (it.kind == op::pull_rows) {
          auto& pos = pos_store.emplace_back(it.ids.size());
          for (std::size_t k = 0; k < pos.size(); ++k) pos[k] = k;
          plans[0].rb.pull_rows(var, it.ids);
          plans[0].sinks.push_back({op::pull_rows, var, 0, it.result, 0, it.ids.size() * dim, &pos, dim});
        } else {
          plans[0].rb.push_rows(var, it.ids, it.values);
        }
        continue;
      }
      std::fill(ids_of.begin(), ids_of.end(), nullptr);
      for (std::size_t k = 0; k < it.ids.size(); ++k) {
        const std::uint32_t p = place_.ps_of_id(it.ids[k]);
        if (ids_of[p] == nullptr) {
          ids_of[p] = &id_store.emplace_back();
          if (it.kind == op::pull_rows)
            pos_of[p] = &pos_store.emplace_back();
          else
            grads_of[p] = &grad_store.emplace_back();
        }
        ids_of[p]->push_back(it.ids[k]);
        if (it.kind == op::pull_rows) {
          pos_of[p]->push_back(k);
        } else {
          grads_of[p]->insert(grads_of[p]->end(), it.values.begin() + static_cast<std::ptrdiff_t>(k * dim),
                              it.values.begin() + static_cast<std::ptrdiff_t>((k + 1) * dim));
        }
      }
      for (std::uint32_t p = 0; p < num_ps; ++p) {
        if (ids_of[p] == nullptr) continue;
        if (it.kind == op::pull_rows) {
          plans[p].rb.pull_rows(var, *ids_of[p]);
          plans[p].sinks.push_back({op::pull_rows, var, 0, it.result, 0, ids_of[p]->size() * dim, pos_of[p], dim});
        } else {
          plans[p].rb.push_rows(var, *ids_of[p], *grads_of[p]);
        }
      }
    }
    return true;
  }

  void run_impl(batch& b, std::uint32_t control_flags, bool all_ps, std::error_code& ec) {
    ec.clear();
    b.error_.clear();
    ++stats_.runs;
    const std::size_t num_ps = ps_tasks_.size();
    // Fused: one group (one request per PS). Unfused: a group per pull/push.
    std::deque<std::vector<ps_plan>> groups;
    std::deque<std::vector<std::int64_t>> id_store;
    std::deque<std::vector<float>> grad_store;
    std::deque<std::vector<std::size_t>> pos_store;
    const bool fused = copts_.fuse || control_flags != 0 || b.items_.size() <= 1;
    if (fused) {
      if (!plan(b, 0, b.items_.size(), groups.emplace_back(num_ps), id_store, grad_store, pos_store, ec)) return;
    } else {
      for (std::size_t i = 0; i < b.items_.size(); ++i) {
        if (!plan(b, i, i + 1, groups.emplace_back(num_ps), id_store, grad_store, pos_store, ec)) return;
      }
    }
    const bool sync = copts_.mode == training_mode::sync;
    const bool pushes =
        std::any_of(b.items_.begin(), b.items_.end(), [](const batch::item& it) { return is_push(it.kind); });
    std::vector<attempt> attempts;
    for (auto& plans : groups) {
      for (std::uint32_t p = 0; p < num_ps; ++p) {
        std::uint32_t flags = control_flags | (sync ? request_flags::sync : 0u);
        std::uint64_t push_step = 0;
        if (sync && pushes && control_flags == 0) {
          flags |= request_flags::contributes;
          push_step = ps_step_[p];
          want_[p] = ps_step_[p] + 1;
        }
        if (plans[p].rb.empty() && (flags & ~request_flags::sync) == 0 && !all_ps) continue;
        const std::uint64_t min_step = sync && control_flags == 0 ? want_[p] : 0;
        plans[p].rb.set_header(incarnation_, ++seq_[p], fingerprint_, push_step, min_step, flags);
        attempt& a = attempts.emplace_back();
        a.ps = p;
        a.plan = &plans[p];
        a.seq = seq_[p];
        a.request = plans[p].rb.finish();
        stats_.bytes_sent += a.request.size();
        ++stats_.requests;
      }
    }
    std::string why;
    if (!exchange(attempts, copts_.step_timeout, ec, why)) {
      b.error_ = std::move(why);
      return;
    }
    // Decode every reply; scatter pulled values.
    std::error_code first_ec;
    std::string first_why;
    for (attempt& a : attempts) {
      const std::uint32_t p = a.ps;
      reply_view r;
      std::error_code dec;
      std::string dwhy;
      decode_reply(a.reply.bytes(), r, dec, dwhy);
      const std::string who = ps_tasks_[p].to_string();
      if (dec) {
        if (!first_ec) first_ec = dec, first_why = who + ": bad reply: " + dwhy;
        continue;
      }
      ps_step_[p] = sync ? r.step : std::max(ps_step_[p], r.step);
      if ((r.flags & reply_flags::stale) != 0) ++stats_.stale;
      stats_.bytes_received += a.reply.size();
      if (r.status != 0) {
        if (!first_ec) first_ec = make_error_code(static_cast<errc>(r.status)), first_why = r.message;
        continue;
      }
      const auto& sinks = a.plan->sinks;
      if (r.entries.size() != sinks.size()) {
        if (!first_ec) {
          first_ec = make_error_code(errc::malformed_frame);
          first_why = who + ": reply has " + std::to_string(r.entries.size()) + " entries, expected " +
                      std::to_string(sinks.size());
        }
        continue;
      }
      for (std::size_t i = 0; i < sinks.size(); ++i) {
        const sink& s = sinks[i];
        const reply_entry_view& e = r.entries[i];
        if (e.kind != s.kind || e.var != s.var || e.slice != s.slice || e.value_count != s.count) {
          if (!first_ec) {
            first_ec = make_error_code(errc::malformed_frame);
            first_why = who + ": reply entry " + std::to_string(i) + " does not match the request";
          }
          break;
        }
        std::vector<float>& out = b.results_[s.result];
        if (s.kind == op::pull_dense) {
          e.copy_values(out.data() + s.offset, 0, s.count);
        } else {
          const auto& pos = *s.positions;
          for (std::size_t k = 0; k < pos.size(); ++k) e.copy_values(out.data() + pos[k] * s.dim, k * s.dim, s.dim);
        }
      }
    }
    if (first_ec) {
      ec = first_ec;
      b.error_ = std::move(first_why);
    }
  }

  /// Sends every attempt and waits for its reply; see the file comment. Replies
  /// are matched to attempts by (PS, sequence number); one receive per PS is
  /// posted at a time.
  bool exchange(std::vector<attempt>& attempts, std::chrono::milliseconds timeout, std::error_code& ec,
                std::string& why) {
    using namespace std::chrono_literals;
    const auto start = clock::now();
    const auto deadline = start + timeout;
    const std::size_t num_ps = ps_tasks_.size();
    std::vector<clock::time_point> next_recv(num_ps, start);
    std::vector<std::size_t> pending(num_ps, 0);
    for (auto& a : attempts) {
      a.next_send = start;
      ++pending[a.ps];
    }
    std::size_t left = attempts.size();
    std::deque<event> got;
    for (;;) {
      if (left == 0) return true;
      auto now = clock::now();
      if (now >= deadline) {
        for (const attempt& a : attempts) {
          if (a.done) continue;
          ec = make_error_code(errc::timed_out);
          why = ps_tasks_[a.ps].to_string() + " did not answer within " + std::to_string(timeout.count()) + " ms" +
                (a.last_error ? " (last error: " + a.last_error.message() + ")" : std::string());
          return false;
        }
      }
      auto wake = deadline;
      for (std::size_t i = 0; i < attempts.size(); ++i) {
        attempt& a = attempts[i];
        if (a.done || !a.need_send) continue;
        if (now >= a.next_send) {
          a.need_send = false;
          a.last_send = now;
          if (!a.first_send) ++stats_.resends;
          a.first_send = false;
          auto q = events_;
          ep_->send(
              ps_tasks_[a.ps], std::string(request_key), a.request.share(),
              [q, i, seq = a.seq](std::error_code e) {
                q->push({true, static_cast<std::uint32_t>(i), seq, e, {}});
              },
              deadline - now);
        } else {
          wake = std::min(wake, a.next_send);
        }
      }
      for (std::uint32_t p = 0; p < num_ps; ++p) {
        if (pending[p] == 0 || recv_outstanding_[p]) continue;
        if (now < next_recv[p]) {
          wake = std::min(wake, next_recv[p]);
          continue;
        }
        recv_outstanding_[p] = true;
        auto q = events_;
        const auto limit = std::min<clock::duration>(deadline - now, copts_.retry_interval);
        ep_->recv(
            ps_tasks_[p], std::string(reply_key),
            [q, p](std::error_code e, tensor_buffer buf) {
              q->push({false, p, 0, e, std::move(buf)});
            },
            limit);
      }
      {
        std::unique_lock lock(events_->mutex);
        events_->cv.wait_until(lock, wake, [this] { return !events_->events.empty(); });
        got.swap(events_->events);
      }
      now = clock::now();
      for (event& e : got) {
        if (e.is_send) {
          // Events of an earlier run() carry indexes of its attempts: the sequence number tells them apart.
          if (e.ps >= attempts.size()) continue;
          attempt& a = attempts[e.ps];
          if (a.done || e.seq != a.seq || !e.ec) continue;
          a.last_error = e.ec;
          if (e.ec == make_error_code(errc::cancelled)) {
            ec = e.ec;
            why = "ps client closed while sending to " + ps_tasks_[a.ps].to_string();
            return false;
          }
          a.need_send = true;
          a.next_send = now + 50ms;
          continue;
        }
        const std::uint32_t p = e.ps;
        recv_outstanding_[p] = false;
        if (pending[p] == 0) continue;
        if (e.ec) {
          if (e.ec == make_error_code(errc::cancelled)) {
            ec = e.ec;
            why = "ps client closed while waiting for " + ps_tasks_[p].to_string();
            return false;
          }
          const bool reset = e.ec != make_error_code(errc::timed_out);
          // After a reset, poll again soon (the PS reconnects to us when it replies).
          next_recv[p] = reset ? now + 20ms : now;
          for (attempt& a : attempts) {
            if (a.done || a.ps != p) continue;
            if (reset) a.last_error = e.ec;
            if ((reset && !a.reset_resent) || now - a.last_send >= copts_.retry_interval) {
              if (reset) a.reset_resent = true;
              if (!a.need_send) {
                a.need_send = true;
                a.next_send = reset ? now + 20ms : now;
              }
            }
          }
          continue;
        }
        next_recv[p] = now;
        const auto bytes = e.buffer.bytes();
        if (bytes.size() < reply_header_bytes || detail::get<std::uint32_t>(bytes.data()) != message_magic) continue;
        const auto seq = detail::get<std::uint64_t>(bytes.data() + 8);
        for (attempt& a : attempts) {
          if (!a.done && a.ps == p && a.seq == seq) {
            a.done = true;
            a.reply = std::move(e.buffer);
            --pending[p];
            --left;
            break;
          }
        }
      }
      got.clear();
    }
  }

  model_spec model_;
  client_config<Transport> copts_;  ///< options, transport and log are moved into the endpoint
  placement place_;
  std::uint64_t fingerprint_ = 0;
  std::unordered_map<std::string, std::uint32_t> names_;
  std::vector<task_id> ps_tasks_;
  std::vector<std::uint64_t> seq_, ps_step_, want_;
  std::vector<bool> recv_outstanding_;
  std::uint64_t incarnation_ = 0;
  std::uint64_t barrier_generation_ = 0;
  client_stats stats_;
  std::shared_ptr<event_queue> events_;
  std::unique_ptr<endpoint_type> ep_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
