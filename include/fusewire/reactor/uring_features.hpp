#pragma once
/// What the kernel let an io_uring engine use (`uring_features`): probed setup
/// flags and opcodes, the provided-buffer ring, and what transports learned.

#include <cstddef>
#include <cstdint>
#include <string>

namespace fusewire {
inline namespace v0 {

/// What this kernel (and the engine's config) let the ring use. Probed once,
/// when the engine starts on its reactor thread.
struct uring_features {
  unsigned setup_flags = 0;  ///< the IORING_SETUP_* flags the ring was created with
  bool single_issuer = false;
  bool defer_taskrun = false;
  bool coop_taskrun = false;
  bool taskrun_flag = false;  ///< the kernel flags pending task work, so idle polls skip io_uring_enter
  bool submit_all = false;
  bool registered_ring_fd = false;  ///< io_uring_register_ring_fd: enters skip the fd lookup
  bool ext_arg = false;             ///< IORING_FEAT_EXT_ARG: waits with a timeout need no extra SQE
  bool nodrop = false;              ///< IORING_FEAT_NODROP: completions are never lost on CQ overflow
  bool fast_poll = false;
  bool op_recv = false;
  bool op_sendmsg = false;
  bool op_send_zc = false;
  bool op_sendmsg_zc = false;
  bool op_accept = false;
  bool op_connect = false;
  bool op_async_cancel = false;
  bool buf_ring = false;       ///< a provided-buffer ring is registered
  unsigned buf_count = 0;      ///< its buffers
  std::size_t buf_size = 0;    ///< and their size
  std::string buf_ring_error;  ///< why there is none, if there is none
  std::string setup_fallback;  ///< flags dropped because the kernel refused them

  /// Learned by transports at runtime (no probe exists for these).
  enum class tri : std::uint8_t { unknown, yes, no };
  tri recv_multishot = tri::unknown;   ///< multishot recv with provided buffers worked (or failed with EINVAL)
  tri zc_report_usage = tri::unknown;  ///< IORING_SEND_ZC_REPORT_USAGE accepted (kernel 6.2+)

  /// One line for logs and benchmark headers.
  std::string to_string() const {
    std::string s = "io_uring setup=";
    const auto flag = [&](bool on, const char* name) {
      if (!on) return;
      if (s.back() != '=') s += '|';
      s += name;
    };
    flag(single_issuer, "SINGLE_ISSUER");
    flag(defer_taskrun, "DEFER_TASKRUN");
    flag(coop_taskrun, "COOP_TASKRUN");
    flag(taskrun_flag, "TASKRUN_FLAG");
    flag(submit_all, "SUBMIT_ALL");
    if (s.back() == '=') s += "none";
    if (!setup_fallback.empty()) s += " (dropped " + setup_fallback + ")";
    s += " ops=";
    const auto op = [&](bool on, const char* name) {
      s += name;
      s += on ? "+ " : "- ";
    };
    op(op_recv, "recv");
    op(op_sendmsg, "sendmsg");
    op(op_send_zc, "send_zc");
    op(op_sendmsg_zc, "sendmsg_zc");
    op(op_accept, "accept");
    op(op_connect, "connect");
    op(op_async_cancel, "cancel");
    s += "ext_arg";
    s += ext_arg ? "+" : "-";
    s += " ring_fd";
    s += registered_ring_fd ? "+" : "-";
    s += " buf_ring=";
    if (buf_ring) {
      s += std::to_string(buf_count) + "x" + std::to_string(buf_size);
    } else {
      s += "off(" + buf_ring_error + ")";
    }
    const auto learned = [](tri t) { return t == tri::yes ? "yes" : t == tri::no ? "no" : "untried"; };
    s += " recv_multishot=";
    s += learned(recv_multishot);
    s += " zc_report_usage=";
    s += learned(zc_report_usage);
    return s;
  }
};

}  // namespace v0
}  // namespace fusewire
