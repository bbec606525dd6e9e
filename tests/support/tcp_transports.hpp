#pragma once
/// The TCP transports a test runs over: asio_tcp always, uring_tcp where
/// liburing was found. A test case written once for all of them:
///   TEST_CASE_TEMPLATE_DEFINE("...", T, some_id) { ... }
///   TEST_CASE_TEMPLATE_APPLY(some_id, fusewire::test::tcp_transports);
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <tuple>

namespace fusewire::test {

#if FUSEWIRE_HAS_URING
using tcp_transports = std::tuple<fusewire::asio_tcp, fusewire::uring_tcp>;
#else
using tcp_transports = std::tuple<fusewire::asio_tcp>;
#endif

}  // namespace fusewire::test
