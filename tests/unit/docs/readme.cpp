// The README documents every environment knob with its real default, so the
// table cannot drift from include/fusewire/core/options.hpp.
#include <fusewire/core/options.hpp>

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read_readme() {
  std::ifstream in(FUSEWIRE_SOURCE_DIR "/README.md");
  REQUIRE_MESSAGE(in.good(), "cannot open " FUSEWIRE_SOURCE_DIR "/README.md");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The README's table row for `name`, or "" if there is none.
std::string row_of(const std::string& readme, std::string_view name) {
  const std::string start = "| `" + std::string(name) + "` |";
  const auto at = readme.find(start);
  if (at == std::string::npos) return {};
  return readme.substr(at, readme.find('\n', at) - at);
}

}  // namespace

TEST_CASE("README lists every environment knob with its default") {
  const std::string readme = read_readme();
  for (const auto& knob : fusewire::env_knobs) {
    CAPTURE(knob.name);
    const std::string row = row_of(readme, knob.name);
    REQUIRE_MESSAGE(!row.empty(), "README.md has no table row for " << knob.name);
    const std::string expected_default =
        knob.default_value.empty() ? std::string("(unset)") : "`" + std::string(knob.default_value) + "`";
    CHECK_MESSAGE(row.find("| " + expected_default + " |") != std::string::npos,
                  "README.md row for " << knob.name << " does not give the default " << expected_default);
  }
}

TEST_CASE("README names the two commands") {
  const std::string readme = read_readme();
  CHECK(readme.find("./examples/demo.sh") != std::string::npos);
  CHECK(readme.find("./tests/run.sh") != std::string::npos);
}
