// A program that uses an installed fusewire, built by each consumer project
// in this folder (CMake, Meson, plain pkg-config). It prints one line and
// exits 0, or names what is wrong and exits 1.
//
// FUSEWIRE_EXPECTED_VERSION (optional): the version the build system found;
// it must match the headers. FUSEWIRE_HAS_URING: the uring flavour was
// requested, so liburing must link (a kernel that refuses a ring is a skip
// noted in the output, not a failure).

#include <fusewire/fusewire.hpp>

#include <cstdio>
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

  std::printf("fusewire %s: %s:%d '%s'%s\n", FUSEWIRE_VERSION_STRING, ec.category().name(), ec.value(),
              ec.message().c_str(), uring.c_str());
  return 0;
}
