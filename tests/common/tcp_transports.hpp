#pragma once
// The TCP transports a test runs over: asio_tcp always, uring_tcp where
// liburing was found. TRANSPORTS lists them for TEST_CASE_TEMPLATE.
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#define TRANSPORTS fusewire::asio_tcp, fusewire::uring_tcp
#else
#define TRANSPORTS fusewire::asio_tcp
#endif
