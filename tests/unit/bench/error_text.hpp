#pragma once
// The message of a std::system_error thrown by `f`, without the ": <category
// message>" suffix, after checking it carries `expected`.

#include <doctest/doctest.h>

#include <fusewire/core/error.hpp>
#include <string>
#include <system_error>

namespace fusewire::bench::test {

template <typename F>
std::string error_of(F&& f, errc expected = errc::invalid_argument) {
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

}  // namespace fusewire::bench::test
