#pragma once
/// uring_tcp: the io_uring TCP transport (liburing >= 2.2), a model of
/// fusewire::transport. See transport/concepts.hpp for the contract; here is
/// what it does underneath.
///
/// Receiving
/// - async_read_some: a multishot recv fills buffers of the reactor's
///   provided-buffer ring; each filled buffer is handed to the caller as a
///   tensor_buffer without a copy (it returns to the ring when its last alias
///   dies, on any thread). While a quarter or less of the ring is left, received
///   bytes are copied to the heap instead and the ring buffer reused at once, so
///   one slow consumer cannot starve the reactor's other connections. Without a
///   ring (or when it is empty, or multishot is unsupported) a plain recv into a
///   heap buffer of config::fallback_read bytes is used.
/// - async_read(dst) with dst of config::copy_threshold bytes or more (8 KiB):
///   bytes the multishot recv already delivered (read ahead, at most
///   config::read_ahead bytes) are COPIED into dst first; that is the only copy
///   on this path. For the rest, the multishot recv is cancelled and a plain
///   recv(MSG_WAITALL) goes straight into dst; the multishot is re-armed when a
///   read needs it again. So a large payload lands in the destination without a
///   copy except for what arrived before the read was posted. The next few
///   small exact reads after a large one (the following frames' heads) also get
///   exact recvs, not the multishot: in a stream of large frames a re-armed
///   multishot would drain the next payload into ring buffers before its head
///   was even parsed, and all of it would be copied.
/// - async_read(dst) with a smaller dst (headers, small tensors) is filled by
///   copying from the multishot receive: no SQE per read, one small copy.
/// - The multishot recv stays armed between read_some calls (that is its point)
///   until config::read_ahead unconsumed bytes pile up; then it is cancelled
///   (backpressure) and re-armed on demand.
/// - On a spinning reactor (poll mode, adaptive while it polls) a connection
///   whose small exact read waits for the multishot recv is also read with a plain
///   non-blocking recv (at most spin_read_bytes) once a tick, for the few
///   connections that waited last (uring_engine::config::spin_readers): bytes
///   then reach the reader without the multishot's detour through task work
///   and a completion, as with a busy-polling C program. Stream order is kept
///   with a multishot recv armed because with DEFER_TASKRUN the kernel runs it
///   only inside this thread's io_uring_enter (see uring_engine::watch()).
///   But an armed multishot is woken by every message, in the sender's
///   sendmsg: so a watched connection on a spinning reactor arms none, and a
///   spin read that takes bytes cancels one still armed (no spin read while
///   the cancel is in flight). It is armed again when the reactor stops reading the connection
///   that way: evicted from the watch list, or the reactor about to sleep
///   (spin_stopped()). Without DEFER_TASKRUN this is all off.
///
/// Sending
/// - async_write of at most config::speculative_send bytes (16 KiB) with no
///   unsent bytes queued before it first tries one direct non-blocking sendmsg
///   (what a busy-polling C program does); whatever it could not send goes to
///   the ring. Earlier writes whose bytes are all sent but whose completions
///   have not run yet do not hold it back (a task that writes several frames
///   has each leave as it is made); completions still run in call order.
/// - Otherwise one sendmsg SQE (MSG_WAITALL) with the caller's iovecs, continued
///   on short writes. Writes of at least config::zc_threshold bytes use
///   SENDMSG_ZC when the kernel has it: the first CQE reports the bytes sent,
///   the notification CQE (IORING_CQE_F_NOTIF) says the kernel released the
///   pages; the handler runs only after every notification of that write, so
///   the caller may reuse its buffers as soon as the handler runs. The next
///   write does not wait for notifications, only for the bytes to be queued.
///   Over loopback the kernel pins the pages, then copies them anyway, and
///   SENDMSG_ZC costs about twice a plain send; so by default
///   (config::zero_copy = automatic) a connection whose peer is on this host
///   (loopback address, or the same address at both ends) never uses it, and
///   any other connection stops using it once a notification says the kernel
///   copied the bytes. zero_copy_policy::always forces it, ::never turns it off.
///
/// Closing
/// - close() shuts the socket down and cancels its SQEs; handlers of operations
///   the kernel still holds run when their CQEs arrive (after the buffers are
///   free), the rest right away (posted), all in call order. The fd is closed
///   once no SQE is in flight; if zero-copy notifications are still owed then,
///   the socket is reset (SO_LINGER 0) so the kernel drops its queued data and
///   releases the caller's pages instead of waiting for a peer that may never read.
///
/// Releasing (async_release, for a move to another reactor; see
/// handoff_transport in concepts.hpp)
/// - Like close() without the shutdown: the SQEs are cancelled, and the fd is
///   handed out once no SQE is in flight and no zero-copy notification is owed.
///   Bytes the multishot recv (or a fallback recv) took that no read consumed,
///   at the release or from a CQE that beat the cancellation, and exact reads or
///   writes the cancellation cut in half, make it close the socket instead.
///   The fd stays non-blocking (accept4, socket() and adopt() make it so).
///
/// Every SQE is submitted by the reactor's engine in one io_uring_enter per tick.

#include <fusewire/transport/uring_tcp/connection.hpp>
#include <fusewire/transport/uring_tcp/listener.hpp>
#include <fusewire/transport/uring_tcp/options.hpp>
#include <fusewire/transport/uring_tcp/transport.hpp>
