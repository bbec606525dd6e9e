#pragma once
/// The transport named requirements: `fusewire::connection`, `fusewire::listener`
/// and `fusewire::transport` (and `rdma_transport` for one-sided writes,
/// `handoff_transport` for moving a connection to another reactor), as C++20 concepts.
///
/// A type opts in with a tag (`using connection_concept = connection_tag;`,
/// likewise `listener_concept`, `transport_concept`) and must then provide every
/// member below; each member is its own named sub-concept, so a compiler error
/// names the piece that is missing (e.g. `detail::connection_reads_some<C>`).
///
/// Contract of every model (checked by tests/unit/transport/transport_suite.cpp):
///
/// - Threads: a connection, listener or pending connect belongs to the reactor
///   it was made on; every call and every handler happens on that reactor's thread.
/// - Handlers fire exactly once: on success, on failure, and on close() or
///   reactor stop (errc::cancelled). Never inline from the initiating call.
///   They may be move-only; an exception escaping one is caught and reported by
///   the reactor.
/// - async_write(sg, h): `h(error_code, bytes_written)`. Writes all bytes of the
///   scatter-gather list, in order, without gathering them into one buffer.
///   Several writes may be queued; they go out in call order, and their handlers
///   run in call order. The bytes must stay valid and unchanged until `h` runs
///   (for zero-copy sends: until the kernel released them); the span of
///   descriptors itself is copied and may be a temporary.
/// - async_read(dst, h): `h(error_code, bytes_read)`. Fills exactly `dst` (the
///   zero-copy path: into the caller's memory); an empty `dst` completes at
///   once, taking no bytes. On error, bytes_read says how much was filled.
/// - async_read_some(h): `h(error_code, tensor_buffer)`: at least one byte that
///   arrived, as an owning buffer handed over without a further copy (it may
///   outlive the connection and die on any thread).
/// - Reads of both kinds are served in call order, each taking the bytes that
///   follow the previous one.
/// - close(): idempotent; every pending operation completes with
///   errc::cancelled; later operations complete with errc::connection_closed.
///   Destroying a connection closes it.
/// - Errors: errc::connection_closed (peer closed: end of stream),
///   errc::connection_reset (peer vanished, broken pipe), errc::connection_refused
///   (connect), errc::cancelled (close/stop); other OS errors in std::system_category.
///
/// Hand-off (`handoff_transport`: the TCP transports, not verbs). A connection
/// belongs to the reactor it was made on; to move it, release its socket on
/// that reactor and adopt the descriptor on the other (carried there by the
/// caller, e.g. through basic_reactor_group::submit_to):
///
/// - conn.async_release(h): `h(error_code, int fd)`, on the connection's reactor
///   thread. The connection gives up its socket WITHOUT closing or shutting it
///   down: every pending read and write first completes with errc::cancelled
///   (as on close()); once the kernel let go of every buffer (io_uring: every
///   CQE is in, the cancelled multishot recv's and zero-copy notifications
///   included) `h({}, fd)` runs, posted, never inline. The caller then owns
///   `fd`: open, connected, in non-blocking mode, close-on-exec. The connection
///   is closed from then on (is_open() is false; later operations complete with
///   errc::connection_closed). Keep the connection alive until `h` ran:
///   destroying it closes it, which cancels the release (below).
/// - The fd is handed out only where the stream is at a clean boundary: every
///   byte taken from the socket was delivered by a read that completed
///   successfully, and no write was cut off after part of it was sent. Else
///   (bytes read ahead and not consumed; bytes a still-armed receive took
///   before its cancellation; an exact read cancelled half-filled; a write
///   cancelled half-sent) handing out the fd would lose or tear data: the
///   socket is closed instead and `h(errc::invalid_argument, -1)` runs. Callers
///   release where the protocol guarantees the peer sends nothing (e.g. in the
///   middle of a handshake, waiting for our reply), so this error is evidence
///   that the peer broke the protocol. Should the transport be unable to stop
///   its operations without a shutdown (io_uring: no SQE for the cancellation),
///   the socket is closed too and `h` gets that error.
/// - close() (or destroying the connection, or the reactor stopping) while a
///   release is under way (until `h` ran): `h(errc::cancelled, -1)` and the
///   socket is closed. A second async_release, or one on a closed connection:
///   `h(errc::connection_closed, -1)`, posted. `h` runs exactly once.
/// - transport.adopt(reactor, fd, ec), on `reactor`'s thread (anywhere else it
///   throws std::system_error(errc::invalid_argument) after closing `fd`):
///   takes ownership of the connected TCP socket `fd` and returns a connection
///   on `reactor` equivalent to one its listener would have accepted
///   (non-blocking, close-on-exec, the transport's socket options;
///   remote_endpoint() names the peer). On failure (`fd` is not a connected
///   TCP socket, the reactor is stopping: errc::cancelled, an option cannot
///   be set) `fd` is closed, `ec` says why and an empty connection is returned.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/tensor_buffer.hpp>

namespace fusewire {
inline namespace v0 {

/// Opt-in tags: a model declares `using connection_concept = connection_tag;` etc.
struct connection_tag {};
struct listener_tag {};
struct transport_tag {};

/// A completion handler for writes and exact reads: `void(std::error_code, std::size_t)`.
template <class H>
concept io_handler =
    std::move_constructible<std::decay_t<H>> && std::invocable<std::decay_t<H>&, std::error_code, std::size_t>;

/// A completion handler for async_read_some: `void(std::error_code, tensor_buffer)`.
template <class H>
concept read_some_handler =
    std::move_constructible<std::decay_t<H>> && std::invocable<std::decay_t<H>&, std::error_code, tensor_buffer>;

/// A completion handler for async_release: `void(std::error_code, int fd)`.
template <class H>
concept release_handler =
    std::move_constructible<std::decay_t<H>> && std::invocable<std::decay_t<H>&, std::error_code, int>;

/// A completion handler for connect and accept: `void(std::error_code, Connection)`.
template <class H, class Connection>
concept connection_handler =
    std::move_constructible<std::decay_t<H>> && std::invocable<std::decay_t<H>&, std::error_code, Connection>;

namespace detail {

/// The least a handler can be: move-only, callable with exactly these arguments.
template <class... Args>
struct handler_archetype {
  handler_archetype() = default;
  handler_archetype(handler_archetype&&) = default;
  handler_archetype(const handler_archetype&) = delete;
  handler_archetype& operator=(handler_archetype&&) = default;
  void operator()(Args...) {}
};

using io_handler_archetype = handler_archetype<std::error_code, std::size_t>;
using read_some_handler_archetype = handler_archetype<std::error_code, tensor_buffer>;
template <class Connection>
using connection_handler_archetype = handler_archetype<std::error_code, Connection>;

template <class C>
concept connection_opts_in =
    requires { typename C::connection_concept; } && std::derived_from<typename C::connection_concept, connection_tag>;
template <class C>
concept connection_is_movable = std::movable<C> && std::default_initializable<C>;
template <class C>
concept connection_writes_scatter_gather =
    requires(C& c, std::span<const const_buffer> sg, io_handler_archetype h) { c.async_write(sg, std::move(h)); };
template <class C>
concept connection_reads_exact =
    requires(C& c, mutable_buffer dst, io_handler_archetype h) { c.async_read(dst, std::move(h)); };
template <class C>
concept connection_reads_some = requires(C& c, read_some_handler_archetype h) { c.async_read_some(std::move(h)); };
template <class C>
concept connection_closes = requires(C& c, const C& cc) {
  c.close();
  { cc.is_open() } -> std::same_as<bool>;
};
template <class C>
concept connection_names_peer = requires(const C& c) {
  { c.remote_endpoint() } -> std::convertible_to<std::string>;
};

template <class L>
concept listener_opts_in =
    requires { typename L::listener_concept; } && std::derived_from<typename L::listener_concept, listener_tag>;
template <class L>
concept listener_names_connection = requires { typename L::connection_type; };
template <class L>
concept listener_accepts =
    requires(L& l, connection_handler_archetype<typename L::connection_type> h) { l.async_accept(std::move(h)); };
template <class L>
concept listener_has_port = requires(const L& l) {
  { l.port() } -> std::same_as<std::uint16_t>;
};
template <class L>
concept listener_closes = requires(L& l) { l.close(); };

template <class T>
concept transport_opts_in =
    requires { typename T::transport_concept; } && std::derived_from<typename T::transport_concept, transport_tag>;
template <class T>
concept transport_names_types = requires {
  typename T::reactor_type;
  typename T::connection_type;
  typename T::listener_type;
};
template <class T>
concept transport_connects =
    requires(T& t, typename T::reactor_type& r, std::string_view host, std::uint16_t port,
             connection_handler_archetype<typename T::connection_type> h) { t.connect(r, host, port, std::move(h)); };
template <class T>
concept transport_listens =
    requires(T& t, typename T::reactor_type& r, std::string_view host, std::uint16_t port, std::error_code& ec) {
      { t.listen(r, host, port) } -> std::same_as<typename T::listener_type>;
      { t.listen(r, host, port, ec) } -> std::same_as<typename T::listener_type>;
    };
template <class T>
concept transport_has_name = requires {
  { T::name() } -> std::convertible_to<std::string_view>;
};

}  // namespace detail

/// A byte stream to one peer: scatter-gather writes, exact reads into the
/// caller's buffer, and reads of whatever arrived (see the contract above).
template <class C>
concept connection =
    detail::connection_opts_in<C> && detail::connection_is_movable<C> && detail::connection_writes_scatter_gather<C> &&
    detail::connection_reads_exact<C> && detail::connection_reads_some<C> && detail::connection_closes<C> &&
    detail::connection_names_peer<C>;

/// Accepts connections on a port: `async_accept(h)` with `h(error_code, connection)`,
/// `port()` (the bound port, also when 0 was asked for), `close()`.
template <class L>
concept listener = detail::listener_opts_in<L> && std::movable<L> && detail::listener_names_connection<L> &&
                   connection<typename L::connection_type> && detail::listener_accepts<L> &&
                   detail::listener_has_port<L> && detail::listener_closes<L>;

/// Makes connections on a reactor: `connect(reactor, host, port, h)` with
/// `h(error_code, connection)`; `listen(reactor, host, port[, ec])` (setup: the
/// throwing form throws std::system_error naming the address); `name()`.
template <class T>
concept transport = detail::transport_opts_in<T> && detail::transport_names_types<T> &&
                    connection<typename T::connection_type> && listener<typename T::listener_type> &&
                    std::same_as<typename T::listener_type::connection_type, typename T::connection_type> &&
                    detail::transport_connects<T> && detail::transport_listens<T> && detail::transport_has_name<T>;

namespace detail {
using release_handler_archetype = handler_archetype<std::error_code, int>;

template <class C>
concept connection_releases = requires(C& c, release_handler_archetype h) { c.async_release(std::move(h)); };
template <class T>
concept transport_adopts = requires(T& t, typename T::reactor_type& r, int fd, std::error_code& ec) {
  { t.adopt(r, fd, ec) } -> std::same_as<typename T::connection_type>;
};
}  // namespace detail

/// A transport whose connections can move to another reactor: `conn.async_release(h)`
/// on one reactor, `transport.adopt(reactor, fd, ec)` on another (see the contract above).
template <class T>
concept handoff_transport =
    transport<T> && detail::connection_releases<typename T::connection_type> && detail::transport_adopts<T>;

namespace detail {
template <class C>
concept connection_takes_read_ahead = requires(C& c, mutable_buffer dst) {
  { c.try_read(dst) } -> std::same_as<bool>;
};
}  // namespace detail

/// A connection that can hand over, at once, bytes it already read ahead:
/// `conn.try_read(dst)`, on the connection's thread, fills exactly `dst` and
/// returns true when no read is queued and at least `dst.size()` bytes arrived
/// and were not consumed yet (no handler, no system call: a copy from the
/// read-ahead buffers). Otherwise it consumes nothing and returns false, which
/// is not an error (too few bytes, a read pending, a closed connection): the
/// caller goes on with async_read. It lets a caller parse a small message that
/// arrived whole (a frame's meta and payload behind its header) without one
/// completion per piece. The TCP transports and shm model it; verbs does not.
template <class C>
concept readahead_connection = connection<C> && detail::connection_takes_read_ahead<C>;

/// Registered memory of a peer that the peer allowed us to write into (an
/// address and a remote key, as the peer's `describe()` produced them).
struct remote_region {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t size = 0;
  friend bool operator==(const remote_region&, const remote_region&) = default;
};

namespace detail {
template <class T>
concept rdma_makes_registered_pools = requires(const T& t, typename T::reactor_type& r, buffer_pool_config cfg) {
  { t.make_registered_pool(r, cfg) } -> std::same_as<buffer_pool>;
};
template <class T>
concept rdma_describes_memory = requires(const tensor_buffer& b) {
  { T::describe(b) } -> std::same_as<remote_region>;
};
template <class C>
concept connection_writes_remote = requires(C& c, const tensor_buffer& src, remote_region dst, io_handler_archetype h) {
  c.async_write_remote(src, dst, std::move(h));
};
}  // namespace detail

/// A transport with one-sided writes (RDMA): memory is registered per pool
/// slab (`make_registered_pool(reactor, cfg)`), a registered buffer is
/// described to the peer (`describe(buffer)`, sent over the stream once, e.g.
/// per rendezvous key, and cached by the peer), and the peer then writes into
/// it without a round trip: `conn.async_write_remote(src, region, h)`, with
/// `src` registered memory; `h(error_code, bytes)` once the writer's adapter
/// has it acknowledged. The owner of the region learns nothing by itself: the
/// writer sends a stream message after the write, which (same connection, in
/// order) arrives only after the written bytes are in place.
template <class T>
concept rdma_transport = transport<T> && detail::rdma_makes_registered_pools<T> && detail::rdma_describes_memory<T> &&
                         detail::connection_writes_remote<typename T::connection_type>;

/// A transport whose peers can read part of this process's memory directly:
/// `t.allocate_shared(n)` gives `n` bytes such that a write of them is copied
/// once, by the peer, instead of through the transport's buffers (shm's
/// shared pool). Any thread.
template <class T>
concept shared_memory_transport = transport<T> && requires(const T& t, std::size_t n) {
  { t.allocate_shared(n) } -> std::same_as<tensor_buffer>;
};

}  // namespace v0
}  // namespace fusewire
