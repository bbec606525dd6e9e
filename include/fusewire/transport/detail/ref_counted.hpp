#pragma once
/// Single-threaded intrusive reference counting for connection and listener
/// state shared between a handle and its in-flight operations. Private to the
/// transport layer.

#include <cstddef>
#include <utility>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// Base of objects kept alive by ref_ptr; counts are touched on one thread only.
class ref_counted {
 public:
  ref_counted(const ref_counted&) = delete;
  ref_counted& operator=(const ref_counted&) = delete;

  void add_ref() noexcept { ++refs_; }
  void release() noexcept {
    if (--refs_ == 0) delete this;
  }
  std::size_t use_count() const noexcept { return refs_; }

 protected:
  ref_counted() noexcept = default;
  virtual ~ref_counted() = default;

 private:
  std::size_t refs_ = 0;
};

/// A counted reference to a ref_counted T.
template <class T>
class ref_ptr {
 public:
  ref_ptr() noexcept = default;
  explicit ref_ptr(T* p) noexcept : p_(p) {
    if (p_ != nullptr) p_->add_ref();
  }
  ref_ptr(const ref_ptr& o) noexcept : ref_ptr(o.p_) {}
  ref_ptr(ref_ptr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ref_ptr& operator=(ref_ptr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~ref_ptr() { reset(); }

  void reset() noexcept {
    if (T* p = std::exchange(p_, nullptr)) p->release();
  }
  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
