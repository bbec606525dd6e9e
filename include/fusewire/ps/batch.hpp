#pragma once
/// ps::batch: the pulls and pushes of one worker step, which client::run()
/// turns into one fused request per PS and whose results it fills in.
/// ps::variable_handle: a variable resolved once (client::variable()), so a
/// step names it by index instead of looking its name up.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

template <transport Transport>
class client;
class batch;

/// A variable of one client's model, resolved once by client::variable(name).
/// Cheap to copy; valid for every client made with the same model and PS
/// count (a batch naming it on another model fails run() with invalid_argument).
class variable_handle {
 public:
  variable_handle() = default;

  /// Index in the model's variables.
  std::uint32_t index() const noexcept { return index_; }
  variable_kind kind() const noexcept { return kind_; }
  /// Dense: every element of the variable. Embedding: the values of one row (dim).
  std::size_t size() const noexcept { return size_; }
  /// False for a default-constructed handle.
  bool valid() const noexcept { return model_ != 0; }

 private:
  template <transport>
  friend class client;
  friend class batch;
  variable_handle(std::uint32_t index, variable_kind kind, std::size_t size, std::uint64_t model) noexcept
      : index_(index), kind_(kind), size_(size), model_(model) {}

  std::uint32_t index_ = 0;
  variable_kind kind_ = variable_kind::dense;
  std::size_t size_ = 0;
  std::uint64_t model_ = 0;  ///< the model's fingerprint (with its PS count); 0 = none
};

/// The pulls and pushes of one step. Reusable: clear() keeps capacity.
///
/// Memory a step refers to — gradients, the ids given with a handle, and the
/// destinations of pull_into() — must stay valid until run() returns; run()
/// sends gradients from it and writes pulled values into it without staging
/// copies. The ids given with a name are copied.
class batch {
 public:
  /// Names a pull's result (pulls without a destination).
  using handle = std::size_t;

  /// Pulls the whole dense variable `var` (row-major, every slice).
  handle pull(std::string_view var) { return add_named(op::pull_dense, var, {}, {}); }
  handle pull(const variable_handle& var) { return add(op::pull_dense, var, {}, {}, {}, false); }
  /// Pulls dense `var` into `out` (var.size() floats, else run() fails with errc::size_mismatch).
  void pull_into(const variable_handle& var, std::span<float> out) { add(op::pull_dense, var, {}, {}, out, true); }
  /// Pulls the rows `ids` of embedding `var`; the result is ids.size() * dim floats in ids' order.
  /// A repeated id is fetched once and copied to each of its positions.
  handle pull_rows(std::string_view var, std::span<const std::int64_t> ids) {
    return add_named(op::pull_rows, var, ids, {});
  }
  handle pull_rows(const variable_handle& var, std::span<const std::int64_t> ids) {
    return add(op::pull_rows, var, ids, {}, {}, false);
  }
  /// Pulls the rows `ids` of embedding `var` into `out` (ids.size() * dim floats, in ids' order).
  void pull_rows_into(const variable_handle& var, std::span<const std::int64_t> ids, std::span<float> out) {
    add(op::pull_rows, var, ids, {}, out, true);
  }
  /// Pushes the gradient of dense `var` (all its elements).
  void push(std::string_view var, std::span<const float> grad) { add_named(op::push_dense, var, {}, grad); }
  void push(const variable_handle& var, std::span<const float> grad) { add(op::push_dense, var, {}, grad, {}, false); }
  /// Pushes gradients of rows `ids` (`grads`: ids.size() * dim floats). The
  /// gradients of a repeated id are summed before they are sent, and applied once.
  void push_rows(std::string_view var, std::span<const std::int64_t> ids, std::span<const float> grads) {
    add_named(op::push_rows, var, ids, grads);
  }
  void push_rows(const variable_handle& var, std::span<const std::int64_t> ids, std::span<const float> grads) {
    add(op::push_rows, var, ids, grads, {}, false);
  }

  /// A pull's values after a successful run().
  std::span<const float> result(handle h) const { return results_.at(h); }
  std::span<float> result(handle h) { return results_.at(h); }
  /// Moves a pull's values out.
  std::vector<float> take(handle h) { return std::move(results_.at(h)); }

  /// Why the last run(b, ec) failed (names the PS and variable); empty after success.
  const std::string& error_message() const noexcept { return error_; }
  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return items_.empty(); }
  /// Forgets every pull and push; result storage is kept for reuse (its contents are unspecified until the next run()).
  void clear() noexcept {
    items_.clear();
    pulls_ = 0;
    error_.clear();
  }

 private:
  template <transport>
  friend class client;

  static constexpr std::uint32_t by_name = static_cast<std::uint32_t>(-1);

  struct item {
    op kind;
    std::uint32_t var = by_name;  ///< a handle's index, or by_name: look `name` up
    std::uint64_t model = 0;      ///< the handle's model fingerprint
    std::string name;             ///< by_name only
    std::vector<std::int64_t> own_ids;
    std::span<const std::int64_t> caller_ids;
    bool owns_ids = false;
    std::span<const float> values;
    std::span<float> into;  ///< pull_into: the destination; else the result is results_[result]
    bool has_into = false;
    handle result = 0;

    std::span<const std::int64_t> ids() const noexcept {
      return owns_ids ? std::span<const std::int64_t>(own_ids) : caller_ids;
    }
  };

  handle add_named(op kind, std::string_view var, std::span<const std::int64_t> ids, std::span<const float> values) {
    item& it = items_.emplace_back();
    it.kind = kind;
    it.name.assign(var);
    it.own_ids.assign(ids.begin(), ids.end());
    it.owns_ids = true;
    it.values = values;
    return finish(it);
  }

  handle add(op kind, const variable_handle& var, std::span<const std::int64_t> ids, std::span<const float> values,
             std::span<float> into, bool has_into) {
    item& it = items_.emplace_back();
    it.kind = kind;
    it.var = var.index_;
    it.model = var.model_;
    it.caller_ids = ids;
    it.values = values;
    it.into = into;
    it.has_into = has_into;
    return finish(it);
  }

  handle finish(item& it) {
    if (!is_push(it.kind) && !it.has_into) {
      it.result = pulls_++;
      if (results_.size() < pulls_) results_.resize(pulls_);
    }
    return it.result;
  }

  std::vector<item> items_;
  std::vector<std::vector<float>> results_;
  std::size_t pulls_ = 0;
  std::string error_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
