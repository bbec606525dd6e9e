#pragma once
/// ps::batch: the pulls and pushes of one worker step, which client::run()
/// turns into one fused request per PS and whose results it fills in.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fusewire/ps/message.hpp>
#include <fusewire/transport/concepts.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

template <transport Transport>
class client;

/// The pulls and pushes of one step. Reusable: clear() keeps capacity.
class batch {
 public:
  /// Names a pull's result.
  using handle = std::size_t;

  /// Pulls the whole dense variable `var` (row-major, every slice).
  handle pull(std::string_view var) { return add(op::pull_dense, var, {}, {}); }
  /// Pulls the rows `ids` of embedding `var` (copied); the result is ids.size() * dim floats in ids' order.
  handle pull_rows(std::string_view var, std::span<const std::int64_t> ids) { return add(op::pull_rows, var, ids, {}); }
  /// Pushes the gradient of dense `var` (all its elements). `grad` must stay valid until run() returns.
  void push(std::string_view var, std::span<const float> grad) { add(op::push_dense, var, {}, grad); }
  /// Pushes gradients of rows `ids` (ids copied; `grads`: ids.size() * dim floats, valid until run()
  /// returns). Gradients of a repeated id are summed and applied once.
  void push_rows(std::string_view var, std::span<const std::int64_t> ids, std::span<const float> grads) {
    add(op::push_rows, var, ids, grads);
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

  struct item {
    op kind;
    std::string var;
    std::vector<std::int64_t> ids;
    std::span<const float> values;
    handle result = 0;
  };

  handle add(op kind, std::string_view var, std::span<const std::int64_t> ids, std::span<const float> values) {
    item it{kind, std::string(var), std::vector<std::int64_t>(ids.begin(), ids.end()), values, 0};
    if (!is_push(kind)) {
      it.result = pulls_++;
      if (results_.size() < pulls_) results_.resize(pulls_);
    }
    items_.push_back(std::move(it));
    return items_.back().result;
  }

  std::vector<item> items_;
  std::vector<std::vector<float>> results_;
  std::size_t pulls_ = 0;
  std::string error_;
};

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
