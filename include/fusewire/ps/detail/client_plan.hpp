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
  // Per PS, the row of each id already in this entry: a pull asks for an id
  // once (a PS refuses a pull that names an id twice: its reply could outgrow
  // what it holds) and a push sends one summed gradient per id.
  std::vector<std::unordered_map<std::int64_t, std::size_t>> row_of(num_ps);
  for (std::size_t item_index = first_item; item_index < last_item; ++item_index) {
    batch::item& it = b.items_[item_index];
    std::uint32_t var = it.var;
    if (var == batch::by_name) {
      auto found = names_.find(it.name);
      if (found == names_.end()) {
        return fail(b, ec, errc::invalid_argument,
                    std::string(to_string(it.kind)) + ": unknown variable '" + it.name +
                        "' (model has: " + known_names() + ")");
      }
      var = found->second;
    } else if (it.model != base_fingerprint_ || var >= model_.variables.size()) {
      return fail(b, ec, errc::invalid_argument,
                  std::string(to_string(it.kind)) +
                      (it.model == 0 ? ": an empty variable handle (make handles with client::variable(name))"
                                     : ": a variable handle of another model or PS count"));
    }
    const variable_spec& v = model_.variables[var];
    const std::string what = std::string(to_string(it.kind)) + " of '" + v.name + "'";
    if (is_rows(it.kind) != (v.kind == variable_kind::embedding)) {
      return fail(b, ec, errc::invalid_argument,
                  what + ": the variable is " +
                      (v.kind == variable_kind::embedding ? "an embedding (use pull_rows/push_rows)"
                                                          : "dense (use pull/push)"));
    }
    // Where a pull's values go: its pull_into() destination, else its result.
    auto destination = [&](std::size_t n) -> float* {
      if (!it.has_into) {
        b.results_[it.result].resize(n);  // every element is overwritten
        return b.results_[it.result].data();
      }
      if (it.into.size() != n) {
        fail(b, ec, errc::size_mismatch,
             what + ": the destination has " + std::to_string(it.into.size()) + " floats, the pull gives " +
                 std::to_string(n));
        return nullptr;
      }
      return it.into.data();
    };
    if (!is_rows(it.kind)) {
      const auto n = static_cast<std::size_t>(v.num_elements());
      if (it.kind == op::push_dense && it.values.size() != n) {
        return fail(b, ec, errc::size_mismatch,
                    what + ": gradient has " + std::to_string(it.values.size()) + " values, the variable has " +
                        std::to_string(n));
      }
      float* out = nullptr;
      if (it.kind == op::pull_dense && (out = destination(n)) == nullptr) return false;
      const auto slices = place_.slices(var);
      for (std::uint32_t s = 0; s < slices.size(); ++s) {
        const slice_info& si = slices[s];
        ps_plan& pl = plans[si.ps];
        pl.vars.push_back(var);
        const auto first = static_cast<std::size_t>(si.element_begin),
                   count = static_cast<std::size_t>(si.element_count);
        if (it.kind == op::pull_dense) {
          // A PS refuses a request that names a slice twice: pull it once.
          const auto same = std::find_if(pl.sinks.begin(), pl.sinks.end(), [&](const sink& k) {
            return k.kind == op::pull_dense && k.var == var && k.slice == s;
          });
          if (same != pl.sinks.end()) {
            pl.repeats.push_back({static_cast<std::size_t>(same - pl.sinks.begin()), out});
            continue;
          }
          pl.rb.pull_dense(var, s);
          pl.sinks.push_back({op::pull_dense, var, s, out, first, count, nullptr, 0});
        } else {
          pl.rb.push_dense(var, s, it.values.subspan(first, count));
        }
      }
      continue;
    }
    const auto dim = static_cast<std::size_t>(v.row_size());
    const std::int64_t num_ids = v.shape[0];
    const std::span<const std::int64_t> ids = it.ids();
    for (std::int64_t id : ids) {
      if (num_ids > 0 && (id < 0 || id >= num_ids)) {
        return fail(b, ec, errc::invalid_argument,
                    what + ": id " + std::to_string(id) + " out of range [0, " + std::to_string(num_ids) + ")");
      }
    }
    if (it.kind == op::push_rows && it.values.size() != ids.size() * dim) {
      return fail(b, ec, errc::size_mismatch,
                  what + ": " + std::to_string(it.values.size()) + " gradient values for " +
                      std::to_string(ids.size()) + " ids of dim " + std::to_string(dim) + " (expected " +
                      std::to_string(ids.size() * dim) + ")");
    }
    float* out = nullptr;
    if (it.kind == op::pull_rows && (out = destination(ids.size() * dim)) == nullptr) return false;
    if (num_ps == 1 && it.kind == op::push_rows) {
      // Sent as given, from the caller's memory, unless an id repeats.
      row_of[0].clear();
      bool repeats = false;
      for (std::int64_t id : ids) repeats = repeats || !row_of[0].try_emplace(id, 0).second;
      if (!repeats) {
        plans[0].vars.push_back(var);
        plans[0].rb.push_rows(var, ids, it.values);
        continue;
      }
    }
    std::fill(ids_of.begin(), ids_of.end(), nullptr);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::uint32_t p = num_ps == 1 ? 0 : place_.ps_of_id(ids[k]);
      if (ids_of[p] == nullptr) {
        ids_of[p] = &id_store.emplace_back();
        row_of[p].clear();
        if (it.kind == op::pull_rows) {
          pos_of[p] = &pos_store.emplace_back();
        } else {
          grads_of[p] = &grad_store.emplace_back();
        }
      }
      const auto [at, fresh] = row_of[p].try_emplace(ids[k], ids_of[p]->size());
      if (fresh) ids_of[p]->push_back(ids[k]);
      if (it.kind == op::pull_rows) {
        pos_of[p]->emplace_back(k, at->second);
        continue;
      }
      const float* g = it.values.data() + k * dim;
      std::vector<float>& grads = *grads_of[p];
      if (fresh) {
        grads.insert(grads.end(), g, g + dim);
      } else {
        float* sum = grads.data() + at->second * dim;
        for (std::size_t c = 0; c < dim; ++c) sum[c] += g[c];
      }
    }
    for (std::uint32_t p = 0; p < num_ps; ++p) {
      if (ids_of[p] == nullptr) continue;
      plans[p].vars.push_back(var);
      if (it.kind == op::pull_rows) {
        plans[p].rb.pull_rows(var, *ids_of[p]);
        plans[p].sinks.push_back({op::pull_rows, var, 0, out, 0, ids_of[p]->size() * dim, pos_of[p], dim});
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
