// The documents must not drift from the code: docs/configuration.md has a row
// for every environment knob with its real default (include/fusewire/core/options.hpp),
// and README.md names the two commands and links to the knob table.
#include <fusewire/core/options.hpp>

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {

/// The text of `path`, relative to the source root.
std::string read_doc(const std::string& path) {
  const std::string full = std::string(FUSEWIRE_SOURCE_DIR) + "/" + path;
  std::ifstream in(full);
  REQUIRE_MESSAGE(in.good(), "cannot open " << full);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The table row for `name` in `doc` ("| `NAME` | ..." up to the end of the line), or "" if there is none.
std::string row_of(const std::string& doc, std::string_view name) {
  const std::string start = "| `" + std::string(name) + "` |";
  const auto at = doc.find(start);
  if (at == std::string::npos) return {};
  return doc.substr(at, doc.find('\n', at) - at);
}

}  // namespace

TEST_CASE("docs/configuration.md lists every environment knob with its default") {
  const std::string doc = read_doc("docs/configuration.md");
  for (const auto& knob : fusewire::env_knobs) {
    CAPTURE(knob.name);
    const std::string row = row_of(doc, knob.name);
    REQUIRE_MESSAGE(!row.empty(), "docs/configuration.md has no table row for " << knob.name);
    const std::string expected_default =
        knob.default_value.empty() ? std::string("(unset)") : "`" + std::string(knob.default_value) + "`";
    CHECK_MESSAGE(row.find("| " + expected_default + " |") != std::string::npos,
                  "docs/configuration.md row for " << knob.name << " does not give the default " << expected_default);
  }
}

TEST_CASE("README names the two commands and links to the knob table") {
  const std::string readme = read_doc("README.md");
  CHECK(readme.find("./examples/demo.sh") != std::string::npos);
  CHECK(readme.find("./tests/run.sh") != std::string::npos);
  CHECK_MESSAGE(readme.find("](docs/configuration.md)") != std::string::npos,
                "README.md does not link to docs/configuration.md");
}
