#pragma once
/// Choosing a transport by name at run time: the names this build and machine
/// can run (available_transports), the choice "auto" (choose_transport, made
/// for a cluster by auto_transport), and with_transport(), which calls the
/// caller's code, generic over the transport, with the one it names.
///
/// "auto" looks at the cluster spec and the machine, in this order:
/// - `shm` when every task of the cluster is on this host: its address is
///   loopback, this host's name, or an address of one of this host's network
///   interfaces. shm's listener is an abstract Unix socket, which lives in the
///   network namespace of this kernel, so "same host" is judged by what this
///   process's namespace can see.
/// - `verbs` when TF_RDMA_ENABLED is true, this build has rdma-core and
///   verbs::preflight passes (an active port with a GID, RLIMIT_MEMLOCK of at
///   least TF_RDMA_BUF_SIZE, a registration budget that holds a reactor), and
///   the cluster names an address rdmacm can route (not only loopback).
/// - `shm+uring` (per_host<uring_shm, uring_tcp>) when some task is on
///   another host and at least two are on this one: each connection is chosen
///   when it is made, shm to a peer on this host, uring_tcp to the others; or
///   `shm+asio` (per_host<shm, asio_tcp>) when io_uring is unusable.
/// - `uring` when this build has liburing and the kernel sets up a ring.
/// - `asio` otherwise.
/// When it settles for TCP although RDMA was enabled, or because a task is on
/// another host, one line in the log says what it chose and why.

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/log.hpp>
#include <fusewire/core/options.hpp>
#include <fusewire/core/security.hpp>
#include <fusewire/transport/asio_tcp.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/this_host.hpp>
#include <fusewire/transport/per_host.hpp>
#include <fusewire/transport/shm.hpp>
#include <fusewire/util/text.hpp>
#if defined(FUSEWIRE_HAS_URING) && __has_include(<liburing.h>)
#define FUSEWIRE_SELECT_URING 1
#include <liburing.h>

#include <fusewire/transport/uring_tcp.hpp>
#else
#define FUSEWIRE_SELECT_URING 0
#endif
#if defined(FUSEWIRE_HAS_RDMA) && __has_include(<infiniband/verbs.h>) && __has_include(<rdma/rdma_cma.h>)
#define FUSEWIRE_SELECT_VERBS 1
#include <fusewire/transport/verbs.hpp>
#else
#define FUSEWIRE_SELECT_VERBS 0
#endif

namespace fusewire {
inline namespace v0 {

/// Every name with_transport() takes, "auto" first.
inline constexpr std::array<std::string_view, 7> transport_names{"auto",     "uring",     "asio", "shm",
                                                                 "shm+asio", "shm+uring", "verbs"};

/// The transport "shm+asio" names: shm to peers on this host, asio_tcp to the others.
using shm_or_asio = per_host<shm, asio_tcp>;
#if FUSEWIRE_SELECT_URING
/// The transport "shm+uring" names: shm to peers on this host, uring_tcp to
/// the others, on io_uring's reactors.
using shm_or_uring = per_host<uring_shm, uring_tcp>;
#endif

/// What the choice "auto" knows about this machine; probe_machine() fills it,
/// a test can make one up.
struct machine_facts {
  bool uring = false;     ///< this build has liburing and the kernel sets up a ring
  std::string uring_why;  ///< why not
  bool shm = false;       ///< memfd_create works
  std::string shm_why;
  bool verbs = false;  ///< this build has rdma-core and verbs::preflight passed
  std::string verbs_why;
  std::string hostname;                ///< gethostname()
  std::vector<std::string> addresses;  ///< this host's interface addresses, numeric (inet_ntop)
};

/// The transport "auto" picked and why.
struct transport_choice {
  std::string name;    ///< "shm", "verbs", "shm+uring", "shm+asio", "uring" or "asio"
  std::string reason;  ///< a sentence for people
  bool fallback =
      false;  ///< a better transport was out of reach (RDMA unusable, a task on another host): worth a log line
};

namespace detail {

struct probe_result {
  bool ok = false;
  std::string why;
};

inline probe_result probe_uring() {
#if FUSEWIRE_SELECT_URING
  io_uring ring;
  const int rc = ::io_uring_queue_init(4, &ring, 0);
  if (rc != 0) return {false, "the kernel refuses an io_uring ring (" + std::system_category().message(-rc) + ")"};
  ::io_uring_queue_exit(&ring);
  return {true, {}};
#else
  return {false, "this build has no io_uring transport (liburing not found)"};
#endif
}

inline probe_result probe_shm() {
  const int fd = ::memfd_create("fusewire-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return {false, "memfd_create fails (" + std::system_category().message(errno) + ")"};
  ::close(fd);
  return {true, {}};
}

/// Device presence only (verbs::available); cached, as it opens every device.
inline probe_result probe_rdma_device() {
#if FUSEWIRE_SELECT_VERBS
  std::string why;
  if (!verbs::available(why)) return {false, why};
  return {true, {}};
#else
  return {false, "this build has no RDMA verbs transport (rdma-core not found)"};
#endif
}

inline const probe_result& uring_probe() {
  static const probe_result r = probe_uring();
  return r;
}
inline const probe_result& shm_probe() {
  static const probe_result r = probe_shm();
  return r;
}
inline const probe_result& rdma_device_probe() {
  static const probe_result r = probe_rdma_device();
  return r;
}

/// True if `host` is this machine as `m` sees it. A name other than this
/// host's own is not resolved (a lookup could block): it counts as another host.
inline bool on_this_host(std::string_view host, const machine_facts& m) {
  return is_host(host, m.hostname, m.addresses);
}

/// Whether task `t` of `spec` (control and fast-path address) is on this host.
inline bool task_on_this_host(const cluster_spec& spec, const task_id& t, const machine_facts& m) {
  if (!on_this_host(spec.control_endpoint(t).host, m)) return false;
  return !spec.has_endpoint_map() || on_this_host(spec.fast_path_endpoint(t).host, m);
}

/// How many tasks of `spec` are on this host.
inline std::size_t tasks_on_this_host(const cluster_spec& spec, const machine_facts& m) {
  std::size_t n = 0;
  for (const task_id& t : spec.tasks()) n += task_on_this_host(spec, t, m) ? 1 : 0;
  return n;
}

/// The first task of `spec` (control or fast-path address) not on this host,
/// as "worker:1 at 192.0.2.7:2222"; nullopt when every one is.
inline std::optional<std::string> first_remote_task(const cluster_spec& spec, const machine_facts& m) {
  for (const task_id& t : spec.tasks()) {
    const net_address& control = spec.control_endpoint(t);
    if (!on_this_host(control.host, m)) return t.to_string() + " at " + control.to_string();
    if (spec.has_endpoint_map()) {
      const net_address fast = spec.fast_path_endpoint(t);
      if (!on_this_host(fast.host, m)) return t.to_string() + " at " + fast.to_string();
    }
  }
  return std::nullopt;
}

inline std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace detail

/// The transports this build has and this machine can run, in the order
/// uring, asio, shm, shm+asio, shm+uring, verbs ("auto" is not among them; it
/// picks one of them).
/// The probes run once per process: an io_uring ring is set up, memfd_create
/// is tried, the RDMA devices are asked for an active port (verbs::available).
inline std::vector<std::string> available_transports() {
  std::vector<std::string> names;
  if (detail::uring_probe().ok) names.emplace_back("uring");
  names.emplace_back("asio");
  if (detail::shm_probe().ok) {
    names.emplace_back("shm");
    names.emplace_back("shm+asio");
    if (detail::uring_probe().ok) names.emplace_back("shm+uring");
  }
  if (detail::rdma_device_probe().ok) names.emplace_back("verbs");
  return names;
}

/// Why with_transport() cannot run the transport named `name`; nullopt if it
/// can. "auto" always can.
inline std::optional<std::string> transport_problem(std::string_view name) {
  const std::string allowed = "expected one of auto, " + detail::join_names(available_transports());
  if (name == "auto" || name == "asio") return std::nullopt;
  const detail::probe_result* p = nullptr;
  if (name == "uring") p = &detail::uring_probe();
  if (name == "shm" || name == "shm+asio") p = &detail::shm_probe();
  if (name == "shm+uring") p = detail::uring_probe().ok ? &detail::shm_probe() : &detail::uring_probe();
  if (name == "verbs") p = &detail::rdma_device_probe();
  if (p == nullptr) return "unknown transport; " + allowed;
  if (!p->ok) return p->why + "; " + allowed;
  return std::nullopt;
}

/// The facts choose_transport() needs, probed on this machine; the RDMA
/// preflight is made for the options' TF_RDMA_* knobs, and only when
/// `o.rdma_enabled`.
inline machine_facts probe_machine(const options& o) {
  machine_facts m;
  m.uring = detail::uring_probe().ok;
  m.uring_why = detail::uring_probe().why;
  m.shm = detail::shm_probe().ok;
  m.shm_why = detail::shm_probe().why;
#if FUSEWIRE_SELECT_VERBS
  if (o.rdma_enabled) {
    try {
      m.verbs = verbs::preflight(verbs_config::from(o), m.verbs_why);
    } catch (const std::exception& e) {
      m.verbs_why = e.what();
    }
  } else {
    m.verbs_why = "TF_RDMA_ENABLED is false";
  }
#else
  (void)o;
  m.verbs_why = detail::rdma_device_probe().why;
#endif
  m.hostname = detail::host_name();
  m.addresses = detail::interface_addresses();
  return m;
}

/// The choice "auto" makes for a process of cluster `spec` with options `o`
/// on a machine described by `m` (see the top of this file). Pure: no probe, no log.
inline transport_choice choose_transport(const options& o, const cluster_spec& spec, const machine_facts& m) {
  const std::optional<std::string> remote = detail::first_remote_task(spec, m);
  if (!remote && m.shm) return {"shm", "every task of the cluster is on this host", false};
  std::vector<std::string> why_not;
  if (remote) {
    why_not.push_back(*remote + " is not on this host, so shm cannot reach it");
  } else {
    why_not.push_back("shm is unusable (" + m.shm_why + ")");
  }
  if (o.rdma_enabled) {
    if (!m.verbs) {
      why_not.push_back("TF_RDMA_ENABLED is true but RDMA is unusable (" + m.verbs_why + ")");
    } else if (!first_network_address(spec)) {
      why_not.push_back("RDMA cannot route the cluster's loopback addresses");
    } else {
      return {"verbs", "TF_RDMA_ENABLED is true and the RDMA preflight passed; " + why_not.front(), false};
    }
  }
  const std::size_t here = detail::tasks_on_this_host(spec, m);
  if (remote && m.shm && here >= 2) {
    std::string reason = std::to_string(here) + " tasks are on this host and use shm between them; " + *remote +
                         " is not on this host and is reached over " + (m.uring ? "uring_tcp" : "asio_tcp");
    for (std::size_t i = 1; i < why_not.size(); ++i) reason += "; " + why_not[i];
    if (!m.uring) reason += "; io_uring is unusable (" + m.uring_why + ")";
    return {m.uring ? "shm+uring" : "shm+asio", reason, true};
  }
  if (!m.uring) why_not.push_back("io_uring is unusable (" + m.uring_why + ")");
  std::string reason;
  for (const std::string& w : why_not) reason += (reason.empty() ? "" : "; ") + w;
  return {m.uring ? "uring" : "asio", reason, true};
}

/// choose_transport() on this machine (probe_machine; the io_uring, shm and
/// device probes run once per process) for this `spec` and `o`. When it is a
/// fallback, one line goes to `log` (stderr when empty), once per process for
/// each distinct line: "fusewire: transport auto: using uring: worker:1 at
/// ... is not on this host ...".
inline transport_choice auto_transport(const options& o, const cluster_spec& spec, const log_sink& log = {}) {
  transport_choice choice = choose_transport(o, spec, probe_machine(o));
  if (choice.fallback) {
    static std::mutex mutex;
    static std::vector<std::string> said;
    std::string line = "fusewire: transport auto: using " + choice.name + ": " + choice.reason;
    bool fresh = false;
    {
      std::lock_guard lock(mutex);
      fresh = std::find(said.begin(), said.end(), line) == said.end();
      if (fresh) said.push_back(line);
    }
    if (fresh) write_log(log, line);
  }
  return choice;
}

/// The result of with_transport(name, ..., f).
template <class F>
using with_transport_result = std::invoke_result_t<F&, asio_tcp>;

/// Calls `f(T transport)` with the transport named `name` and returns what it
/// returns: "uring" (uring_tcp{}), "asio" (asio_tcp{}), "shm" (shm{}),
/// "shm+asio" (shm_or_asio{}), "shm+uring" (shm_or_uring{}), "verbs"
/// (verbs configured from `o`'s TF_RDMA_* knobs, verbs_config::from), or
/// "auto" (auto_transport(o, spec, log)). `f` is generic (`[&](auto t)` or
/// `[&]<class T>(T t)`) and returns the same type for every transport. Throws
/// std::invalid_argument naming `name`, why it cannot run and the names that
/// can (transport_problem) for an unknown name or one this build or machine
/// cannot run.
template <class F>
with_transport_result<F> with_transport(std::string_view name, const options& o, const cluster_spec& spec, F&& f,
                                        const log_sink& log = {}) {
  using result = with_transport_result<F>;
  if (auto problem = transport_problem(name)) {
    throw std::invalid_argument("transport '" + std::string(name) + "': " + *problem);
  }
  const std::string chosen = name == "auto" ? auto_transport(o, spec, log).name : std::string(name);
#if FUSEWIRE_SELECT_URING
  if (chosen == "uring") return static_cast<result>(f(uring_tcp{}));
  if (chosen == "shm+uring") return static_cast<result>(f(shm_or_uring{}));
#endif
#if FUSEWIRE_SELECT_VERBS
  if (chosen == "verbs") return static_cast<result>(f(verbs(verbs_config::from(o))));
#endif
  if (chosen == "shm") return static_cast<result>(f(shm{}));
  if (chosen == "shm+asio") return static_cast<result>(f(shm_or_asio{}));
  return static_cast<result>(f(asio_tcp{}));
}

}  // namespace v0
}  // namespace fusewire

#undef FUSEWIRE_SELECT_URING
#undef FUSEWIRE_SELECT_VERBS
