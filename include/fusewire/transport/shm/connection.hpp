#pragma once
/// shm: a connection's state (its rings, queued operations, wake-ups and the
/// peer's liveness) and shm_connection, the public handle. See transport/shm.hpp.

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/posix/stream_descriptor.hpp>

#include <fusewire/core/error.hpp>
#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/reactor/asio_engine.hpp>
#include <fusewire/util/unique_function.hpp>
#include <fusewire/transport/concepts.hpp>
#include <fusewire/transport/detail/member_task.hpp>
#include <fusewire/transport/detail/ref_counted.hpp>
#include <fusewire/transport/detail/stream_handle.hpp>
#include <fusewire/transport/shm/segment.hpp>

namespace fusewire {
inline namespace v0 {

/// Counters of one shm connection.
struct shm_stats {
  std::uint64_t bytes_sent = 0;      ///< bytes this side put into its outgoing ring
  std::uint64_t bytes_received = 0;  ///< bytes this side took from its incoming ring
  std::uint64_t wakeups_sent = 0;    ///< eventfd writes to a peer that declared itself asleep
  std::uint64_t sleeps = 0;          ///< waits on this side's eventfd (block mode, adaptive after idle_poll)
  std::uint64_t spins = 0;           ///< posted re-checks of the rings (poll mode, adaptive within idle_poll)
};

namespace detail {

/// One shm connection's state, shared by its handle and its pending waits.
class shm_connection_state final : public ref_counted, public closable {
 public:
  using io_handler_type = util::unique_function<void(std::error_code, std::size_t)>;
  using some_handler_type = util::unique_function<void(std::error_code, tensor_buffer)>;
  static constexpr const char* handle_name = "shm_connection";  ///< for handle_name_of

  /// `side` 0: the connecting side (writes ring 0), 1: the accepting side.
  shm_connection_state(asio_reactor& reactor, shm::unique_fd sock, shm::unique_fd my_bell, shm::unique_fd peer_bell,
                       shm::mapping map, int side, std::string peer, std::size_t read_some_max)
      : reactor_(&reactor),
        sock_(std::in_place, reactor.engine().context(), sock.release()),
        bell_(std::in_place, reactor.engine().context(), my_bell.release()),
        peer_bell_(std::move(peer_bell)),
        map_(std::move(map)),
        peer_(std::move(peer)),
        read_some_max_(read_some_max) {
    shm::segment_header* h = map_.header();
    ring_size_ = (map_.size() - shm::header_size) / 2;
    mask_ = ring_size_ - 1;
    out_ = &h->ring[side];
    in_ = &h->ring[1 - side];
    out_data_ = map_.ring_data(side);
    in_data_ = map_.ring_data(1 - side);
    me_ = &h->side[side];
    them_ = &h->side[1 - side];
    reactor_->add_closable(*this);
    watch_socket();
  }

  ~shm_connection_state() override {
    if (closable_linked_) reactor_->remove_closable(*this);
    teardown();
  }

  asio_reactor& reactor() const noexcept { return *reactor_; }
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
    std::vector<const_buffer> sg;
    std::size_t idx = 0, off = 0, done = 0;
    io_handler_type h;
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
    boost::system::error_code ignored;
    sock_->close(ignored);
    bell_->close(ignored);
    peer_bell_.reset();
    map_.reset();
    out_ = in_ = nullptr;
    me_ = them_ = nullptr;
    let_go_if_idle();
  }

  /// Drops the Asio descriptor objects once torn down and no wait of theirs
  /// is left to run, so that nothing of this state touches the io_context
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

  void copy_in(const std::byte* src, std::size_t n) noexcept {
    const std::size_t pos = static_cast<std::size_t>(out_head_ & mask_);
    const std::size_t first = std::min(n, ring_size_ - pos);
    std::memcpy(out_data_ + pos, src, first);
    if (first < n) std::memcpy(out_data_, src + first, n - first);
    out_head_ += n;
  }
  void copy_out(std::byte* dst, std::size_t n) noexcept {
    const std::size_t pos = static_cast<std::size_t>(in_tail_ & mask_);
    const std::size_t first = std::min(n, ring_size_ - pos);
    std::memcpy(dst, in_data_ + pos, first);
    if (first < n) std::memcpy(dst + first, in_data_, n - first);
    in_tail_ += n;
  }

  /// Moves what it can: queued writes into the outgoing ring, the incoming
  /// ring into queued reads; then waits (spins or sleeps) for the rest.
  void pump() noexcept {
    if (!open_ || failed_ || !map_) return;
    bool moved = false;
    if (!push_writes(moved) || !pull_reads(moved)) return;
    if (moved) spin_since_.reset();
    if (reads_.empty() && writes_.empty()) {
      spin_since_.reset();
      return;
    }
    wait_more();
  }

  /// False after a protocol error.
  bool push_writes(bool& moved) noexcept {
    if (writes_.empty()) return true;
    if (peer_gone_ || them_->closed.load(std::memory_order_acquire) != 0) {
      fail_writes(make_error_code(errc::connection_reset));  // as TCP's broken pipe
      return true;
    }
    const std::uint64_t tail = out_->tail.load(std::memory_order_acquire);
    const std::uint64_t used = out_head_ - tail;
    if (used > ring_size_) {
      protocol_error("the peer's read index " + std::to_string(tail) + " is not within the ring of " +
                     std::to_string(ring_size_) + " bytes behind the write index " + std::to_string(out_head_));
      return false;
    }
    std::size_t space = ring_size_ - static_cast<std::size_t>(used);
    const std::uint64_t start = out_head_;
    while (!writes_.empty()) {
      write_op& w = writes_.front();
      while (w.idx < w.sg.size()) {
        const const_buffer& b = w.sg[w.idx];
        const std::size_t n = std::min(b.size() - w.off, space);
        if (n > 0) {
          copy_in(b.data() + w.off, n);
          space -= n;
          w.off += n;
          w.done += n;
        }
        if (w.off < b.size()) break;
        ++w.idx;
        w.off = 0;
      }
      if (w.idx < w.sg.size()) break;
      complete(std::move(w.h), {}, w.done);
      writes_.pop_front();
    }
    if (out_head_ != start) {
      out_->head.store(out_head_, std::memory_order_seq_cst);
      stats_.bytes_sent += out_head_ - start;
      moved = true;
      notify_peer();
    }
    return true;
  }

  /// False after a protocol error.
  bool pull_reads(bool& moved) noexcept {
    if (reads_.empty()) return true;
    // The flag first: bytes produced before the peer closed are then all visible.
    const bool peer_done = peer_gone_ || them_->closed.load(std::memory_order_acquire) != 0;
    const std::uint64_t head = in_->head.load(std::memory_order_acquire);
    std::uint64_t avail = head - in_tail_;
    if (avail > ring_size_) {
      protocol_error("the peer's write index " + std::to_string(head) + " is not within the ring of " +
                     std::to_string(ring_size_) + " bytes ahead of the read index " + std::to_string(in_tail_));
      return false;
    }
    const std::uint64_t start = in_tail_;
    while (!reads_.empty()) {
      read_op& r = reads_.front();
      if (r.some) {
        if (avail == 0) break;
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(avail, read_some_max_));
        tensor_buffer b;
        try {
          b = tensor_buffer::allocate(n);
        } catch (...) {
          reactor_->report("shm_connection: no memory for a received buffer");
          break;
        }
        copy_out(b.data(), n);
        avail -= n;
        complete_some(std::move(r.sh), {}, std::move(b));
      } else {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(avail, r.dst.size() - r.filled));
        copy_out(r.dst.data() + r.filled, n);
        avail -= n;
        r.filled += n;
        if (r.filled < r.dst.size()) break;
        complete(std::move(r.h), {}, r.filled);
      }
      reads_.pop_front();
    }
    if (in_tail_ != start) {
      in_->tail.store(in_tail_, std::memory_order_seq_cst);
      stats_.bytes_received += in_tail_ - start;
      moved = true;
      notify_peer();
    }
    if (!reads_.empty() && avail == 0 && peer_done) {
      const bool clean = them_->closed.load(std::memory_order_acquire) != 0;
      fail_reads(make_error_code(clean ? errc::connection_closed : errc::connection_reset));
    }
    return true;
  }

  /// Whether a queued operation could move now (the flag-raising side of notify_peer).
  bool ready() const noexcept {
    if (peer_gone_ || them_->closed.load(std::memory_order_seq_cst) != 0) return true;
    if (!reads_.empty() && in_->head.load(std::memory_order_seq_cst) != in_tail_) return true;
    if (!writes_.empty() && out_head_ - out_->tail.load(std::memory_order_seq_cst) != ring_size_) return true;
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
    me_->sleeping.store(1, std::memory_order_seq_cst);
    if (ready()) {
      me_->sleeping.store(0, std::memory_order_relaxed);
      spin_since_.reset();
      return spin();
    }
    if (bell_armed_) return;
    bell_armed_ = true;
    ++stats_.sleeps;
    bell_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                      [self = ref_ptr<shm_connection_state>(this)](const boost::system::error_code& ec) {
                        self->bell_armed_ = false;
                        if (ec || !self->map_) return self->let_go_if_idle();
                        std::uint64_t count = 0;
                        while (::read(self->bell_->native_handle(), &count, sizeof count) > 0) {
                        }
                        self->me_->sleeping.store(0, std::memory_order_relaxed);
                        self->spin_since_.reset();
                        self->pump();
                      });
  }

  /// The Unix socket stays open for the connection's life: its hang-up is the
  /// peer's death (or close). Bytes on it after the handshake break the protocol.
  void watch_socket() {
    sock_waiting_ = true;
    sock_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                      [self = ref_ptr<shm_connection_state>(this)](const boost::system::error_code& ec) {
                        self->sock_waiting_ = false;
                        if (ec || !self->map_) return self->let_go_if_idle();
                        char b = 0;
                        const ssize_t n = ::recv(self->sock_->native_handle(), &b, 1, MSG_DONTWAIT);
                        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
                          self->watch_socket();
                          return;
                        }
                        if (n > 0) {
                          self->protocol_error("the peer sent bytes on the control socket after the handshake");
                          return;
                        }
                        self->peer_gone_ = true;
                        self->pump();
                      });
  }

  asio_reactor* reactor_;
  /// The Unix socket (the peer's liveness) and this side's eventfd; empty
  /// once torn down and idle (let_go_if_idle).
  std::optional<boost::asio::posix::stream_descriptor> sock_;
  std::optional<boost::asio::posix::stream_descriptor> bell_;
  shm::unique_fd peer_bell_;  ///< the peer's eventfd
  shm::mapping map_;
  std::string peer_;
  std::size_t read_some_max_;
  std::size_t ring_size_ = 0;
  std::uint64_t mask_ = 0;
  shm::ring_indices* out_ = nullptr;
  shm::ring_indices* in_ = nullptr;
  std::byte* out_data_ = nullptr;
  std::byte* in_data_ = nullptr;
  shm::side_flags* me_ = nullptr;
  shm::side_flags* them_ = nullptr;
  std::uint64_t out_head_ = 0;  ///< this side's own copies of its indices: never read back from the segment
  std::uint64_t in_tail_ = 0;
  std::deque<read_op> reads_;
  std::deque<write_op> writes_;
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

/// A connection of the shm transport; a model of fusewire::connection.
/// Move-only; destroying it closes it. Use it on its reactor's thread only.
class shm_connection : public detail::stream_connection_handle<detail::shm_connection_state, asio_reactor, shm_stats> {
  friend detail::handle_access;
  using stream_connection_handle::stream_connection_handle;
};

}  // namespace v0
}  // namespace fusewire
