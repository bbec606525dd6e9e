#pragma once
/// How a multi-process test runs its tasks over a given transport: where they
/// listen and how the transport object is made. TCP transports listen on
/// loopback with their defaults; verbs listens on the test guest's RDMA
/// interface (rdmacm cannot route over lo) with the small-footprint config.
#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/options.hpp>

#include "support/loopback_cluster.hpp"
#if FUSEWIRE_HAS_RDMA
#include "support/verbs_setup.hpp"
#endif

namespace fusewire::test {

template <class Transport>
struct transport_setup {
  static fusewire::cluster_spec cluster(unsigned ps, unsigned workers) { return loopback_cluster(ps, workers); }
  static Transport make() { return Transport{}; }
  /// Options every task of the test starts from.
  static void adjust(fusewire::options&) {}
};

#if FUSEWIRE_HAS_RDMA
template <>
struct transport_setup<fusewire::verbs> {
  static fusewire::cluster_spec cluster(unsigned ps, unsigned workers) { return cluster_on(rdma_host(), ps, workers); }
  static fusewire::verbs make() { return small_verbs(); }
  /// The RDMA address is the test guest's private network, not loopback: no
  /// cluster token is needed there.
  static void adjust(fusewire::options& o) { o.insecure = true; }
};
#endif

}  // namespace fusewire::test
