#pragma once
/// ps::client's routing: check a batch against the model and split it into
/// one request per PS — dense variables by slice, embedding rows by the PS
/// their id hashes to — remembering where each pulled value goes back.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/ps/batch.hpp>
#include <fusewire/ps/client.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

template <transport Transport>
bool client<Transport>::fail(batch& b, std::error_code& ec, errc e, std::string why) {
  ec = make_error_code(e);
  b.error_ = std::move(why);
  return false;
}

template <transport Transport>
bool client<Transport>::plan(batch& b, std::size_t first_item, std::size_t last_item, std::vector<ps_plan>& plans,
                             std::deque<std::vector<std::int64_t>>& id_store,
                             std::deque<std::vector<float>>& grad_store, std::deque<row_targets>& pos_store,
                             std::error_code& ec) {
  const std::size_t num_ps = ps_tasks_.size();
  std::vector<std::vector<std::int64_t>*> ids_of(num_ps);
  std::vector<std::vector<float>*> grads_of(num_ps);
  std::vector<row_targets*> pos_of(num_ps);
  // Per PS, the reply row of each id already asked for in this pull: a PS
  // refuses a pull that names an id twice (its reply could outgrow what it holds).
  std::vector<std::unordered_map<std::int64_t, std::size_t>> row_of(num_ps);
  for (std::size_t item_index = first_item; item_index < last_item; ++item_index) {
    const batch::item& it = b.items_[item_index];
    auto found = names_.find(it.var);
    if (found == names_.end()) {
      std::string known;
      for (const auto& v : model_.variables) known += (known.empty() ? "" : ", ") + v.name;
      return fail(b, ec, errc::invalid_argument,
                  std::string(to_string(it.kind)) + ": unknown variable '" + it.var + "' (model has: " + known + ")");
    }
    const std::uint32_t var = found->second;
    const variable_spec& v = model_.variables[var];
    const std::string what = std::string(to_string(it.kind)) + " of '" + v.name + "'";
    if (is_rows(it.kind) != (v.kind == variable_kind::embedding)) {
      return fail(b, ec, errc::invalid_argument,
                  what + ": the variable is " +
                      (v.kind == variable_kind::embedding ? "an embedding (use pull_rows/push_rows)"
                                                          : "dense (use pull/push)"));
    }
    if (!is_rows(it.kind)) {
      const auto n = static_cast<std::size_t>(v.num_elements());
      if (it.kind == op::push_dense && it.values.size() != n) {
        return fail(b, ec, errc::size_mismatch,
                    what + ": gradient has " + std::to_string(it.values.size()) + " values, the variable has " +
                        std::to_string(n));
      }
      if (it.kind == op::pull_dense) b.results_[it.result].resize(n);  // every element is overwritten
      const auto slices = place_.slices(var);
      for (std::uint32_t s = 0; s < slices.size(); ++s) {
        const slice_info& si = slices[s];
        ps_plan& pl = plans[si.ps];
        pl.vars.push_back(var);
        const auto first = static_cast<std::size_t>(si.element_begin),
                   count = static_cast<std::size_t>(si.element_count);
        if (it.kind == op::pull_dense) {
          pl.rb.pull_dense(var, s);
          pl.sinks.push_back({op::pull_dense, var, s, it.result, first, count, nullptr, 0});
        } else {
          pl.rb.push_dense(var, s, it.values.subspan(first, count));
        }
      }
      continue;
    }
    const auto dim = static_cast<std::size_t>(v.row_size());
    const std::int64_t num_ids = v.shape[0];
    for (std::int64_t id : it.ids) {
      if (num_ids > 0 && (id < 0 || id >= num_ids)) {
        return fail(b, ec, errc::invalid_argument,
                    what + ": id " + std::to_string(id) + " out of range [0, " + std::to_string(num_ids) + ")");
      }
    }
    if (it.kind == op::push_rows && it.values.size() != it.ids.size() * dim) {
      return fail(b, ec, errc::size_mismatch,
                  what + ": " + std::to_string(it.values.size()) + " gradient values for " +
                      std::to_string(it.ids.size()) + " ids of dim " + std::to_string(dim) + " (expected " +
                      std::to_string(it.ids.size() * dim) + ")");
    }
    if (it.kind == op::pull_rows) b.results_[it.result].resize(it.ids.size() * dim);
    if (num_ps == 1) {
      if (it.kind == op::pull_rows) {
        auto& pos = pos_store.emplace_back();
        pos.reserve(it.ids.size());
        auto& ids = id_store.emplace_back();
        row_of[0].clear();
        for (std::size_t k = 0; k < it.ids.size(); ++k) {
          const auto [at, fresh] = row_of[0].try_emplace(it.ids[k], ids.size());
          if (fresh) ids.push_back(it.ids[k]);
          pos.emplace_back(k, at->second);
        }
        plans[0].vars.push_back(var);
        plans[0].rb.pull_rows(var, ids);
        plans[0].sinks.push_back({op::pull_rows, var, 0, it.result, 0, ids.size() * dim, &pos, dim});
      } else {
        plans[0].vars.push_back(var);
        plans[0].rb.push_rows(var, it.ids, it.values);
      }
      continue;
    }
    std::fill(ids_of.begin(), ids_of.end(), nullptr);
    for (std::size_t k = 0; k < it.ids.size(); ++k) {
      const std::uint32_t p = place_.ps_of_id(it.ids[k]);
      if (ids_of[p] == nullptr) {
        ids_of[p] = &id_store.emplace_back();
        if (it.kind == op::pull_rows) {
          pos_of[p] = &pos_store.emplace_back();
          row_of[p].clear();
        } else {
          grads_of[p] = &grad_store.emplace_back();
        }
      }
      if (it.kind == op::pull_rows) {
        const auto [at, fresh] = row_of[p].try_emplace(it.ids[k], ids_of[p]->size());
        if (fresh) ids_of[p]->push_back(it.ids[k]);
        pos_of[p]->emplace_back(k, at->second);
      } else {
        ids_of[p]->push_back(it.ids[k]);
        grads_of[p]->insert(grads_of[p]->end(), it.values.begin() + static_cast<std::ptrdiff_t>(k * dim),
                            it.values.begin() + static_cast<std::ptrdiff_t>((k + 1) * dim));
      }
    }
    for (std::uint32_t p = 0; p < num_ps; ++p) {
      if (ids_of[p] == nullptr) continue;
      plans[p].vars.push_back(var);
      if (it.kind == op::pull_rows) {
        plans[p].rb.pull_rows(var, *ids_of[p]);
        plans[p].sinks.push_back({op::pull_rows, var, 0, it.result, 0, ids_of[p]->size() * dim, pos_of[p], dim});
      } else {
        plans[p].rb.push_rows(var, *ids_of[p], *grads_of[p]);
      }
    }
  }
  return true;
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
