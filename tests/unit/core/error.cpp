#include <fusewire/core/error.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it

#include <string>
#include <system_error>

using fusewire::errc;

TEST_CASE("errc converts to error_code in the fusewire category") {
  std::error_code ec = errc::pool_exhausted;
  CHECK(ec.category().name() == std::string("fusewire"));
  CHECK(&ec.category() == &fusewire::error_category());
  CHECK(ec.value() == 40);
  CHECK(ec.message() == "buffer pool exhausted");
  CHECK(ec == errc::pool_exhausted);
  CHECK(ec != errc::out_of_memory);
  CHECK(fusewire::make_error_code(errc::timed_out) == errc::timed_out);
}

TEST_CASE("errc::ok is success") {
  std::error_code ec = errc::ok;
  // A fusewire code with value 0 is still falsy, like every error_code.
  CHECK_FALSE(ec);
  CHECK(ec.message() == "success");
}

TEST_CASE("fusewire errors map to portable conditions") {
  CHECK(std::error_code(errc::invalid_config) == std::errc::invalid_argument);
  CHECK(std::error_code(errc::invalid_argument) == std::errc::invalid_argument);
  CHECK(std::error_code(errc::pool_exhausted) == std::errc::no_buffer_space);
  CHECK(std::error_code(errc::timed_out) == std::errc::timed_out);
  CHECK(std::error_code(errc::cancelled) == std::errc::operation_canceled);
  CHECK(std::error_code(errc::connection_refused) == std::errc::connection_refused);
  CHECK(std::error_code(errc::connection_reset) == std::errc::connection_reset);
  CHECK(std::error_code(errc::truncated_frame) == std::errc::bad_message);
  CHECK(std::error_code(errc::frame_too_large) == std::errc::message_size);
  CHECK(std::error_code(errc::auth_failed) == std::errc::permission_denied);
  CHECK(std::error_code(errc::not_supported) == std::errc::not_supported);
  // Codes without a portable equivalent match only themselves.
  CHECK(std::error_code(errc::graph_cycle) != std::errc::invalid_argument);
  CHECK(std::error_code(errc::graph_cycle).default_error_condition().category() == fusewire::error_category());
}

TEST_CASE("every named code has its own message; unknown values say so") {
  for (int v : {1, 2, 20, 21, 22, 23, 24, 25, 40, 41, 60, 61, 62, 63, 64, 80, 81, 82, 83, 84, 85, 100, 101}) {
    const std::string m = fusewire::error_category().message(v);
    CAPTURE(v);
    CHECK(m.find("unknown fusewire error") == std::string::npos);
  }
  CHECK(fusewire::error_category().message(7) == "unknown fusewire error 7");
}

TEST_CASE("throw_error throws system_error with the code and the message") {
  try {
    fusewire::throw_error(errc::invalid_config, "FOO='x': expected a boolean");
    FAIL("throw_error returned");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_config);
    CHECK(std::string(e.what()) == "FOO='x': expected a boolean: invalid configuration");
  }
}
