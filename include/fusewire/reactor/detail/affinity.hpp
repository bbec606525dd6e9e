#pragma once
/// CPU affinity helpers: the CPUs this process may use, and pinning a thread
/// to one of them. Private to the reactor layer.

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <system_error>
#include <vector>

namespace fusewire {
inline namespace v0 {
namespace detail {

/// The CPUs the calling thread may run on (its sched_getaffinity mask), ascending.
inline std::vector<int> allowed_cpus(std::error_code& ec) {
  ec.clear();
  std::vector<int> cpus;
  for (int ncpu = CPU_SETSIZE;; ncpu *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpu);
    if (set == nullptr) {
      ec = std::make_error_code(std::errc::not_enough_memory);
      return {};
    }
    const std::size_t bytes = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(bytes, set);
    if (::sched_getaffinity(0, bytes, set) == 0) {
      for (int cpu = 0; cpu < ncpu; ++cpu) {
        if (CPU_ISSET_S(cpu, bytes, set)) cpus.push_back(cpu);
      }
      CPU_FREE(set);
      return cpus;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL || ncpu >= (1 << 20)) {
      ec = std::error_code(err, std::system_category());
      return {};
    }
  }
}

/// Restricts `thread` to the single CPU `cpu`.
inline std::error_code pin_thread(pthread_t thread, int cpu) {
  const int ncpu = cpu + 1;
  cpu_set_t* set = CPU_ALLOC(ncpu);
  if (set == nullptr) return std::make_error_code(std::errc::not_enough_memory);
  const std::size_t bytes = CPU_ALLOC_SIZE(ncpu);
  CPU_ZERO_S(bytes, set);
  CPU_SET_S(cpu, bytes, set);
  const int rc = ::pthread_setaffinity_np(thread, bytes, set);
  CPU_FREE(set);
  return rc == 0 ? std::error_code() : std::error_code(rc, std::system_category());
}

}  // namespace detail
}  // namespace v0
}  // namespace fusewire
