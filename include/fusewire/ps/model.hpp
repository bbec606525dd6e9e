#pragma once
/// ps model: what a parameter-server job trains — its variables (dense and
/// embedding), their initializers and optimizers — and where each piece lives
/// (placement across the PS tasks).
///
/// Every worker and every PS builds the same model_spec (in the same order);
/// placement is a pure function of (model_spec, number of PS tasks), so all
/// processes agree on it without talking. Requests carry fingerprint() and a
/// PS refuses a request built from a different spec.
///
/// Values are float32. A dense variable of shape [d0, d1, ...] is split along
/// d0 into slices (TensorFlow's min_max_variable_partitioner idea): a variable
/// of B bytes gets min(num_ps, d0, max(1, B / min_slice_bytes)) slices of
/// near-equal row counts (the first d0 % n slices get one row more), each on a
/// different PS, choosing the least-loaded PS (bytes so far; ties: the one
/// whose task holds the fewest bytes, then the lowest index) slice by slice in
/// spec order. With lanes, each lane is a PS here (lane l of task p is PS
/// p * lanes + l), and the tie rule spreads a variable's slices over the
/// tasks before it puts two on one task. An embedding row `id` lives on PS
/// `hash_id(id) % num_ps` (hash_id = splitmix64's finaliser, below).
///
/// Initial values are a function of (variable name, seed, row, column) only,
/// so they do not depend on which PS holds a row or on the order rows are
/// first touched.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

/// splitmix64's output function: the documented hash of embedding ids
/// (PS of id = hash_id(id) % num_ps) and the mixer behind initializers.
constexpr std::uint64_t hash_id(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// FNV-1a 64 of `bytes`, continuing from `h`.
constexpr std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// How a variable's values (or an embedding row) start.
struct initializer {
  enum class kind : std::uint8_t { zeros = 0, constant = 1, uniform = 2, normal = 3 };
  kind type = kind::zeros;
  float a = 0.0f;          ///< constant: the value; uniform: low; normal: mean
  float b = 0.0f;          ///< uniform: high; normal: stddev
  std::uint64_t seed = 0;  ///< uniform/normal: mixed with the variable's name

  static initializer zeros() { return {}; }
  static initializer constant(float v) { return {kind::constant, v, 0.0f, 0}; }
  /// Uniform in [low, high).
  static initializer uniform(float low, float high, std::uint64_t seed) { return {kind::uniform, low, high, seed}; }
  /// Normal(mean, stddev) by Box-Muller.
  static initializer normal(float mean, float stddev, std::uint64_t seed) { return {kind::normal, mean, stddev, seed}; }

  /// The initial value of element (row, col) of variable `var_name`; pure.
  float value(std::string_view var_name, std::uint64_t row, std::uint64_t col) const noexcept {
    switch (type) {
      case kind::zeros:
        return 0.0f;
      case kind::constant:
        return a;
      case kind::uniform:
      case kind::normal:
        break;
    }
    const std::uint64_t base = hash_id(fnv1a(var_name) ^ hash_id(seed));
    const std::uint64_t h1 = hash_id(base ^ hash_id(row * 0x9e3779b97f4a7c15ull + col));
    const double u1 = static_cast<double>(h1 >> 11) * 0x1.0p-53;  // [0, 1)
    if (type == kind::uniform) return static_cast<float>(a + (static_cast<double>(b) - a) * u1);
    const std::uint64_t h2 = hash_id(h1);
    const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(1.0 - u1));
    return static_cast<float>(a + b * r * std::cos(2.0 * std::numbers::pi * u2));
  }
};

/// async: every push is applied when it arrives; sync: each step the PS
/// averages one push from each of `replicas` workers and applies once.
enum class training_mode : std::uint8_t { async = 0, sync = 1 };

constexpr std::string_view to_string(training_mode m) noexcept { return m == training_mode::sync ? "sync" : "async"; }

/// Which update rule a PS applies to pushed gradients.
enum class optimizer_kind : std::uint8_t { sgd = 0, momentum = 1, adagrad = 2, adam = 3 };

/// "sgd", "momentum", "adagrad", "adam".
constexpr std::string_view to_string(optimizer_kind k) noexcept {
  switch (k) {
    case optimizer_kind::sgd:
      return "sgd";
    case optimizer_kind::momentum:
      return "momentum";
    case optimizer_kind::adagrad:
      return "adagrad";
    case optimizer_kind::adam:
      return "adam";
  }
  return "?";
}

/// Every name to_string(optimizer_kind) gives, for messages and command lines.
inline constexpr std::string_view optimizer_kind_names = "sgd, momentum, adagrad, adam";

/// The optimizer_kind that to_string spells `name`, or nullopt.
constexpr std::optional<optimizer_kind> optimizer_kind_from_string(std::string_view name) noexcept {
  for (const auto k : {optimizer_kind::sgd, optimizer_kind::momentum, optimizer_kind::adagrad, optimizer_kind::adam})
    if (to_string(k) == name) return k;
  return std::nullopt;
}

/// An optimizer and its hyper-parameters (TensorFlow's update rules; see optimizer.hpp).
struct optimizer_config {
  optimizer_kind kind = optimizer_kind::sgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;             ///< momentum
  bool nesterov = false;             ///< momentum
  float initial_accumulator = 0.1f;  ///< adagrad
  float beta1 = 0.9f;                ///< adam
  float beta2 = 0.999f;              ///< adam
  float epsilon = 1e-7f;             ///< adagrad and adam

  static optimizer_config sgd(float lr) { return {optimizer_kind::sgd, lr}; }
  static optimizer_config momentum_sgd(float lr, float m = 0.9f, bool nesterov = false) {
    optimizer_config c{optimizer_kind::momentum, lr};
    c.momentum = m;
    c.nesterov = nesterov;
    return c;
  }
  static optimizer_config adagrad(float lr, float initial_accumulator = 0.1f) {
    optimizer_config c{optimizer_kind::adagrad, lr};
    c.initial_accumulator = initial_accumulator;
    return c;
  }
  static optimizer_config adam(float lr, float beta1 = 0.9f, float beta2 = 0.999f, float epsilon = 1e-7f) {
    optimizer_config c{optimizer_kind::adam, lr};
    c.beta1 = beta1;
    c.beta2 = beta2;
    c.epsilon = epsilon;
    return c;
  }

  /// The rule named `name` (to_string's spelling) with learning rate `lr` and
  /// its other hyper-parameters at their defaults. Throws
  /// system_error(errc::invalid_argument) naming the allowed names.
  static optimizer_config from_name(std::string_view name, float lr) {
    const auto kind = optimizer_kind_from_string(name);
    if (!kind)
      throw_error(errc::invalid_argument,
                  "optimizer '" + std::string(name) + "' is not one of: " + std::string(optimizer_kind_names));
    return {*kind, lr};
  }

  /// Float slots kept per element: sgd 0, momentum 1, adagrad 1, adam 2.
  std::size_t slots() const noexcept {
    switch (kind) {
      case optimizer_kind::sgd:
        return 0;
      case optimizer_kind::momentum:
      case optimizer_kind::adagrad:
        return 1;
      case optimizer_kind::adam:
        return 2;
    }
    return 0;
  }

  /// Throws system_error(errc::invalid_argument) naming the bad hyper-parameter.
  void validate(std::string_view var_name = {}) const {
    const std::string where =
        var_name.empty() ? std::string("optimizer") : "optimizer of '" + std::string(var_name) + "'";
    auto bad = [&](std::string_view field, float v, std::string_view allowed) {
      throw_error(errc::invalid_argument, where + ": " + std::string(field) + " = " + std::to_string(v) +
                                              " (allowed: " + std::string(allowed) + ")");
    };
    if (static_cast<unsigned>(kind) > 3)
      throw_error(errc::invalid_argument,
                  where + ": unknown kind (allowed: " + std::string(optimizer_kind_names) + ")");
    if (!(learning_rate > 0.0f) || !std::isfinite(learning_rate)) bad("learning_rate", learning_rate, "> 0");
    if (!(momentum >= 0.0f && momentum < 1.0f)) bad("momentum", momentum, "[0, 1)");
    if (!(initial_accumulator >= 0.0f) || !std::isfinite(initial_accumulator))
      bad("initial_accumulator", initial_accumulator, ">= 0");
    if (!(beta1 >= 0.0f && beta1 < 1.0f)) bad("beta1", beta1, "[0, 1)");
    if (!(beta2 >= 0.0f && beta2 < 1.0f)) bad("beta2", beta2, "[0, 1)");
    if (!(epsilon >= 0.0f) || !std::isfinite(epsilon)) bad("epsilon", epsilon, ">= 0");
    if (kind == optimizer_kind::adagrad && initial_accumulator == 0.0f && epsilon == 0.0f) {
      bad("initial_accumulator", 0.0f, "> 0 when epsilon is 0 (else the first step divides by zero)");
    }
  }
};

/// Dense (whole tensor, sliced across PS) or embedding (rows by id, hashed across PS).
enum class variable_kind : std::uint8_t { dense = 0, embedding = 1 };

/// One variable of the model.
struct variable_spec {
  std::string name;
  variable_kind kind = variable_kind::dense;
  /// dense: the shape (rank 0..8); embedding: {num_ids, dim}, num_ids 0 = any int64 id.
  std::vector<std::int64_t> shape;
  initializer init;
  /// This variable's optimizer; unset = model_spec::optimizer.
  std::optional<optimizer_config> optimizer;

  /// Elements of a dense variable (product of shape; 1 for a scalar).
  std::int64_t num_elements() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  /// Rows (dim 0) of a dense variable; 1 for a scalar. Embedding: num_ids.
  std::int64_t rows() const noexcept { return shape.empty() ? 1 : shape[0]; }
  /// Floats per row: dense: elements / rows (1 for a scalar); embedding: dim.
  std::int64_t row_size() const noexcept {
    if (kind == variable_kind::embedding) return shape.size() == 2 ? shape[1] : 0;
    std::int64_t n = 1;
    for (std::size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return n;
  }
};

/// The whole model: variables in a fixed order, the default optimizer, slicing.
struct model_spec {
  std::vector<variable_spec> variables;
  optimizer_config optimizer;
  /// Smallest dense slice worth its own PS (bytes); TF's min_slice_size.
  std::size_t min_slice_bytes = 256 * 1024;

  /// Adds a dense variable; returns its index. Throws like validate().
  std::uint32_t add_dense(std::string name, std::vector<std::int64_t> shape, initializer init = {},
                          std::optional<optimizer_config> opt = std::nullopt) {
    variables.push_back({std::move(name), variable_kind::dense, std::move(shape), init, opt});
    check_last();
    return static_cast<std::uint32_t>(variables.size() - 1);
  }
  /// Adds an embedding table of `dim` floats per row; `num_ids` 0 = ids unbounded. Returns its index.
  std::uint32_t add_embedding(std::string name, std::int64_t dim, initializer init = {}, std::int64_t num_ids = 0,
                              std::optional<optimizer_config> opt = std::nullopt) {
    variables.push_back({std::move(name), variable_kind::embedding, {num_ids, dim}, init, opt});
    check_last();
    return static_cast<std::uint32_t>(variables.size() - 1);
  }

  /// Index of variable `name`, or nullopt.
  std::optional<std::uint32_t> find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < variables.size(); ++i) {
      if (variables[i].name == name) return static_cast<std::uint32_t>(i);
    }
    return std::nullopt;
  }
  /// Index of variable `name`; throws system_error(errc::invalid_argument) naming it and the known ones.
  std::uint32_t index_of(std::string_view name) const {
    if (auto i = find(name)) return *i;
    std::string known;
    for (const auto& v : variables) known += (known.empty() ? "" : ", ") + v.name;
    throw_error(errc::invalid_argument, "unknown variable '" + std::string(name) + "' (model has: " + known + ")");
  }

  /// The optimizer that applies to variable `i`.
  const optimizer_config& optimizer_of(std::uint32_t i) const {
    return variables.at(i).optimizer ? *variables[i].optimizer : optimizer;
  }

  /// Throws system_error(errc::invalid_argument) naming the first bad variable
  /// (empty or repeated name, bad shape, bad optimizer) and what is allowed.
  void validate() const {
    optimizer.validate();
    if (min_slice_bytes == 0) throw_error(errc::invalid_argument, "model_spec.min_slice_bytes = 0 (allowed: >= 1)");
    for (std::size_t i = 0; i < variables.size(); ++i) check(i);
  }

  /// Hash of everything that must agree between workers and PS (FNV-1a over a canonical form).
  std::uint64_t fingerprint(std::size_t num_ps) const noexcept {
    auto mix = [](std::uint64_t h, std::uint64_t v) {
      for (int i = 0; i < 8; ++i) h = fnv1a(std::string_view(reinterpret_cast<const char*>(&v) + i, 1), h);
      return h;
    };
    auto mixf = [&](std::uint64_t h, float f) { return mix(h, std::bit_cast<std::uint32_t>(f)); };
    auto mixo = [&](std::uint64_t h, const optimizer_config& o) {
      h = mix(h, static_cast<std::uint64_t>(o.kind));
      h = mixf(h, o.learning_rate);
      h = mixf(h, o.momentum);
      h = mix(h, o.nesterov);
      h = mixf(h, o.initial_accumulator);
      h = mixf(h, o.beta1);
      h = mixf(h, o.beta2);
      return mixf(h, o.epsilon);
    };
    std::uint64_t h = mix(fnv1a("fusewire.ps.model"), num_ps);
    h = mix(h, min_slice_bytes);
    h = mixo(h, optimizer);
    for (const auto& v : variables) {
      h = fnv1a(v.name, mix(h, v.name.size()));
      h = mix(h, static_cast<std::uint64_t>(v.kind));
      h = mix(h, v.shape.size());
      for (std::int64_t d : v.shape) h = mix(h, static_cast<std::uint64_t>(d));
      h = mix(h, static_cast<std::uint64_t>(v.init.type));
      h = mixf(mixf(h, v.init.a), v.init.b);
      h = mix(h, v.init.seed);
      h = mix(h, v.optimizer.has_value());
      if (v.optimizer) h = mixo(h, *v.optimizer);
    }
    return h;
  }

 private:
  void check_last() {
    try {
      check(variables.size() - 1);
    } catch (...) {
      variables.pop_back();
      throw;
    }
  }

  void check(std::size_t i) const {
    const variable_spec& v = variables[i];
    if (v.name.empty() || v.name.size() > 1024) {
      throw_error(errc::invalid_argument, "variable " + std::to_string(i) + ": name must be 1 to 1024 bytes");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (variables[j].name == v.name)
        throw_error(errc::invalid_argument, "variable '" + v.name + "' is declared twice");
    }
    const std::string what = "variable '" + v.name + "'";
    if (v.kind == variable_kind::dense) {
      if (v.shape.size() > 8)
        throw_error(errc::invalid_argument, what + ": rank " + std::to_string(v.shape.size()) + " (allowed: 0 to 8)");
      std::int64_t n = 1;
      for (std::int64_t d : v.shape) {
        if (d <= 0) throw_error(errc::invalid_argument, what + ": dimension " + std::to_string(d) + " (allowed: >= 1)");
        if (n > (std::int64_t{1} << 40) / d) throw_error(errc::invalid_argument, what + ": more than 2^40 elements");
        n *= d;
      }
    } else if (v.kind == variable_kind::embedding) {
      if (v.shape.size() != 2 || v.shape[0] < 0 || v.shape[1] <= 0 || v.shape[1] > (1 << 20)) {
        throw_error(errc::invalid_argument, what + ": an embedding needs shape {num_ids >= 0, 1 <= dim <= 2^20}");
      }
    } else {
      throw_error(errc::invalid_argument, what + ": unknown kind (allowed: dense, embedding)");
    }
    if (static_cast<unsigned>(v.init.type) > 3) throw_error(errc::invalid_argument, what + ": unknown initializer");
    if (v.init.type == initializer::kind::uniform && !(v.init.a <= v.init.b)) {
      throw_error(errc::invalid_argument, what + ": uniform initializer needs low <= high");
    }
    if (v.init.type == initializer::kind::normal && !(v.init.b >= 0.0f)) {
      throw_error(errc::invalid_argument, what + ": normal initializer needs stddev >= 0");
    }
    if (v.optimizer) v.optimizer->validate(v.name);
  }
};

/// One slice of a dense variable: rows [row_begin, row_begin + row_count) on PS `ps`.
struct slice_info {
  std::uint32_t ps = 0;
  std::int64_t row_begin = 0;
  std::int64_t row_count = 0;
  /// First element (flat index into the whole variable) and element count.
  std::int64_t element_begin = 0;
  std::int64_t element_count = 0;
};

/// Where every variable lives; a pure function of (model_spec, num_ps); see the file comment.
class placement {
 public:
  placement() = default;

  /// `num_ps` places, `lanes` to a PS task (place p * lanes + l). Throws
  /// system_error(errc::invalid_argument) if num_ps is 0 or not a multiple of
  /// lanes, or the spec is invalid.
  placement(const model_spec& model, std::size_t num_ps, std::size_t lanes = 1) : num_ps_(num_ps) {
    if (num_ps == 0) throw_error(errc::invalid_argument, "placement: num_ps = 0 (allowed: >= 1)");
    if (lanes == 0 || num_ps % lanes != 0) {
      throw_error(errc::invalid_argument, "placement: " + std::to_string(num_ps) +
                                              " places are not a whole number of " + std::to_string(lanes) +
                                              "-lane PS tasks");
    }
    model.validate();
    std::vector<std::uint64_t> load(num_ps, 0), task_load(num_ps / lanes, 0);
    auto better = [&](std::size_t a, std::size_t b) {
      if (load[a] != load[b]) return load[a] < load[b];
      return task_load[a / lanes] < task_load[b / lanes];
    };
    slices_.resize(model.variables.size());
    for (std::size_t i = 0; i < model.variables.size(); ++i) {
      const variable_spec& v = model.variables[i];
      if (v.kind != variable_kind::dense) continue;
      const std::uint64_t bytes = static_cast<std::uint64_t>(v.num_elements()) * sizeof(float);
      const std::int64_t rows = v.rows();
      std::uint64_t n = std::max<std::uint64_t>(1, bytes / model.min_slice_bytes);
      n = std::min<std::uint64_t>({n, num_ps, static_cast<std::uint64_t>(rows)});
      std::vector<bool> used(num_ps, false);
      std::int64_t row = 0;
      for (std::uint64_t s = 0; s < n; ++s) {
        const std::int64_t count = rows / static_cast<std::int64_t>(n) +
                                   (static_cast<std::int64_t>(s) < rows % static_cast<std::int64_t>(n) ? 1 : 0);
        std::size_t best = num_ps;
        for (std::size_t p = 0; p < num_ps; ++p) {
          if (!used[p] && (best == num_ps || better(p, best))) best = p;
        }
        used[best] = true;
        slice_info si;
        si.ps = static_cast<std::uint32_t>(best);
        si.row_begin = row;
        si.row_count = count;
        si.element_begin = row * v.row_size();
        si.element_count = count * v.row_size();
        load[best] += static_cast<std::uint64_t>(si.element_count) * sizeof(float);
        task_load[best / lanes] += static_cast<std::uint64_t>(si.element_count) * sizeof(float);
        slices_[i].push_back(si);
        row += count;
      }
    }
    load_ = std::move(load);
  }

  std::size_t num_ps() const noexcept { return num_ps_; }
  /// Slices of dense variable `var` in row order (empty for an embedding).
  std::span<const slice_info> slices(std::uint32_t var) const { return slices_.at(var); }
  /// The PS that holds embedding row `id`: hash_id(id) % num_ps.
  std::uint32_t ps_of_id(std::int64_t id) const noexcept {
    return static_cast<std::uint32_t>(hash_id(static_cast<std::uint64_t>(id)) % num_ps_);
  }
  /// Dense bytes placed on each PS.
  std::span<const std::uint64_t> dense_bytes() const noexcept { return load_; }

 private:
  std::size_t num_ps_ = 0;
  std::vector<std::vector<slice_info>> slices_;
  std::vector<std::uint64_t> load_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
