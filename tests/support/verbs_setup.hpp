#pragma once
/// The verbs setup of the RDMA tests: where the test device lives and a
/// small-footprint transport config (the QEMU guest has little memory).
#include <fusewire/transport/verbs.hpp>

#include <cstdlib>
#include <string>

namespace fusewire::test {

/// The address of the RDMA-capable interface (FUSEWIRE_RDMA_TEST_ADDR, default
/// 192.0.2.1: the guest's rxe0 netdev; rdmacm cannot route over lo).
inline std::string rdma_host() {
  const char* a = std::getenv("FUSEWIRE_RDMA_TEST_ADDR");
  return a != nullptr && *a != '\0' ? std::string(a) : std::string("192.0.2.1");
}

/// Small slots and budgets: ~12 MiB registered per reactor.
/// FUSEWIRE_RDMA_TEST_WRITE_THRESHOLD=0 runs everything over SEND messages.
inline fusewire::verbs_config small_verbs_config() {
  fusewire::verbs_config c;
  const char* dev = std::getenv("TF_RDMA_DEV_NAME");
  c.device = dev != nullptr && *dev != '\0' ? dev : "rxe0";
  c.message_size = 16 * 1024;
  c.credits = 4;
  c.max_connections = 160;
  c.sq_depth = 16;
  c.send_slots = 64;
  c.rx_buffer_limit = 1u << 20;
  c.rdma_write_threshold = 8192;  // writes above 8 KiB go by RDMA write ...
  c.chunk_size = 256 * 1024;      // ... in chunks of 256 KiB (64 MiB = 256 chunks)
  c.staging_blocks = 8;
  c.max_grants = 2;
  if (const char* t = std::getenv("FUSEWIRE_RDMA_TEST_WRITE_THRESHOLD"); t != nullptr && *t != '\0') {
    c.rdma_write_threshold = std::strtoull(t, nullptr, 10);
  }
  return c;
}

/// A verbs transport with small_verbs_config().
inline fusewire::verbs small_verbs() { return fusewire::verbs(small_verbs_config()); }

}  // namespace fusewire::test
