#pragma once
/// The executor's tensor arithmetic: elementwise ops with one-element
/// broadcast, MatMul, Gather and Concat on float32 tensors. A bad shape throws
/// op_failure, which the executor turns into the step's error naming the node.
/// Private to the graph layer.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <fusewire/graph/channel.hpp>
#include <fusewire/graph/detail/edge_value.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph::detail {

/// A shape or index an op cannot handle; what() says which.
struct op_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void need(bool ok, const std::string& what) {
  if (!ok) throw op_failure(what);
}

inline std::string shapes(const tensor& a, const tensor& b) {
  return tensor::shape_string(a.shape) + " and " + tensor::shape_string(b.shape);
}

template <class F>
tensor elementwise(const tensor& a, const tensor& b, F f) {
  tensor out;
  if (a.shape == b.shape || b.values.size() == 1) {
    out.shape = a.shape;
    out.values.resize(a.values.size());
    for (std::size_t k = 0; k < a.values.size(); ++k)
      out.values[k] = f(a.values[k], b.values.size() == 1 ? b.values[0] : b.values[k]);
    return out;
  }
  need(a.values.size() == 1, "shapes " + shapes(a, b) + " are not compatible");
  out.shape = b.shape;
  out.values.resize(b.values.size());
  for (std::size_t k = 0; k < b.values.size(); ++k) out.values[k] = f(a.values[0], b.values[k]);
  return out;
}

inline tensor matmul(const tensor& a, const tensor& b) {
  need(a.shape.size() == 2 && b.shape.size() == 2 && a.shape[1] == b.shape[0],
       "cannot multiply matrices of shapes " + shapes(a, b));
  const auto m = static_cast<std::size_t>(a.shape[0]), k = static_cast<std::size_t>(a.shape[1]),
             n = static_cast<std::size_t>(b.shape[1]);
  tensor out({a.shape[0], b.shape[1]}, std::vector<float>(m * n, 0.0f));
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < k; ++j) {
      const float x = a.values[i * k + j];
      for (std::size_t c = 0; c < n; ++c) out.values[i * n + c] += x * b.values[j * n + c];
    }
  return out;
}

inline tensor gather(const tensor& params, const tensor& indices) {
  need(!params.shape.empty(), "cannot gather from a scalar");
  const auto rows = params.shape[0];
  const std::size_t row = rows == 0 ? 0 : params.values.size() / static_cast<std::size_t>(rows);
  tensor out;
  out.shape = indices.shape;
  out.shape.insert(out.shape.end(), params.shape.begin() + 1, params.shape.end());
  for (float x : indices.values) {
    need(x >= 0 && x < static_cast<float>(rows) && std::floor(x) == x,
         "index " + std::to_string(x) + " is not a row of a tensor with " + std::to_string(rows) + " rows");
    auto first = params.values.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(x) * row);
    out.values.insert(out.values.end(), first, first + static_cast<std::ptrdiff_t>(row));
  }
  return out;
}

inline tensor concat(const std::vector<edge_value>& parts, std::int64_t axis) {
  const auto& first = parts[0].value;
  const auto rank = static_cast<std::int64_t>(first.shape.size());
  if (axis < 0) axis += rank;
  need(axis >= 0 && axis < rank, "axis out of range for rank " + std::to_string(rank));
  const auto ax = static_cast<std::size_t>(axis);
  tensor out;
  out.shape = first.shape;
  out.shape[ax] = 0;
  for (const auto& p : parts) {
    const auto& s = p.value.shape;
    bool same = s.size() == first.shape.size();
    for (std::size_t d = 0; same && d < s.size(); ++d) same = d == ax || s[d] == first.shape[d];
    need(same, "cannot concatenate shapes " + shapes(first, p.value) + " on axis " + std::to_string(axis));
    out.shape[ax] += s[ax];
  }
  std::size_t outer = 1;
  for (std::size_t d = 0; d < ax; ++d) outer *= static_cast<std::size_t>(first.shape[d]);
  for (std::size_t o = 0; o < outer; ++o)
    for (const auto& p : parts) {
      const std::size_t chunk = outer == 0 ? 0 : p.value.values.size() / outer;
      auto from = p.value.values.begin() + static_cast<std::ptrdiff_t>(o * chunk);
      out.values.insert(out.values.end(), from, from + static_cast<std::ptrdiff_t>(chunk));
    }
  return out;
}

}  // namespace graph::detail
}  // namespace v0
}  // namespace fusewire
