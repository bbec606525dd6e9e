#include "driver.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <fusewire/core/error.hpp>
#include <memory>
#include <optional>
#include <thread>

#include "backend.hpp"
#include "cli.hpp"
#include "report.hpp"

namespace fusewire::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw_error(errc::not_supported, "cannot find this executable through /proc/self/exe");
  path[n] = '\0';
  return path;
}

/// A PS or worker started by the launcher, with pipes to its stdin, stdout and stderr.
struct child_process {
  std::string name;
  pid_t pid = -1;
  int to_child = -1;
  int from_child = -1;
  int errors = -1;
  std::string pending;     ///< stdout bytes not yet ending in a newline
  std::string error_text;  ///< the tail of its stderr
  bool finished = false;   ///< sent its last event
  bool reaped = false;
  int status = 0;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

/// Every child of one repetition; kills and reaps what is left when destroyed.
class process_group {
 public:
  explicit process_group(std::string exe) : exe_(std::move(exe)) {}
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;
  ~process_group() { kill_all(); }

  child_process& spawn(const std::string& name, const std::vector<std::string>& args) {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      throw_error(errc::out_of_memory, "cannot create pipes for " + name + ": " + std::strerror(errno));
    }
    std::vector<std::string> argv_text{exe_};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw_error(errc::out_of_memory, "cannot start " + name + ": " + std::strerror(errno));
    if (pid == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execv(exe_.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    auto child = std::make_unique<child_process>();
    child->name = name;
    child->pid = pid;
    child->to_child = in[1];
    child->from_child = out[0];
    child->errors = err[0];
    children_.push_back(std::move(child));
    return *children_.back();
  }

  void send(child_process& c, const std::string& line) {
    if (c.to_child < 0) return;
    const std::string text = line + "\n";
    if (::write(c.to_child, text.data(), text.size()) != static_cast<ssize_t>(text.size())) close_fd(c.to_child);
  }

  /// Reads events until `done()`, calling `on_event` for each JSON line and
  /// `on_tick` at least every 100 ms. Throws when `deadline` passes first or
  /// a child ends before its last event.
  void wait(const std::function<bool()>& done, clock_type::time_point deadline, const std::string& waiting_for,
            const std::function<void(child_process&, const json&)>& on_event,
            const std::function<void()>& on_tick = {}) {
    while (!done()) {
      if (clock_type::now() >= deadline) {
        throw_error(errc::timed_out, "timed out waiting for " + waiting_for + stderr_tail());
      }
      std::vector<pollfd> fds;
      std::vector<std::pair<child_process*, bool>> owners;  // child, is stdout
      for (auto& c : children_) {
        if (c->from_child >= 0) {
          fds.push_back({c->from_child, POLLIN, 0});
          owners.push_back({c.get(), true});
        }
        if (c->errors >= 0) {
          fds.push_back({c->errors, POLLIN, 0});
          owners.push_back({c.get(), false});
        }
      }
      if (fds.empty())
        throw_error(errc::connection_closed, "every process ended before " + waiting_for + stderr_tail());
      ::poll(fds.data(), fds.size(), 100);
      if (on_tick) on_tick();
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        child_process& c = *owners[i].first;
        char buffer[65536];
        const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
        if (!owners[i].second) {
          if (n <= 0) {
            close_fd(c.errors);
          } else {
            c.error_text.append(buffer, static_cast<std::size_t>(n));
            if (c.error_text.size() > 4096) c.error_text.erase(0, c.error_text.size() - 4096);
          }
          continue;
        }
        if (n <= 0) {
          close_fd(c.from_child);
          if (!c.finished) {
            reap(c, clock_type::now() + std::chrono::seconds(2));
            throw_error(errc::connection_reset, c.name + " ended early (" + exit_text(c) + ")" + stderr_tail());
          }
          continue;
        }
        c.pending.append(buffer, static_cast<std::size_t>(n));
        std::size_t newline;
        while ((newline = c.pending.find('\n')) != std::string::npos) {
          const std::string line = c.pending.substr(0, newline);
          c.pending.erase(0, newline + 1);
          json event = json::parse(line, nullptr, false);
          if (event.is_discarded() || !event.contains("event")) {
            throw_error(errc::malformed_frame, c.name + " printed something unexpected: " + line);
          }
          on_event(c, event);
        }
      }
    }
  }

  /// Waits for every child to exit (after they finished); kills the late ones.
  void reap_all(clock_type::time_point deadline) {
    for (auto& c : children_) reap(*c, deadline);
  }

  /// Children that exited with a failure after their last event (a sanitizer
  /// report, a crash on the way out), with their last words; empty if none.
  std::string failed_exits() {
    std::string out;
    for (auto& c : children_) {
      if (c->reaped && !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0)) {
        out += (out.empty() ? "" : "; ") + c->name + " finished but then ended with " + exit_text(*c);
      }
    }
    return out.empty() ? out : out + stderr_tail();
  }

 private:
  static std::string exit_text(const child_process& c) {
    if (!c.reaped) return "still running";
    if (WIFEXITED(c.status)) return "exit status " + std::to_string(WEXITSTATUS(c.status));
    if (WIFSIGNALED(c.status)) return std::string("killed by signal ") + ::strsignal(WTERMSIG(c.status));
    return "ended";
  }

  /// ": <name> said: <last stderr line>" for every child that wrote to stderr.
  std::string stderr_tail() {
    // Give a dying child's last words a moment to arrive.
    for (auto& c : children_) {
      if (c->errors < 0) continue;
      pollfd p{c->errors, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        char buffer[4096];
        const ssize_t n = ::read(c->errors, buffer, sizeof buffer);
        if (n > 0) c->error_text.append(buffer, static_cast<std::size_t>(n));
      }
    }
    std::string out;
    for (auto& c : children_) {
      std::string text = c->error_text;
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
      if (text.empty()) continue;
      const std::size_t line = text.rfind('\n');
      out += "; " + c->name + " said: " + (line == std::string::npos ? text : text.substr(line + 1));
    }
    return out;
  }

  void reap(child_process& c, clock_type::time_point deadline) {
    while (!c.reaped) {
      const pid_t r = ::waitpid(c.pid, &c.status, WNOHANG);
      if (r == c.pid || (r < 0 && errno != EINTR)) {
        c.reaped = true;
        break;
      }
      if (clock_type::now() >= deadline) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.reaped = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void kill_all() {
    for (auto& c : children_) {
      if (!c->reaped) {
        ::kill(c->pid, SIGKILL);
        ::waitpid(c->pid, &c->status, 0);
        c->reaped = true;
      }
      close_fd(c->to_child);
      close_fd(c->from_child);
      close_fd(c->errors);
    }
  }

  std::string exe_;
  std::vector<std::unique_ptr<child_process>> children_;
};

/// TCP ports held for children that must know every task's port before any
/// of them starts (backend_info::fixed_ports): each is bound with SO_REUSEADDR
/// and not listening, so the child can bind it too, and nobody else gets it
/// meanwhile (an outgoing connection is never given a bound port).
class port_reservation {
 public:
  port_reservation() = default;
  port_reservation(const port_reservation&) = delete;
  port_reservation& operator=(const port_reservation&) = delete;
  ~port_reservation() { release(); }

  std::uint16_t reserve(const std::string& host) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    if (const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &list); rc != 0) {
      throw_error(errc::invalid_argument, "--host '" + host + "': " + ::gai_strerror(rc));
    }
    int last_error = 0;
    for (addrinfo* a = list; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        last_error = errno;
        ::close(fd);
        continue;
      }
      ::freeaddrinfo(list);
      fds_.push_back(fd);
      return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    }
    ::freeaddrinfo(list);
    throw_error(errc::invalid_argument, "cannot reserve a port on " + host + ": " + std::strerror(last_error));
  }

  void release() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }

 private:
  std::vector<int> fds_;
};

/// One status line on stderr: rewritten in place on a terminal, start and
/// end lines otherwise; nothing with --quiet.
class progress_line {
 public:
  explicit progress_line(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) != 0) {}

  void start(const std::string& text) {
    prefix_ = text;
    if (quiet_) return;
    if (tty_) {
      show(prefix_);
    } else {
      std::fprintf(stderr, "%s ...\n", prefix_.c_str());
    }
  }

  void update(const std::string& text) {
    if (!quiet_ && tty_) show(prefix_ + "  " + text);
  }

  void finish(const std::string& text) {
    if (quiet_) return;
    if (tty_) {
      show(prefix_ + "  " + text);
      std::fputc('\n', stderr);
      shown_ = 0;
    } else {
      std::fprintf(stderr, "%s  %s\n", prefix_.c_str(), text.c_str());
    }
  }

 private:
  void show(const std::string& text) {
    std::fprintf(stderr, "\r%s", text.c_str());
    if (text.size() < shown_) std::fprintf(stderr, "%*s", static_cast<int>(shown_ - text.size()), "");
    shown_ = text.size();
    std::fflush(stderr);
  }

  bool quiet_;
  bool tty_;
  std::string prefix_;
  std::size_t shown_ = 0;
};

std::string fmt(const char* format, double v) {
  char out[64];
  std::snprintf(out, sizeof out, format, v);
  return out;
}

std::string summary_of(const cell& c, const repetition& r) {
  if (!r.ok) return "FAILED: " + r.error;
  switch (c.benchmark) {
    case benchmark_kind::p2p_latency:
      return "p50 " + fmt("%.1f", r.latency.p50_us) + " us, p99 " + fmt("%.1f", r.latency.p99_us) + " us";
    case benchmark_kind::p2p_bandwidth:
      return fmt("%.1f", r.mb_per_s) + " MB/s";
    case benchmark_kind::ps_throughput:
      return fmt("%.0f", r.rpc_per_s) + " RPC/s, " + fmt("%.1f", r.mb_per_s) + " MB/s";
  }
  return {};
}

/// Runs one repetition of `c`: PSs first (they report their ports), then
/// workers; "go" when every worker is connected, "mark" to the PSs when the
/// warmup ends, "stop" when every worker has reported.
repetition run_repetition(const cell& c, const run_config& rc, const std::string& exe, progress_line& progress) {
  role_config base;
  base.backend = c.backend;
  base.benchmark = c.benchmark;
  base.mode = c.mode;
  base.payload = c.payload;
  base.transport = rc.transport;
  base.time = rc.time;
  base.time.repetitions = 1;
  base.managed = true;
  repetition rep;
  process_group group(exe);
  port_reservation reserved;
  try {
    // Backends whose PS connects back to the workers get every port up front:
    // consecutive from --port, or reserved here.
    const backend_info* info = find_backend(c.backend.name);
    const bool fixed = info && info->fixed_ports;
    auto port_for = [&](unsigned slot) -> std::uint16_t {
      if (rc.port) return static_cast<std::uint16_t>(rc.port + slot);
      return fixed ? reserved.reserve(rc.host) : 0;
    };
    for (unsigned i = 0; i < c.ps; ++i) base.cluster.ps.push_back({rc.host, port_for(i)});
    for (unsigned j = 0; j < c.workers; ++j) {
      base.cluster.workers.push_back({rc.host, fixed ? port_for(c.ps + j) : std::uint16_t{0}});
    }

    std::vector<child_process*> ps;
    std::vector<child_process*> workers;
    std::vector<bool> listening(c.ps, false);
    auto on_ps_event = [&](child_process& child, const json& e) {
      const auto it = std::find(ps.begin(), ps.end(), &child);
      if (it == ps.end()) return;
      const std::size_t i = static_cast<std::size_t>(it - ps.begin());
      if (e["event"] == "listening") {
        base.cluster.ps[i].port = e.at("port").get<std::uint16_t>();
        listening[i] = true;
      }
    };
    for (unsigned i = 0; i < c.ps; ++i) {
      role_config r = base;
      r.role = role_kind::ps;
      r.task = i;
      ps.push_back(&group.spawn("ps " + std::to_string(i), role_arguments(r)));
    }
    group.wait([&] { return std::all_of(listening.begin(), listening.end(), [](bool b) { return b; }); },
               clock_type::now() + std::chrono::seconds(30), "the PSs to listen", on_ps_event);

    std::vector<bool> ready(c.workers, false);
    std::vector<std::optional<worker_result>> results(c.workers);
    std::vector<std::optional<process_usage>> ps_usage(c.ps);
    auto on_event = [&](child_process& child, const json& e) {
      const std::string kind = e["event"];
      const auto w = std::find(workers.begin(), workers.end(), &child);
      if (w != workers.end()) {
        const std::size_t j = static_cast<std::size_t>(w - workers.begin());
        if (kind == "ready") ready[j] = true;
        if (kind == "progress" && j == 0) {
          progress.update(e.at("phase").get<std::string>() + " " + fmt("%.0f", e.at("elapsed").get<double>()) + "/" +
                          fmt("%.0f", e.at("total").get<double>()) + " s, " +
                          std::to_string(e.at("calls").get<std::uint64_t>()) + " calls");
        }
        if (kind == "result") {
          results[j] = e.at("result").get<worker_result>();
          child.finished = true;
        }
        return;
      }
      const auto p = std::find(ps.begin(), ps.end(), &child);
      if (p != ps.end() && kind == "done") {
        ps_usage[static_cast<std::size_t>(p - ps.begin())] = e.at("usage").get<process_usage>();
        child.finished = true;
      }
    };
    for (unsigned j = 0; j < c.workers; ++j) {
      role_config r = base;
      r.role = role_kind::worker;
      r.task = j;
      workers.push_back(&group.spawn("worker " + std::to_string(j), role_arguments(r)));
    }
    group.wait([&] { return std::all_of(ready.begin(), ready.end(), [](bool b) { return b; }); },
               clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                       std::chrono::duration<double>(rc.transport.connect_timeout_s + 30)),
               "the workers to connect", on_event);
    reserved.release();

    for (child_process* w : workers) group.send(*w, "go");
    const auto go = clock_type::now();
    const auto measure_start =
        go + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(rc.time.warmup_s));
    const double budget = rc.time.warmup_s + rc.time.run_s;
    const auto deadline =
        go + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(budget * 2 + 60));
    bool marked = false;
    group.wait([&] { return std::all_of(results.begin(), results.end(), [](const auto& r) { return r.has_value(); }); },
               deadline, "the workers' results", on_event,
               [&] {
                 if (!marked && clock_type::now() >= measure_start) {
                   marked = true;
                   for (child_process* p : ps) group.send(*p, "mark");
                 }
               });
    for (child_process* p : ps) group.send(*p, "stop");
    group.wait(
        [&] { return std::all_of(ps_usage.begin(), ps_usage.end(), [](const auto& u) { return u.has_value(); }); },
        clock_type::now() + std::chrono::seconds(30), "the PSs to stop", on_event);
    group.reap_all(clock_type::now() + std::chrono::seconds(10));
    if (const std::string failed = group.failed_exits(); !failed.empty()) {
      throw_error(errc::connection_reset, failed);
    }

    std::vector<worker_result> all;
    for (auto& r : results) all.push_back(*r);
    rep = combine(all);
    for (auto& u : ps_usage) rep.usage.push_back(*u);
  } catch (const std::system_error& e) {
    rep = repetition{};
    rep.ok = false;
    rep.error = error_text(e);
  } catch (const std::exception& e) {
    rep = repetition{};
    rep.ok = false;
    rep.error = e.what();
  }
  return rep;
}

cell make_cell(const backend_choice& backend, benchmark_kind b, const std::string& label, payload_spec payload,
               wire_mode mode, unsigned ps, unsigned workers) {
  cell c;
  c.backend = backend;
  c.benchmark = b;
  c.payload_label = label;
  if (payload.kind != scheme::custom) payload.custom.clear();
  c.payload = payload;
  c.mode = mode;
  const bool p2p = b != benchmark_kind::ps_throughput;
  c.ps = p2p ? 1 : ps;
  c.workers = p2p ? 1 : workers;
  const buffer_plan plan = plan_payload(payload, 0);
  c.payload_bytes = plan.total();
  c.buffers = plan.sizes.size();
  const backend_info* info = find_backend(backend.name);
  if (!info || !info->available) {
    c.skipped = info ? info->unavailable_reason : "unknown backend";
  } else if (mode == wire_mode::serialized && !info->serialized) {
    c.skipped = "serialized mode needs protobuf, which this build lacks";
  }
  return c;
}

std::string cell_title(const cell& c, std::size_t index, std::size_t total, unsigned rep, unsigned reps) {
  char head[32];
  const int width = static_cast<int>(std::to_string(total).size());
  std::snprintf(head, sizeof head, "[%*zu/%zu]", width, index + 1, total);
  std::string title = std::string(head) + " " + c.backend.label() + " " + std::string(option_name(c.benchmark)) + " " +
                      c.payload_label + " " + std::string(option_name(c.mode));
  if (c.benchmark == benchmark_kind::ps_throughput) {
    title += " " + std::to_string(c.ps) + "x" + std::to_string(c.workers);
  }
  if (reps > 1) title += " rep " + std::to_string(rep + 1) + "/" + std::to_string(reps);
  return title;
}

/// Runs every cell that is not skipped; returns false when a repetition failed.
bool run_cells(std::vector<cell>& cells, const run_config& rc) {
  const std::string exe = self_executable();
  progress_line progress(rc.quiet);
  bool all_ok = true;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    cell& c = cells[i];
    if (!c.skipped.empty()) {
      if (!rc.quiet)
        std::fprintf(stderr, "%s  skipped: %s\n", cell_title(c, i, cells.size(), 0, 1).c_str(), c.skipped.c_str());
      continue;
    }
    for (unsigned r = 0; r < rc.time.repetitions; ++r) {
      progress.start(cell_title(c, i, cells.size(), r, rc.time.repetitions));
      c.reps.push_back(run_repetition(c, rc, exe, progress));
      progress.finish(summary_of(c, c.reps.back()));
      all_ok = all_ok && c.reps.back().ok;
    }
  }
  return all_ok;
}

json config_json(const run_config& rc) {
  json backends = json::array();
  for (const backend_choice& b : rc.backends) backends.push_back(b.label());
  return {{"warmup_s", rc.time.warmup_s},
          {"run_s", rc.time.run_s},
          {"repetitions", rc.time.repetitions},
          {"reactor_mode", std::string(option_name(rc.transport.mode))},
          {"idle_poll_us", rc.transport.idle_poll.count()},
          {"fusion", rc.transport.fusion},
          {"shared_pool", rc.transport.shared_pool},
          {"pin", rc.transport.pin},
          {"grpc_threads", rc.transport.grpc_threads},
          {"zc_threshold", rc.transport.zc_threshold ? json(*rc.transport.zc_threshold) : json(nullptr)},
          {"local_send_buffer", rc.transport.local_send_buffer ? json(*rc.transport.local_send_buffer) : json(nullptr)},
          {"host", rc.host},
          {"count", rc.payload.count},
          {"sizes",
           {{"small", rc.payload.size_of(category::small)},
            {"medium", rc.payload.size_of(category::medium)},
            {"large", rc.payload.size_of(category::large)}}},
          {"seed", rc.payload.seed},
          {"backends", backends}};
}

std::string plot_title() {
  const json host = host_info();
  return "fwbench on " + host["hostname"].get<std::string>() + " (" + std::to_string(host["cpus"].get<int>()) +
         " CPUs, loopback)";
}

/// Writes whichever outputs were asked for; an output that fails is reported
/// and makes the exit code 1, the others are still written.
bool write_outputs(const run_config& rc, const std::vector<cell>& cells, const json& extra) {
  bool ok = true;
  auto attempt = [&](const std::string& path, const char* what, const std::function<void()>& write,
                     bool optional = false) {
    if (path.empty()) return;
    try {
      write();
      std::fprintf(stderr, "fwbench: wrote %s %s\n", what, path.c_str());
    } catch (const std::system_error& e) {
      const bool missing_tool = e.code() == make_error_code(errc::not_supported);
      std::fprintf(stderr, "fwbench: %s%s\n", optional && missing_tool ? "no plot: " : "", error_text(e).c_str());
      ok = ok && optional && missing_tool;
    }
  };
  attempt(rc.outputs.json, "JSON", [&] { write_json(rc.outputs.json, cells, extra); });
  attempt(rc.outputs.csv, "CSV", [&] { write_csv(rc.outputs.csv, cells); });
  attempt(
      rc.outputs.plot, "plot", [&] { write_plot(rc.outputs.plot, cells, plot_title()); }, rc.outputs.plot_optional);
  return ok;
}

void note_ignored_settings(const run_config& rc, const std::vector<cell>& cells) {
  if (rc.quiet) return;
  bool fusewire = false;
  for (const cell& c : cells) {
    const backend_info* info = find_backend(c.backend.name);
    fusewire = fusewire || (info && info->fusewire && c.skipped.empty());
  }
  if (rc.transport.fusion && !fusewire) {
    std::fprintf(stderr, "fwbench: note: --fusion only changes fusewire backends, and none runs here\n");
  }
}

}  // namespace

std::vector<cell> plan_cells(const run_config& rc) {
  std::vector<backend_choice> chosen = rc.backends;
  if (chosen.empty()) {
    for (const backend_info& b : backends()) {
      // RDMA, same-host and run-time-chosen transports only when asked for
      if (b.available && !b.rdma && !b.same_host && !b.picks_transport) chosen.push_back({b.name, std::nullopt});
    }
  } else {
    for (const backend_choice& b : chosen) require_backend(b);
  }
  std::vector<cell> cells;
  for (benchmark_kind b : rc.benchmarks) {
    for (scheme s : rc.schemes) {
      for (wire_mode m : rc.modes) {
        for (const backend_choice& backend : chosen) {
          payload_spec p = rc.payload;
          p.kind = s;
          cells.push_back(make_cell(backend, b, std::string(option_name(s)), p, m, rc.ps, rc.workers));
        }
      }
    }
  }
  return cells;
}

std::vector<cell> plan_compare(const compare_config& config) {
  const run_config& rc = config.base;
  std::vector<backend_choice> subjects;
  std::vector<backend_choice> others;
  if (config.subject == "fusewire") {
    // fusewire's best TCP transport: the first built one in registry order
    // (io_uring, then Asio).
    // Two modes of it, as the floor has two: --reactor-mode (default
    // adaptive) and block; each row takes the better.
    for (const backend_info& b : backends()) {
      if (b.fusewire && b.available && !b.rdma && !b.same_host && !b.picks_transport) {
        subjects.push_back({b.name, std::nullopt});
        if (rc.transport.mode != wait_mode::block) subjects.push_back({b.name, wait_mode::block});
        break;
      }
    }
    if (subjects.empty()) subjects.push_back({"fusewire", std::nullopt});
  } else {
    const backend_choice s = parse_backend_choice(config.subject, "--subject");
    require_backend(s);
    subjects.push_back(s);
  }
  for (const backend_choice& b :
       {backend_choice{"grpc", std::nullopt}, backend_choice{"zmq", wait_mode::block},
        backend_choice{"floor", wait_mode::poll}, backend_choice{"floor", wait_mode::block}}) {
    if (std::find_if(subjects.begin(), subjects.end(),
                     [&](const backend_choice& s) { return s.name == b.name && s.mode == b.mode; }) == subjects.end()) {
      others.push_back(b);
    }
  }
  std::vector<backend_choice> all = subjects;
  all.insert(all.end(), others.begin(), others.end());

  std::vector<cell> cells;
  auto add_row = [&](benchmark_kind b, const std::string& label, const payload_spec& p) {
    for (const backend_choice& backend : all) {
      if (backend.name == "fusewire") {
        cell c = make_cell({"floor", std::nullopt}, b, label, p, wire_mode::raw, rc.ps, rc.workers);
        c.backend = backend;
        c.skipped = "fusewire: not built yet";
        cells.push_back(std::move(c));
        continue;
      }
      cells.push_back(make_cell(backend, b, label, p, wire_mode::raw, rc.ps, rc.workers));
    }
  };
  for (benchmark_kind b : {benchmark_kind::p2p_latency, benchmark_kind::p2p_bandwidth, benchmark_kind::ps_throughput}) {
    for (scheme s : {scheme::uniform, scheme::random, scheme::skew}) {
      payload_spec p = rc.payload;
      p.kind = s;
      add_row(b, std::string(option_name(s)), p);
    }
    if (b == benchmark_kind::p2p_latency) {
      for (std::size_t size : {std::size_t{10}, 64 * kib}) {
        payload_spec p = rc.payload;
        p.kind = scheme::custom;
        p.custom = {size};
        add_row(b, format_size(size), p);
      }
    }
  }
  return cells;
}

int run_benchmarks(const run_config& config) {
  std::vector<cell> cells = plan_cells(config);
  note_ignored_settings(config, cells);
  const bool ok = run_cells(cells, config);
  std::fputc('\n', stdout);
  print_table(stdout, cells);
  std::fflush(stdout);
  const bool written = write_outputs(config, cells, {{"config", config_json(config)}});
  return ok && written ? 0 : 1;
}

namespace {

/// The subject's ratio to each other library per benchmark: the geometric mean
/// over the payload schemes (uniform, random, skew) of the per-row ratios,
/// and the single-buffer latency rows on their own. Columns are backends by
/// name; where a name has several modes (floor:poll, floor:block) the best
/// of them counts (the smallest ratio). Prints it and returns it as JSON.
json print_summary(const json& ratios, const std::vector<std::string>& other_labels) {
  std::vector<std::string> names;
  for (const std::string& label : other_labels) {
    const std::string name = label.substr(0, label.find(':'));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::string subject;
  for (const json& row : ratios) {
    if (row["subject"].is_string()) subject = row["subject"].get<std::string>();
  }
  // One ratio per row and name: the best of that name's modes.
  auto row_ratio = [&](const json& row, const std::string& name) -> std::optional<double> {
    std::optional<double> best;
    for (const auto& [label, value] : row["ratios"].items()) {
      if (label.substr(0, label.find(':')) != name || !value.is_number()) continue;
      const double v = value.get<double>();
      if (!best || v < *best) best = v;
    }
    return best;
  };
  std::vector<std::string> schemes;
  for (scheme s : {scheme::uniform, scheme::random, scheme::skew}) schemes.emplace_back(option_name(s));
  struct line {
    std::string title;
    std::vector<const json*> rows;
  };
  std::vector<line> lines;
  for (benchmark_kind b : {benchmark_kind::p2p_latency, benchmark_kind::p2p_bandwidth, benchmark_kind::ps_throughput}) {
    line l{std::string(option_name(b)), {}};
    std::vector<line> singles;
    for (const json& row : ratios) {
      if (row["benchmark"] != option_name(b)) continue;
      const std::string payload = row["payload"];
      if (std::find(schemes.begin(), schemes.end(), payload) != schemes.end()) {
        l.rows.push_back(&row);
      } else {
        singles.push_back({std::string(option_name(b)) + " " + payload, {&row}});
      }
    }
    lines.push_back(l);
    lines.insert(lines.end(), singles.begin(), singles.end());
  }
  std::printf(
      "\n%s vs each library (x > 1: %s is better); per benchmark the geometric mean over the uniform, "
      "random and skew payloads; latency compares p50; a library with several modes counts its best\n",
      subject.c_str(), subject.c_str());
  std::printf("%-24s", "benchmark");
  for (const std::string& n : names) std::printf(" %12s", ("vs " + n).c_str());
  std::printf("\n");
  json out = json::object();
  for (const line& l : lines) {
    std::printf("%-24s", l.title.c_str());
    json entry = json::object();
    for (const std::string& n : names) {
      double log_sum = 0;
      std::size_t count = 0;
      bool complete = !l.rows.empty();
      for (const json* row : l.rows) {
        const std::optional<double> r = row_ratio(*row, n);
        if (!r || *r <= 0) {
          complete = false;
          break;
        }
        log_sum += std::log(*r);
        ++count;
      }
      if (!complete || count == 0) {
        std::printf(" %12s", "n/a");
        entry[n] = nullptr;
        continue;
      }
      const double mean = std::exp(log_sum / static_cast<double>(count));
      std::printf(" %11.2fx", mean);
      entry[n] = mean;
    }
    std::printf("\n");
    out[l.title] = entry;
  }
  return out;
}

}  // namespace

int run_compare(const compare_config& config) {
  std::vector<cell> cells = plan_compare(config);
  std::size_t runs = 0;
  for (const cell& c : cells) runs += c.skipped.empty() ? config.base.time.repetitions : 0;
  const double estimate = static_cast<double>(runs) * (config.base.time.warmup_s + config.base.time.run_s + 0.4);
  if (!config.base.quiet) {
    std::fprintf(stderr, "fwbench compare: %zu runs, about %.0f s (warmup %.1f s + run %.1f s each)\n", runs, estimate,
                 config.base.time.warmup_s, config.base.time.run_s);
  }
  const bool ok = run_cells(cells, config.base);

  std::fputc('\n', stdout);
  print_table(stdout, cells);

  // Ratios: the subject's best backend per row against each other backend.
  bool subject_built = false;
  std::vector<std::string> subject_names;
  std::vector<std::string> other_labels;
  for (const cell& c : cells) {
    const backend_info* info = find_backend(c.backend.name);
    const bool is_subject = config.subject == "fusewire"
                                ? (c.backend.name == "fusewire" || (info && info->fusewire))
                                : c.backend.label() == config.subject || c.backend.name == config.subject;
    auto& list = is_subject ? subject_names : other_labels;
    if (std::find(list.begin(), list.end(), c.backend.label()) == list.end()) list.push_back(c.backend.label());
    if (is_subject && c.skipped.empty()) {
      subject_built = true;
    }
  }
  json ratios = json::array();
  json summary = nullptr;
  std::printf("\n");
  if (!subject_built) {
    std::printf("%s: not built yet; no ratios. (The layout: `fwbench compare --quick --subject zmq`.)\n",
                config.subject.c_str());
  } else {
    std::printf("%s vs each backend (x > 1: %s is better; latency ratios compare p50)\n", config.subject.c_str(),
                config.subject.c_str());
    std::printf("%-14s %-8s %-16s", "benchmark", "payload", "best subject");
    for (const std::string& o : other_labels) std::printf(" %12s", o.c_str());
    std::printf("\n");
    std::vector<std::pair<benchmark_kind, std::string>> rows;
    for (const cell& c : cells) {
      const std::pair<benchmark_kind, std::string> row{c.benchmark, c.payload_label};
      if (std::find(rows.begin(), rows.end(), row) == rows.end()) rows.push_back(row);
    }
    for (const auto& [b, label] : rows) {
      auto value_of = [&](const cell& c) {
        return spread_of(c, [&](const repetition& r) { return headline(b, r); }).median;
      };
      const cell* best = nullptr;
      for (const cell& c : cells) {
        if (c.benchmark != b || c.payload_label != label || !c.ran()) continue;
        if (std::find(subject_names.begin(), subject_names.end(), c.backend.label()) == subject_names.end()) continue;
        if (!best || (lower_is_better(b) ? value_of(c) < value_of(*best) : value_of(c) > value_of(*best))) best = &c;
      }
      std::printf("%-14s %-8s %-16s", std::string(option_name(b)).c_str(), label.c_str(),
                  best ? best->backend.label().c_str() : "(failed)");
      json row = {{"benchmark", std::string(option_name(b))},
                  {"payload", label},
                  {"subject", best ? json(best->backend.label()) : json(nullptr)}};
      json against = json::object();
      for (const std::string& o : other_labels) {
        const auto other = std::find_if(cells.begin(), cells.end(), [&](const cell& c) {
          return c.benchmark == b && c.payload_label == label && c.backend.label() == o;
        });
        if (!best || other == cells.end() || !other->ran() || value_of(*other) <= 0 || value_of(*best) <= 0) {
          std::printf(" %12s", "n/a");
          against[o] = nullptr;
          continue;
        }
        const double ratio =
            lower_is_better(b) ? value_of(*other) / value_of(*best) : value_of(*best) / value_of(*other);
        std::printf(" %11.2fx", ratio);
        against[o] = ratio;
      }
      std::printf("\n");
      row["ratios"] = against;
      ratios.push_back(row);
    }
    summary = print_summary(ratios, other_labels);
  }
  std::fflush(stdout);
  json extra = {{"config", config_json(config.base)},
                {"compare", {{"subject", config.subject}, {"quick", config.quick}, {"subject_built", subject_built}}},
                {"ratios", subject_built ? ratios : json(nullptr)},
                {"summary", summary}};
  if (!subject_built) extra["compare"]["subject_status"] = config.subject + ": not built yet";
  const bool written = write_outputs(config.base, cells, extra);
  return ok && written ? 0 : 1;
}

void print_backends(std::FILE* out) {
  for (const backend_info& b : backends()) {
    std::fprintf(out, "%-15s %-9s %s\n", b.name.c_str(), b.available ? "built" : "not built",
                 b.available ? b.summary.c_str() : b.unavailable_reason.c_str());
  }
}

}  // namespace fusewire::bench
