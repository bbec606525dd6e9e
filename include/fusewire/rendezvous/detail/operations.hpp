#pragma once
/// The records a shard keeps: send and receive operations, a peer's outbound
/// lanes and inbound connections, chunked transfers being received.

#include <fusewire/rendezvous/endpoint.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

template <transport Transport>
struct endpoint<Transport>::send_op {
  send_op() = default;
  send_op(const send_op&) = delete;
  send_op& operator=(const send_op&) = delete;
  ~send_op() { unlink(); }

  /// Reactor thread: joins the list of started, not yet completed sends (stall reports).
  void link(send_op*& head) noexcept {
    list_head = &head;
    prev = nullptr;
    next = head;
    if (head != nullptr) head->prev = this;
    head = this;
  }
  void unlink() noexcept {
    if (list_head == nullptr) return;
    if (prev != nullptr) {
      prev->next = next;
    } else {
      *list_head = next;
    }
    if (next != nullptr) next->prev = prev;
    list_head = nullptr;
    prev = next = nullptr;
  }

  std::string peer;
  std::string key;
  tensor_buffer owned;
  detail::segments sg;
  send_handler h;
  timer_id timer;
  std::uint32_t pending_chunks = 0;  ///< chunk writes not completed yet
  std::error_code chunk_error;       ///< first failed chunk write
  bool in_flight = false;
  bool timed_out = false;
  bool done = false;
  std::uint32_t peer_index = no_peer;  ///< the peer's position in the cluster spec (counters)
  std::uint64_t bytes = 0;             ///< payload bytes
  clock::time_point started{};         ///< when its reactor took it (coarse; unset without observe_enabled)
  clock::duration report_at{};         ///< the age at which a stall report names it next
  send_op** list_head = nullptr;       ///< set while linked into shard::send_ops_
  send_op* prev = nullptr;
  send_op* next = nullptr;
};

template <transport Transport>
struct endpoint<Transport>::recv_op {
  recv_op() = default;
  recv_op(const recv_op&) = delete;
  recv_op& operator=(const recv_op&) = delete;
  ~recv_op() { unlink(); }

  /// Reactor thread: joins the list of started, not yet completed receives.
  void link(recv_op*& head) noexcept {
    list_head = &head;
    prev = nullptr;
    next = head;
    if (head != nullptr) head->prev = this;
    head = this;
  }
  void unlink() noexcept {
    if (list_head == nullptr) return;
    if (prev != nullptr) {
      prev->next = next;
    } else {
      *list_head = next;
    }
    if (next != nullptr) next->prev = prev;
    list_head = nullptr;
    prev = next = nullptr;
  }

  /// Bytes its destination takes (head and tail of a split one).
  std::size_t dst_size() const noexcept { return dst.size() + tail.size(); }

  std::weak_ptr<recv_op> self;  ///< its own owner, for RDMA transports only (see shard::owner_of)
  std::uint64_t slot_hash = 0;  ///< detail::slot_hash_of(peer, key), computed by the starting thread
  std::string peer;
  std::string key;
  tensor_buffer dst;
  bool has_dst = false;
  /// A split destination's second part (recv with a head and a tail): the
  /// tensor's first dst.size() bytes land in dst, the rest here.
  mutable_buffer tail;
  recv_handler h;
  timer_id timer;
  std::shared_ptr<channel_type> bound;  ///< the channel reading into dst, if any
  std::shared_ptr<incoming> xfer;       ///< the chunked transfer it waits for, if any
  bool timed_out = false;
  bool done = false;
  std::uint32_t peer_index = no_peer;  ///< the peer's position in the cluster spec (counters)
  clock::time_point started{};         ///< when its reactor took it (coarse; unset without observe_enabled)
  clock::duration report_at{};         ///< the age at which a stall report names it next
  recv_op** list_head = nullptr;       ///< set while linked into shard::recv_ops_
  recv_op* prev = nullptr;
  recv_op* next = nullptr;
};

template <transport Transport>
struct endpoint<Transport>::out_peer {
  task_id task;
  std::shared_ptr<channel_type> ch;
  bool ready = false;
  bool connecting = false;
  std::deque<std::shared_ptr<send_op>> waiting;
  std::vector<std::shared_ptr<send_op>> batch;  ///< small sends waiting for the end of this tick
  std::size_t batch_bytes = 0;
  std::size_t batch_meta = 4;
  bool flush_posted = false;
  timer_id flush_timer;  ///< options.fuse_delay > 0: when the batch leaves at the latest
  clock::time_point first_attempt{};
  clock::duration backoff{};
  std::vector<std::shared_ptr<channel_type>> extra;  ///< striping lanes (chunks 1.. only)
  bool extra_started = false;
  std::size_t next_extra = 0;
  std::uint64_t generation = 0;  ///< bumped whenever the lanes are dropped
  clock::time_point last_write{};
  /// The peer refused our cluster token: every send to it fails with this at
  /// once, without a new connection (an authentication failure is not retried).
  std::error_code refused;
  std::uint32_t index = no_peer;  ///< the peer's position in the cluster spec (counters)
  bool was_connected = false;     ///< a connection to it was up once (connecting again = reconnecting)
  std::error_code last_error;     ///< the last connect or lane error (stall reports)
};

/// One peer's share of the receive budget (options.recv_peer_budget): what its
/// early arrivals and the transfers the endpoint allocated for it hold.
template <transport Transport>
struct endpoint<Transport>::recv_account {
  std::string peer;
  std::size_t held = 0;           ///< bytes charged to it now
  std::uint64_t incarnation = 0;  ///< of the peer process last seen on an inbound connection (0: none yet)
  unsigned parked = 0;            ///< its connections not read until memory is released
  std::error_code last_error;     ///< the last error that closed a connection from it (stall reports)
};

/// Bytes charged to a peer's account and to the process total
/// (options.recv_budget) while an early arrival, the stored tensors of one
/// fused frame, or a transfer's own buffer hold them.
template <transport Transport>
struct endpoint<Transport>::held_bytes {
  shard* owner = nullptr;  ///< nullptr once detached (the shard is being destroyed)
  recv_account* account = nullptr;
  std::size_t bytes = 0;
  clock::time_point since{};      ///< when it was charged, or when its transfer completed unmatched
  std::uint64_t incarnation = 0;  ///< of the peer process that sent it
  unsigned refs = 1;
  held_bytes* prev = nullptr;  ///< in its shard's list of charges (detached when the shard goes)
  held_bytes* next = nullptr;
};

/// A counted reference to a held_bytes: the last one to go releases the bytes.
/// A plain count: every reference lives on its shard's reactor thread (or is
/// destroyed after the reactors stopped).
template <transport Transport>
class endpoint<Transport>::held_ref {
 public:
  held_ref() noexcept = default;
  explicit held_ref(held_bytes* p) noexcept : p_(p) {}
  held_ref(const held_ref& o) noexcept : p_(o.p_) {
    if (p_ != nullptr) ++p_->refs;
  }
  held_ref(held_ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  held_ref& operator=(held_ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~held_ref() { reset(); }

  void reset() noexcept {
    held_bytes* p = std::exchange(p_, nullptr);
    if (p == nullptr || --p->refs != 0) return;
    if (p->owner != nullptr) p->owner->release(*p);  // shard::release, rendezvous/detail/recv_budget.hpp
    delete p;
  }
  held_bytes* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  held_bytes* p_ = nullptr;
};

/// A chunked tensor being received: its chunks may arrive on any lane of the peer.
template <transport Transport>
struct endpoint<Transport>::incoming {
  transfer_key id;
  std::string key;
  std::uint64_t total = 0;
  std::uint32_t count = 0;
  std::uint32_t chunks_left = 0;
  unsigned reads = 0;    ///< chunk payload reads in progress into buf
  bool ordered = false;  ///< chunk 0 (sent on the peer's ordered lane) seen: matched to a recv
  bool failed = false;
  bool starved = false;  ///< its buffer waits for the receive budget (in shard::starved_)
  std::error_code error;
  tensor_buffer buf;
  /// With buf a split destination's head: where the bytes past buf.size() go.
  mutable_buffer tail;
  std::shared_ptr<recv_op> op;
  recv_account* account = nullptr;
  held_ref held{};                 ///< set while buf is the endpoint's own (not a receive's destination)
  clock::time_point last_chunk{};  ///< when its last chunk head or payload came (options.transfer_idle)
  /// Chunks whose head arrived before chunk 0: their payloads wait in their
  /// lanes' sockets until chunk 0 says where the tensor goes.
  struct parked_chunk {
    std::shared_ptr<void> lane;  ///< the channel (type-erased: incoming does not know it)
    std::uint64_t offset = 0;
    std::uint64_t len = 0;
  };
  std::vector<parked_chunk> parked;
};

/// A tensor that arrived before its recv, or a chunked one still arriving (`pending`).
template <transport Transport>
struct endpoint<Transport>::arrival {
  tensor_buffer buf;
  std::shared_ptr<incoming> pending;
  held_ref held{};  ///< what buf is charged (unset while pending: the transfer holds it)
};

template <transport Transport>
struct endpoint<Transport>::slot {
  fusewire::util::small_fifo<arrival> arrived;
  fusewire::util::small_fifo<std::shared_ptr<recv_op>> waiting;
  bool empty() const noexcept { return arrived.empty() && waiting.empty(); }
};

/// A connection we read the peer's frames on: one it made to us, or one we
/// made that it sends on too (reverse lanes).
template <transport Transport>
struct endpoint<Transport>::inbound {
  std::shared_ptr<channel_type> ch;
  std::string peer;  ///< empty until the handshake named it
  std::uint64_t incarnation = 0;
  clock::time_point last_frame{};
  bool reverse = false;             ///< the peer reads our frames on it (it offered protocol::feature_reverse)
  out_peer* out = nullptr;          ///< set while it is one of our send lanes to that peer too
  recv_account* account = nullptr;  ///< the peer's, set with `peer`
  /// Not read until memory is released: its frame's payload waits in the
  /// socket (the head in parked_head when head_parked, else a chunk in its
  /// transfer's `parked`).
  bool parked = false;
  bool head_parked = false;
  protocol::frame_head parked_head{};
};

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
