// The "@tag k=v ..." lines a task prints for its launcher (which takes them
// out of the forwarded output), and the per-worker result the trainer
// examples report that way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

namespace example {

using result_fields = std::map<std::string, std::string>;

/// Parses "@tag k=v k=v" into {k: v}, with the tag under "@".
inline result_fields parse_result(const std::string& line) {
  result_fields out;
  std::istringstream in(line);
  std::string word;
  in >> word;
  out["@"] = word;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

/// The number under `key`, 0 when it is absent.
inline double num(const result_fields& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0.0 : std::stod(it->second);
}

/// What one trainer worker measured, sent to the launcher as an "@result" line.
struct worker_result {
  unsigned task = 0;
  std::size_t samples = 0;
  std::size_t steps = 0;
  double seconds = 0;
  double comm_seconds = 0;
  double first_loss = 0;
  double last_loss = 0;

  /// Prints the "@result ..." line, then `extra` (" key=value ..."), and flushes stdout.
  void print(const std::string& extra = "") const {
    std::printf("@result task=%u samples=%zu steps=%zu seconds=%.4f comm=%.4f first_loss=%.5f last_loss=%.5f%s\n", task,
                samples, steps, seconds, comm_seconds, first_loss, last_loss, extra.c_str());
    std::fflush(stdout);
  }
};

/// The launcher's sum over the workers' "@result" lines.
struct worker_totals {
  unsigned results = 0;
  double samples = 0;
  double seconds = 0;
  double max_seconds = 0;
  double comm_seconds = 0;
  double first_loss = 0;
  double last_loss = 0;

  /// Adds one parsed "@result" line.
  void add(const result_fields& r) {
    ++results;
    samples += num(r, "samples");
    seconds += num(r, "seconds");
    max_seconds = std::max(max_seconds, num(r, "seconds"));
    comm_seconds += num(r, "comm");
    first_loss += num(r, "first_loss");
    last_loss += num(r, "last_loss");
  }
  /// Samples per second of all workers together; the slowest worker bounds the run.
  double samples_per_second() const { return max_seconds > 0 ? samples / max_seconds : 0.0; }
  /// Percent of the workers' training time spent in pull and push.
  double comm_percent() const { return seconds > 0 ? 100.0 * comm_seconds / seconds : 0.0; }
  double mean_first_loss() const { return results ? first_loss / results : 0.0; }
  double mean_last_loss() const { return results ? last_loss / results : 0.0; }
};

}  // namespace example
