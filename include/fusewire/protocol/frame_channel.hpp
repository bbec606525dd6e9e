#pragma once
/// protocol::frame_channel: framed messages over one `fusewire::connection`.
///
/// Writes: header + meta + payload go out as ONE scatter-gather async_write;
/// the payload buffers are passed through, never gathered. Reads: the 32-byte
/// header, then the meta (its length checked against `wire::limits` before the
/// meta buffer is allocated), then — when the caller says where — the payload
/// straight into its destination. Where the connection read ahead
/// (readahead_connection), the meta and a payload that arrived with the header
/// are taken at once, without a completion each.
///
/// Threads: a channel belongs to the reactor its connection was made on; every
/// call and every handler happens on that thread. Handlers fire exactly once
/// (also after close(), with errc::cancelled), never inline.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/buffer_pool.hpp>
#include <fusewire/core/reusable_buffer.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/wire/codec.hpp>
#include <fusewire/wire/frame.hpp>

namespace fusewire {
inline namespace v0 {
namespace protocol {

/// A frame's header and decoded meta. `body` views into `meta`, which it keeps alive.
struct frame_head {
  wire::frame_header header;
  tensor_buffer meta;
  wire::frame_body body;
};

/// The wire limits a process applies to its peers: `max_frame_bytes` bounds one
/// frame's payload, `max_transfer_bytes` (0 = the format's default) the tensor a
/// chunked transfer or a receive request announces.
inline wire::limits limits_for(std::size_t max_frame_bytes, std::size_t max_transfer_bytes = 0) noexcept {
  wire::limits lim;
  lim.max_payload_bytes = max_frame_bytes;
  if (max_transfer_bytes != 0) lim.max_transfer_bytes = max_transfer_bytes;
  return lim;
}

/// The limits applied to a peer that has not authenticated yet: one small
/// frame at a time (a hello, an auth_response), no payload, short strings, so
/// that an unauthenticated connection costs a few KiB at most.
inline wire::limits handshake_limits() noexcept {
  wire::limits lim;
  lim.max_meta_bytes = 2048;
  lim.max_payload_bytes = 0;
  lim.max_transfer_bytes = 0;
  lim.max_entries = 1;
  lim.max_segments = 1;
  lim.max_chunks = 1;
  lim.max_key_bytes = 256;
  lim.max_message_bytes = 1024;
  return lim;
}

/// A buffer for `size` payload bytes that nobody posted a destination for: a
/// block of `pool` (shard `shard`) when it fits one and the pool has a free
/// block, else a fresh heap buffer. The caller has already bounded `size` by
/// the wire limits. Throws std::bad_alloc only if the heap is exhausted.
inline tensor_buffer payload_buffer(buffer_pool* pool, unsigned shard, std::size_t size) {
  if (pool != nullptr && size != 0 && size <= pool->block_size()) {
    tensor_buffer out;
    if (!pool->allocate(size, shard, out)) return out;
  }
  return tensor_buffer::allocate(size);
}

/// Framed messages over connection type `Connection`; shared by the handlers
/// of its in-flight operations (create with std::make_shared).
template <connection Connection>
class frame_channel : public std::enable_shared_from_this<frame_channel<Connection>> {
 public:
  /// Takes over `conn`; frames read are checked against `lim`.
  frame_channel(Connection conn, wire::limits lim) : conn_(std::move(conn)), limits_(lim) {}

  frame_channel(const frame_channel&) = delete;
  frame_channel& operator=(const frame_channel&) = delete;

  const wire::limits& limits() const noexcept { return limits_; }
  /// Applies `lim` to the frames read from now on (e.g. once the peer authenticated).
  void set_limits(const wire::limits& lim) noexcept { limits_ = lim; }
  Connection& connection() noexcept { return conn_; }
  bool is_open() const noexcept { return conn_.is_open(); }
  std::string remote_endpoint() const { return conn_.remote_endpoint(); }

  /// Sends a frame carrying `meta` with `payload` (may be empty) and request id
  /// `request_id`: `h(error_code)` once the bytes were handed to the kernel.
  /// The payload bytes must stay valid and unchanged until `h` runs; the span
  /// of descriptors may be a temporary. A meta that cannot be encoded completes
  /// with errc::invalid_argument (nothing is written).
  template <wire::frame_meta Meta, class Handler>
    requires std::invocable<Handler&, std::error_code> && std::move_constructible<Handler>
  void write(const Meta& meta, std::span<const const_buffer> payload, Handler h, std::uint64_t request_id = 0) {
    wire::frame_header header;
    header.request_id = request_id;
    header.payload_len = total_size(payload);
    tensor_buffer prefix = prefixes_.take(wire::prefix_size(meta));
    std::error_code ec;
    wire::encode_prefix(meta, header, prefix.bytes(), ec);
    boost::container::small_vector<const_buffer, 8> sg;
    if (ec) {
      // Still go through the connection (an empty write) so the handler is never inline.
      conn_.async_write(std::span<const const_buffer>(sg.data(), sg.size()),
                        [h = std::move(h), ec](std::error_code, std::size_t) mutable { h(ec); });
      return;
    }
    sg.push_back(prefix.bytes());
    for (const_buffer b : payload) {
      if (!b.empty()) sg.push_back(b);
    }
    conn_.async_write(std::span<const const_buffer>(sg.data(), sg.size()),
                      [prefix = fusewire::detail::buffer_hold(std::move(prefix)), h = std::move(h)](
                          std::error_code e, std::size_t) mutable {
                        prefix.reset();
                        h(e);
                      });
  }

  /// Reads the next frame's header and meta: `h(error_code, frame_head)`.
  /// Errors: the transport's (errc::connection_closed at end of stream...), or
  /// decode_header/decode_meta's (bad_magic, frame_too_large, truncated_frame...)
  /// — after which the stream is unusable and the caller should close().
  /// The payload (header.payload_len bytes) must then be consumed with read_payload.
  template <class Handler>
    requires std::invocable<Handler&, std::error_code, frame_head> && std::move_constructible<Handler>
  void read_head(Handler h) {
    conn_.async_read(mutable_buffer(header_bytes_),
                     [self = this->shared_from_this(), h = std::move(h)](std::error_code ec, std::size_t) mutable {
                       if (ec) return h(ec, frame_head{});
                       frame_head head;
                       if (auto e = wire::decode_header(self->header_bytes_, self->limits_, head.header)) {
                         return h(e, frame_head{});
                       }
                       if (head.header.meta_len == 0) return self->finish_head(std::move(head), h);
                       // The frame's header and meta wait in the channel (one read_head at a
                       // time), so the continuation stays small enough to be stored inline.
                       head.meta = self->metas_.take(head.header.meta_len);
                       const mutable_buffer dst = head.meta.bytes();
                       // A small frame usually arrives whole: its meta is parsed now.
                       if (self->try_read_now(dst)) return self->finish_head(std::move(head), h);
                       self->head_ = std::move(head);
                       self->conn_.async_read(dst, [self, h = std::move(h)](std::error_code e, std::size_t) mutable {
                         frame_head head = std::move(self->head_);
                         if (e) {
                           // A stream that ends inside a frame is a truncated frame.
                           if (e == make_error_code(errc::connection_closed))
                             e = make_error_code(errc::truncated_frame);
                           return h(e, frame_head{});
                         }
                         self->finish_head(std::move(head), h);
                       });
                     });
  }

  /// Reads exactly `dst.size()` payload bytes into `dst` (the zero-copy path):
  /// `h(error_code)`. `dst` must stay valid until `h` runs. End of stream inside
  /// the payload reports errc::truncated_frame.
  template <class Handler>
    requires std::invocable<Handler&, std::error_code> && std::move_constructible<Handler>
  void read_payload(mutable_buffer dst, Handler h) {
    if (dst.empty()) {
      conn_.async_write(std::span<const const_buffer>{},
                        [h = std::move(h)](std::error_code e, std::size_t) mutable { h(e); });
      return;
    }
    conn_.async_read(dst, [h = std::move(h)](std::error_code e, std::size_t) mutable {
      if (e == make_error_code(errc::connection_closed)) e = make_error_code(errc::truncated_frame);
      h(e);
    });
  }

  /// Reads exactly `dst.size()` payload bytes into `dst` NOW when they already
  /// arrived (the connection read them ahead with the frame's head) and returns
  /// true; else reads nothing and returns false: call read_payload. No handler
  /// runs; for the caller of a read_head handler that wants to finish a small
  /// frame in the same step.
  bool try_read_payload(mutable_buffer dst) { return try_read_now(dst); }

  /// Closes the connection; pending operations complete with errc::cancelled.
  void close() noexcept { conn_.close(); }

 private:
  bool try_read_now(mutable_buffer dst) {
    if constexpr (readahead_connection<Connection>) {
      return conn_.try_read(dst);
    } else {
      return false;
    }
  }

  template <class Handler>
  void finish_head(frame_head head, Handler& h) {
    const const_buffer meta = head.meta.empty() ? const_buffer{} : const_buffer(head.meta.bytes());
    if (auto e = wire::decode_meta(head.header, meta, limits_, head.body)) return h(e, frame_head{});
    h(std::error_code{}, std::move(head));
  }

  Connection conn_;
  wire::limits limits_;
  std::array<std::byte, wire::header_size> header_bytes_{};
  frame_head head_;                     ///< the frame whose meta is being read
  fusewire::reusable_buffer metas_;     ///< small metas read
  fusewire::reusable_buffer prefixes_;  ///< small header + meta written
};

}  // namespace protocol
}  // namespace v0
}  // namespace fusewire
