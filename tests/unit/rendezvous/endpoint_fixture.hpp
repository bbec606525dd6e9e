#pragma once
// What every rendezvous::endpoint test file starts with: the endpoint and both
// transports, the usual aliases, TRANSPORTS for TEST_CASE_TEMPLATE, and the
// task ids of the test clusters.
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#if FUSEWIRE_HAS_URING
#include <fusewire/transport/uring_tcp.hpp>
#endif

#include <chrono>

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;

#if FUSEWIRE_HAS_URING
#define TRANSPORTS fw::asio_tcp, fw::uring_tcp
#else
#define TRANSPORTS fw::asio_tcp
#endif

inline const fw::task_id ps0{"ps", 0};
inline const fw::task_id w0{"worker", 0};
inline const fw::task_id w1{"worker", 1};
