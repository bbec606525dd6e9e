#pragma once
/// Runs a partitioned plan inside one process: one executor per task, all
/// joined by a `local_channel`. It is how the tests check that a plan computes
/// what the unpartitioned graph computes, and how many messages it really
/// sends; a multi-process runner swaps the channel for a transport.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/channel.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/partition.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// Every task of a plan, in this process. Variables persist across run()s.
class local_cluster {
 public:
  /// Builds one executor per partition; throws what executor's constructor throws.
  explicit local_cluster(const plan& p, executor_options opts = {}) {
    for (const auto& part : p.partitions) {
      tasks_.push_back(part.task);
      executors_.push_back(std::make_unique<executor>(part.graph, opts));
    }
  }

  /// Runs one step, driving every executor from this thread. Feeds and
  /// fetches name the original graph's nodes. Throws std::system_error: the
  /// failing task's error, or errc::graph_cycle if the step deadlocked (what()
  /// lists what each task waits for).
  std::map<std::string, tensor> run(const feed_map& feeds, const std::vector<std::string>& fetches) {
    const auto step = begin(feeds, fetches);
    while (true) {
      std::size_t events = 0;
      bool all_done = true;
      for (auto& ex : executors_) {
        events += ex->poll();
        all_done = all_done && ex->finished();
      }
      if (failed_task() != npos) break;
      if (all_done) break;
      if (events == 0) {
        std::string text = "step " + std::to_string(step) + " deadlocked:";
        for (std::size_t t = 0; t < executors_.size(); ++t)
          for (const auto& w : executors_[t]->waiting_for())
            text += " " + tasks_[t].to_string() + " waits for " + w + ";";
        abort_step(step);
        throw_error(errc::graph_cycle, text);
      }
    }
    return end(step);
  }

  /// Runs one step with one thread per task (the executors' channel handlers
  /// then cross threads). A task idle longer than `timeout` fails the step
  /// with errc::timed_out.
  std::map<std::string, tensor> run_threaded(const feed_map& feeds, const std::vector<std::string>& fetches,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto step = begin(feeds, fetches);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    std::vector<char> timed_out(executors_.size(), 0);
    for (std::size_t t = 0; t < executors_.size(); ++t)
      threads.emplace_back([&, t] {
        auto& ex = *executors_[t];
        auto idle_since = std::chrono::steady_clock::now();
        while (!stop.load()) {
          if (ex.poll() > 0) idle_since = std::chrono::steady_clock::now();
          if (ex.finished()) {
            if (ex.error()) {
              stop = true;
              channel_.cancel(step);
            }
            return;
          }
          ex.wait(std::chrono::milliseconds(20));
          if (std::chrono::steady_clock::now() - idle_since > timeout) {
            timed_out[t] = 1;
            stop = true;
            channel_.cancel(step);
            return;
          }
        }
      });
    for (auto& th : threads) th.join();
    for (std::size_t t = 0; t < executors_.size(); ++t)
      if (timed_out[t]) {
        std::string text = "step " + std::to_string(step) + ": " + tasks_[t].to_string() + " waited longer than " +
                           std::to_string(timeout.count()) + " ms for:";
        for (const auto& w : executors_[t]->waiting_for()) text += " " + w + ";";
        abort_step(step);
        throw_error(errc::timed_out, text);
      }
    if (stop.load() && failed_task() == npos) {
      abort_step(step);
      throw_error(errc::cancelled, "step " + std::to_string(step) + " was cancelled");
    }
    return end(step);
  }

  /// Current value of Variable `name` on whichever task holds it, or nullptr.
  const tensor* variable(std::string_view name) const {
    for (const auto& ex : executors_)
      if (const auto* v = ex->variable(name)) return v;
    return nullptr;
  }

  /// What the last completed step sent through the channel.
  local_channel::counters last_step_traffic() const noexcept { return traffic_; }

  /// The tasks, in plan order.
  const std::vector<task_id>& tasks() const noexcept { return tasks_; }

 private:
  std::uint64_t begin(const feed_map& feeds, const std::vector<std::string>& fetches) {
    const auto step = ++step_;
    std::vector<feed_map> task_feeds(executors_.size());
    std::vector<std::vector<std::string>> task_fetches(executors_.size());
    for (const auto& [name, value] : feeds) {
      auto t = owner(name);
      if (t == npos || graph_of(t).node(*graph_of(t).find(name)).op != "Placeholder")
        throw_error(errc::invalid_argument, "feed " + util::quoted(name) + " names no Placeholder in the plan");
      task_feeds[t].emplace(name, value);
    }
    for (const auto& f : fetches) {
      auto in = detail::split_input(f);
      auto t = in && !in->control ? owner(in->node) : npos;
      if (t == npos) throw_error(errc::invalid_argument, "fetch " + util::quoted(f) + " names no node in the plan");
      task_fetches[t].push_back(f);
    }
    feeds_ = std::move(task_feeds);
    for (std::size_t t = 0; t < executors_.size(); ++t) {
      try {
        executors_[t]->begin_step(channel_, step, feeds_[t], task_fetches[t]);
      } catch (...) {
        for (std::size_t k = 0; k < t; ++k) executors_[k]->abandon();
        throw;
      }
    }
    return step;
  }

  std::map<std::string, tensor> end(std::uint64_t step) {
    if (auto t = failed_task(); t != npos) {
      abort_step(step);
      try {
        executors_[t]->end_step();
      } catch (const std::system_error& e) {
        throw std::system_error(e.code(), tasks_[t].to_string() + ": " + strip(e));
      }
    }
    std::map<std::string, tensor> out;
    for (auto& ex : executors_) out.merge(ex->end_step());
    auto unmatched = channel_.unmatched(step);
    traffic_ = channel_.sent(step);
    channel_.forget(step);
    if (!unmatched.empty())
      throw_error(errc::invalid_graph,
                  "step " + std::to_string(step) + " left messages unmatched: " + detail::join(unmatched, "; "));
    return out;
  }

  static std::string strip(const std::system_error& e) {
    std::string what = e.what();
    const std::string suffix = ": " + e.code().message();
    if (what.size() >= suffix.size() && what.compare(what.size() - suffix.size(), suffix.size(), suffix) == 0)
      what.resize(what.size() - suffix.size());
    return what;
  }

  /// The first task whose step failed with its own error (not a cancellation).
  std::size_t failed_task() const {
    std::size_t cancelled = npos;
    for (std::size_t t = 0; t < executors_.size(); ++t) {
      auto ec = executors_[t]->error();
      if (!ec) continue;
      if (ec == errc::cancelled) {
        cancelled = std::min(cancelled, t);
        continue;
      }
      return t;
    }
    return cancelled;
  }

  void abort_step(std::uint64_t step) {
    channel_.cancel(step);
    for (auto& ex : executors_) ex->abandon();
    channel_.forget(step);
  }

  std::size_t owner(std::string_view node) const {
    for (std::size_t t = 0; t < executors_.size(); ++t)
      if (graph_of(t).find(node)) return t;
    return npos;
  }

  const placed_graph& graph_of(std::size_t t) const { return executors_[t]->graph(); }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::vector<task_id> tasks_;
  std::vector<std::unique_ptr<executor>> executors_;
  std::vector<feed_map> feeds_;
  local_channel channel_;
  local_channel::counters traffic_;
  std::uint64_t step_ = 0;
};

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
