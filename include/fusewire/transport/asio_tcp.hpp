#pragma once
/// asio_tcp: the portable TCP transport on Boost.Asio (epoll underneath), a
/// model of fusewire::transport. See transport/concepts.hpp for the contract.
///
/// Zero copy: async_write hands the kernel the caller's buffers as they are
/// (sendmsg of up to IOV_MAX of them per call, no gathering copy), at once when
/// nothing unsent is queued before it (earlier writes may still wait for their
/// completions to run; those run in call order); async_read reads straight into the
/// destination; async_read_some reads into a chunk (asio_tcp::config::read_chunk)
/// and hands out aliases of it, so nothing is copied after the kernel. An exact
/// read below asio_tcp::config::read_ahead_below reads ahead into the chunk
/// instead (one recv for a frame's header, meta and small payload, which the
/// following reads then copy out); a larger one first takes what was read
/// ahead, then reads the rest straight into its destination.
///
/// On a spinning reactor (poll mode, or adaptive), reads into the chunk are
/// plain non-blocking recvs made by the connection itself; when the socket has
/// nothing, the reactor tries the recv on every tick, as a busy-polling C
/// program does (asio_engine::config::spin_readers). Once such a recv got
/// bytes, the socket leaves Asio's epoll set (basic_socket::release()) until
/// Asio is needed again: registered, every message would run epoll's wake-up
/// in the sender's sendmsg. When the reactor stops reading it that way
/// (evicted, or about to sleep), the socket goes back to Asio, which waits for
/// it to be readable (and reads nothing). In block mode Asio reads into the chunk.
///
/// async_release (a move to another reactor; see handoff_transport in
/// concepts.hpp) takes the socket back from Asio (basic_socket::release(),
/// which aborts Asio's operations on it) and hands it out once their handlers
/// ran, non-blocking and close-on-exec whatever Asio left it as; unless the
/// chunk holds bytes no read consumed (read ahead before the release, or by a
/// receive Asio had finished but not yet delivered), or an exact read or a
/// write was cut in half: then the socket is closed.

#include <fusewire/transport/asio_tcp/connection.hpp>
#include <fusewire/transport/asio_tcp/listener.hpp>
#include <fusewire/transport/asio_tcp/options.hpp>
#include <fusewire/transport/asio_tcp/transport.hpp>
