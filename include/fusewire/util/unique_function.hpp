#pragma once
/// Move-only type-erased callables and an intrusive task list: the currency of
/// reactor inboxes, transport handlers and rendezvous completions.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include <fusewire/util/node_cache.hpp>

namespace fusewire {
inline namespace v0 {
namespace util {

template <class Signature>
class unique_function;

/// A move-only std::function: holds small callables inline, larger ones on the heap.
template <class R, class... Args>
class unique_function<R(Args...)> {
 public:
  unique_function() noexcept = default;
  unique_function(std::nullptr_t) noexcept {}

  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, unique_function> &&
             std::is_invocable_r_v<R, std::decay_t<F>&, Args...> && std::is_constructible_v<std::decay_t<F>, F &&>)
  unique_function(F&& f) {  // NOLINT: implicit, like std::function
    using Fn = std::decay_t<F>;
    if constexpr (fits_inline<Fn>()) {
      ::new (static_cast<void*>(storage_)) Fn(std::forward<F>(f));
      ops_ = &inline_ops<Fn>;
    } else {
      *reinterpret_cast<Fn**>(storage_) = new Fn(std::forward<F>(f));
      ops_ = &heap_ops<Fn>;
    }
  }

  unique_function(unique_function&& other) noexcept : ops_(other.ops_) {
    if (ops_ != nullptr) {
      ops_->move(storage_, other.storage_);
      other.ops_ = nullptr;
    }
  }

  unique_function& operator=(unique_function&& other) noexcept {
    if (this != &other) {
      reset();
      ops_ = other.ops_;
      if (ops_ != nullptr) {
        ops_->move(storage_, other.storage_);
        other.ops_ = nullptr;
      }
    }
    return *this;
  }

  unique_function(const unique_function&) = delete;
  unique_function& operator=(const unique_function&) = delete;

  ~unique_function() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  R operator()(Args... args) { return ops_->call(storage_, std::forward<Args>(args)...); }

  void reset() noexcept {
    if (ops_ != nullptr) {
      ops_->destroy(storage_);
      ops_ = nullptr;
    }
  }

 private:
  // A continuation of two shared_ptrs, `this` and a small capture fits (the
  // endpoint's per-frame continuations do: no heap block per message).
  static constexpr std::size_t inline_size = 64;

  struct ops_table {
    R (*call)(void*, Args&&...);
    void (*move)(void* dst, void* src) noexcept;
    void (*destroy)(void*) noexcept;
  };

  template <class Fn>
  static constexpr bool fits_inline() {
    return sizeof(Fn) <= inline_size && alignof(Fn) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<Fn>;
  }

  template <class Fn>
  static constexpr ops_table inline_ops{
      [](void* s, Args&&... a) -> R { return std::invoke(*static_cast<Fn*>(s), std::forward<Args>(a)...); },
      [](void* d, void* s) noexcept {
        ::new (d) Fn(std::move(*static_cast<Fn*>(s)));
        static_cast<Fn*>(s)->~Fn();
      },
      [](void* s) noexcept { static_cast<Fn*>(s)->~Fn(); }};

  template <class Fn>
  static constexpr ops_table heap_ops{
      [](void* s, Args&&... a) -> R { return std::invoke(**static_cast<Fn**>(s), std::forward<Args>(a)...); },
      [](void* d, void* s) noexcept { *static_cast<Fn**>(d) = *static_cast<Fn**>(s); },
      [](void* s) noexcept { delete *static_cast<Fn**>(s); }};

  alignas(std::max_align_t) unsigned char storage_[inline_size];
  const ops_table* ops_ = nullptr;
};

/// A node holding one `void()` job; queues link these intrusively. Most are
/// heap nodes (make_task, recycled per thread: node_cache); a task embedded in a
/// longer-lived object overrides dispose() and is queued without an allocation.
class task {
 public:
  task() = default;
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  virtual ~task() = default;
  virtual void run() = 0;
  /// Called once a queue is done with the task, whether it ran or was dropped.
  virtual void dispose() noexcept { delete this; }

  task* next_ = nullptr;
};

/// task_ptr's deleter: hands the task back to its owner (task::dispose).
struct task_disposer {
  void operator()(task* t) const noexcept { t->dispose(); }
};

/// make_task's node: frees itself through the allocator that made it.
template <class F>
class task_impl final : public task {
 public:
  template <class G>
  explicit task_impl(G&& g) : fn_(std::forward<G>(g)) {}
  void run() override { fn_(); }
  void dispose() noexcept override {
    this->~task_impl();
    recycling_allocator<task_impl>{}.deallocate(this, 1);
  }

 private:
  F fn_;
};

using task_ptr = std::unique_ptr<task, task_disposer>;

template <class F>
task_ptr make_task(F&& f) {
  using T = task_impl<std::decay_t<F>>;
  recycling_allocator<T> alloc;
  T* node = alloc.allocate(1);
  try {
    return task_ptr(::new (static_cast<void*>(node)) T(std::forward<F>(f)));
  } catch (...) {
    alloc.deallocate(node, 1);
    throw;
  }
}

/// FIFO of tasks linked through task::next_. Single-threaded.
class task_list {
 public:
  task_list() = default;
  task_list(task_list&& other) noexcept
      : head_(std::exchange(other.head_, nullptr)),
        tail_(std::exchange(other.tail_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  task_list& operator=(task_list&& other) noexcept {
    if (this != &other) {
      clear();
      head_ = std::exchange(other.head_, nullptr);
      tail_ = std::exchange(other.tail_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  task_list(const task_list&) = delete;
  task_list& operator=(const task_list&) = delete;
  ~task_list() { clear(); }

  bool empty() const noexcept { return head_ == nullptr; }
  std::size_t size() const noexcept { return size_; }

  void push_back(task_ptr t) noexcept {
    task* raw = t.release();
    raw->next_ = nullptr;
    if (tail_ != nullptr) {
      tail_->next_ = raw;
    } else {
      head_ = raw;
    }
    tail_ = raw;
    ++size_;
  }

  task_ptr pop_front() noexcept {
    task* raw = head_;
    if (raw == nullptr) return nullptr;
    head_ = raw->next_;
    if (head_ == nullptr) tail_ = nullptr;
    raw->next_ = nullptr;
    --size_;
    return task_ptr(raw);
  }

  void clear() noexcept {
    while (task_ptr t = pop_front()) {
    }
  }

 private:
  task* head_ = nullptr;
  task* tail_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace util
}  // namespace v0
}  // namespace fusewire
