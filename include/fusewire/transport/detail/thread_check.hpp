#pragma once
/// Refuses transport calls made off the owning reactor's thread (a silent data
/// race otherwise). Private to the transport layer.

#include <concepts>
#include <string>

#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// Throws std::system_error(errc::invalid_argument) unless called on `r`'s thread.
template <class Reactor>
  requires requires(const Reactor& r) {
    { r.on_reactor_thread() } -> std::same_as<bool>;
    r.index();
  }
void check_reactor_thread(const Reactor& r, const char* who, const char* what) {
  if (!r.on_reactor_thread()) {
    throw_error(errc::invalid_argument, std::string(who) + "::" + what + " called off the thread of reactor " +
                                            std::to_string(r.index()) + " that owns it");
  }
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
