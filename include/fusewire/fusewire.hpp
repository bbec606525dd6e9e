#pragma once
/// The umbrella header: includes every layer of fusewire that this system can
/// build (transports whose system headers are missing are left out).

#include <fusewire/core/version.hpp>
#include <fusewire/core/core.hpp>
#include <fusewire/wire/wire.hpp>
