// A program that uses an installed fusewire, built by each consumer project
// in this folder (CMake, Meson, plain pkg-config). It prints one line and
// exits 0, or names what is wrong and exits 1.
//
// FUSEWIRE_EXPECTED_VERSION (optional): the version the build system found;
// it must match the headers. Each component the build requested must link
// and is exercised through fusewire's own calls:
// - FUSEWIRE_HAS_URING: an io_uring ring (a kernel that refuses one is noted
//   in the output, not a failure);
// - FUSEWIRE_HAS_RDMA: verbs::available() asks rdma-core for a device (none
//   here is noted, not a failure: the point is that libibverbs and librdmacm link);
// - FUSEWIRE_HAS_CRYPTO: provide_local_token() draws a token from libcrypto.

#include <fusewire/fusewire.hpp>

#if FUSEWIRE_HAS_RDMA
#include <fusewire/transport/verbs.hpp>
#endif
#if FUSEWIRE_HAS_CRYPTO
#include <fusewire/protocol/local_token.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

#if FUSEWIRE_HAS_URING
#include <liburing.h>
#endif

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "consumer: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main() {
#ifdef FUSEWIRE_EXPECTED_VERSION
  if (std::string_view(FUSEWIRE_EXPECTED_VERSION) != FUSEWIRE_VERSION_STRING) {
    return fail(std::string("the build system found fusewire ") + FUSEWIRE_EXPECTED_VERSION + " but the headers say " +
                FUSEWIRE_VERSION_STRING);
  }
#endif

  const std::error_code ec = fusewire::make_error_code(fusewire::errc::pool_exhausted);
  if (std::string_view(ec.category().name()) != "fusewire" || ec.message() != "buffer pool exhausted" ||
      ec.value() != 40) {
    return fail("unexpected error code: " + std::string(ec.category().name()) + ":" + std::to_string(ec.value()) +
                " '" + ec.message() + "'");
  }

  std::string uring = "";
#if FUSEWIRE_HAS_URING
  io_uring ring;
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc == 0) {
    io_uring_queue_exit(&ring);
    uring = ", io_uring ring ok";
  } else {
    uring = std::string(", io_uring linked (ring refused by the kernel: ") + std::strerror(-rc) + ")";
  }
#endif

  std::string rdma = "";
#if FUSEWIRE_HAS_RDMA
  std::string why;
  rdma = fusewire::verbs::available(why) ? ", rdma device ok" : ", rdma linked (" + why + ")";
#endif

  std::string crypto = "";
#if FUSEWIRE_HAS_CRYPTO
  ::unsetenv("FUSEWIRE_CLUSTER_TOKEN");
  ::unsetenv("FUSEWIRE_CLUSTER_TOKEN_FILE");
  const char* token = fusewire::protocol::provide_local_token() ? std::getenv("FUSEWIRE_CLUSTER_TOKEN") : nullptr;
  if (token == nullptr || std::strlen(token) != 64) return fail("provide_local_token() made no token with libcrypto");
  crypto = ", crypto token ok";
#endif

  std::printf("fusewire %s: %s:%d '%s'%s%s%s\n", FUSEWIRE_VERSION_STRING, ec.category().name(), ec.value(),
              ec.message().c_str(), uring.c_str(), rdma.c_str(), crypto.c_str());
  return 0;
}
