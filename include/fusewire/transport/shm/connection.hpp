#pragma once
/// shm: a connection's state (its rings, queued operations, wake-ups and the
/// peer's liveness) and basic_shm_connection, the public handle. See
/// transport/shm.hpp.

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/basic_reactor.hpp>
#include <fusewire/util/small_fifo.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/shm/pool.hpp>
#include <fusewire/transport/shm/segment.hpp>

namespace fusewire {
inline namespace v0 {

/// Counters of one shm connection.
struct shm_stats {
  std::uint64_t bytes_sent = 0;            ///< bytes this side sent (through its outgoing ring or by single copy)
  std::uint64_t bytes_received = 0;        ///< bytes this side received (from its incoming ring or by single copy)
  std::uint64_t wakeups_sent = 0;          ///< eventfd writes to a peer that declared itself asleep
  std::uint64_t sleeps = 0;                ///< waits on this side's eventfd (block mode, adaptive after idle_poll)
  std::uint64_t spins = 0;                 ///< posted re-checks of the rings (poll mode, adaptive within idle_poll)
  std::uint64_t single_copy_sent = 0;      ///< of bytes_sent, those the peer copied straight from this side's buffers
  std::uint64_t single_copy_received = 0;  ///< of bytes_received, those copied straight from the peer's buffers
  std::uint64_t pool_sent = 0;             ///< of bytes_sent, those the peer copied out of this side's shared pool
  std::uint64_t pool_received = 0;         ///< of bytes_received, those copied out of the peer's shared pool
};

namespace detail {

/// What a connection needs beyond its descriptors and mapping.
struct shm_link_options {
  std::size_t read_some_max = 256 * 1024;
  /// Pieces of a write at least this long go by single copy when the peer can
  /// read this process's memory; 0 = never (and this side reads none either).
  std::size_t single_copy_min = 0;
  pid_t peer_pid = 0;  ///< from SO_PEERCRED; 0 = unknown (no single copy)
  /// This side's shared pool (its transport's), or null: pieces of a write
  /// that lie in it go by reference.
  std::shared_ptr<shm::shared_pool> pool;
};

/// One shm connection's state, shared by its handle and its pending waits.
/// `Reactor`: a basic_reactor whose engine offers a readiness wait (fd_wait).
template <class Reactor>
class shm_connection_state final : public ref_counted, public closable {
 public:
  using io_handler_type = util::unique_function<void(std::error_code, std::size_t)>;
  using some_handler_type = util::unique_function<void(std::error_code, tensor_buffer)>;
  static constexpr const char* handle_name = "shm_connection";  ///< for handle_name_of

  /// `side` 0: the connecting side (writes ring 0), 1: the accepting side.
  shm_connection_state(Reactor& reactor, shm::unique_fd sock, shm::unique_fd my_bell, shm::unique_fd peer_bell,
                       shm::mapping map, int side, std::string peer, const shm_link_options& opts)
      : reactor_(&reactor),
        sock_(std::in_place, reactor.engine(), sock.release()),
        bell_(std::in_place, reactor.engine(), my_bell.release()),
        peer_bell_(std::move(peer_bell)),
        map_(std::move(map)),
        peer_(std::move(peer)),
        read_some_max_(opts.read_some_max),
        single_copy_min_(opts.peer_pid > 0 ? opts.single_copy_min : 0),
        peer_pid_(opts.peer_pid),
        pool_(opts.pool) {
    shm::segment_header* h = map_.header();
    ring_size_ = (map_.size() - shm::header_size) / 2;
    mask_ = ring_size_ - 1;
    publish_step_ = std::max<std::size_t>(ring_size_ / 16, 4096);
    record_max_ = std::min(publish_step_, ring_size_ - record_reserve);
    out_ = &h->ring[side];
    in_ = &h->ring[1 - side];
    out_data_ = map_.ring_data(side);
    in_data_ = map_.ring_data(1 - side);
    me_ = &h->side[side];
    them_ = &h->side[1 - side];
    out_rq_ = &h->remote[side];
    in_rq_ = &h->remote[1 - side];
    probe_word_ = random_word();
    me_->probe_value.store(probe_word_, std::memory_order_relaxed);
    me_->probe_addr.store(reinterpret_cast<std::uintptr_t>(&probe_word_), std::memory_order_release);
    // The peer's process as a pidfd: after each copy out of its memory, the
    // pidfd says whether that pid still is the peer (a pid can be reused).
    if (single_copy_min_ != 0) {
      peer_pidfd_ = shm::unique_fd(static_cast<int>(::syscall(SYS_pidfd_open, peer_pid_, 0)));
      if (!peer_pidfd_) single_copy_min_ = 0;
    }
    if (single_copy_min_ == 0) {
      me_->reads_peer.store(static_cast<std::uint32_t>(shm::single_copy::off), std::memory_order_release);
      reads_peer_ = shm::single_copy::off;
    }
    reactor_->add_closable(*this);
    watch_socket();
  }

  ~shm_connection_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
    teardown();
  }

  Reactor& reactor() const noexcept { return *reactor_; }
  bool is_open() const noexcept { return open_; }
  const std::string& peer() const noexcept { return peer_; }
  shm_stats stats() const noexcept { return stats_; }

  void async_write(std::span<const const_buffer> sg, io_handler_type h) {
    reactor_->work_started();
    if (!open_ || failed_) {
      complete(std::move(h), open_ ? failed_ : make_error_code(errc::connection_closed), 0);
      return;
    }
    write_op w;
    w.sg.assign(sg.begin(), sg.end());
    w.h = std::move(h);
    writes_.push_back(std::move(w));
    pump();
  }

  void async_read(mutable_buffer dst, io_handler_type h) {
    reactor_->work_started();
    if (!open_ || failed_) {
      complete(std::move(h), open_ ? failed_ : make_error_code(errc::connection_closed), 0);
      return;
    }
    read_op r;
    r.dst = dst;
    r.h = std::move(h);
    reads_.push_back(std::move(r));
    pump();
  }

  void async_read_some(some_handler_type h) {
    reactor_->work_started();
    if (!open_ || failed_) {
      complete_some(std::move(h), open_ ? failed_ : make_error_code(errc::connection_closed), {});
      return;
    }
    read_op r;
    r.some = true;
    r.sh = std::move(h);
    reads_.push_back(std::move(r));
    pump();
  }

  /// Fills exactly `dst` now, when no read is queued and the incoming ring
  /// already holds that many bytes before the next piece announced for single
  /// copy (see readahead_connection); otherwise consumes nothing and returns
  /// false, and async_read goes on from there in stream order.
  bool try_read(mutable_buffer dst) noexcept {
    if (!open_ || failed_ || !map_ || !reads_.empty()) return false;
    // From the records published before the next piece of the peer's (a
    // piece not checked yet is take_piece's job, a header that does not check
    // pull_reads' to report): otherwise "not now".
    if (in_left_ < dst.size()) {
      const std::uint64_t rem_head = in_rq_->head.load(std::memory_order_acquire);
      if (!piece_ && rem_head != in_rem_tail_) return false;
      if (published(dst.size(), rem_head) < dst.size()) return false;
    }
    if (dst.empty()) return true;
    copy_records(dst.data(), dst.size());
    stats_.bytes_received += dst.size();
    publish_reads(false);
    return true;
  }

  void close() noexcept {
    if (!open_) return;
    open_ = false;
    if (closable_linked_) reactor_->remove_closable(*this);
    teardown();
    fail_all(make_error_code(errc::cancelled));
  }

  void shutdown() noexcept override { close(); }

 private:
  struct read_op {
    mutable_buffer dst;
    std::size_t filled = 0;
    bool some = false;
    io_handler_type h;
    some_handler_type sh;
  };
  struct write_op {
    /// A frame is its prefix and a payload or two: no allocation per write.
    boost::container::small_vector<const_buffer, 3> sg;
    std::size_t idx = 0, off = 0, done = 0;
    std::uint64_t need_ack = 0;  ///< the remote pieces the peer must have copied before this completes
    io_handler_type h;
  };
  /// The remote piece being read: `off` of its `size` bytes copied so far.
  struct piece_in {
    shm::remote_piece p;
    std::uint64_t off = 0;
  };

  void complete(io_handler_type h, std::error_code ec, std::size_t n) noexcept {
    try {
      reactor_->post([r = reactor_, h = std::move(h), ec, n]() mutable {
        r->work_finished();
        r->invoke(h, ec, n);
      });
    } catch (...) {
      reactor_->report("shm_connection: no memory to post a completion");
    }
  }
  void complete_some(some_handler_type h, std::error_code ec, tensor_buffer b) noexcept {
    try {
      reactor_->post([r = reactor_, h = std::move(h), ec, b = std::move(b)]() mutable {
        r->work_finished();
        r->invoke(h, ec, std::move(b));
      });
    } catch (...) {
      reactor_->report("shm_connection: no memory to post a completion");
    }
  }

  void fail_reads(std::error_code ec) noexcept {
    while (!reads_.empty()) {
      read_op r = std::move(reads_.front());
      reads_.pop_front();
      if (r.some) {
        complete_some(std::move(r.sh), ec, {});
      } else {
        complete(std::move(r.h), ec, r.filled);
      }
    }
  }
  void fail_writes(std::error_code ec) noexcept {
    while (!unacked_.empty()) {
      write_op w = std::move(unacked_.front());
      unacked_.pop_front();
      complete(std::move(w.h), ec, w.done);
    }
    while (!writes_.empty()) {
      write_op w = std::move(writes_.front());
      writes_.pop_front();
      complete(std::move(w.h), ec, w.done);
    }
  }
  void fail_all(std::error_code ec) noexcept {
    fail_reads(ec);
    fail_writes(ec);
  }

  /// The peer broke the protocol: the connection fails (its pending and later
  /// operations with errc::malformed_frame) and the reactor reports why.
  void protocol_error(const std::string& what) noexcept {
    if (failed_) return;
    failed_ = make_error_code(errc::malformed_frame);
    reactor_->report("shm_connection to " + peer_ + ": " + what + "; the connection failed");
    teardown();
    fail_all(failed_);
  }

  /// Announces this side's close (the peer reads what was produced, then the
  /// end of the stream), wakes the peer and lets go of every descriptor and the mapping.
  void teardown() noexcept {
    if (!map_) return;
    me_->closed.store(1, std::memory_order_seq_cst);
    if (them_->sleeping.exchange(0, std::memory_order_seq_cst) != 0) ring_bell();
    sock_->close();
    bell_->close();
    peer_bell_.reset();
    map_.reset();
    peer_pool_.reset();
    out_ = in_ = nullptr;
    out_rq_ = in_rq_ = nullptr;
    me_ = them_ = nullptr;
    let_go_if_idle();
  }

  /// Drops the descriptor objects once torn down and no wait of theirs is
  /// left to run, so that nothing of this state touches the reactor's engine
  /// after the reactor stopped (a state held past then, by an endpoint being
  /// destroyed, say, is destroyed without it).
  void let_go_if_idle() noexcept {
    if (map_ || bell_armed_ || sock_waiting_) return;
    sock_.reset();
    bell_.reset();
  }

  void ring_bell() noexcept {
    const std::uint64_t one = 1;
    if (::write(peer_bell_.get(), &one, sizeof one) == static_cast<ssize_t>(sizeof one)) ++stats_.wakeups_sent;
  }

  /// Wakes the peer if it declared itself asleep (seq_cst on both sides:
  /// "publish an index, then look at the flag" against "raise the flag, then
  /// look at the index", so a wake-up is never lost).
  void notify_peer() noexcept {
    if (them_->sleeping.load(std::memory_order_seq_cst) != 0 &&
        them_->sleeping.exchange(0, std::memory_order_seq_cst) != 0) {
      ring_bell();
    }
  }

  /// After this side consumed: wakes the peer if it sleeps, except while
  /// this side still has pieces of the peer's to copy (`pieces_left`) and the
  /// peer waits neither for room in the ring nor for an acknowledgement made
  /// so far: in the middle of a large transfer it would wake to find nothing
  /// to do, at the cost of a switch there and, between cores, an interrupt
  /// here. Otherwise a wake-up now, before the answer to what was read is
  /// ready, overlaps the peer's wake-up with this side's work on it. The
  /// peer's flags are only advice: they decide whether it is woken, never
  /// what this side reads or writes.
  void notify_peer_of_reads(bool pieces_left) noexcept {
    if (pieces_left && them_->sleeping.load(std::memory_order_seq_cst) != 0 &&
        them_->wants_room.load(std::memory_order_seq_cst) == 0 &&
        in_rem_tail_ < them_->ack_wanted.load(std::memory_order_seq_cst)) {
      return;
    }
    notify_peer();
  }

  void copy_in(const std::byte* src, std::size_t n) noexcept {
    const std::size_t pos = static_cast<std::size_t>(out_head_ & mask_);
    const std::size_t first = std::min(n, ring_size_ - pos);
    std::memcpy(out_data_ + pos, src, first);
    if (first < n) std::memcpy(out_data_, src + first, n - first);
    out_head_ += n;
  }
  /// Copies `n` bytes (at most in_left_) of the open record; past its last
  /// byte, in_tail_ moves on to the next record's header.
  void copy_out(std::byte* dst, std::size_t n) noexcept {
    const std::size_t pos = static_cast<std::size_t>(in_tail_ & mask_);
    const std::size_t first = std::min(n, ring_size_ - pos);
    std::memcpy(dst, in_data_ + pos, first);
    if (first < n) std::memcpy(dst + first, in_data_, n - first);
    in_tail_ += n;
    in_left_ -= n;
    if (in_left_ == 0) in_tail_ = align8(in_tail_);
  }

  /// The bytes of the open record and of the records published after it,
  /// up to `cap` and up to the next piece of the peer's (or a header that
  /// does not check: open_record reports it when the reader gets there).
  /// Each header is loaded before the piece queue's head, as in open_record,
  /// so the records counted here precede every piece not yet taken.
  std::size_t published(std::size_t cap, std::uint64_t rem_head) const noexcept {
    std::size_t total = in_left_;
    std::uint64_t pos = align8(in_tail_ + in_left_);
    while (total < cap) {
      if (piece_ ? piece_->p.at <= pos : in_rem_tail_ != rem_head) break;
      const std::uint64_t len = record_length(ring_word(in_data_, pos).load(std::memory_order_acquire), pos);
      if (len == 0) break;
      if (in_rq_->head.load(std::memory_order_acquire) != rem_head) break;
      total += static_cast<std::size_t>(len);
      pos = align8(pos + 8 + len);
    }
    return std::min(total, cap);
  }
  /// Copies `n` bytes that published() counted, opening records as it goes.
  void copy_records(std::byte* dst, std::size_t n) noexcept {
    while (n != 0) {
      if (in_left_ == 0) {
        const std::uint64_t len = ring_word(in_data_, in_tail_).load(std::memory_order_acquire) & 0xffffffffu;
        in_tail_ += 8;
        in_left_ = static_cast<std::size_t>(len);
      }
      const std::size_t k = std::min(n, in_left_);
      copy_out(dst, k);
      dst += k;
      n -= k;
    }
  }

  /// The length of the record whose header word `w` was loaded at `pos`, or
  /// 0 when `w` is no header (zero: nothing published there yet; else it
  /// carries another position, or a length that does not fit the ring).
  std::uint64_t record_length(std::uint64_t w, std::uint64_t pos) const noexcept {
    const std::uint64_t len = w & 0xffffffffu;
    return w == shm::record_header(pos, len) && len <= ring_size_ - record_reserve ? len : 0;
  }
  static std::uint64_t align8(std::uint64_t pos) noexcept { return (pos + 7) & ~std::uint64_t{7}; }

  /// The 8-byte word of a ring at stream position `pos` (a multiple of 8, so
  /// it never wraps): a record's header, or zero where none was published yet.
  std::atomic_ref<std::uint64_t> ring_word(std::byte* data, std::uint64_t pos) const noexcept {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(data + (pos & mask_)));
  }

  /// Moves what it can: queued writes into the outgoing ring, the incoming
  /// ring into queued reads; then waits (spins or sleeps) for the rest.
  void pump() noexcept {
    if (!open_ || failed_ || !map_) return;
    bool moved = false;
    if (!push_writes(moved) || !pull_reads(moved)) return;
    if (moved) spin_since_.reset();
    if (reads_.empty() && writes_.empty() && unacked_.empty()) {
      spin_since_.reset();
      return;
    }
    wait_more();
  }

  /// False after a protocol error.
  bool push_writes(bool& moved) noexcept {
    if (writes_.empty() && unacked_.empty()) return true;
    // What the peer copied is done with, closed or not: complete that first.
    if (!unacked_.empty() && !complete_acked()) return false;
    if (writes_.empty() && unacked_.empty()) return true;
    if (peer_gone_ || them_->closed.load(std::memory_order_acquire) != 0) {
      fail_writes(make_error_code(errc::connection_reset));  // as TCP's broken pipe
      return true;
    }
    // The peer's read index as last loaded is a lower bound: it is loaded
    // again (a shared line moved between the cores) only when the front write
    // does not fit behind it.
    if (!writes_.empty()) {
      const write_op& w = writes_.front();
      if (free_bytes() < total_size({w.sg.data(), w.sg.size()}) - w.done + record_reserve && !load_tail()) return false;
    }
    // Single copy: only where the peer said it reads this process's memory,
    // and while the piece queue has room (else the ring takes the bytes).
    const bool remote_ok = single_copy_min_ != 0 && them_->reads_peer.load(std::memory_order_acquire) ==
                                                        static_cast<std::uint32_t>(shm::single_copy::works);
    const std::uint64_t start = out_head_, rem_start = out_rem_head_;
    // At most a ring's worth per call (the other connections of this reactor
    // get their turn), shown to the peer a step at a time so that it copies
    // out while this side copies in.
    std::size_t budget = ring_size_;
    std::uint64_t seen_at = out_head_;  ///< out_head_ when the read index was last loaded
    std::uint64_t ring_bytes = 0;
    while (!writes_.empty()) {
      write_op& w = writes_.front();
      while (w.idx < w.sg.size()) {
        const const_buffer& b = w.sg[w.idx];
        const std::size_t left = b.size() - w.off;
        const bool slot_free = out_rem_head_ - out_rem_acked_ < shm::remote_slots;
        std::optional<std::uint64_t> in_pool;
        if (pool_ && slot_free && left >= shm::pool_piece_min) in_pool = pool_->offset_of(b.data() + w.off, left);
        if (in_pool && offer_pool()) {
          announce(w, shm::piece_kind::pool, *in_pool, left);
          stats_.pool_sent += left;
          continue;
        }
        if (remote_ok && slot_free && left >= single_copy_min_) {
          announce(w, shm::piece_kind::process, reinterpret_cast<std::uintptr_t>(b.data() + w.off), left);
          stats_.single_copy_sent += left;
          continue;
        }
        if (record_room() == 0 && budget != 0 && out_head_ != seen_at) {
          // The peer may have made room while this side copied.
          publish_writes();
          seen_at = out_head_;
          if (!load_tail()) return false;
        }
        const std::size_t n = std::min({left, record_room(), budget});
        if (n > 0) {
          if (!rec_open_) {  // its header's 8 bytes, stored when the record is published
            rec_open_ = true;
            rec_at_ = out_head_;
            out_head_ += 8;
          }
          copy_in(b.data() + w.off, n);
          rec_len_ += n;
          ring_bytes += n;
          budget -= n;
          w.off += n;
          w.done += n;
          if (rec_len_ >= record_max_) publish_writes();
        }
        if (w.off < b.size()) {
          if (n > 0) continue;  // the next step of this buffer
          break;
        }
        ++w.idx;
        w.off = 0;
      }
      if (w.idx < w.sg.size()) break;
      // In order: a write waits behind any whose pieces the peer still copies.
      if (w.need_ack > out_rem_acked_ || !unacked_.empty()) {
        unacked_.push_back(std::move(w));
      } else {
        complete(std::move(w.h), {}, w.done);
      }
      writes_.pop_front();
    }
    stats_.bytes_sent += ring_bytes;
    if (out_head_ != start || out_rem_head_ != rem_start) {
      moved = true;
      publish_writes();
    }
    return true;
  }

  /// Puts the rest of `w`'s current buffer (`left` bytes) in the piece queue
  /// at the ring's head; `w` completes once the peer copied it.
  void announce(write_op& w, shm::piece_kind kind, std::uint64_t addr, std::size_t left) noexcept {
    close_record();  // a piece sits between two records
    shm::remote_piece& slot = out_rq_->slot[out_rem_head_ % shm::remote_slots];
    slot.at = out_head_;
    slot.addr = addr;
    slot.size = left;
    slot.kind = kind;
    w.need_ack = ++out_rem_head_;
    w.done += left;
    stats_.bytes_sent += left;
    ++w.idx;
    w.off = 0;
  }

  /// Whether the peer has (or, sent now, will have before it sees the next
  /// piece) this side's pool. The descriptor goes over the Unix socket before
  /// any piece of the pool is published, so the peer finds it queued there.
  bool offer_pool() noexcept {
    if (pool_offer_ == offer::sent) return true;
    if (pool_offer_ == offer::refused) return false;
    pool_offer_ = pool_->send_to(sock_->native_handle()) ? offer::sent : offer::refused;
    return pool_offer_ == offer::sent;
  }

  /// Loads the peer's read index into out_tail_ (what free_bytes() counts
  /// from). False after a protocol error (an index outside the ring).
  bool load_tail() noexcept {
    const std::uint64_t tail = out_->tail.load(std::memory_order_acquire);
    const std::uint64_t used = out_head_ - tail;
    if (used > ring_size_) {
      protocol_error("the peer's read index " + std::to_string(tail) + " is not within the ring of " +
                     std::to_string(ring_size_) + " bytes behind the write index " + std::to_string(out_head_));
      return false;
    }
    out_tail_ = tail;
    return true;
  }

  /// Shows the peer what this side wrote so far (the open record, and the
  /// pieces announced before it) and wakes it if it sleeps.
  void publish_writes() noexcept {
    close_record();
    show_pieces();
    notify_peer();
  }
  void show_pieces() noexcept {
    if (out_rem_head_ != shown_rem_head_) {
      out_rq_->head.store(out_rem_head_, std::memory_order_seq_cst);
      shown_rem_head_ = out_rem_head_;
    }
  }

  /// The outgoing ring's free bytes as far as this side knows (out_tail_).
  std::size_t free_bytes() const noexcept { return ring_size_ - static_cast<std::size_t>(out_head_ - out_tail_); }
  /// The bytes the open record, or a new one, can still take: what is free
  /// after a new record's header, the padding to the next header (at most 7
  /// bytes) and that header's zero word.
  std::size_t record_room() const noexcept {
    const std::size_t space = free_bytes();
    const std::size_t reserve = rec_open_ ? 15 : 23;
    return space <= reserve ? 0 : std::min(space - reserve, record_max_ - rec_len_);
  }

  /// Publishes the open record: the next header's word zeroed first (the
  /// consumer that sees this header and reads on finds "nothing yet" there,
  /// never a lap-old byte), the pieces announced before it, then the header.
  /// Its seq_cst store is the publication notify_peer() pairs with.
  void close_record() noexcept {
    if (!rec_open_) return;
    out_head_ = align8(out_head_);
    ring_word(out_data_, out_head_).store(0, std::memory_order_relaxed);
    show_pieces();
    ring_word(out_data_, rec_at_).store(shm::record_header(rec_at_, rec_len_), std::memory_order_seq_cst);
    rec_open_ = false;
    rec_len_ = 0;
  }

  /// Completes the writes whose pieces the peer has copied. False after a protocol error.
  bool complete_acked() noexcept {
    const std::uint64_t acked = out_rq_->tail.load(std::memory_order_acquire);
    if (acked < out_rem_acked_ || acked > out_rem_head_) {
      protocol_error("the peer acknowledged piece " + std::to_string(acked) + ", outside " +
                     std::to_string(out_rem_acked_) + ".." + std::to_string(out_rem_head_));
      return false;
    }
    out_rem_acked_ = acked;
    while (!unacked_.empty() && unacked_.front().need_ack <= acked) {
      complete(std::move(unacked_.front().h), {}, unacked_.front().done);
      unacked_.pop_front();
    }
    return true;
  }

  /// False after a protocol error.
  bool pull_reads(bool& moved) noexcept {
    if (reads_.empty()) return true;
    if (reads_peer_ == shm::single_copy::unknown) probe_peer();
    // The flag first: bytes produced before the peer closed are then all visible.
    const bool peer_done = peer_gone_ || them_->closed.load(std::memory_order_acquire) != 0;
    std::uint64_t rem_head = 0;
    if (!load_rem_head(rem_head)) return false;
    const std::uint64_t rem_start = in_rem_tail_;
    std::uint64_t ring_bytes = 0, piece_bytes = 0;
    // At most a ring's worth of the ring's bytes and of pieces per call: the
    // other connections of this reactor get their turn. The ring's bytes are
    // handed back a step at a time, so that the peer copies in while this
    // side copies out.
    std::size_t ring_budget = ring_size_, piece_budget = ring_size_;
    bool failed = false;
    while (!reads_.empty()) {
      // An empty exact read takes no bytes: it completes where it stands, as
      // on the other transports, and waits for none to arrive.
      if (!reads_.front().some && reads_.front().dst.empty()) {
        complete(std::move(reads_.front().h), {}, 0);
        reads_.pop_front();
        continue;
      }
      if (!piece_ && in_rem_tail_ != rem_head && !take_piece()) return false;
      // Between two records: the piece that sits here, or the next record.
      bool from_peer = false;
      if (in_left_ == 0) {
        if (piece_ && piece_->p.at == in_tail_) {
          from_peer = true;
        } else if (piece_ && piece_->p.at < in_tail_) {
          protocol_error("the peer announced a piece at ring position " + std::to_string(piece_->p.at) +
                         ", inside a record that ends at " + std::to_string(in_tail_));
          return false;
        } else if (ring_budget == 0) {
          break;
        } else {
          const record got = open_record(rem_head);
          if (got == record::bad) return false;
          if (got == record::pieces_first) continue;
          if (got == record::none) break;
        }
      }
      read_op& r = reads_.front();
      const std::size_t want = r.some ? read_some_max_ : r.dst.size() - r.filled;
      // A read_some is one delivery (at most read_some_max) of what the ring
      // holds before the next piece, over as many records; a record is at
      // most a publish step, so an exact read from the ring goes a step at a time.
      const std::size_t avail =
          from_peer ? static_cast<std::size_t>(std::min<std::uint64_t>(piece_->p.size - piece_->off, piece_budget))
          : r.some  ? published(std::min(want, ring_budget), rem_head)
                    : std::min(in_left_, ring_budget);
      if (avail == 0) break;
      const std::size_t n = std::min(want, avail);
      std::byte* dst = nullptr;
      tensor_buffer b;
      if (r.some) {
        try {
          b = tensor_buffer::allocate(n);
        } catch (...) {
          reactor_->report("shm_connection: no memory for a received buffer");
          break;
        }
        dst = b.data();
      } else {
        dst = r.dst.data() + r.filled;
      }
      if (from_peer) {
        if (!copy_from_peer(dst, n, failed)) return !failed;
        piece_bytes += n;
        piece_budget -= n;
      } else {
        copy_records(dst, n);
        ring_bytes += n;
        ring_budget -= n;
        if (in_tail_ - shown_tail_ >= publish_step_) publish_reads(piece_ || in_rem_tail_ != rem_head);
      }
      if (r.some) {
        complete_some(std::move(r.sh), {}, std::move(b));
      } else {
        r.filled += n;
        if (r.filled < r.dst.size()) continue;
        complete(std::move(r.h), {}, r.filled);
      }
      reads_.pop_front();
    }
    stats_.bytes_received += ring_bytes;
    if (in_rem_tail_ != rem_start) in_rq_->tail.store(in_rem_tail_, std::memory_order_seq_cst);
    stats_.bytes_received += piece_bytes;
    if (ring_bytes != 0 || piece_bytes != 0) {
      moved = true;
      publish_reads(piece_ || in_rem_tail_ != rem_head);
    }
    if (!reads_.empty() && in_left_ == 0 && !piece_ && in_rem_tail_ == rem_head && peer_done &&
        ring_word(in_data_, in_tail_).load(std::memory_order_acquire) == 0) {
      const bool clean = them_->closed.load(std::memory_order_acquire) != 0;
      fail_reads(make_error_code(clean ? errc::connection_closed : errc::connection_reset));
    }
    return true;
  }

  /// The peer's piece queue's head, checked. False after a protocol error.
  bool load_rem_head(std::uint64_t& rem_head) noexcept {
    const std::uint64_t h = in_rq_->head.load(std::memory_order_acquire);
    if (h - in_rem_tail_ > shm::remote_slots) {
      protocol_error("the peer announced piece " + std::to_string(h) + ", more than " +
                     std::to_string(shm::remote_slots) + " ahead of piece " + std::to_string(in_rem_tail_));
      return false;
    }
    rem_head = h;
    return true;
  }

  enum class record { opened, none, pieces_first, bad };

  /// At a record boundary (in_left_ == 0): opens the record the peer
  /// published at in_tail_, if any. A piece announced before that record is
  /// seen once its header is: when the piece queue moved past `rem_head`
  /// (updated), the pieces are taken first (one may sit at this boundary).
  /// A bad header is a protocol error.
  record open_record(std::uint64_t& rem_head) noexcept {
    const std::uint64_t w = ring_word(in_data_, in_tail_).load(std::memory_order_acquire);
    if (w == 0) return record::none;
    const std::uint64_t len = record_length(w, in_tail_);
    if (len == 0) {
      protocol_error("the peer's record header at ring position " + std::to_string(in_tail_) + " (0x" + hex(w) +
                     ") does not carry that position and a length from 1 to " +
                     std::to_string(ring_size_ - record_reserve));
      return record::bad;
    }
    const std::uint64_t seen = rem_head;
    if (!load_rem_head(rem_head)) return record::bad;
    if (rem_head != seen) return record::pieces_first;
    in_tail_ += 8;
    in_left_ = static_cast<std::size_t>(len);
    return record::opened;
  }

  /// Hands the bytes this side copied out back to the peer and wakes it if it
  /// sleeps (notify_peer_of_reads says when not). The read index is stored
  /// once a quarter ring was read since it last was, or when the peer
  /// sleeps (it may wait for room), not after every read: a small message
  /// then moves no line of the read index between the cores. A writer waits
  /// for room only when what it cannot see read plus what is unread fills
  /// the ring; with nothing unread that is a full ring read and not shown,
  /// so this side shows it, and a writer never waits on bytes already read.
  void publish_reads(bool pieces_left) noexcept {
    if (in_tail_ != shown_tail_ &&
        (in_tail_ - shown_tail_ >= ring_size_ / 4 || them_->sleeping.load(std::memory_order_seq_cst) != 0)) {
      show_reads();
    }
    notify_peer_of_reads(pieces_left);
  }
  void show_reads() noexcept {
    in_->tail.store(in_tail_, std::memory_order_seq_cst);
    shown_tail_ = in_tail_;
  }

  /// Takes the next announced piece, checked: it starts within the ring's
  /// unread bytes, is not empty, and lies in memory this side reads: the
  /// peer's process where single copy works, or the peer's pool (whose
  /// descriptor must be on the socket by now). False after a protocol error.
  bool take_piece() noexcept {
    const shm::remote_piece p = in_rq_->slot[in_rem_tail_ % shm::remote_slots];  // a copy: the peer may scribble
    std::string why;
    if (p.at < in_tail_ || p.at - in_tail_ > ring_size_ || p.size == 0) {
      why = "";
    } else if (p.kind == shm::piece_kind::pool) {
      if (!peer_pool_ && receive_control() != control::pool) {
        if (failed_) return false;
        why = ", but sent no pool";
      } else if (p.addr > peer_pool_.size() || p.size > peer_pool_.size() - p.addr) {
        why =
            ", at offset " + std::to_string(p.addr) + " of its pool of " + std::to_string(peer_pool_.size()) + " bytes";
      } else {
        piece_ = piece_in{p, 0};
        return true;
      }
    } else if (p.kind != shm::piece_kind::process) {
      why = " of an unknown kind " + std::to_string(static_cast<std::uint64_t>(p.kind));
    } else if (p.addr + p.size < p.addr || single_copy_min_ == 0 || reads_peer_ != shm::single_copy::works) {
      why = p.addr + p.size < p.addr ? "" : ", but this side reads no pieces";
    } else {
      piece_ = piece_in{p, 0};
      return true;
    }
    protocol_error("the peer announced a piece of " + std::to_string(p.size) + " bytes at ring position " +
                   std::to_string(p.at) + " (read index " + std::to_string(in_tail_) + ")" + why);
    return false;
  }

  /// Copies `n` bytes of the current piece out of the peer's memory. False
  /// when the connection failed (`failed`: by a protocol error) or the peer's
  /// close may have taken the piece's memory back (the reads then fail).
  bool copy_from_peer(std::byte* dst, std::size_t n, bool& failed) noexcept {
    if (piece_->p.kind == shm::piece_kind::pool) return copy_from_pool(dst, n);
    iovec local{dst, n};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(piece_->p.addr + piece_->off)), n};
    ssize_t got = -1;
    do {
      got = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0 && errno == ESRCH) {
      peer_gone_ = true;
      fail_reads(make_error_code(errc::connection_reset));
      return false;
    }
    if (got != static_cast<ssize_t>(n)) {
      const std::string why = got < 0 ? last_error_text() : "only " + std::to_string(got) + " could be read";
      protocol_error("reading " + std::to_string(n) + " bytes of the peer's piece at 0x" +
                     hex(reinterpret_cast<std::uintptr_t>(remote.iov_base)) + " failed: " + why);
      failed = true;
      return false;
    }
    // A write completes only once its pieces were copied, unless its side
    // closed or died: then the memory may be reused already (by another
    // process, for a dead one's pid), and what was read is lost.
    pollfd exited{peer_pidfd_.get(), POLLIN, 0};
    if (::poll(&exited, 1, 0) != 0) peer_gone_ = true;
    if (peer_gone_ || them_->closed.load(std::memory_order_seq_cst) != 0) {
      fail_reads(make_error_code(errc::connection_reset));
      return false;
    }
    stats_.single_copy_received += n;
    piece_done(n);
    return true;
  }

  /// copy_from_peer() for a piece of the peer's pool. The mapping stays
  /// valid whatever the peer does; only a peer that closed may have reused
  /// the piece's memory (one that died reuses nothing).
  bool copy_from_pool(std::byte* dst, std::size_t n) noexcept {
    std::memcpy(dst, peer_pool_.data() + piece_->p.addr + piece_->off, n);
    if (them_->closed.load(std::memory_order_seq_cst) != 0) {
      fail_reads(make_error_code(errc::connection_reset));
      return false;
    }
    stats_.pool_received += n;
    piece_done(n);
    return true;
  }

  void piece_done(std::size_t n) noexcept {
    piece_->off += n;
    if (piece_->off == piece_->p.size) {
      piece_.reset();
      ++in_rem_tail_;
    }
  }

  /// Reads the peer's probe word through process_vm_readv (once, when the
  /// peer published where it is) and tells the peer whether this side will
  /// copy its pieces.
  void probe_peer() noexcept {
    const std::uint64_t addr = them_->probe_addr.load(std::memory_order_acquire);
    if (addr == 0) return;
    const std::uint64_t expect = them_->probe_value.load(std::memory_order_relaxed);
    std::uint64_t word = 0;
    iovec local{&word, sizeof word};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), sizeof word};
    const bool ok =
        ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof word) && word == expect;
    reads_peer_ = ok ? shm::single_copy::works : shm::single_copy::off;
    me_->reads_peer.store(static_cast<std::uint32_t>(reads_peer_), std::memory_order_release);
  }

  static std::uint64_t random_word() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uint64_t w = 0;
    while (w == 0) w = rng();
    return w;
  }
  static std::string last_error_text() { return std::error_code(errno, std::system_category()).message(); }
  static std::string hex(std::uint64_t w) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%jx", static_cast<std::uintmax_t>(w));
    return buf;
  }

  /// Whether a queued operation could move now (the flag-raising side of notify_peer).
  bool ready() const noexcept {
    if (peer_gone_ || them_->closed.load(std::memory_order_seq_cst) != 0) return true;
    if (!reads_.empty() && (in_left_ != 0 || ring_word(in_data_, in_tail_).load(std::memory_order_seq_cst) != 0)) {
      return true;
    }
    if (!writes_.empty() && ring_size_ - (out_head_ - out_->tail.load(std::memory_order_seq_cst)) >= record_reserve) {
      return true;
    }
    if (!reads_.empty() && in_rq_->head.load(std::memory_order_seq_cst) != in_rem_tail_) return true;
    if (!unacked_.empty() && out_rq_->tail.load(std::memory_order_seq_cst) >= unacked_.front().need_ack) return true;
    return false;
  }

  /// Poll mode spins (a posted re-check each tick); adaptive spins for the
  /// reactor's idle_poll since the last progress, then sleeps; block sleeps:
  /// raises this side's flag and waits for the eventfd the peer then signals.
  void wait_more() noexcept {
    const reactor_mode mode = reactor_->mode();
    if (mode == reactor_mode::poll) return spin();
    if (mode == reactor_mode::adaptive) {
      const auto now = std::chrono::steady_clock::now();
      if (!spin_since_) spin_since_ = now;
      if (now - *spin_since_ < reactor_->group().config().idle_poll) {
        // The re-check is a task, so the reactor counts its tick as work and
        // does not give way as an idle adaptive tick does; give way here: on a
        // host with fewer cores than threads, the peer that would fill the
        // ring may be waiting for this CPU.
        std::this_thread::yield();
        return spin();
      }
    }
    sleep();
  }

  /// A re-check of the rings on the next tick (embedded: no allocation per tick).
  void spin() noexcept {
    if (spin_task_.scheduled()) return;
    spin_task_.schedule(*reactor_);
    ++stats_.spins;
  }

  void sleep() noexcept {
    if (in_tail_ != shown_tail_) show_reads();  // off the critical path now; the peer may want the room
    me_->wants_room.store(writes_.empty() ? 0 : 1, std::memory_order_relaxed);
    me_->ack_wanted.store(unacked_.empty() ? ~std::uint64_t{0} : unacked_.front().need_ack, std::memory_order_relaxed);
    me_->sleeping.store(1, std::memory_order_seq_cst);
    if (ready()) {
      me_->sleeping.store(0, std::memory_order_relaxed);
      spin_since_.reset();
      return spin();
    }
    if (bell_armed_) return;
    try {
      bell_->async_wait([self = ref_ptr<shm_connection_state>(this)](std::error_code ec) {
        self->bell_armed_ = false;
        if (ec || !self->map_) return self->let_go_if_idle();
        std::uint64_t count = 0;
        while (::read(self->bell_->native_handle(), &count, sizeof count) > 0) {
        }
        self->me_->sleeping.store(0, std::memory_order_relaxed);
        self->spin_since_.reset();
        self->pump();
      });
    } catch (...) {
      // The engine could not take the wait (no memory, a full ring): spin
      // this tick and try to sleep again on the next.
      me_->sleeping.store(0, std::memory_order_relaxed);
      return spin();
    }
    bell_armed_ = true;
    ++stats_.sleeps;
  }

  /// What the Unix socket had: nothing yet, the peer's pool (now mapped),
  /// its hang-up, or something that broke the protocol (the connection failed).
  enum class control { nothing, pool, hang_up, failed };

  /// Takes one message off the Unix socket, if one is there. After the
  /// handshake the only message a peer may send is its pool, once.
  control receive_control() noexcept {
    shm::pool_hello h{};
    const shm::received_message m = shm::receive_with_fds(sock_->native_handle(), &h, sizeof h);
    if (m.bytes < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return control::nothing;
    if (m.bytes <= 0) return control::hang_up;
    std::string why;
    if (m.bytes != static_cast<ssize_t>(sizeof h) || m.truncated || m.fd_count != 1) {
      why = "the peer sent a message of " + std::to_string(m.bytes) + (m.truncated ? " or more" : "") + " bytes and " +
            std::to_string(m.fd_count) + " descriptors on the control socket that is not its pool";
    } else if (peer_pool_) {
      why = "the peer sent its pool a second time";
    } else {
      peer_pool_ = shm::accept_pool(h, m.fds[0].get(), why);
      if (peer_pool_) return control::pool;
    }
    protocol_error(why);
    return control::failed;
  }

  /// The Unix socket stays open for the connection's life: its hang-up is the
  /// peer's death (or close). The peer's pool may arrive on it, once.
  void watch_socket() noexcept {
    try {
      sock_->async_wait([self = ref_ptr<shm_connection_state>(this)](std::error_code ec) {
        self->sock_waiting_ = false;
        if (ec || !self->map_) return self->let_go_if_idle();
        switch (self->receive_control()) {
          case control::nothing:
            return self->watch_socket();
          case control::pool:
            self->watch_socket();
            return self->pump();
          case control::hang_up:
            self->peer_gone_ = true;
            return self->pump();
          case control::failed:
            return self->let_go_if_idle();
        }
      });
    } catch (...) {
      // Without the watch a dead peer would go unnoticed: fail instead.
      if (failed_) return;
      failed_ = make_error_code(errc::out_of_memory);
      reactor_->report("shm_connection to " + peer_ +
                       ": the reactor's engine took no wait on the control socket; the connection failed");
      teardown();
      return fail_all(failed_);
    }
    sock_waiting_ = true;
  }

  using fd_wait = typename Reactor::engine_type::fd_wait;
  Reactor* reactor_;
  /// The Unix socket (the peer's liveness) and this side's eventfd; empty
  /// once torn down and idle (let_go_if_idle).
  std::optional<fd_wait> sock_;
  std::optional<fd_wait> bell_;
  shm::unique_fd peer_bell_;  ///< the peer's eventfd
  shm::mapping map_;
  std::string peer_;
  std::size_t read_some_max_;
  std::size_t single_copy_min_;  ///< 0 = no single copy on this connection
  pid_t peer_pid_;
  shm::unique_fd peer_pidfd_;                                ///< readable once the peer's process ended
  std::uint64_t probe_word_ = 0;                             ///< what the peer reads through side_flags::probe_addr
  shm::single_copy reads_peer_ = shm::single_copy::unknown;  ///< this side's own finding
  std::shared_ptr<shm::shared_pool> pool_;                   ///< this side's pool, or null
  enum class offer : std::uint8_t { not_yet, sent, refused };
  offer pool_offer_ = offer::not_yet;  ///< whether the peer was sent pool_'s descriptor
  shm::mapping peer_pool_;             ///< the peer's pool, read-only, once it sent it
  std::size_t ring_size_ = 0;
  std::uint64_t mask_ = 0;
  shm::ring_indices* out_ = nullptr;
  shm::ring_indices* in_ = nullptr;
  std::byte* out_data_ = nullptr;
  std::byte* in_data_ = nullptr;
  shm::side_flags* me_ = nullptr;
  shm::side_flags* them_ = nullptr;
  shm::remote_queue* out_rq_ = nullptr;
  shm::remote_queue* in_rq_ = nullptr;
  std::uint64_t out_head_ = 0;  ///< this side's own copies of its indices: never read back from the segment
  std::uint64_t in_tail_ = 0;
  std::uint64_t out_tail_ = 0;        ///< the peer's read index as last loaded (checked): at most its true value
  std::uint64_t shown_rem_head_ = 0;  ///< out_rem_head_ as last stored for the peer
  std::uint64_t shown_tail_ = 0;      ///< in_tail_ as last stored for the peer
  /// How many bytes one side copies before it shows them to the other: the
  /// two copies (in on one side, out on the other) overlap in steps of this.
  std::size_t publish_step_ = 0;
  /// The ring carries records: an 8-byte header (shm::record_header), the bytes,
  /// padding to a multiple of 8. A side reads the peer's header, not an
  /// index the peer stores apart, so a small message moves the lines its
  /// bytes are on and no other. The producer keeps this many free bytes
  /// beyond a record's bytes: its header, its padding and the next header's
  /// zero word (plus one).
  static constexpr std::size_t record_reserve = 24;
  std::size_t record_max_ = 0;       ///< the most bytes one record carries
  bool rec_open_ = false;            ///< a record's bytes are being written, its header not stored yet
  std::uint64_t rec_at_ = 0;         ///< the open record's header position
  std::size_t rec_len_ = 0;          ///< the open record's bytes so far
  std::size_t in_left_ = 0;          ///< the bytes of the peer's record being read left unread; 0: at a header
  std::uint64_t out_rem_head_ = 0;   ///< pieces announced
  std::uint64_t out_rem_acked_ = 0;  ///< pieces the peer copied
  std::uint64_t in_rem_tail_ = 0;    ///< the peer's pieces copied in full
  std::optional<piece_in> piece_;    ///< the peer's piece being copied
  util::small_fifo<read_op> reads_;
  util::small_fifo<write_op> writes_;
  util::small_fifo<write_op> unacked_;  ///< written in full, waiting for the peer to copy their pieces
  std::optional<std::chrono::steady_clock::time_point> spin_since_;
  std::error_code failed_;
  bool open_ = true;
  bool peer_gone_ = false;
  bool bell_armed_ = false;
  bool sock_waiting_ = false;  ///< watch_socket()'s wait is under way
  member_task<shm_connection_state> spin_task_{*this, &shm_connection_state::pump};
  shm_stats stats_;
};

}  // namespace detail

/// A connection of the shm transport on a `Reactor`; a model of
/// fusewire::connection. Move-only; destroying it closes it. Use it on its
/// reactor's thread only.
template <class Reactor>
class basic_shm_connection
    : public detail::stream_connection_handle<detail::shm_connection_state<Reactor>, Reactor, shm_stats> {
  friend detail::handle_access;
  using detail::stream_connection_handle<detail::shm_connection_state<Reactor>, Reactor,
                                         shm_stats>::stream_connection_handle;
};

}  // namespace v0
}  // namespace fusewire
