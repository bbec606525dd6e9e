#pragma once
/// Device-level helpers of the verbs transport: choosing the RDMA device,
/// the protection domain shared by everything registered on it, and memory
/// registration within TF_RDMA_BUF_SIZE with a memlock diagnosis. Private
/// to the transport layer.

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/transport/verbs/config.hpp>

namespace fusewire {
inline namespace v0 {

namespace detail {

/// A protection domain; shared (shared_ptr) by every registration made in it,
/// so a pool whose buffers outlive the transport still deregisters before the
/// domain goes away.
class verbs_pd {
 public:
  explicit verbs_pd(ibv_context* ctx) : ctx_(ctx), pd_(ibv_alloc_pd(ctx)) {
    if (pd_ == nullptr) {
      throw std::system_error(errno != 0 ? errno : ENOMEM, std::system_category(),
                              std::string("verbs: ibv_alloc_pd on ") + ibv_get_device_name(ctx->device) + " failed");
    }
  }
  verbs_pd(const verbs_pd&) = delete;
  verbs_pd& operator=(const verbs_pd&) = delete;
  ~verbs_pd() { ibv_dealloc_pd(pd_); }

  ibv_pd* get() const noexcept { return pd_; }
  ibv_context* context() const noexcept { return ctx_; }

 private:
  ibv_context* ctx_;
  ibv_pd* pd_;
};

/// The process's RLIMIT_MEMLOCK soft limit as text ("unlimited" or "N bytes").
inline std::string memlock_limit_text() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(static_cast<unsigned long long>(rl.rlim_cur)) + " bytes";
}

/// ibv_reg_mr for local writes and remote writes, within `budget`
/// (TF_RDMA_BUF_SIZE): the bytes are taken from it first, so a registration
/// past it fails before anything is locked. Throws
/// system_error(errc::out_of_memory) naming TF_RDMA_BUF_SIZE, or, when the
/// kernel refuses, the size, the memlock limit and how to raise it.
inline registration register_memory(verbs_pd& pd, registered_budget& budget, void* base, std::size_t len) {
  budget.take(len);
  ibv_mr* mr = ibv_reg_mr(pd.get(), base, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr == nullptr) {
    const int err = errno;
    const std::size_t locked = budget.used();
    budget.give_back(len);
    // The kernel's limit is below what TF_RDMA_BUF_SIZE allows: raising the
    // memlock limit to TF_RDMA_BUF_SIZE per reactor keeps the kernel from
    // refusing, and lowering TF_RDMA_BUF_SIZE only turns this into the
    // budget's error.
    throw_error(errc::out_of_memory,
                "verbs: ibv_reg_mr of " + std::to_string(len) + " bytes on " +
                    ibv_get_device_name(pd.context()->device) + " failed (" + std::generic_category().message(err) +
                    "); RLIMIT_MEMLOCK is " + memlock_limit_text() + " and this reactor would hold " +
                    std::to_string(locked) + " bytes locked (TF_RDMA_BUF_SIZE allows " +
                    std::to_string(budget.limit()) +
                    "): raise it to at least TF_RDMA_BUF_SIZE per reactor (ulimit -l unlimited, memlock in "
                    "/etc/security/limits.conf, LimitMEMLOCK=infinity for systemd, --ulimit memlock=-1 for docker)");
  }
  registration r;
  r.lkey = mr->lkey;
  r.rkey = mr->rkey;
  r.handle = mr;
  return r;
}

/// Undoes register_memory: deregisters `r` and gives its `len` bytes back to `budget`.
inline void deregister_memory(const registration& r, registered_budget& budget, std::size_t len) noexcept {
  if (r.handle == nullptr) return;
  ibv_dereg_mr(static_cast<ibv_mr*>(r.handle));
  budget.give_back(len);
}

/// True if `ctx` has a port in state ACTIVE.
inline bool has_active_port(ibv_context* ctx) noexcept {
  ibv_device_attr attr{};
  if (ibv_query_device(ctx, &attr) != 0) return false;
  for (std::uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) return true;
  }
  return false;
}

/// True if `ctx` has a port in state ACTIVE whose GID 0 is set (a RoCE port
/// gets it from its interface's address; an all-zero GID cannot be routed).
inline bool has_active_port_with_gid(ibv_context* ctx) noexcept {
  ibv_device_attr attr{};
  if (ibv_query_device(ctx, &attr) != 0) return false;
  for (std::uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE) continue;
    ibv_gid gid{};
    if (ibv_query_gid(ctx, port, 0, &gid) != 0) continue;
    for (std::uint8_t b : gid.raw) {
      if (b != 0) return true;
    }
  }
  return false;
}

/// The names of the RDMA devices rdmacm sees (empty if none).
inline std::vector<std::string> rdma_device_names() {
  std::vector<std::string> names;
  int n = 0;
  ibv_context** list = rdma_get_devices(&n);
  if (list == nullptr) return names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]->device));
  rdma_free_devices(list);
  return names;
}

/// Picks the device named `wanted`; if there is none, the first device with
/// an active port, and `warning` says so. The context stays open (rdmacm owns
/// it for the life of the process). Throws system_error(errc::not_supported)
/// when there is no usable device.
inline ibv_context* choose_device(const std::string& wanted, std::string& warning) {
  int n = 0;
  ibv_context** list = rdma_get_devices(&n);
  if (list == nullptr || n == 0) {
    if (list != nullptr) rdma_free_devices(list);
    throw_error(errc::not_supported,
                "verbs: no RDMA device found (ibv_devices lists none; load a NIC driver, or rdma_rxe for "
                "soft-RoCE: rdma link add rxe0 type rxe netdev <if>)");
  }
  ibv_context* chosen = nullptr;
  std::string names;
  for (int i = 0; i < n; ++i) {
    const std::string name = ibv_get_device_name(list[i]->device);
    names += (names.empty() ? "" : ", ") + name;
    if (name == wanted) chosen = list[i];
  }
  if (chosen == nullptr) {
    for (int i = 0; i < n && chosen == nullptr; ++i) {
      if (has_active_port(list[i])) chosen = list[i];
    }
    if (chosen == nullptr) {
      rdma_free_devices(list);
      throw_error(errc::not_supported, "verbs: TF_RDMA_DEV_NAME=" + wanted + " not found and no device among [" +
                                           names + "] has an active port");
    }
    warning = "verbs: RDMA device " + wanted + " (TF_RDMA_DEV_NAME) not found among [" + names + "]; using " +
              ibv_get_device_name(chosen->device) + ", the first with an active port";
  }
  rdma_free_devices(list);
  return chosen;
}

/// rdmacm's errno (or a cm event status) in the transports' terms.
inline std::error_code cm_error(int err) noexcept {
  switch (err) {
    case 0:
      return {};
    case ECONNREFUSED:
    case ETIMEDOUT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case EADDRNOTAVAIL:
    case ENODEV:
      return make_error_code(errc::connection_refused);
    case ECONNRESET:
    case ECONNABORTED:
      return make_error_code(errc::connection_reset);
    default:
      return {err, std::system_category()};
  }
}

}  // namespace detail

}  // namespace v0
}  // namespace fusewire
