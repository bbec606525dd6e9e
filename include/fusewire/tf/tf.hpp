#pragma once
/// The TensorFlow adapter: rendezvous keys, device names, protocol names and
/// the tensor_fuse flag, for a TensorFlow fork that embeds fusewire.

#include <fusewire/tf/device_name.hpp>
#include <fusewire/tf/protocol.hpp>
#include <fusewire/tf/rendezvous_key.hpp>
