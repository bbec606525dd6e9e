#pragma once
/// shm: the same-host shared-memory transport on an asio_reactor, a model of
/// fusewire::transport (not of handoff_transport, readahead_connection or
/// rdma_transport). See transport/concepts.hpp for the contract and
/// docs/transports.md for its use.
///
/// Addressing: host:port names an abstract-namespace Unix socket
/// ("\0fusewire-shm/HOST:PORT"; HOST is 1..64 characters of [A-Za-z0-9._:-],
/// a label rather than an address: "127.0.0.1" and "localhost" are different
/// namespaces). Nothing is created in the file system, so nothing is left
/// behind when a process dies. listen(.., 0) picks a free port at random.
///
/// Connect: the connecting side creates the connection's segment (a memfd
/// sealed against shrinking and growing: 4 KiB of indices and flags, then one
/// ring per direction of shm::config::ring_size bytes) and two eventfds, and
/// sends them with SCM_RIGHTS in one SOCK_SEQPACKET message; the listener
/// checks the hello (magic, version, a ring size within its
/// max_ring_size, the seals, the size, eventfds) and maps it. The Unix socket
/// stays open for the connection's life: its hang-up is the peer's death.
///
/// Data: each ring is a single-producer/single-consumer byte stream.
/// async_write copies the caller's buffers into the outgoing ring as space
/// frees up (a large tensor goes through in ring-sized pieces); async_read
/// copies out of the incoming ring into its destination; async_read_some into
/// a new buffer of at most read_some_max bytes. One copy per side. A piece of
/// a write of config::single_copy_min bytes or more (off by default) is instead announced in a
/// queue beside the ring and copied once, by the reader, straight out of the
/// writer's memory (process_vm_readv); the write completes when it was. Each
/// side first checks that it can read the other's memory (a random word the
/// peer published); where it cannot, the ring carries everything.
///
/// Wake-ups follow the reactor's mode: poll spins (a re-check posted each
/// tick); adaptive spins for the reactor's idle_poll since the last progress,
/// then sleeps; block sleeps at once. A sleeping side raises its flag in the
/// segment and waits on its eventfd; the other side writes that eventfd only
/// when it sees the flag raised (after publishing an index, seq_cst both ways).
///
/// Errors: the peer's close: reads drain the ring, then errc::connection_closed;
/// writes errc::connection_reset. The peer's death (hang-up without its close
/// flag): reads drain, then errc::connection_reset; writes errc::connection_reset.
/// A peer that breaks the protocol (an index outside the ring, bytes on the
/// socket after the hello): the connection fails with errc::malformed_frame and
/// the reactor reports what was wrong. Indices are checked against this side's
/// own copies; nothing is read or written outside the segment.

#include <fusewire/transport/shm/connection.hpp>
#include <fusewire/transport/shm/listener.hpp>
#include <fusewire/transport/shm/segment.hpp>
#include <fusewire/transport/shm/transport.hpp>
