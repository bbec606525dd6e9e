#pragma once
/// The TensorFlow adapter: rendezvous keys, device names (graph's grammar,
/// spelled tf:: in rendezvous_key.hpp), protocol names and the tensor_fuse
/// flag, for a TensorFlow fork that embeds fusewire.

#include <fusewire/tf/protocol.hpp>
#include <fusewire/tf/rendezvous_key.hpp>
