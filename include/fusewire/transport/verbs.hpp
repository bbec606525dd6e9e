#pragma once
/// verbs: the RDMA transport on rdma-core (libibverbs + librdmacm), a model of
/// fusewire::transport. See transport/concepts.hpp for the contract every
/// transport keeps; this file says what is particular to RDMA.
///
/// Design:
/// - Connections are RC queue pairs set up with rdmacm (RDMA_PS_TCP port space,
///   so host:port addressing works as with TCP). Each reactor owns one
///   `verbs_engine` which owns, per reactor and shared by all its QPs: one
///   protection domain, one completion queue (with its completion channel),
///   one shared receive queue, one rdmacm event channel and one registered
///   buffer_pool of message slots (registered once per slab through the
///   pool's registration hook, never per message or tensor). The QP, CQ and
///   memory budget is fixed per reactor (config::max_connections), it does not
///   grow with the cluster.
/// - The byte stream is carried by SEND messages of at most
///   config::message_size bytes (header + data) copied into registered slots:
///   consecutive small writes are coalesced into one message; large writes are
///   cut into messages and pipelined up to the credit window.
/// - Flow control: each side grants the other config::credits receive
///   credits (one per message; the SRQ holds credits x max_connections
///   slots, so it is never overrun); credits come back piggybacked on every
///   message, or in a header-only message once half are owed. Data needs two
///   credits, a credit return one, so two peers can never both be stuck. A
///   receiver holding more than config::rx_buffer_limit unread bytes stops
///   returning credits: a reader that does not read stops the writer, as TCP
///   does. Every send is signalled and counted, so the send queue and the CQ
///   (sized srq + max_connections x sq_depth) are never overrun either.
/// - Bulk writes (larger than config::rdma_write_threshold) go by
///   RDMA_WRITE_WITH_IMM into registered chunk buffers of the receiver (its
///   staging pool), without a round trip per write: the first bulk write on a
///   connection announces itself (RTS flag) and the receiver answers with a
///   window of config::max_grants chunk grants, which it keeps topped up as
///   chunks are filled and delivered. The sender packs consecutive bulk bytes
///   into the granted chunks (at offsets; the immediate carries the length
///   and whether the chunk is finished). A window stays with its connection
///   until the receiver's staging pool runs short: then the receiver revokes
///   idle windows (REVOKE), the sender hands back the grants it has not
///   written (RELEASE, after its writes, so RC ordering makes it exact) and
///   announces again when it next has bulk bytes.
/// - The reactor drives the device: every tick polls the CQ (busy-polling in
///   reactor_mode::poll) and, every config::cm_poll_interval ticks, the rdmacm
///   channel; before sleeping (adaptive/block) the CQ is armed and the reactor
///   waits in epoll on the completion channel, the rdmacm channel and its wake fd.
/// - Errors: a failed work completion fails the operations of that connection
///   with errc::device_error (never aborts); the peer disconnecting (also when
///   it was killed: its kernel tears the connection down) ends the stream —
///   reads get errc::connection_closed after the bytes that arrived, pending
///   writes errc::connection_reset.
/// - fork(): RDMA memory and queues are not usable in a child. Create every
///   verbs object after fork() (e.g. in each forked worker), or call
///   ibv_fork_init() (or set RDMAV_FORK_SAFE=1) before any verbs object exists
///   if the parent keeps using RDMA while it forks other programs; a child must
///   never touch the parent's connections.
///
/// Device: config::device (TF_RDMA_DEV_NAME, default mlx5_0); if absent, the
/// first device with an active port, with a warning through the reactor's
/// error reporter. Addresses given to listen/connect must route over that device.

#include <fusewire/transport/verbs/config.hpp>
#include <fusewire/transport/verbs/connection.hpp>
#include <fusewire/transport/verbs/engine.hpp>
#include <fusewire/transport/verbs/listener.hpp>
#include <fusewire/transport/verbs/transport.hpp>
