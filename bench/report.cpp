#include "report.hpp"

#include <sched.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <fusewire/core/error.hpp>
#include <fusewire/core/version.hpp>
#include <map>
#include <sstream>

namespace fusewire::bench {
namespace {

std::string fixed(double v, int decimals) {
  char out[48];
  std::snprintf(out, sizeof out, "%.*f", decimals, v);
  return out;
}

/// Latency-like numbers: one decimal below 1000, none above.
std::string micros(double v) { return fixed(v, v < 1000 ? 1 : 0); }

std::string rate(double v) { return fixed(v, v < 100 ? 1 : 0); }

std::string payload_text(const cell& c) {
  if (c.payload_bytes == 0) return "-";
  return std::to_string(c.buffers) + " x, " + format_size(c.payload_bytes);
}

std::string headline_text(benchmark_kind b, double v) { return b == benchmark_kind::p2p_latency ? micros(v) : rate(v); }

std::ofstream open_output(const std::string& path) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    throw_error(errc::invalid_argument, "cannot write '" + path + "': " + std::strerror(errno));
  }
  return file;
}

void close_output(std::ofstream& file, const std::string& path) {
  file.close();
  if (!file) throw_error(errc::invalid_argument, "cannot write '" + path + "'");
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

/// Sum of CPU% over the processes of one role.
double cpu_of(const repetition& r, role_kind role) {
  double sum = 0;
  for (const process_usage& u : r.usage) {
    if (u.role == role) sum += u.cpu_percent();
  }
  return sum;
}

double rss_mib(const repetition& r) {
  long peak = 0;
  for (const process_usage& u : r.usage) peak = std::max(peak, u.max_rss_kib);
  return static_cast<double>(peak) / 1024.0;
}

std::string gnuplot_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

void print_table(std::FILE* out, const std::vector<cell>& cells) {
  const char* header_format = "%-15s %-14s %-8s %-15s %-17s %9s %9s %9s %9s %9s %9s %7s %7s %8s\n";
  std::fprintf(out, header_format, "backend", "benchmark", "payload", "mode", "buffers, size", "p50 us", "p99 us",
               "mean us", "MB/s", "net MB/s", "RPC/s", "PS cpu%", "wk cpu%", "RSS MiB");
  std::string last_group;
  for (const cell& c : cells) {
    const std::string group =
        std::string(option_name(c.benchmark)) + c.payload_label + std::string(option_name(c.mode));
    if (!last_group.empty() && group != last_group) std::fputc('\n', out);
    last_group = group;
    std::fprintf(out, "%-15s %-14s %-8s %-15s %-17s ", c.backend.label().c_str(),
                 std::string(option_name(c.benchmark)).c_str(), c.payload_label.c_str(),
                 std::string(option_name(c.mode)).c_str(), payload_text(c).c_str());
    if (!c.skipped.empty()) {
      std::fprintf(out, "%s\n", c.skipped.c_str());
      continue;
    }
    if (!c.ran()) {
      const std::string error = c.reps.empty() ? "did not run" : c.reps.front().error;
      std::fprintf(out, "FAILED: %s\n", error.c_str());
      continue;
    }
    auto med = [&](auto get) { return spread_of(c, get).median; };
    const bool net = std::any_of(c.reps.begin(), c.reps.end(),
                                 [](const repetition& r) { return r.ok && !r.net_interfaces.empty(); });
    std::fprintf(out, "%9s %9s %9s %9s %9s %9s %7.0f %7.0f %8.1f\n",
                 micros(med([](const repetition& r) { return r.latency.p50_us; })).c_str(),
                 micros(med([](const repetition& r) { return r.latency.p99_us; })).c_str(),
                 micros(med([](const repetition& r) { return r.latency.mean_us; })).c_str(),
                 rate(med([](const repetition& r) { return r.mb_per_s; })).c_str(),
                 net ? rate(med([](const repetition& r) { return r.net_tx_mb_per_s; })).c_str() : "-",
                 rate(med([](const repetition& r) { return r.rpc_per_s; })).c_str(),
                 med([](const repetition& r) { return cpu_of(r, role_kind::ps); }),
                 med([](const repetition& r) { return cpu_of(r, role_kind::worker); }), med(rss_mib));
    const spread h = spread_of(c, [&](const repetition& r) { return headline(c.benchmark, r); });
    const std::size_t failed = c.reps.size() - h.count;
    if (h.count > 1 || failed > 0) {
      std::fprintf(out, "%-15s %s over %zu repetitions: min %s, median %s, max %s%s\n", "",
                   headline_unit(c.benchmark).c_str(), h.count, headline_text(c.benchmark, h.min).c_str(),
                   headline_text(c.benchmark, h.median).c_str(), headline_text(c.benchmark, h.max).c_str(),
                   failed ? (" (" + std::to_string(failed) + " failed)").c_str() : "");
    }
  }
}

nlohmann::json host_info() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  utsname u{};
  ::uname(&u);
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = 0;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  return {
      {"hostname", name}, {"kernel", std::string(u.sysname) + " " + u.release}, {"machine", u.machine}, {"cpus", cpus}};
}

void write_json(const std::string& path, const std::vector<cell>& cells, const nlohmann::json& extra) {
  std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json doc = {
      {"fwbench", {{"version", FUSEWIRE_VERSION_STRING}, {"date", when}}}, {"host", host_info()}, {"results", cells}};
  for (auto it = extra.begin(); it != extra.end(); ++it) doc[it.key()] = it.value();
  std::ofstream file = open_output(path);
  file << doc.dump(2) << '\n';
  close_output(file, path);
}

void write_csv(const std::string& path, const std::vector<cell>& cells) {
  std::ofstream file = open_output(path);
  file << "backend,benchmark,payload,scheme,mode,payload_bytes,buffers,ps,workers,repetition,ok,seconds,calls,"
          "rpc_per_s,mb_per_s,latency_mean_us,latency_p50_us,latency_p99_us,latency_min_us,latency_max_us,"
          "ps_cpu_percent,worker_cpu_percent,ps_user_s,ps_sys_s,worker_user_s,worker_sys_s,max_rss_kib,"
          "net_tx_mb_per_s,net_rx_mb_per_s,net_interfaces,error\n";
  for (const cell& c : cells) {
    const std::string prefix = csv_field(c.backend.label()) + "," + std::string(option_name(c.benchmark)) + "," +
                               csv_field(c.payload_label) + "," + std::string(option_name(c.payload.kind)) + "," +
                               std::string(option_name(c.mode)) + "," + std::to_string(c.payload_bytes) + "," +
                               std::to_string(c.buffers) + "," + std::to_string(c.ps) + "," +
                               std::to_string(c.workers) + ",";
    if (!c.skipped.empty()) {
      file << prefix << ",false,,,,,,,,,,,,,,,,,,," << csv_field(c.skipped) << '\n';
      continue;
    }
    for (std::size_t i = 0; i < c.reps.size(); ++i) {
      const repetition& r = c.reps[i];
      double ps_user = 0, ps_sys = 0, wk_user = 0, wk_sys = 0;
      long rss = 0;
      for (const process_usage& u : r.usage) {
        (u.role == role_kind::ps ? ps_user : wk_user) += u.user_s;
        (u.role == role_kind::ps ? ps_sys : wk_sys) += u.sys_s;
        rss = std::max(rss, u.max_rss_kib);
      }
      std::ostringstream row;
      row.precision(9);
      row << prefix << i + 1 << ',' << (r.ok ? "true" : "false") << ',' << r.seconds << ',' << r.calls << ','
          << r.rpc_per_s << ',' << r.mb_per_s << ',' << r.latency.mean_us << ',' << r.latency.p50_us << ','
          << r.latency.p99_us << ',' << r.latency.min_us << ',' << r.latency.max_us << ',' << cpu_of(r, role_kind::ps)
          << ',' << cpu_of(r, role_kind::worker) << ',' << ps_user << ',' << ps_sys << ',' << wk_user << ',' << wk_sys
          << ',' << rss << ',' << r.net_tx_mb_per_s << ',' << r.net_rx_mb_per_s << ',' << csv_field(r.net_interfaces)
          << ',' << csv_field(r.error) << '\n';
      file << row.str();
    }
  }
  close_output(file, path);
}

std::string plot_script(const std::string& path, const std::vector<cell>& cells, const std::string& title) {
  const bool png = path.size() >= 4 && path.compare(path.size() - 4, 4, ".png") == 0;
  const bool svg = path.size() >= 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
  if (!png && !svg) {
    throw_error(errc::invalid_argument, "--plot '" + path + "': the file must end in .svg or .png");
  }
  bool several_modes = false;
  for (const cell& c : cells) several_modes = several_modes || c.mode != cells.front().mode;
  auto series_of = [&](const cell& c) {
    return c.backend.label() + (several_modes && c.mode == wire_mode::serialized ? " (serialized)" : "");
  };

  struct panel {
    benchmark_kind benchmark;
    std::vector<std::string> rows;    // payload labels
    std::vector<std::string> series;  // backends
    std::map<std::pair<std::string, std::string>, double> values;
  };
  std::vector<panel> panels;
  std::vector<std::string> not_run;  // series without a single bar, and why
  for (benchmark_kind b : {benchmark_kind::p2p_latency, benchmark_kind::p2p_bandwidth, benchmark_kind::ps_throughput}) {
    panel p{b, {}, {}, {}};
    for (const cell& c : cells) {
      if (c.benchmark != b) continue;
      if (std::find(p.rows.begin(), p.rows.end(), c.payload_label) == p.rows.end()) p.rows.push_back(c.payload_label);
      const std::string s = series_of(c);
      if (c.ran()) {
        if (std::find(p.series.begin(), p.series.end(), s) == p.series.end()) p.series.push_back(s);
        p.values[{c.payload_label, s}] = spread_of(c, [&](const repetition& r) { return headline(b, r); }).median;
      }
    }
    if (!p.series.empty()) panels.push_back(std::move(p));
  }
  for (const cell& c : cells) {
    const std::string s = series_of(c);
    bool drawn = false;
    for (const panel& p : panels) drawn = drawn || std::find(p.series.begin(), p.series.end(), s) != p.series.end();
    const std::string note = s + " (" + (c.skipped.empty() ? "failed" : c.skipped) + ")";
    if (!drawn && std::find(not_run.begin(), not_run.end(), note) == not_run.end()) not_run.push_back(note);
  }
  if (panels.empty()) throw_error(errc::invalid_argument, "--plot: there are no results to draw");
  std::string full_title = title;
  for (std::size_t i = 0; i < not_run.size(); ++i) full_title += (i ? ", " : "\nnot shown: ") + not_run[i];

  std::ostringstream g;
  const int height = 380 * static_cast<int>(panels.size()) + 40;
  if (svg) {
    g << "set terminal svg size 1100," << height << " dynamic enhanced font 'Sans,11' background rgb 'white'\n";
  } else {
    g << "set terminal pngcairo size 1100," << height << " enhanced font 'Sans,10' background rgb 'white'\n";
  }
  g << "set output " << gnuplot_string(path) << "\n"
    << "set datafile missing '-'\n"
    << "set style data histograms\n"
    << "set style histogram clustered gap 1\n"
    << "set style fill solid 0.85 border -1\n"
    << "set boxwidth 0.9\n"
    << "set key outside right top\n"
    << "set grid ytics\n"
    << "set yrange [0:*]\n"
    << "set multiplot layout " << panels.size() << ",1 title " << gnuplot_string(full_title) << "\n";
  int n = 0;
  for (const panel& p : panels) {
    const std::string block = "$data" + std::to_string(n++);
    g << block << " << EOD\npayload";
    for (const std::string& s : p.series) g << ' ' << gnuplot_string(s);
    g << '\n';
    for (const std::string& row : p.rows) {
      g << gnuplot_string(row);
      for (const std::string& s : p.series) {
        const auto it = p.values.find({row, s});
        if (it == p.values.end()) {
          g << " -";
        } else {
          g << ' ' << it->second;
        }
      }
      g << '\n';
    }
    g << "EOD\n";
    switch (p.benchmark) {
      case benchmark_kind::p2p_latency:
        g << "set title 'p2p-latency: p50 round trip (lower is better)'\n"
          << "set ylabel 'microseconds (log scale)'\nset logscale y\nset yrange [*:*]\n";
        break;
      case benchmark_kind::p2p_bandwidth:
        g << "set title 'p2p-bandwidth (higher is better)'\nset ylabel 'MB/s'\nunset logscale y\nset yrange [0:*]\n";
        break;
      case benchmark_kind::ps_throughput:
        g << "set title 'ps-throughput: RPCs per second, all workers (higher is better)'\n"
          << "set ylabel 'RPC/s'\nunset logscale y\nset yrange [0:*]\n";
        break;
    }
    g << "plot for [i=2:" << p.series.size() + 1 << "] " << block << " using i:xtic(1) title columnheader(i)\n";
  }
  g << "unset multiplot\n";
  return g.str();
}

void write_plot(const std::string& path, const std::vector<cell>& cells, const std::string& title) {
  const std::string script = plot_script(path, cells, title);
  const std::string script_path = path + ".gp";
  {
    std::ofstream file = open_output(script_path);
    file << script;
    close_output(file, script_path);
  }
  const pid_t pid = ::fork();
  if (pid < 0) throw_error(errc::out_of_memory, "--plot: cannot start gnuplot: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    ::execlp("gnuplot", "gnuplot", script_path.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::remove(script_path.c_str());
    return;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    throw_error(errc::not_supported,
                "--plot needs gnuplot (Debian: gnuplot-nox); the script is in '" + script_path + "'");
  }
  throw_error(errc::invalid_argument, "--plot: gnuplot failed on '" + script_path + "' (left there to inspect)");
}

}  // namespace fusewire::bench
