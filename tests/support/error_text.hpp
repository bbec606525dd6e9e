#pragma once
/// The text of the std::system_error a call throws, after checking its code:
/// whole (error_of) or without the ": <code message>" suffix (error_text_of).
#include <fusewire/core/error.hpp>

#include <doctest/doctest.h>

#include <concepts>
#include <string>
#include <system_error>

namespace fusewire::test {

/// The what() of the std::system_error `f` throws (checking its code), or "no error".
template <std::invocable F>
std::string error_of(F f, fusewire::errc expected) {
  try {
    f();
  } catch (const std::system_error& e) {
    CHECK(e.code() == expected);
    return e.what();
  }
  return "no error";
}

/// The message of the std::system_error `f` throws, without the ": <category
/// message>" suffix, after checking it carries `expected`; "(no error)" if it
/// throws none.
template <typename F>
std::string error_text_of(F&& f, errc expected = errc::invalid_argument) {
  try {
    f();
  } catch (const std::system_error& e) {
    CHECK(e.code().value() == static_cast<int>(expected));
    CHECK(e.code().category().name() == std::string("fusewire"));
    std::string text = e.what();
    const std::string suffix = ": " + e.code().message();
    if (text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      text.resize(text.size() - suffix.size());
    }
    return text;
  }
  return "(no error)";
}

}  // namespace fusewire::test
