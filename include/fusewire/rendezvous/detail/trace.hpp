#pragma once
/// The timeline of options.trace_file (FUSEWIRE_TRACE): every completed send
/// and receive as a span on its reactor's track, and marks such as a PS step,
/// written as Chrome trace events (chrome://tracing, Perfetto) when the
/// endpoint is destroyed. Private to the rendezvous layer.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {
namespace detail {

/// One span: an operation from its start on the reactor to its completion, or a mark.
struct trace_event {
  std::chrono::steady_clock::time_point begin{};
  std::chrono::steady_clock::time_point end{};
  std::string name;    ///< the key, or the mark's name
  std::string peer;    ///< empty for a mark
  std::string detail;  ///< a mark's arguments, as text
  std::uint64_t bytes = 0;
  char kind = 's';  ///< 's' send, 'r' receive, 'm' mark
  bool ok = true;
};

/// At most `capacity` events; the ones past it are counted, not kept. One per
/// reactor (touched only by it), plus one behind a mutex for marks.
class trace_buffer {
 public:
  explicit trace_buffer(std::size_t capacity = 0) : capacity_(capacity) {}
  void add(trace_event e) {
    if (events_.size() >= capacity_) {
      ++dropped_;
      return;
    }
    if (events_.capacity() == events_.size())
      events_.reserve(std::min(capacity_, std::max<std::size_t>(1024, 2 * events_.size())));
    events_.push_back(std::move(e));
  }
  const std::vector<trace_event>& events() const noexcept { return events_; }
  std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  std::size_t capacity_;
  std::vector<trace_event> events_;
  std::uint64_t dropped_ = 0;
};

/// One buffer of the written trace: its track id and name ("reactor 0", "steps").
struct trace_track {
  int tid = 0;
  std::string name;
  const trace_buffer* events = nullptr;
};

/// Writes `tracks` to `path` as a Chrome trace of process `task`. Timestamps
/// are steady-clock microseconds; otherData.steady_to_wall_us maps them to
/// wall-clock time (what tools/fwtrace_merge aligns tasks by).
inline std::error_code write_chrome_trace(const std::string& path, const std::string& task, int sort_index,
                                          const std::vector<trace_track>& tracks) {
  using nlohmann::json;
  const auto us = [](std::chrono::steady_clock::time_point t) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count()) /
           1000.0;
  };
  const auto wall =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const double steady_now = us(std::chrono::steady_clock::now());
  const int pid = static_cast<int>(::getpid());
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", task}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", sort_index}}}});
  std::uint64_t dropped = 0;
  // Operations go on one track per reactor, direction and peer ("reactor 0:
  // send to ps:1"): operations of one track rarely overlap, so the viewers
  // stack them cleanly. Marks keep their own track.
  std::map<std::pair<int, std::string>, int> tids;
  int next_tid = 0;
  for (const trace_track& t : tracks) next_tid = std::max(next_tid, t.tid + 1);
  auto tid_of = [&](const trace_track& t, const trace_event& e) {
    if (e.kind == 'm') return t.tid;
    const std::string name = t.name + (e.kind == 's' ? ": send to " : ": recv from ") + e.peer;
    auto [it, fresh] = tids.try_emplace({t.tid, name}, 0);
    if (fresh) {
      it->second = next_tid++;
      events.push_back(
          {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", it->second}, {"args", {{"name", name}}}});
    }
    return it->second;
  };
  for (const trace_track& t : tracks) {
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", t.tid}, {"args", {{"name", t.name}}}});
    dropped += t.events->dropped();
    for (const trace_event& e : t.events->events()) {
      const int tid = tid_of(t, e);
      json ev = {{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"ts", us(e.begin)}, {"dur", us(e.end) - us(e.begin)}};
      if (e.kind == 'm') {
        ev["name"] = e.name;
        ev["cat"] = "mark";
        ev["args"] = {{"detail", e.detail}};
      } else {
        ev["name"] = std::string(e.kind == 's' ? "send " : "recv ") + e.name;
        ev["cat"] = e.kind == 's' ? "send" : "recv";
        ev["args"] = {{"key", e.name}, {"peer", e.peer}, {"bytes", e.bytes}, {"ok", e.ok}};
      }
      events.push_back(std::move(ev));
    }
  }
  const json doc = {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"task", task}, {"steady_to_wall_us", static_cast<double>(wall) - steady_now}, {"dropped_events", dropped}}}};
  std::ofstream f(path, std::ios::trunc);
  if (!f) return std::error_code(errno != 0 ? errno : EIO, std::generic_category());
  f << doc.dump() << '\n';
  f.close();
  if (!f) return std::error_code(EIO, std::generic_category());
  return {};
}

}  // namespace detail
}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
