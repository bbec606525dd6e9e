#pragma once
/// The umbrella header: includes every layer of fusewire that this system can
/// build (transports whose system headers are missing are left out).

#include <fusewire/core/version.hpp>
#include <fusewire/core/core.hpp>
#include <fusewire/wire/wire.hpp>
#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/shm.hpp>
#if defined(FUSEWIRE_HAS_URING) && __has_include(<liburing.h>)
#include <fusewire/transport/uring_tcp.hpp>
#endif
// verbs needs -libverbs -lrdmacm at link time: only with fusewire-rdma
// (pkg-config), fusewire::rdma (CMake) or fusewire_rdma_dep (Meson).
#if defined(FUSEWIRE_HAS_RDMA) && __has_include(<infiniband/verbs.h>) && __has_include(<rdma/rdma_cma.h>)
#include <fusewire/transport/verbs.hpp>
#endif
#include <fusewire/transport/select.hpp>
#include <fusewire/protocol/frame_channel.hpp>
#include <fusewire/rendezvous/endpoint.hpp>
#include <fusewire/ps/ps.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/graph/executor.hpp>
#include <fusewire/graph/local_cluster.hpp>
#include <fusewire/graph/payload_codec.hpp>
#include <fusewire/graph/rendezvous_channel.hpp>
#include <fusewire/tf/tf.hpp>
