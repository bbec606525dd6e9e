// Small pieces the trainer examples share: timing, result lines, role parsing.
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

namespace example {

using steady = std::chrono::steady_clock;

/// Seconds since `t0`.
inline double since(steady::time_point t0) { return std::chrono::duration<double>(steady::now() - t0).count(); }

/// Adds the time spent in its scope to `total` (seconds).
class scoped_timer {
 public:
  explicit scoped_timer(double& total) : total_(total), t0_(steady::now()) {}
  ~scoped_timer() { total_ += since(t0_); }
  scoped_timer(const scoped_timer&) = delete;
  scoped_timer& operator=(const scoped_timer&) = delete;

 private:
  double& total_;
  steady::time_point t0_;
};

/// Parses "@tag k=v k=v" into {k: v}; the launcher reads what workers print.
inline std::map<std::string, std::string> parse_result(const std::string& line) {
  std::map<std::string, std::string> out;
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

inline double num(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0.0 : std::stod(it->second);
}

}  // namespace example
