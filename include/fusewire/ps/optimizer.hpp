#pragma once
/// ps optimizers: the update rules a PS applies to pushed gradients, element
/// by element, in float32 (TensorFlow's formulas):
///
///   sgd       w -= lr * g
///   momentum  a = m * a + g;  w -= lr * a            (nesterov: w -= lr * (g + m * a))
///   adagrad   acc += g * g;   w -= lr * g / (sqrt(acc) + eps)        (acc starts at initial_accumulator)
///   adam      t += 1;  lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
///             m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g;  w -= lr_t * m / (sqrt(v) + eps)
///
/// `t` counts the updates of that dense slice or that embedding row (so a row
/// untouched for a while keeps its own bias correction).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include <fusewire/ps/model.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
// Every rule also has an AVX2 loop (eight lanes), chosen at run time on x86-64
// CPUs that have AVX2, whatever the build's -march: Adam and Adagrad are the
// costliest rules, and at -O2 GCC leaves SGD's and momentum's plain loops
// scalar (its cheap cost model does not version a loop for aliasing).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <immintrin.h>
#define FUSEWIRE_PS_AVX2 1
#else
#define FUSEWIRE_PS_AVX2 0
#endif

namespace fusewire {
inline namespace v0 {
namespace ps {

namespace detail {

#if FUSEWIRE_PS_AVX2
inline bool cpu_has_avx2() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2") != 0;
  return yes;
}

/// Adam over the first n - n % 8 elements, eight lanes at a time: the same
/// IEEE operations in the same order as the SSE and scalar loops of
/// apply_update, so the same results (no fused multiply-adds: the target is
/// avx2 alone). Returns how many elements it did.
__attribute__((target("avx2"))) inline std::size_t adam_avx2(float* w, float* m, float* v, const float* grad,
                                                             std::size_t n, float scale, float b1, float b2, float lr_t,
                                                             float eps) noexcept {
  const __m256 vs = _mm256_set1_ps(scale), vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
  const __m256 vc1 = _mm256_set1_ps(1.0f - b1), vc2 = _mm256_set1_ps(1.0f - b2);
  const __m256 vlr = _mm256_set1_ps(lr_t), veps = _mm256_set1_ps(eps);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), vs);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(vc1, g));
    const __m256 vi =
        _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(vc2, g), g));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(vlr, mi), _mm256_add_ps(_mm256_sqrt_ps(vi), veps));
    _mm256_storeu_ps(w + i, _mm256_sub_ps(_mm256_loadu_ps(w + i), step));
  }
  return i;
}

/// SGD the same way (the operations of the scalar loop).
__attribute__((target("avx2"))) inline std::size_t sgd_avx2(float* w, const float* grad, std::size_t n, float scale,
                                                            float lr) noexcept {
  const __m256 vs = _mm256_set1_ps(scale), vlr = _mm256_set1_ps(lr);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 step = _mm256_mul_ps(vlr, _mm256_mul_ps(_mm256_loadu_ps(grad + i), vs));
    _mm256_storeu_ps(w + i, _mm256_sub_ps(_mm256_loadu_ps(w + i), step));
  }
  return i;
}

/// Momentum (plain or Nesterov) the same way (the operations of the scalar loop).
__attribute__((target("avx2"))) inline std::size_t momentum_avx2(float* w, float* a, const float* grad, std::size_t n,
                                                                 float scale, float lr, float mom,
                                                                 bool nesterov) noexcept {
  const __m256 vs = _mm256_set1_ps(scale), vlr = _mm256_set1_ps(lr), vm = _mm256_set1_ps(mom);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), vs);
    const __m256 ai = _mm256_add_ps(_mm256_mul_ps(vm, _mm256_loadu_ps(a + i)), g);
    _mm256_storeu_ps(a + i, ai);
    const __m256 step = nesterov ? _mm256_mul_ps(vlr, _mm256_add_ps(g, _mm256_mul_ps(vm, ai))) : _mm256_mul_ps(vlr, ai);
    _mm256_storeu_ps(w + i, _mm256_sub_ps(_mm256_loadu_ps(w + i), step));
  }
  return i;
}

/// Adagrad the same way (the operations of its four-lane loop).
__attribute__((target("avx2"))) inline std::size_t adagrad_avx2(float* w, float* acc, const float* grad, std::size_t n,
                                                                float scale, float lr, float eps) noexcept {
  const __m256 vs = _mm256_set1_ps(scale), vlr = _mm256_set1_ps(lr), veps = _mm256_set1_ps(eps);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), vs);
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(g, g));
    _mm256_storeu_ps(acc + i, a);
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(vlr, g), _mm256_add_ps(_mm256_sqrt_ps(a), veps));
    _mm256_storeu_ps(w + i, _mm256_sub_ps(_mm256_loadu_ps(w + i), step));
  }
  return i;
}
#endif

}  // namespace detail

/// Initial value of slot `k` (of opt.slots()) of every element.
inline float initial_slot_value(const optimizer_config& opt, std::size_t k) noexcept {
  (void)k;
  return opt.kind == optimizer_kind::adagrad ? opt.initial_accumulator : 0.0f;
}

/// Applies `grad * scale` to `w`; `slots` holds opt.slots() arrays of w.size()
/// floats back to back; `updates` is the element group's update count (adam's t),
/// incremented here. Sizes must agree (the caller checked them).
inline void apply_update(const optimizer_config& opt, std::span<float> w, std::span<float> slots,
                         std::span<const float> grad, std::uint64_t& updates, float scale = 1.0f) noexcept {
  const std::size_t n = w.size();
  const float lr = opt.learning_rate;
  ++updates;
  switch (opt.kind) {
    case optimizer_kind::sgd: {
      std::size_t i = 0;
#if FUSEWIRE_PS_AVX2
      if (detail::cpu_has_avx2()) i = detail::sgd_avx2(w.data(), grad.data(), n, scale, lr);
#endif
      for (; i < n; ++i) w[i] -= lr * (grad[i] * scale);
      return;
    }
    case optimizer_kind::momentum: {
      float* a = slots.data();
      const float m = opt.momentum;
      std::size_t i = 0;
#if FUSEWIRE_PS_AVX2
      if (detail::cpu_has_avx2()) i = detail::momentum_avx2(w.data(), a, grad.data(), n, scale, lr, m, opt.nesterov);
#endif
      for (; i < n; ++i) {
        const float g = grad[i] * scale;
        a[i] = m * a[i] + g;
        w[i] -= opt.nesterov ? lr * (g + m * a[i]) : lr * a[i];
      }
      return;
    }
    case optimizer_kind::adagrad: {
      float* acc = slots.data();
      std::size_t i = 0;
#if FUSEWIRE_PS_AVX2
      if (detail::cpu_has_avx2()) i = detail::adagrad_avx2(w.data(), acc, grad.data(), n, scale, lr, opt.epsilon);
#endif
#if defined(__SSE2__)
      // Four lanes at a time: std::sqrt may set errno, which keeps the
      // compiler from vectorizing the loop below on its own. The same IEEE
      // operations in the same order as the scalar loop, so the same results
      // (unless a compiler contracts the scalar one into fused multiply-adds).
      const __m128 vs = _mm_set1_ps(scale), vlr = _mm_set1_ps(lr), veps = _mm_set1_ps(opt.epsilon);
      for (; i + 4 <= n; i += 4) {
        const __m128 g = _mm_mul_ps(_mm_loadu_ps(grad.data() + i), vs);
        const __m128 a = _mm_add_ps(_mm_loadu_ps(acc + i), _mm_mul_ps(g, g));
        _mm_storeu_ps(acc + i, a);
        const __m128 step = _mm_div_ps(_mm_mul_ps(vlr, g), _mm_add_ps(_mm_sqrt_ps(a), veps));
        _mm_storeu_ps(w.data() + i, _mm_sub_ps(_mm_loadu_ps(w.data() + i), step));
      }
#endif
      for (; i < n; ++i) {
        const float g = grad[i] * scale;
        acc[i] += g * g;
        w[i] -= lr * g / (std::sqrt(acc[i]) + opt.epsilon);
      }
      return;
    }
    case optimizer_kind::adam: {
      float* m = slots.data();
      float* v = slots.data() + n;
      const double t = static_cast<double>(updates);
      const float lr_t = static_cast<float>(lr * std::sqrt(1.0 - std::pow(static_cast<double>(opt.beta2), t)) /
                                            (1.0 - std::pow(static_cast<double>(opt.beta1), t)));
      const float b1 = opt.beta1, b2 = opt.beta2;
      std::size_t i = 0;
#if FUSEWIRE_PS_AVX2
      if (detail::cpu_has_avx2())
        i = detail::adam_avx2(w.data(), m, v, grad.data(), n, scale, b1, b2, lr_t, opt.epsilon);
#endif
#if defined(__SSE2__)
      // Four lanes at a time, as adagrad's loop (same results as the scalar one).
      const __m128 vs = _mm_set1_ps(scale), vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2);
      const __m128 vc1 = _mm_set1_ps(1.0f - b1), vc2 = _mm_set1_ps(1.0f - b2);
      const __m128 vlr = _mm_set1_ps(lr_t), veps = _mm_set1_ps(opt.epsilon);
      for (; i + 4 <= n; i += 4) {
        const __m128 g = _mm_mul_ps(_mm_loadu_ps(grad.data() + i), vs);
        const __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + i)), _mm_mul_ps(vc1, g));
        const __m128 vi = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(vc2, g), g));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        const __m128 step = _mm_div_ps(_mm_mul_ps(vlr, mi), _mm_add_ps(_mm_sqrt_ps(vi), veps));
        _mm_storeu_ps(w.data() + i, _mm_sub_ps(_mm_loadu_ps(w.data() + i), step));
      }
#endif
      for (; i < n; ++i) {
        const float g = grad[i] * scale;
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + opt.epsilon);
      }
      return;
    }
  }
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire

#undef FUSEWIRE_PS_AVX2
