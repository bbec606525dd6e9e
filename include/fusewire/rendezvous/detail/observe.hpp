#pragma once
/// What an endpoint says about itself: per-peer counters, the operations it
/// waits on (pending(), stall reports, SIGUSR1 snapshots) and the counter
/// dumps of options.stats_file. See docs/observability.md.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fusewire/rendezvous/detail/report_signal.hpp>
#include <fusewire/rendezvous/detail/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// `d` as seconds with milliseconds, e.g. "7.512 s".
inline std::string format_age(std::chrono::milliseconds d) {
  char b[32];
  std::snprintf(b, sizeof b, "%lld.%03lld s", static_cast<long long>(d.count() / 1000),
                static_cast<long long>(d.count() % 1000));
  return b;
}

/// `s` quoted for a JSON string or a Prometheus label value (both escape \ " and control bytes).
inline std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace detail

template <transport Transport>
inline std::uint32_t endpoint<Transport>::index_of(const task_id& t) const noexcept {
  auto it = job_base_.find(t.job);
  if (it == job_base_.end()) return no_peer;
  return static_cast<std::uint32_t>(it->second + t.index);
}

template <transport Transport>
inline void endpoint<Transport>::count_peer_event(std::string_view peer, std::atomic<std::uint64_t> peer_cells::*cell,
                                                  std::uint64_t n) const noexcept {
  if (n == 0) return;
  const auto colon = peer.rfind(':');
  if (colon == std::string_view::npos) return;
  unsigned index = 0;
  const std::string_view digits = peer.substr(colon + 1);
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (err != std::errc() || end != digits.data() + digits.size()) return;
  const auto it = job_base_.find(peer.substr(0, colon));
  if (it == job_base_.end()) return;
  if (peer_cells* c = cells(static_cast<std::uint32_t>(it->second + index))) {
    (c->*cell).fetch_add(n, std::memory_order_relaxed);
  }
}

template <transport Transport>
inline std::vector<reactor_usage> endpoint<Transport>::reactor_usages() const {
  std::vector<reactor_usage> out;
  for (unsigned i = 0; i < shards_ && i < shard_list_.size(); ++i) {
    const reactor_stats r = group_->at(i).stats();
    const shard_stats p = shard_list_[i]->pool_stats();
    reactor_usage& u = out.emplace_back();
    u.reactor = i;
    u.busy_ns = r.busy_ns;
    u.idle_ns = r.idle_ns;
    u.sleep_ns = r.sleep_ns;
    u.ticks = r.ticks;
    u.tasks = r.tasks;
    u.pool_blocks = p.total_blocks;
    u.pool_blocks_in_use = p.total_blocks - std::min(p.free_blocks, p.total_blocks);
    u.pool_exhausted = p.failed_allocations;
  }
  return out;
}

template <transport Transport>
inline std::vector<peer_counters> endpoint<Transport>::counters() const {
  constexpr auto relaxed = std::memory_order_relaxed;
  std::vector<peer_counters> out;
  std::uint32_t i = 0;
  for (const task_id& t : spec_.tasks()) {
    const std::uint32_t at = i++;
    if (t == self_) continue;
    peer_counters& c = out.emplace_back();
    c.peer = t.to_string();
    const peer_cells* p = cells(at);
    if (p == nullptr) continue;
    c.sends = p->sends.load(relaxed);
    c.bytes_sent = p->bytes_sent.load(relaxed);
    c.send_errors = p->send_errors.load(relaxed);
    c.recvs = p->recvs.load(relaxed);
    c.bytes_received = p->bytes_received.load(relaxed);
    c.recv_errors = p->recv_errors.load(relaxed);
    c.tensor_frames_sent = p->tensor_frames.load(relaxed);
    c.fused_frames_sent = p->fused_frames.load(relaxed);
    c.tensors_fused = p->tensors_fused.load(relaxed);
    c.chunk_frames_sent = p->chunk_frames.load(relaxed);
    c.connects = p->connects.load(relaxed);
    c.connections_lost = p->lost.load(relaxed);
    c.recv_pauses = p->recv_pauses.load(relaxed);
    c.dropped = p->dropped.load(relaxed);
    c.frames_too_large = p->frames_too_large.load(relaxed);
    // Started minus completed; the loads are not one snapshot, so never below 0.
    const std::uint64_t sends_done = c.sends + c.send_errors;
    const std::uint64_t recvs_done = c.recvs + c.recv_errors;
    const std::uint64_t sends_started = p->sends_started.load(relaxed);
    const std::uint64_t recvs_started = p->recvs_started.load(relaxed);
    c.pending_sends = sends_started > sends_done ? sends_started - sends_done : 0;
    c.pending_recvs = recvs_started > recvs_done ? recvs_started - recvs_done : 0;
  }
  return out;
}

template <transport Transport>
inline std::vector<pending_operation> endpoint<Transport>::pending() {
  std::vector<pending_operation> out;
  if (on_reactor()) return out;
  const auto now = util::coarse_now();
  for (unsigned i = 0; i < shards_; ++i) {
    try {
      auto part = group_
                      ->submit(i,
                               [this, i, now] {
                                 std::vector<pending_operation> v;
                                 shard_list_[i]->snapshot(now, v);
                                 return v;
                               })
                      .get();
      out.insert(out.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
    } catch (const std::system_error&) {
      // That reactor stopped (the endpoint is closed): nothing is pending on it.
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.age > b.age; });
  return out;
}

/// One line per operation, oldest first, at most 64 (then how many more).
template <transport Transport>
inline std::string endpoint<Transport>::format_report(std::string_view title, std::vector<pending_operation> ops) {
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.age > b.age; });
  std::string s(title);
  s += ": " + std::to_string(ops.size()) + (ops.size() == 1 ? " operation" : " operations");
  constexpr std::size_t max_lines = 64;
  for (std::size_t i = 0; i < ops.size() && i < max_lines; ++i) {
    const pending_operation& o = ops[i];
    s += "\n  ";
    s += o.is_send ? "send to " : "recv from ";
    s += o.peer + " key " + detail::quoted(o.key) + " " + std::to_string(o.bytes) + " B age " +
         detail::format_age(o.age) + ": " + o.stage + "; connection " + o.connection;
    if (!o.last_error.empty()) s += " (last error: " + o.last_error + ")";
    s += "; missing: " + o.missing;
  }
  if (ops.size() > max_lines) s += "\n  ... and " + std::to_string(ops.size() - max_lines) + " more";
  return s;
}

// ---- counter dumps (options.stats_file) ----

template <transport Transport>
inline void endpoint<Transport>::shard::arm_stats_dump() {
  stats_timer_ = reactor_->run_after(ep_.opts_.stats_interval, [this](std::error_code ec) {
    stats_timer_ = {};
    if (ec || closing_) return;
    dump_stats();
    arm_stats_dump();
  });
}

/// Reactor 0. JSON: one object per line, appended. Prometheus: the whole
/// file written next to it and renamed over it, so a reader never sees half.
template <transport Transport>
inline void endpoint<Transport>::shard::dump_stats() {
  const options& opts_ = ep_.opts_;
  const endpoint_stats e = ep_.stats();
  const std::vector<peer_counters> peers = ep_.counters();
  const auto wall =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const std::string task = ep_.self_.to_string();
  std::string out;
  const std::pair<const char*, std::uint64_t> totals[] = {
      {"tensor_frames_sent", e.tensor_frames_sent},
      {"fused_frames_sent", e.fused_frames_sent},
      {"tensors_fused", e.tensors_fused},
      {"chunk_frames_sent", e.chunk_frames_sent},
      {"keepalive_pings", e.keepalive_pings},
      {"connections_made", e.connections_made},
      {"connections_accepted", e.connections_accepted},
      {"recv_held_bytes", e.recv_held_bytes},
      {"recv_pauses", e.recv_pauses},
      {"transfers_dropped_idle", e.transfers_dropped_idle},
      {"transfers_dropped_restart", e.transfers_dropped_restart},
      {"arrivals_dropped_restart", e.arrivals_dropped_restart},
      {"arrivals_dropped_age", e.arrivals_dropped_age},
      {"frames_too_large", e.frames_too_large},
  };
  auto per_peer = [](const peer_counters& c) {
    return std::vector<std::pair<const char*, std::uint64_t>>{
        {"sends", c.sends},
        {"bytes_sent", c.bytes_sent},
        {"send_errors", c.send_errors},
        {"recvs", c.recvs},
        {"bytes_received", c.bytes_received},
        {"recv_errors", c.recv_errors},
        {"tensor_frames_sent", c.tensor_frames_sent},
        {"fused_frames_sent", c.fused_frames_sent},
        {"tensors_fused", c.tensors_fused},
        {"chunk_frames_sent", c.chunk_frames_sent},
        {"connects", c.connects},
        {"connections_lost", c.connections_lost},
        {"pending_sends", c.pending_sends},
        {"pending_recvs", c.pending_recvs},
        {"recv_pauses", c.recv_pauses},
        {"dropped", c.dropped},
        {"frames_too_large", c.frames_too_large},
    };
  };
  const std::vector<reactor_usage> reactors = ep_.reactor_usages();
  auto per_reactor = [](const reactor_usage& r) {
    return std::vector<std::pair<const char*, std::uint64_t>>{
        {"busy_ns", r.busy_ns},
        {"idle_ns", r.idle_ns},
        {"sleep_ns", r.sleep_ns},
        {"ticks", r.ticks},
        {"tasks", r.tasks},
        {"pool_blocks", r.pool_blocks},
        {"pool_blocks_in_use", r.pool_blocks_in_use},
        {"pool_exhausted", r.pool_exhausted},
    };
  };
  if (opts_.stats_format == "prometheus") {
    const std::string labels = "task=" + detail::quoted(task);
    for (const auto& [name, v] : totals) {
      out += "fusewire_endpoint_" + std::string(name) + "{" + labels + "} " + std::to_string(v) + "\n";
    }
    for (const peer_counters& c : peers) {
      for (const auto& [name, v] : per_peer(c)) {
        out += "fusewire_peer_" + std::string(name) + "{" + labels + ",peer=" + detail::quoted(c.peer) + "} " +
               std::to_string(v) + "\n";
      }
    }
    for (const reactor_usage& r : reactors) {
      for (const auto& [name, v] : per_reactor(r)) {
        out += "fusewire_reactor_" + std::string(name) + "{" + labels + ",reactor=\"" + std::to_string(r.reactor) +
               "\"} " + std::to_string(v) + "\n";
      }
    }
  } else {
    out = "{\"time_ms\":" + std::to_string(wall) + ",\"task\":" + detail::quoted(task) + ",\"endpoint\":{";
    bool first = true;
    for (const auto& [name, v] : totals) {
      out += (first ? "\"" : ",\"") + std::string(name) + "\":" + std::to_string(v);
      first = false;
    }
    out += "},\"peers\":[";
    for (std::size_t i = 0; i < peers.size(); ++i) {
      out += (i == 0 ? "{\"peer\":" : ",{\"peer\":") + detail::quoted(peers[i].peer);
      for (const auto& [name, v] : per_peer(peers[i])) out += ",\"" + std::string(name) + "\":" + std::to_string(v);
      out += "}";
    }
    out += "],\"reactors\":[";
    for (std::size_t i = 0; i < reactors.size(); ++i) {
      out += (i == 0 ? "{\"reactor\":" : ",{\"reactor\":") + std::to_string(reactors[i].reactor);
      for (const auto& [name, v] : per_reactor(reactors[i]))
        out += ",\"" + std::string(name) + "\":" + std::to_string(v);
      out += "}";
    }
    out += "]}\n";
  }
  const bool replace = opts_.stats_format == "prometheus";
  // "{task}" in the path names this task ("worker-0"): one setting for every task of a job.
  std::string file = opts_.stats_file;
  if (const auto at = file.find("{task}"); at != std::string::npos) {
    file.replace(at, 6, ep_.self_.job + "-" + std::to_string(ep_.self_.index));
  }
  const std::string path = replace ? file + ".tmp" : file;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (replace ? O_TRUNC : O_APPEND), 0644);
  bool ok = fd >= 0;
  if (ok) {
    // One write per dump: with O_APPEND, concurrent writers' lines do not interleave.
    const ssize_t n = ::write(fd, out.data(), out.size());
    ok = n == static_cast<ssize_t>(out.size());
    ok = ::close(fd) == 0 && ok;
  }
  if (ok && replace) ok = ::rename(path.c_str(), file.c_str()) == 0;
  if (!ok) {
    log_limited("stats-file", "cannot write counters to " + path + " (FUSEWIRE_STATS_FILE): " +
                                  std::error_code(errno, std::generic_category()).message());
  }
}

// ---- timeline (options.trace_file) ----

/// After the reactors stopped: every reactor's spans and the marks, one file.
template <transport Transport>
inline void endpoint<Transport>::write_trace() {
  if (!tracing() || shard_list_.empty()) return;
  std::string file = opts_.trace_file;
  if (const auto at = file.find("{task}"); at != std::string::npos) {
    file.replace(at, 6, self_.job + "-" + std::to_string(self_.index));
  }
  std::vector<detail::trace_track> tracks;
  for (unsigned i = 0; i < shards_; ++i) {
    tracks.push_back({static_cast<int>(i), "reactor " + std::to_string(i), &shard_list_[i]->trace()});
  }
  tracks.push_back({static_cast<int>(shards_), "steps", &marks_});
  const std::uint32_t at = index_of(self_);
  if (const std::error_code ec = detail::write_chrome_trace(file, self_.to_string(), static_cast<int>(at), tracks)) {
    shard_list_[0]->log_line("cannot write the trace to " + file + " (FUSEWIRE_TRACE): " + ec.message());
  }
}

// ---- stall reports (options.stall_report) ----

/// Reactor 0 checks every stall_report / 4 (10 ms to 1 s; every second when
/// stall reports are off, for snapshot requests): an operation is named
/// within the threshold plus one check of reaching it.
template <transport Transport>
inline void endpoint<Transport>::shard::arm_stall() {
  const auto threshold = ep_.opts_.stall_report;
  const clock::duration every =
      threshold.count() == 0
          ? clock::duration(std::chrono::seconds(1))
          : std::clamp<clock::duration>(threshold / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
  stall_timer_ = reactor_->run_after(every, [this](std::error_code ec) {
    stall_timer_ = {};
    if (ec || closing_) return;
    stall_tick();
    arm_stall();
  });
}

/// Reactor 0: asks every reactor for its part; the parts meet in
/// stall_collect(), which logs one block for the whole endpoint. A reactor that
/// has not answered by the time the threshold passed again is itself stuck
/// (a handler that blocks it): the block says so, and a new check begins.
template <transport Transport>
inline void endpoint<Transport>::shard::stall_tick() {
  const auto now = util::coarse_now();
  const unsigned requests = detail::report_requests().load(std::memory_order_relaxed);
  const bool asked = requests != seen_requests_;
  const auto threshold = ep_.opts_.stall_report;
  if (!asked && threshold.count() == 0) return;
  if (stall_.open) {
    const clock::duration patience = threshold.count() != 0 ? clock::duration(threshold) : std::chrono::seconds(5);
    if (now - stall_.since < patience) return;  // the last check is still being answered
    std::vector<unsigned> silent;
    for (unsigned i = 0; i < stall_.answered.size(); ++i) {
      if (!stall_.answered[i]) silent.push_back(i);
    }
    stall_log(silent);
  }
  seen_requests_ = requests;
  const unsigned n = ep_.shards_;
  stall_.number++;
  stall_.open = true;
  stall_.asked = asked;
  stall_.due = false;
  stall_.since = now;
  stall_.answered.assign(n, false);
  stall_.ops.clear();
  const std::uint64_t round = stall_.number;
  for (unsigned i = 1; i < n; ++i) {
    shard* other = ep_.shard_list_[i].get();
    const std::error_code ec = ep_.group_->submit_to(i, [this, other, round, asked, i] {
      stall_part part = other->closing_ ? stall_part{} : other->stall_check(asked);
      (void)ep_.group_->submit_to(
          0, [this, round, i, part = std::move(part)]() mutable { stall_collect(round, i, std::move(part)); });
    });
    if (ec) stall_collect(round, i, {});  // that reactor stopped: nothing pending on it
  }
  stall_collect(round, 0, stall_check(asked));
}

/// On its own reactor. Cheap when nothing is old: one pass, no strings.
template <transport Transport>
inline auto endpoint<Transport>::shard::stall_check(bool asked) -> stall_part {
  stall_part part;
  const auto now = util::coarse_now();
  if (asked) {
    snapshot(now, part.ops);
    return part;
  }
  const auto threshold = ep_.opts_.stall_report;
  const auto& idle = ep_.tuning_.idle_keys;
  bool old = false;
  auto check = [&](auto& op) {
    if (op.started == clock::time_point{}) return;
    const auto age = now - op.started;
    if (age < threshold) return;
    old = true;
    if (op.report_at == clock::duration::zero()) op.report_at = threshold;
    if (age < op.report_at) return;
    // Named now, again once its age doubled.
    while (op.report_at <= age) op.report_at *= 2;
    part.due = true;
  };
  for (send_op* op = send_ops_; op != nullptr; op = op->next) check(*op);
  for (recv_op* op = recv_ops_; op != nullptr; op = op->next) {
    if (idle.empty() || std::find(idle.begin(), idle.end(), op->key) == idle.end()) check(*op);
  }
  if (!old) return part;
  snapshot(now, part.ops, threshold);
  std::erase_if(part.ops, [&](const pending_operation& o) {
    return !o.is_send && std::find(idle.begin(), idle.end(), o.key) != idle.end();
  });
  return part;
}

/// Reactor 0: one reactor's part of check `round`; logs once every part is in.
template <transport Transport>
inline void endpoint<Transport>::shard::stall_collect(std::uint64_t round, unsigned from, stall_part part) {
  if (closing_ || !stall_.open || round != stall_.number || from >= stall_.answered.size() || stall_.answered[from]) {
    return;
  }
  stall_.answered[from] = true;
  stall_.due |= part.due;
  stall_.ops.insert(stall_.ops.end(), std::make_move_iterator(part.ops.begin()),
                    std::make_move_iterator(part.ops.end()));
  if (std::find(stall_.answered.begin(), stall_.answered.end(), false) == stall_.answered.end()) stall_log({});
}

template <transport Transport>
inline void endpoint<Transport>::shard::stall_log(const std::vector<unsigned>& silent) {
  stall_.open = false;
  if (!stall_.asked && !stall_.due && silent.empty()) return;
  std::string title = stall_.asked ? "snapshot (SIGUSR1)"
                                   : "stall report: pending longer than " +
                                         std::to_string(ep_.opts_.stall_report.count()) + " ms (FUSEWIRE_STALL_MS)";
  if (ep_.shards_ > 1) title += ", " + std::to_string(ep_.shards_) + " reactors";
  std::string block = format_report(title, std::move(stall_.ops));
  for (const unsigned r : silent) {
    block +=
        "\n  reactor " + std::to_string(r) + " did not answer this check for " +
        detail::format_age(std::chrono::duration_cast<std::chrono::milliseconds>(util::coarse_now() - stall_.since)) +
        " (a handler is blocking it?): its operations are not listed";
  }
  stall_.ops.clear();
  log(block);
}

template <transport Transport>
inline std::string endpoint<Transport>::shard::connection_state(const std::string& peer, std::string& last_error) {
  std::string state;
  auto it = out_.find(peer);
  if (it != out_.end()) {
    const out_peer& p = it->second;
    if (p.last_error) last_error = p.last_error.message();
    if (p.refused) {
      state = "refused";
    } else if (p.ready) {
      state = "connected";
    } else if (p.connecting) {
      state = p.was_connected ? "reconnecting" : "connecting";
    }
  }
  if (auto a = accounts_.find(peer); a != accounts_.end() && a->second.last_error && last_error.empty()) {
    last_error = a->second.last_error.message();
  }
  if (!state.empty() && state != "connecting" && state != "reconnecting") return state;
  for (const auto& [raw, in] : in_) {
    if (in.peer == peer) return state.empty() ? "connected (its connection to us)" : state;
  }
  if (!state.empty()) return state;
  if (down_.contains(peer)) return "closed";
  if (!handshaking_.empty()) return "not connected (" + std::to_string(handshaking_.size()) + " handshaking)";
  return it != out_.end() && it->second.was_connected ? "closed" : "not connected";
}

template <transport Transport>
inline void endpoint<Transport>::shard::snapshot(clock::time_point now, std::vector<pending_operation>& out,
                                                 clock::duration min_age) {
  auto age_of = [&](clock::time_point started) {
    if (started == clock::time_point{} || now < started) return std::chrono::milliseconds(0);
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - started);
  };
  auto old_enough = [&](clock::time_point started) {
    return min_age == clock::duration::zero() || (started != clock::time_point{} && now - started >= min_age);
  };
  for (send_op* op = send_ops_; op != nullptr; op = op->next) {
    if (!old_enough(op->started)) continue;
    pending_operation& o = out.emplace_back();
    o.is_send = true;
    o.peer = op->peer;
    o.key = op->key;
    o.bytes = op->bytes;
    o.age = age_of(op->started);
    o.connection = connection_state(op->peer, o.last_error);
    auto it = out_.find(op->peer);
    const bool ready = it != out_.end() && it->second.ready;
    if (op->in_flight) {
      o.stage = op->pending_chunks > 1 ? std::to_string(op->pending_chunks) + " chunks written, not yet sent"
                                       : "written, not yet taken by the kernel";
      o.missing = op->peer + " is not reading (its receive window is full: stopped, slow, or out of receive budget)";
    } else if (!ready) {
      o.stage = "waiting for a connection";
      o.missing = "a connection to " + op->peer;
    } else {
      o.stage = "queued (fusion batch)";
      o.missing = "this reactor's next tick (is it blocked by a handler?)";
    }
  }
  for (recv_op* op = recv_ops_; op != nullptr; op = op->next) {
    if (!old_enough(op->started)) continue;
    pending_operation& o = out.emplace_back();
    o.peer = op->peer;
    o.key = op->key;
    o.bytes = op->has_dst ? op->dst_size() : 0;
    o.age = age_of(op->started);
    o.connection = connection_state(op->peer, o.last_error);
    if (op->xfer) {
      const incoming& x = *op->xfer;
      o.bytes = x.total;
      o.stage = "chunked transfer, " + std::to_string(x.count - x.chunks_left) + " of " + std::to_string(x.count) +
                " chunks in";
      o.missing = "the other chunks from " + op->peer;
    } else if (op->bound) {
      o.stage = "reading the tensor into its destination";
      o.missing = "the rest of the tensor from " + op->peer;
    } else {
      o.stage = "waiting for the tensor";
      o.missing = down_.contains(op->peer) ? op->peer + " (its connections are closed)"
                                           : op->peer + " has not sent it (nothing under this key arrived)";
    }
  }
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
