#pragma once
/// The partitioner's working state, shared by every mode: the cross-task
/// transfers, the messages and calls they are packed into, the augmented and
/// condensed graphs. Private to the graph layer.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Data and small helpers every partitioning step uses; every failure is
/// reported as (errc, text), never thrown from the algorithm itself
/// (allocation failure aside).
class partition_state {
 protected:
  partition_state(const placed_graph& g, partition_options opts) : user_(g), opts_(std::move(opts)) {}

 public:
  struct failure {
    errc code;
    std::string what;
  };

 protected:
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  struct transfer {
    std::size_t src = 0;
    int port = 0;  // -1: control token
    std::size_t src_task = 0, dst_task = 0, frame = 0, wave = 0;
    std::vector<std::size_t> consumers;
    std::size_t message = npos;
  };
  struct work_message {
    message_kind kind = message_kind::send;
    std::size_t src_task = 0, dst_task = 0, frame = 0, round = 0;
    bool fallback = false;
    std::vector<std::size_t> transfers;
    std::size_t call = npos;
  };
  struct call_info {
    std::size_t client = 0, server = 0, frame = 0, round = 0;
    std::size_t request = npos, response = npos;
    std::vector<std::size_t> triggers;  // server nodes that wait for the request
    std::vector<std::size_t> acks;      // server nodes the response waits for
    bool ordered = true;                // the response waits for the request
  };

  struct skeleton {
    std::string merge, pivot;
  };

  std::string task_tag(std::size_t t) const {
    const auto& id = user_.tasks()[t];
    return id.job + "_" + std::to_string(id.index);
  }

  std::string skeleton_name(std::size_t task, std::size_t frame, std::string_view part) const {
    return "_loop/" + user_.frames()[frame].name + "/" + task_tag(task) + "/" + std::string(part);
  }

  std::vector<std::size_t> all_transfers() const {
    std::vector<std::size_t> v(transfers_.size());
    std::iota(v.begin(), v.end(), 0);
    return v;
  }

  std::size_t new_message(message_kind kind, std::size_t src, std::size_t dst, std::size_t frame, std::size_t round,
                          bool fallback) {
    work_message m;
    m.kind = kind;
    m.src_task = src;
    m.dst_task = dst;
    m.frame = frame;
    m.round = round;
    m.fallback = fallback;
    messages_.push_back(std::move(m));
    return messages_.size() - 1;
  }

  void attach(std::size_t t, std::size_t m) {
    transfers_[t].message = m;
    messages_[m].transfers.push_back(t);
  }

  std::optional<std::size_t> skeleton_merge(std::size_t task, std::size_t frame) const {
    auto it = skeleton_[frame].find(task);
    if (it == skeleton_[frame].end()) return std::nullopt;
    return aug_->find(it->second.merge);
  }

  const placed_graph& user_;
  partition_options opts_;
  std::optional<placed_graph> aug_;
  std::vector<std::map<std::size_t, skeleton>> skeleton_;  // [frame][task]
  std::vector<transfer> transfers_;
  std::map<std::tuple<std::size_t, int, std::size_t>, std::size_t> transfer_index_;
  std::vector<work_message> messages_;
  std::vector<call_info> calls_;
  std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>, std::size_t> call_index_;
  std::size_t cycle_breaks_ = 0;
  std::vector<std::vector<std::size_t>> cin_;  // condensed graph inputs
  std::vector<std::size_t> corder_, cwave_, cpos_;
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
