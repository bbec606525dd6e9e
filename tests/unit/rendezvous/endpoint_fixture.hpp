#pragma once
// What every rendezvous::endpoint test file starts with: the endpoint and both
// transports, the usual aliases, TRANSPORTS for TEST_CASE_TEMPLATE, and the
// task ids of the test clusters.
#include <fusewire/rendezvous/endpoint.hpp>

#include <chrono>

#include "../../common/tcp_transports.hpp"

namespace fw = fusewire;
namespace rv = fusewire::rendezvous;
using namespace std::chrono_literals;

inline const fw::task_id ps0{"ps", 0};
inline const fw::task_id w0{"worker", 0};
inline const fw::task_id w1{"worker", 1};
