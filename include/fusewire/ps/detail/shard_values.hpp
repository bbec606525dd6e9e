#pragma once
/// ps::shard's values and optimizer slots: the dense slices this PS holds,
/// filled at construction, and embedding rows, created on first touch — both
/// from the variable's initializer, with each slot at its optimizer's initial value.
/// A dense slice's values live in their own buffer, which replies share;
/// writable_values() moves them to a fresh one when a reply still holds them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/optimizer.hpp>
#include <fusewire/ps/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline void shard::init_values() {
  const std::size_t nvars = model_.variables.size();
  dense_index_.resize(nvars);
  rows_.resize(nvars);
  acc_rows_.resize(nvars);
  for (std::uint32_t v = 0; v < nvars; ++v) {
    const variable_spec& spec = model_.variables[v];
    if (spec.kind != variable_kind::dense) continue;
    const auto slices = place_.slices(v);
    dense_index_[v].assign(slices.size(), npos);
    for (std::uint32_t s = 0; s < slices.size(); ++s) {
      if (slices[s].ps != index_) continue;
      dense_index_[v][s] = dense_.size();
      dense_state d;
      d.var = v;
      d.slice = s;
      d.info = slices[s];
      const optimizer_config& opt = model_.optimizer_of(v);
      const auto n = static_cast<std::size_t>(slices[s].element_count);
      d.values = slice_buffer(n);
      const std::span<float> w = writable_values(d, false);
      const std::uint64_t row_size = static_cast<std::uint64_t>(spec.row_size());
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t flat = static_cast<std::uint64_t>(slices[s].element_begin) + i;
        w[i] = spec.init.value(spec.name, flat / row_size, flat % row_size);
      }
      d.slots.resize(n * opt.slots());
      for (std::size_t k = 0; k < opt.slots(); ++k) {
        std::fill_n(d.slots.begin() + static_cast<std::ptrdiff_t>(n * k), n, initial_slot_value(opt, k));
      }
      dense_.push_back(std::move(d));
      dense_values_ += n;
    }
  }
}

inline tensor_buffer shard::slice_buffer(std::size_t n) const {
  return allocate_values_ ? allocate_values_(n * sizeof(float)) : tensor_buffer::allocate(n * sizeof(float));
}

inline std::span<float> shard::writable_values(dense_state& d, bool keep) {
  const auto n = static_cast<std::size_t>(d.info.element_count);
  if (n != 0 && !d.values.sole()) {
    // A reply being sent still holds these bytes: it keeps them as they are.
    tensor_buffer fresh = slice_buffer(n);
    if (keep) std::memcpy(fresh.data(), d.values.data(), n * sizeof(float));
    d.values = std::move(fresh);
    ++stats_.cow_copies;
  }
  // operator new's bytes hold floats once written as floats (implicit object creation).
  return {reinterpret_cast<float*>(d.values.data()), d.values.size() / sizeof(float)};
}

inline std::size_t shard::row_width(std::uint32_t var) const {
  return static_cast<std::size_t>(model_.variables[var].row_size()) * (1 + model_.optimizer_of(var).slots());
}

inline shard::row_state& shard::row(std::uint32_t var, std::int64_t id) {
  auto [it, fresh] = rows_[var].try_emplace(id);
  if (fresh) {
    const variable_spec& v = model_.variables[var];
    const auto dim = static_cast<std::size_t>(v.row_size());
    const optimizer_config& opt = model_.optimizer_of(var);
    it->second.data.resize(row_width(var));
    for (std::size_t c = 0; c < dim; ++c) it->second.data[c] = v.init.value(v.name, static_cast<std::uint64_t>(id), c);
    for (std::size_t k = 0; k < opt.slots(); ++k) {
      std::fill_n(it->second.data.begin() + static_cast<std::ptrdiff_t>(dim * (1 + k)), dim,
                  initial_slot_value(opt, k));
    }
  }
  return it->second;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
