#pragma once
// doctest helpers for the graph and tf tests; the graphs are in graphs.hpp.

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/graph/channel.hpp>
#include <fusewire/graph/graph.hpp>
#include <fusewire/graph/partition.hpp>

#include "graphs.hpp"

#include <doctest/doctest.h>

template <>
struct doctest::StringMaker<fusewire::graph::tensor> {
  static doctest::String convert(const fusewire::graph::tensor& t) { return t.to_string().c_str(); }
};

namespace test_graphs {

namespace fg = fusewire::graph;

// The what() of the std::system_error `f` throws (checking its code), or "no error".
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

}  // namespace test_graphs
