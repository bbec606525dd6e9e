#pragma once
/// The core layer: the vocabulary every other layer of fusewire shares.

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/env.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/log.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>
#include <fusewire/core/version.hpp>
