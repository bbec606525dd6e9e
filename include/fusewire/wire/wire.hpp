#pragma once
/// The wire layer: fusewire's versioned little-endian frame format (header,
/// per-type metadata, fused and chunk frames) and its bounded decoders.

#include <fusewire/wire/codec.hpp>
#include <fusewire/wire/descriptor.hpp>
#include <fusewire/wire/endian.hpp>
#include <fusewire/wire/frame.hpp>
#include <fusewire/wire/fused.hpp>
#include <fusewire/wire/meta.hpp>
