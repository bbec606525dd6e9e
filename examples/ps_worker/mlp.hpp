// The trainer's model: a one-hidden-layer MLP (inputs -> hidden, ReLU ->
// classes, softmax cross-entropy) and its forward/backward pass on a batch.
//
// Matrix products go to cblas_sgemm when the build found OpenBLAS
// (FUSEWIRE_EXAMPLE_HAS_CBLAS), else to the loops below.
#pragma once

#if FUSEWIRE_EXAMPLE_HAS_CBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace example {

/// C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op = transpose when the flag is set.
inline void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                 const float* b, float beta, float* c) {
#if FUSEWIRE_EXAMPLE_HAS_CBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(ta ? m : k), b,
              static_cast<int>(tb ? k : n), beta, c, static_cast<int>(n));
#else
  for (std::size_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : c[i] * beta;
  if (!tb) {
    // C[i,:] += alpha * op(A)[i,p] * B[p,:]: the inner loop runs along rows of B and C.
    for (std::size_t i = 0; i < m; ++i) {
      float* ci = c + i * n;
      for (std::size_t p = 0; p < k; ++p) {
        const float av = alpha * (ta ? a[p * m + i] : a[i * k + p]);
        if (av == 0.0f) continue;
        const float* bp = b + p * n;
        for (std::size_t j = 0; j < n; ++j) ci[j] += av * bp[j];
      }
    }
  } else {
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        const float* bj = b + j * k;
        float s = 0.0f;
        if (ta) {
          for (std::size_t p = 0; p < k; ++p) s += a[p * m + i] * bj[p];
        } else {
          const float* ai = a + i * k;
          for (std::size_t p = 0; p < k; ++p) s += ai[p] * bj[p];
        }
        c[i * n + j] += alpha * s;
      }
    }
  }
#endif
}

/// Call once per process: OpenBLAS must not start its own threads next to our processes.
inline void single_threaded_blas() {
#if FUSEWIRE_EXAMPLE_HAS_CBLAS
  openblas_set_num_threads(1);
#endif
}

/// Which BLAS the matrix products use.
inline const char* blas_name() {
#if FUSEWIRE_EXAMPLE_HAS_CBLAS
  return "OpenBLAS (cblas_sgemm)";
#else
  return "built-in loops (no OpenBLAS found)";
#endif
}

/// Shape of the MLP and the names/sizes of its four parameter tensors.
struct mlp_shape {
  std::size_t inputs = 784;
  std::size_t hidden = 128;
  std::size_t classes = 10;

  static constexpr std::size_t tensor_count = 4;
  /// Names as the parameter servers know them.
  static constexpr const char* names[tensor_count] = {"mlp/w1", "mlp/b1", "mlp/w2", "mlp/b2"};
  /// Elements of parameter tensor `i` (w1 [inputs x hidden], b1, w2 [hidden x classes], b2).
  std::size_t size(std::size_t i) const {
    switch (i) {
      case 0:
        return inputs * hidden;
      case 1:
        return hidden;
      case 2:
        return hidden * classes;
      default:
        return classes;
    }
  }
  std::size_t total() const { return size(0) + size(1) + size(2) + size(3); }
};

/// The four parameter (or gradient) tensors.
using tensors = std::vector<std::vector<float>>;

/// Scratch space for one batch, reused across steps.
class mlp {
 public:
  explicit mlp(mlp_shape s) : s_(s) {}
  const mlp_shape& shape() const { return s_; }

  /// Forward and backward on `n` rows of `x` with labels `y`: fills `grads`
  /// (mean over the batch) and returns the mean cross-entropy loss.
  float train_step(const tensors& p, const float* x, const std::uint8_t* y, std::size_t n, tensors& grads) {
    forward(p, x, n);
    grads.resize(mlp_shape::tensor_count);
    for (std::size_t i = 0; i < mlp_shape::tensor_count; ++i) grads[i].assign(s_.size(i), 0.0f);
    const std::size_t h = s_.hidden, c = s_.classes;
    double loss = 0;
    dlogits_.assign(n * c, 0.0f);
    const float inv_n = 1.0f / static_cast<float>(n);
    for (std::size_t r = 0; r < n; ++r) {
      const float* pr = probs_.data() + r * c;
      loss -= std::log(std::max(pr[y[r]], 1e-12f));
      for (std::size_t j = 0; j < c; ++j) dlogits_[r * c + j] = (pr[j] - (j == y[r] ? 1.0f : 0.0f)) * inv_n;
    }
    gemm(true, false, h, c, n, 1.0f, hidden_.data(), dlogits_.data(), 0.0f, grads[2].data());
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < c; ++j) grads[3][j] += dlogits_[r * c + j];
    }
    dhidden_.assign(n * h, 0.0f);
    gemm(false, true, n, h, c, 1.0f, dlogits_.data(), p[2].data(), 0.0f, dhidden_.data());
    for (std::size_t i = 0; i < n * h; ++i) {
      if (hidden_[i] <= 0.0f) dhidden_[i] = 0.0f;
    }
    gemm(true, false, s_.inputs, h, n, 1.0f, x, dhidden_.data(), 0.0f, grads[0].data());
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < h; ++j) grads[1][j] += dhidden_[r * h + j];
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }

  /// Fraction of the `n` rows of `x` whose arg-max class equals the label.
  double accuracy(const tensors& p, const float* x, const std::uint8_t* y, std::size_t n) {
    constexpr std::size_t chunk = 1000;
    std::size_t right = 0;
    for (std::size_t at = 0; at < n; at += chunk) {
      const std::size_t m = std::min(chunk, n - at);
      forward(p, x + at * s_.inputs, m);
      for (std::size_t r = 0; r < m; ++r) {
        const float* pr = probs_.data() + r * s_.classes;
        const auto best = static_cast<std::size_t>(std::max_element(pr, pr + s_.classes) - pr);
        if (best == y[at + r]) ++right;
      }
    }
    return n == 0 ? 0.0 : static_cast<double>(right) / static_cast<double>(n);
  }

 private:
  void forward(const tensors& p, const float* x, std::size_t n) {
    const std::size_t h = s_.hidden, c = s_.classes;
    hidden_.resize(n * h);
    for (std::size_t r = 0; r < n; ++r)
      std::copy(p[1].begin(), p[1].end(), hidden_.begin() + static_cast<std::ptrdiff_t>(r * h));
    gemm(false, false, n, h, s_.inputs, 1.0f, x, p[0].data(), 1.0f, hidden_.data());
    for (float& v : hidden_) v = std::max(v, 0.0f);
    probs_.resize(n * c);
    for (std::size_t r = 0; r < n; ++r)
      std::copy(p[3].begin(), p[3].end(), probs_.begin() + static_cast<std::ptrdiff_t>(r * c));
    gemm(false, false, n, c, h, 1.0f, hidden_.data(), p[2].data(), 1.0f, probs_.data());
    for (std::size_t r = 0; r < n; ++r) {
      float* z = probs_.data() + r * c;
      const float mx = *std::max_element(z, z + c);
      float sum = 0;
      for (std::size_t j = 0; j < c; ++j) sum += (z[j] = std::exp(z[j] - mx));
      for (std::size_t j = 0; j < c; ++j) z[j] /= sum;
    }
  }

  mlp_shape s_;
  std::vector<float> hidden_, probs_, dlogits_, dhidden_;
};

}  // namespace example
