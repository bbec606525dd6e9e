#pragma once
/// What a graph output carries: element type and shape, with unknown
/// dimensions; fully known, a core tensor_descriptor.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fusewire/core/tensor_descriptor.hpp>

namespace fusewire {
inline namespace v0 {
namespace graph {

/// What an output carries: element type and shape; -1 marks an unknown
/// dimension. Fully known, it is a core `tensor_descriptor` (see descriptor()).
struct tensor_spec {
  dtype type = dtype::float32;
  std::vector<std::int64_t> shape;  ///< empty = scalar

  /// True when every dimension is known.
  bool fully_defined() const noexcept {
    return std::all_of(shape.begin(), shape.end(), [](std::int64_t d) { return d >= 0; });
  }
  /// The descriptor of a tensor of this spec; nullopt unless every dimension
  /// is known, the rank is at most max_rank and the byte size fits an int64.
  std::optional<tensor_descriptor> descriptor() const {
    if (!fully_defined() || shape.size() > max_rank || !is_valid(type)) return std::nullopt;
    tensor_descriptor d = tensor_descriptor::make(type, shape);
    if (d.validate()) return std::nullopt;
    return d;
  }
  /// Bytes of one tensor of this spec, when descriptor() is known.
  std::optional<std::size_t> byte_size() const {
    auto d = descriptor();
    if (!d) return std::nullopt;
    return d->byte_size();
  }
  /// "float32[4,8]" ("float32[]" for a scalar, "?" for unknown dimensions).
  std::string to_string() const {
    std::string out(fusewire::to_string(type));
    out += '[';
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (i) out += ',';
      out += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
    }
    out += ']';
    return out;
  }
  friend bool operator==(const tensor_spec&, const tensor_spec&) = default;
};

/// What a control token or a dead value carries: float32[0], no bytes.
inline tensor_descriptor token_descriptor() { return tensor_descriptor::make(dtype::float32, {0}); }

}  // namespace graph
}  // namespace v0
}  // namespace fusewire
