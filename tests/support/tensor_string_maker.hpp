#pragma once
/// How doctest prints a graph::tensor in a failed check: its to_string().
#include <fusewire/graph/channel.hpp>

#include <doctest/doctest.h>

template <>
struct doctest::StringMaker<fusewire::graph::tensor> {
  static doctest::String convert(const fusewire::graph::tensor& t) { return t.to_string().c_str(); }
};
