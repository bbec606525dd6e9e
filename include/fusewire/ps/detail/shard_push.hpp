#pragma once
/// ps::shard's pushes: async mode applies each push as it arrives; sync mode
/// sums the pushes of the current step and, once every replica pushed,
/// applies their average once and answers the pulls that waited for the step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/optimizer.hpp>
#include <fusewire/ps/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline void shard::apply_push(const entry_view& e, float scale, bool accumulate) {
  const optimizer_config& opt = model_.optimizer_of(e.var);
  if (e.kind == op::push_dense) {
    dense_state& d = dense_[dense_index_[e.var][e.slice]];
    const auto n = static_cast<std::size_t>(d.info.element_count);
    grad_.resize(n);
    e.copy_values(grad_.data(), 0, n);
    if (accumulate) {
      if (!d.touched) {
        d.acc.assign(n, 0.0f);
        d.touched = true;
      }
      for (std::size_t i = 0; i < n; ++i) d.acc[i] += grad_[i];
      return;
    }
    apply_update(opt, std::span<float>(d.data.data(), n), std::span<float>(d.data.data() + n, n * opt.slots()), grad_,
                 d.updates, scale);
    return;
  }
  const auto dim = static_cast<std::size_t>(model_.variables[e.var].row_size());
  grad_.resize(dim);
  // Duplicate ids: their gradients are summed and applied once.
  std::unordered_map<std::int64_t, std::vector<float>> summed;
  bool has_dups = false;
  if (e.id_count > 1 && !accumulate) {
    seen_ids_.clear();
    for (std::uint64_t k = 0; k < e.id_count; ++k) {
      if (!seen_ids_.insert(e.id(k)).second) {
        has_dups = true;
        break;
      }
    }
  }
  for (std::uint64_t k = 0; k < e.id_count; ++k) {
    const std::int64_t id = e.id(k);
    e.copy_values(grad_.data(), k * dim, dim);
    if (accumulate) {
      auto [it, fresh] = acc_rows_[e.var].try_emplace(id);
      if (fresh) it->second.assign(dim, 0.0f);
      for (std::size_t c = 0; c < dim; ++c) it->second[c] += grad_[c];
      continue;
    }
    if (has_dups) {
      auto [it, fresh] = summed.try_emplace(id);
      if (fresh) it->second.assign(dim, 0.0f);
      for (std::size_t c = 0; c < dim; ++c) it->second[c] += grad_[c];
      continue;
    }
    row_state& r = row(e.var, id);
    apply_update(opt, std::span<float>(r.data.data(), dim), std::span<float>(r.data.data() + dim, dim * opt.slots()),
                 grad_, r.updates, scale);
  }
  if (has_dups) {
    // Apply in first-occurrence order (deterministic).
    seen_ids_.clear();
    for (std::uint64_t k = 0; k < e.id_count; ++k) {
      const std::int64_t id = e.id(k);
      if (!seen_ids_.insert(id).second) continue;
      row_state& r = row(e.var, id);
      apply_update(opt, std::span<float>(r.data.data(), dim), std::span<float>(r.data.data() + dim, dim * opt.slots()),
                   summed[id], r.updates, scale);
    }
  }
}

inline void shard::finish_step() {
  const float scale = 1.0f / static_cast<float>(opts_.replicas);
  for (dense_state& d : dense_) {
    if (!d.touched) continue;
    const optimizer_config& opt = model_.optimizer_of(d.var);
    const auto n = static_cast<std::size_t>(d.info.element_count);
    apply_update(opt, std::span<float>(d.data.data(), n), std::span<float>(d.data.data() + n, n * opt.slots()), d.acc,
                 d.updates, scale);
    d.touched = false;
  }
  for (std::uint32_t v = 0; v < acc_rows_.size(); ++v) {
    if (acc_rows_[v].empty()) continue;
    const optimizer_config& opt = model_.optimizer_of(v);
    const auto dim = static_cast<std::size_t>(model_.variables[v].row_size());
    std::vector<std::int64_t> ids;
    ids.reserve(acc_rows_[v].size());
    for (const auto& [id, g] : acc_rows_[v]) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    for (std::int64_t id : ids) {
      row_state& r = row(v, id);
      apply_update(opt, std::span<float>(r.data.data(), dim), std::span<float>(r.data.data() + dim, dim * opt.slots()),
                   acc_rows_[v][id], r.updates, scale);
    }
    acc_rows_[v].clear();
  }
  contributors_.clear();
  ++global_step_;
  maybe_autosave();
  auto waiting = std::move(deferred_);
  deferred_.clear();
  for (deferred_request& d : waiting) {
    request_view req;
    std::error_code ec;
    std::string why;
    decode_request(d.request.bytes(), req, ec, why);  // validated when it arrived
    if (req.min_step <= global_step_) {
      answer(d.worker, req, d.flags);
    } else {
      deferred_.push_back(std::move(d));
    }
  }
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
