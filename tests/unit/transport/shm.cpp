#include <fusewire/transport/shm.hpp>
