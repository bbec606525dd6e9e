#pragma once
/// env_lookup: how configuration code reads environment variables, so tests
/// (and embedders) can supply their own without touching the process env.

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace fusewire {
inline namespace v0 {

/// Returns the value of the variable named by its argument, or nullopt if unset.
using env_lookup = std::function<std::optional<std::string>(std::string_view)>;

/// The lookup that reads this process's environment (std::getenv).
inline env_lookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const std::string key(name);
    const char* value = std::getenv(key.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

}  // namespace v0
}  // namespace fusewire
