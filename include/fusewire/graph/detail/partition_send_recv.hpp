#pragma once
/// The `send_recv` mode: one message per cross-task tensor, or with
/// `tensor_fuse` one per (frame, wave, task pair). Star modes use it for the
/// transfers that are not worker<->PS. Private to the graph layer.

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
#include <fusewire/graph/detail/partition_output.hpp>
#include <fusewire/graph/device_name.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition_plan.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

namespace detail {

/// Packs transfers into send messages.
class send_recv_planner : public partition_output {
 protected:
  using partition_output::partition_output;

  void group_sends(const std::vector<std::size_t>& ids, bool fallback) {
    std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>, std::size_t> fused;
    for (auto t : ids) {
      const auto& tr = transfers_[t];
      if (!opts_.tensor_fuse) {
        attach(t, new_message(message_kind::send, tr.src_task, tr.dst_task, tr.frame, tr.wave, fallback));
        continue;
      }
      auto key = std::make_tuple(tr.frame, tr.wave, tr.src_task, tr.dst_task);
      auto it = fused.find(key);
      if (it == fused.end())
        it = fused.emplace(key, new_message(message_kind::send, tr.src_task, tr.dst_task, tr.frame, tr.wave, fallback))
                 .first;
      attach(t, it->second);
    }
  }

  bool is_server(std::size_t task) const { return user_.tasks()[task].job == opts_.server_job; }
};

}  // namespace detail

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
