// The transport test suite for the shm transport (not a handoff_transport:
// the hand-off cases do not apply), with single copy off (the default) and on,
// and on io_uring's reactor. Server and client run on different reactors.
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/shm.hpp>

#include <doctest/doctest.h>

#include <tuple>

namespace fw = fusewire;

static_assert(fw::transport<fw::shm>);
static_assert(!fw::handoff_transport<fw::shm>);

#include "transport_suite.hpp"

namespace shm_suite_cases {

/// shm with single copy on (it is off by default): the suite again, with
/// every piece of 64 KiB or more copied by the reader out of the writer's memory.
struct shm_single_copy : fw::shm {
  shm_single_copy() : fw::shm(on()) {}
  static fw::shm::config on() {
    fw::shm::config c;
    c.single_copy_min = 64 * 1024;
    return c;
  }
};
static_assert(fw::transport<shm_single_copy>);

#if FUSEWIRE_HAS_URING
static_assert(fw::transport<fw::uring_shm>);
using shm_transports = std::tuple<fw::shm, shm_single_copy, fw::uring_shm>;
#else
using shm_transports = std::tuple<fw::shm, shm_single_copy>;
#endif

TEST_CASE_TEMPLATE_APPLY(suite_connect_accept, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_echo, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_scatter_gather, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_buffers, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_back_to_back_writes, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_order, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_read, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_empty_write, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_read_past_close, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_many_connections, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_close_cancels, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_peer_closes, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_connect_refused, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_listen_errors, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_off_thread, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_group_stop, shm_transports);
TEST_CASE_TEMPLATE_APPLY(suite_try_read, shm_transports);

}  // namespace shm_suite_cases
