#include <fusewire/core/env.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <cstdlib>

TEST_CASE("process_env reads the process environment") {
  REQUIRE(::setenv("FUSEWIRE_TEST_ENV_KNOB", "on", 1) == 0);
  ::unsetenv("FUSEWIRE_TEST_ENV_UNSET");
  const fusewire::env_lookup env = fusewire::process_env();
  CHECK(env("FUSEWIRE_TEST_ENV_KNOB") == std::optional<std::string>("on"));
  CHECK_FALSE(env("FUSEWIRE_TEST_ENV_UNSET").has_value());
  REQUIRE(::setenv("FUSEWIRE_TEST_ENV_KNOB", "", 1) == 0);
  CHECK(env("FUSEWIRE_TEST_ENV_KNOB") == std::optional<std::string>(""));
  ::unsetenv("FUSEWIRE_TEST_ENV_KNOB");
}
