#pragma once
/// fusewire's library version (the wire protocol has its own, in wire/).

#define FUSEWIRE_VERSION_MAJOR 0
#define FUSEWIRE_VERSION_MINOR 1
#define FUSEWIRE_VERSION_PATCH 0
#define FUSEWIRE_VERSION_STRING "0.1.0"
