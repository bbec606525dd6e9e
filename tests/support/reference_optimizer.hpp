#pragma once
/// What the ps tests check a parameter server against: TensorFlow's update
/// rules written out on their own, and the gradients the tests feed.
#include <fusewire/ps/model.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusewire::test {

/// TensorFlow's update rules, written out independently of ps::apply_update, in double.
struct reference_optimizer {
  ps::optimizer_config cfg;
  std::vector<double> w, s0, s1;
  std::uint64_t t = 0;

  reference_optimizer(ps::optimizer_config c, std::vector<float> init) : cfg(c) {
    w.assign(init.begin(), init.end());
    const double slot = c.kind == ps::optimizer_kind::adagrad ? c.initial_accumulator : 0.0;
    s0.assign(w.size(), slot);
    s1.assign(w.size(), 0.0);
  }

  void step(const std::vector<float>& g) {
    ++t;
    const double lr = cfg.learning_rate;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i];
      switch (cfg.kind) {
        case ps::optimizer_kind::sgd:
          w[i] -= lr * gi;
          break;
        case ps::optimizer_kind::momentum:
          s0[i] = cfg.momentum * s0[i] + gi;
          w[i] -= cfg.nesterov ? lr * (gi + cfg.momentum * s0[i]) : lr * s0[i];
          break;
        case ps::optimizer_kind::adagrad:
          s0[i] += gi * gi;
          w[i] -= lr * gi / (std::sqrt(s0[i]) + cfg.epsilon);
          break;
        case ps::optimizer_kind::adam: {
          const double b1 = cfg.beta1, b2 = cfg.beta2;
          s0[i] = b1 * s0[i] + (1 - b1) * gi;
          s1[i] = b2 * s1[i] + (1 - b2) * gi * gi;
          const double mhat = s0[i] / (1 - std::pow(b1, static_cast<double>(t)));
          const double vhat = s1[i] / (1 - std::pow(b2, static_cast<double>(t)));
          // TF folds the bias corrections into lr_t and adds epsilon to sqrt(v), not sqrt(vhat).
          w[i] -= lr * mhat / (std::sqrt(vhat) + cfg.epsilon / std::sqrt(1 - std::pow(b2, static_cast<double>(t))));
          break;
        }
      }
    }
  }
};

/// Gradient of step `step` for element `i` (deterministic, varied signs and sizes).
inline float grad_at(int step, std::size_t i, int worker = 0) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * step + 0.7 * worker)) * 0.5f;
}

}  // namespace fusewire::test
