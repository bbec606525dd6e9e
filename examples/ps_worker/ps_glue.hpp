// How the MLP trainer talks to the parameter servers: the MLP as a
// ps::model_spec, its initial values and update rule for the --local run, and
// one worker's session (fused or unfused pull/push per step).
#pragma once

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/ps/ps.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mlp.hpp"

namespace example {

namespace ps = fusewire::ps;

/// What the PS-side choices of a run are; every process of the run gets the same.
struct glue_options {
  bool fusion = true;
  std::string optimizer = "adam";
  float lr = 1e-3f;
  bool sync = false;
  std::uint64_t seed = 1;
};

/// The MLP's variables as the parameter servers hold them.
/// w1 is about 400 KB: a 64 KB minimum slice splits it over up to 6 PS.
inline ps::model_spec make_model(const mlp_shape& s, const glue_options& g) {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::from_name(g.optimizer, g.lr);
  m.min_slice_bytes = 64 * 1024;
  auto glorot = [&](std::size_t in, std::size_t out) {
    const float limit = std::sqrt(6.0f / static_cast<float>(in + out));
    return ps::initializer::uniform(-limit, limit, g.seed);
  };
  const auto in = static_cast<std::int64_t>(s.inputs), h = static_cast<std::int64_t>(s.hidden),
             c = static_cast<std::int64_t>(s.classes);
  m.add_dense(mlp_shape::names[0], {in, h}, glorot(s.inputs, s.hidden));
  m.add_dense(mlp_shape::names[1], {h});
  m.add_dense(mlp_shape::names[2], {h, c}, glorot(s.hidden, s.classes));
  m.add_dense(mlp_shape::names[3], {c});
  return m;
}

/// The initial parameters exactly as the PS creates them (for --local).
inline tensors initial_params(const ps::model_spec& m, const mlp_shape& s) {
  tensors p(mlp_shape::tensor_count);
  for (std::size_t i = 0; i < mlp_shape::tensor_count; ++i) {
    const ps::variable_spec& v = m.variables[m.index_of(mlp_shape::names[i])];
    const auto row = static_cast<std::size_t>(v.row_size());
    p[i].resize(s.size(i));
    for (std::size_t e = 0; e < p[i].size(); ++e) p[i][e] = v.init.value(v.name, e / row, e % row);
  }
  return p;
}

/// The PS's update rules applied in this process (for --local).
class local_optimizer {
 public:
  local_optimizer(ps::optimizer_config opt, const tensors& like) : opt_(opt), updates_(like.size(), 0) {
    for (const auto& t : like) slots_.emplace_back(t.size() * opt_.slots(), ps::initial_slot_value(opt_, 0));
  }
  void apply(tensors& p, const tensors& g) {
    for (std::size_t i = 0; i < p.size(); ++i) ps::apply_update(opt_, p[i], slots_[i], g[i], updates_[i]);
  }

 private:
  ps::optimizer_config opt_;
  std::vector<std::uint64_t> updates_;
  tensors slots_;
};

/// One worker's connection to the parameter servers.
template <class Transport>
class ps_session {
 public:
  ps_session(const fusewire::cluster_spec& spec, unsigned task, const mlp_shape& s, const glue_options& g,
             ps::client_config<Transport> config)
      : g_(g), model_(make_model(s, g)), client_({"worker", task}, spec, model_, std::move(config)) {
    if (g.sync && !g.fusion) {
      throw std::invalid_argument(
          "--fusion off needs --async: in sync mode each worker step must be one request "
          "per PS");
    }
    for (const char* name : mlp_shape::names) vars_.push_back(client_.variable(name));
  }

  /// The current parameters, in one fused request per PS (or one per variable).
  void pull(tensors& params) {
    params.resize(mlp_shape::tensor_count);
    if (g_.fusion) {
      batch_.clear();
      pull_all(params);
      client_.run(batch_);
    } else {
      for (std::size_t i = 0; i < mlp_shape::tensor_count; ++i) params[i] = client_.pull(mlp_shape::names[i]);
    }
  }

  /// Pushes this step's gradients and gets the parameters after they were
  /// applied (sync: after every worker's step), in one request per PS when fused.
  void step(const tensors& grads, tensors& params) {
    if (!g_.fusion) {
      for (std::size_t i = 0; i < mlp_shape::tensor_count; ++i) client_.push(mlp_shape::names[i], grads[i]);
      pull(params);
      return;
    }
    batch_.clear();
    for (std::size_t i = 0; i < mlp_shape::tensor_count; ++i) batch_.push(vars_[i], grads[i]);
    pull_all(params);
    client_.run(batch_);
  }

  /// Waits until every worker finished training.
  void finish() { client_.barrier(); }

  /// Asks every PS to stop serving (worker 0, at the very end).
  void shutdown_servers() { client_.shutdown_servers(); }

 private:
  /// Pulls every variable straight into `params`.
  void pull_all(tensors& params) {
    params.resize(mlp_shape::tensor_count);
    for (std::size_t i = 0; i < mlp_shape::tensor_count; ++i) {
      params[i].resize(vars_[i].size());
      batch_.pull_into(vars_[i], params[i]);
    }
  }

  glue_options g_;
  ps::model_spec model_;
  ps::client<Transport> client_;
  std::vector<ps::variable_handle> vars_;  ///< resolved once, in mlp_shape::names' order
  ps::batch batch_;
};

}  // namespace example
