#pragma once
/// ps::shard's pushes: async mode applies each push as it arrives; sync mode
/// sums the pushes of the current step and, once every replica pushed,
/// applies their average once and answers the pulls that waited for the step.
/// The optimizer reads a gradient where it lies in the request (shard::gradient)
/// and writes a dense slice through writable_values() (copy-on-write).

#include <algorithm>
#include <bit>
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

namespace detail {
/// The little-endian f32 values at `p` read in place as floats, or nullptr
/// when they cannot be: on a big-endian host, or when `p` is not aligned for
/// float (then the caller copies them).
inline const float* floats_in_place(const std::byte* p) noexcept {
  if constexpr (std::endian::native != std::endian::little) {
    (void)p;
    return nullptr;
  } else {
    return reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0 ? reinterpret_cast<const float*>(p) : nullptr;
  }
}
}  // namespace detail

inline std::span<const float> shard::gradient(const entry_view& e) {
  const auto n = static_cast<std::size_t>(e.value_count);
  if (n == 0) return {};
  // A request's values start at a 4-byte offset of a buffer from
  // tensor_buffer::allocate, so they are aligned unless the buffer is a view
  // the caller placed elsewhere.
  if (const float* in_place = detail::floats_in_place(e.values)) return {in_place, n};
  ++stats_.gradient_copies;
  grad_.resize(n);
  e.copy_values(grad_.data(), 0, n);
  return {grad_.data(), n};
}

inline void shard::apply_push(const entry_view& e, float scale, bool accumulate) {
  const optimizer_config& opt = model_.optimizer_of(e.var);
  const std::span<const float> grad = gradient(e);
  if (e.kind == op::push_dense) {
    dense_state& d = dense_[dense_index_[e.var][e.slice]];
    if (accumulate) {
      if (!d.touched) {
        d.acc.assign(grad.begin(), grad.end());
        d.touched = true;
      } else {
        for (std::size_t i = 0; i < grad.size(); ++i) d.acc[i] += grad[i];
      }
      return;
    }
    apply_update(opt, writable_values(d), d.slots, grad, d.updates, scale);
    return;
  }
  const auto dim = static_cast<std::size_t>(model_.variables[e.var].row_size());
  auto row_grad = [&](std::uint64_t k) { return grad.subspan(static_cast<std::size_t>(k) * dim, dim); };
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
    const std::span<const float> g = row_grad(k);
    if (accumulate) {
      auto [it, fresh] = acc_rows_[e.var].try_emplace(id);
      if (fresh) {
        it->second.assign(g.begin(), g.end());
      } else {
        for (std::size_t c = 0; c < dim; ++c) it->second[c] += g[c];
      }
      continue;
    }
    if (has_dups) {
      auto [it, fresh] = summed.try_emplace(id);
      if (fresh) {
        it->second.assign(g.begin(), g.end());
      } else {
        for (std::size_t c = 0; c < dim; ++c) it->second[c] += g[c];
      }
      continue;
    }
    row_state& r = row(e.var, id);
    apply_update(opt, std::span<float>(r.data.data(), dim), std::span<float>(r.data.data() + dim, dim * opt.slots()), g,
                 r.updates, scale);
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
    apply_update(opt, writable_values(d), d.slots, d.acc, d.updates, scale);
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
