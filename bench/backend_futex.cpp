// The same-host floor: shared memory and futex wake-ups, no library, so the
// reference for what a shared-memory transport on this host can do, as
// `floor` is for a network path. Every process runs on one host. One thread
// per connection on the PS.
//
// Finding the PS: it listens on TCP host:port only to own that port (the
// kernel picks free ones, so two PSs never share one), and accepts on the
// abstract Unix socket "\0fwbench-futex/HOST:PORT" (HOST as given: a name,
// not an address). Nothing is created in the file system, so nothing is left
// behind when a process dies. A worker connects there, creates one memfd per
// direction (requests, replies) and sends both with SCM_RIGHTS; the PS checks
// and maps them and answers. The Unix socket stays open for the connection's
// life: its hang-up tells a waiting side that its peer is gone.
//
// A memfd holds the futex word in its first cache line and one frame from
// frame_offset, the floor's frame (floor_shared.hpp) with the magic "FWF1".
// The writer copies its buffers into the frame and publishes it through the
// word; the reader copies the whole frame into its own memory before using
// it, as a socket's receive does: one copy on each side of each direction, as
// a shared-memory transport that delivers into the receiver's memory makes. A
// frame larger than the memfd grows it (the file is sealed against shrinking,
// so no page can vanish under a mapping) and the reader remaps to follow, so
// any payload is one frame.
//
// The word: bits 3..31 count the frames published, bit 2 says that the
// reader's wait must end (set in the reader's own process: its peer hung up,
// or the PS stops), bit 1 that the writer closed its side, bit 0 that the
// reader sleeps in FUTEX_WAIT (or is about to). The writer publishes with one exchange, which clears bits 0
// and 2, and calls FUTEX_WAKE only when bit 0 was set; the reader sets bit 0
// with a CAS and then waits for the word to leave that value. All are
// read-modify-writes of one word, so no wake-up can slip between them.
//
// Wait modes: poll spins on the word (no system call in a round trip), block
// sleeps in FUTEX_WAIT at once, adaptive spins --idle-poll us first. The
// waits have no timeout (a timer per wait would cost the round trip): a
// thread per connection sleeps in poll(2) on the Unix socket and, when the
// peer hangs up without closing (it died), sets bit 2 and wakes the waiter,
// so a dead peer is an error at once, not a hang. A PS's stop() does the same.

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fusewire/core/error.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "floor_shared.hpp"
#include "serial.hpp"

namespace fusewire::bench {
namespace {

using namespace floors;

static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free, "the futex word is shared with another process");

/// The frame's magic, "FWF1", and how errors name this backend and a peer's frame.
constexpr frame_format format{0x31465746, "futex: ", "published"};
constexpr std::uint32_t hello_magic = 0x48465746;  // "FWFH": a worker's hello, carrying its two memfds
constexpr std::uint32_t ready_magic = 0x4b465746;  // "FWFK": the PS's answer, both mapped
/// The word has the first cache line to itself and the frame starts at the
/// next 128-byte pair of lines, so that the reader setting its bit shares
/// neither a line nor an adjacent-line prefetch pair with the data.
constexpr std::size_t frame_offset = 128;
/// A new memfd's size: room for small payloads; larger ones grow it. At least
/// one page of any page size Linux uses, as the word's own mapping is one.
constexpr std::size_t initial_segment_bytes = 64 * kib;
constexpr std::size_t max_segment_bytes = frame_offset + frame_prefix_bytes(max_buffer_count) + max_frame_body_bytes;

constexpr std::uint32_t sleeping_bit = 1;
constexpr std::uint32_t closed_bit = 2;
constexpr std::uint32_t poked_bit = 4;
constexpr std::uint32_t count_step = 8;
constexpr std::uint32_t count_mask = ~(sleeping_bit | closed_bit | poked_bit);

/// How often a PS's accept loop and a handshake look at the stop flag.
constexpr std::chrono::milliseconds stop_period{100};
/// How long a PS waits for a connected worker's memfds, and a worker for the PS's answer.
constexpr std::chrono::seconds handshake_timeout{10};

using clock_type = std::chrono::steady_clock;

std::string seconds_text(double s) {
  char out[32];
  std::snprintf(out, sizeof out, "%g", s);
  return out;
}

/// FUTEX_WAIT on a word of a shared mapping (no FUTEX_PRIVATE_FLAG: the waker
/// is another process) while it holds `expected`. Returns when woken, when the
/// word held something else, or on a signal: the caller looks again.
void futex_wait(std::uint32_t* word, std::uint32_t expected, const std::string& who) {
  if (::syscall(SYS_futex, word, FUTEX_WAIT, expected, nullptr, nullptr, 0) == 0) return;
  if (errno == EAGAIN || errno == EINTR) return;
  throw_errno(errc::not_supported, "futex: FUTEX_WAIT for " + who, errno);
}

/// Wakes the one waiter a word can have.
void futex_wake(std::uint32_t* word, const std::string& who) {
  if (::syscall(SYS_futex, word, FUTEX_WAKE, 1, nullptr, nullptr, 0) < 0) {
    throw_errno(errc::not_supported, "futex: FUTEX_WAKE of " + who, errno);
  }
}

void futex_wake_noexcept(std::uint32_t* word) noexcept {
  ::syscall(SYS_futex, word, FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

/// Tells the core that this is a spin loop (frees the pipeline for a sibling
/// hyperthread, and avoids the memory-order flush on leaving the loop).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// One direction of a connection: a memfd mapped twice, its first page alone
/// (the word: an address that never moves, so another thread may wake it) and
/// the whole file (the frame: remapped when the file grows).
class segment {
 public:
  segment() = default;
  segment(segment&& other) noexcept { swap(other); }
  segment& operator=(segment&& other) noexcept {
    segment gone(std::move(other));
    swap(gone);
    return *this;
  }
  ~segment() {
    if (page_) ::munmap(page_, page_bytes_);
    if (data_) ::munmap(data_, size_);
  }

  /// A new memfd of initial_segment_bytes, sealed against shrinking (and
  /// against further seals, so that nobody can forbid growing it).
  static segment create(const std::string& name) {
    unique_fd fd(::memfd_create(("fwbench-futex " + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (fd.get() < 0) throw_errno(errc::out_of_memory, "futex: memfd_create for the " + name, errno);
    if (::ftruncate(fd.get(), initial_segment_bytes) != 0) {
      throw_errno(errc::out_of_memory, "futex: sizing the " + name, errno);
    }
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
      throw_errno(errc::not_supported, "futex: sealing the " + name, errno);
    }
    return segment(std::move(fd), initial_segment_bytes, name);
  }

  /// A memfd a worker sent: sealed as `create` seals, of a plausible size.
  static segment adopt(unique_fd fd, const std::string& name) {
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL) ||
        (seals & (F_SEAL_GROW | F_SEAL_WRITE)) != 0) {
      throw_error(errc::handshake_failed,
                  "futex: the " + name + " is not a memfd sealed against shrinking and open to growing");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw_errno(errc::handshake_failed, "futex: fstat of the " + name, errno);
    const auto size = static_cast<std::size_t>(st.st_size);
    if (size < initial_segment_bytes || size > max_segment_bytes) {
      throw_error(errc::handshake_failed, "futex: the " + name + " has " + std::to_string(size) + " bytes");
    }
    return segment(std::move(fd), size, name);
  }

  int fd() const noexcept { return fd_.get(); }
  std::uint32_t* word() const noexcept { return reinterpret_cast<std::uint32_t*>(page_); }
  std::atomic_ref<std::uint32_t> atomic_word() const noexcept { return std::atomic_ref<std::uint32_t>(*word()); }
  std::byte* frame() const noexcept { return data_ + frame_offset; }

  /// Writer: room for a frame of `bytes` (at most max_segment_bytes in all).
  void reserve(std::size_t bytes) {
    const std::size_t need = frame_offset + bytes;
    if (need <= size_) return;
    const std::size_t grown =
        std::min(max_segment_bytes, (std::max(need, 2 * size_) + 64 * kib - 1) / (64 * kib) * (64 * kib));
    if (::ftruncate(fd_.get(), static_cast<off_t>(grown)) != 0) {
      throw_errno(errc::out_of_memory, "futex: growing the " + name_ + " to " + std::to_string(grown) + " bytes",
                  errno);
    }
    remap(grown);
  }

  /// Reader: maps what the writer grew the file to for a frame of `bytes`.
  void follow(std::size_t bytes) {
    const std::size_t need = frame_offset + bytes;
    if (need <= size_) return;
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw_errno(errc::connection_reset, "futex: fstat of the " + name_, errno);
    const auto size = static_cast<std::size_t>(st.st_size);
    if (size < need) {
      throw_error(errc::malformed_frame, "futex: the " + name_ + " has " + std::to_string(size) +
                                             " bytes, too few for the frame of " + std::to_string(bytes) +
                                             " bytes published in it");
    }
    remap(size);
  }

 private:
  segment(unique_fd fd, std::size_t size, const std::string& name)
      : fd_(std::move(fd)), name_(name), page_bytes_(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))) {
    if (page_bytes_ > initial_segment_bytes) {
      throw_error(errc::not_supported, "futex: pages of " + std::to_string(page_bytes_) + " bytes are too large");
    }
    void* page = ::mmap(nullptr, page_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (page == MAP_FAILED) throw_errno(errc::out_of_memory, "futex: mapping the word of the " + name_, errno);
    page_ = static_cast<std::byte*>(page);
    void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::munmap(page_, page_bytes_);  // no destructor runs for a constructor that throws
      throw_errno(errc::out_of_memory, "futex: mapping the " + name_, err);
    }
    data_ = static_cast<std::byte*>(data);
    size_ = size;
  }

  void remap(std::size_t size) {
    void* data = ::mremap(data_, size_, size, MREMAP_MAYMOVE);
    if (data == MAP_FAILED) {
      throw_errno(errc::out_of_memory, "futex: remapping the " + name_ + " to " + std::to_string(size) + " bytes",
                  errno);
    }
    data_ = static_cast<std::byte*>(data);
    size_ = size;
  }

  void swap(segment& other) noexcept {
    std::swap(fd_, other.fd_);
    std::swap(name_, other.name_);
    std::swap(page_bytes_, other.page_bytes_);
    std::swap(page_, other.page_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

  unique_fd fd_;
  std::string name_;
  std::size_t page_bytes_ = 0;
  std::byte* page_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The abstract Unix socket address of a PS ("\0fwbench-futex/HOST:PORT").
socklen_t socket_name(const endpoint& ep, sockaddr_un& addr) {
  const std::string name = "fwbench-futex/" + ep.host + ":" + std::to_string(ep.port);
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (1 + name.size() > sizeof addr.sun_path) {
    throw_error(errc::invalid_argument, "futex: the host name '" + ep.host + "' is too long to name a Unix socket");
  }
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

/// One connection: the Unix socket (the peer's liveness), the segment this
/// side writes and the one it reads, and how this side waits.
class connection {
 public:
  connection(unique_fd sock, std::string peer, const transport_settings& t, const std::atomic<bool>* stop)
      : sock_(std::move(sock)), peer_(std::move(peer)), mode_(t.mode), idle_poll_(t.idle_poll), stop_(stop) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() { close(); }

  const std::string& peer() const noexcept { return peer_; }

  /// Worker: creates both segments, sends them, and waits for the PS's answer.
  void offer_segments() {
    segment request = segment::create("request segment for " + peer_);
    segment reply = segment::create("reply segment for " + peer_);
    std::uint32_t magic = hello_magic;
    iovec iov{&magic, sizeof magic};
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    const int fds[2] = {request.fd(), reply.fd()};
    std::memcpy(CMSG_DATA(c), fds, sizeof fds);
    if (::sendmsg(sock_.get(), &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof magic)) {
      throw_errno(errc::handshake_failed, "futex: sending the segments to " + peer_, errno);
    }
    wait_readable("answered the handshake");
    std::uint32_t answer = 0;
    const ssize_t n = ::recv(sock_.get(), &answer, sizeof answer, 0);
    if (n < 0) throw_errno(errc::handshake_failed, "futex: receiving the handshake answer of " + peer_, errno);
    if (n == 0) {
      throw_error(errc::handshake_failed,
                  "futex: " + peer_ + " closed the connection instead of mapping the segments (its stderr says why)");
    }
    if (n != sizeof answer || answer != ready_magic) {
      throw_error(errc::handshake_failed, "futex: " + peer_ + " answered the handshake with something else");
    }
    out_ = std::move(request);
    in_ = std::move(reply);
    ready_.store(true);
    watch();
  }

  /// PS: receives a worker's two memfds, maps them and answers.
  void accept_segments() {
    wait_readable("sent its segments");
    std::uint32_t magic = 0;
    iovec iov{&magic, sizeof magic};
    alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock_.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) throw_errno(errc::handshake_failed, "futex: receiving the segments of " + peer_, errno);
    std::vector<unique_fd> fds;  // owned at once, so that every one is closed on any error
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds.emplace_back(fd);
      }
    }
    if (n == 0) throw_error(errc::connection_closed, "futex: " + peer_ + " left before the handshake");
    if (n != sizeof magic || magic != hello_magic) {
      throw_error(errc::handshake_failed, "futex: " + peer_ + " sent no fwbench futex hello");
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() != 2) {
      throw_error(errc::handshake_failed,
                  "futex: " + peer_ + " sent " + std::to_string(fds.size()) + " descriptors, expected 2 memfds");
    }
    in_ = segment::adopt(std::move(fds[0]), "request segment of " + peer_);
    out_ = segment::adopt(std::move(fds[1]), "reply segment of " + peer_);
    if (::send(sock_.get(), &ready_magic, sizeof ready_magic, MSG_NOSIGNAL) !=
        static_cast<ssize_t>(sizeof ready_magic)) {
      throw_errno(errc::connection_closed, "futex: answering the handshake of " + peer_, errno);
    }
    // Sequentially consistent, as stop()'s load of it and the serve loop's
    // load of the stop flag: one of the two threads sees the other's store.
    ready_.store(true);
    watch();
  }

  /// Copies header + sizes + body buffers into the outgoing frame and publishes it.
  void send(const frame_header& h, std::span<const const_buffer> sized_buffers, std::span<const const_buffer> body) {
    if (sized_buffers.size() > max_buffer_count || h.body > max_frame_body_bytes) {
      throw_error(errc::frame_too_large, "futex: a frame of " + std::to_string(sized_buffers.size()) + " buffers and " +
                                             std::to_string(h.body) + " bytes is too large");
    }
    out_.reserve(frame_prefix_bytes(sized_buffers.size()) + h.body);
    std::byte* at = write_frame_prefix(out_.frame(), format, h, sized_buffers);
    for (const_buffer b : body) {
      if (b.empty()) continue;
      std::memcpy(at, b.data(), b.size());
      at += b.size();
    }
    publish();
  }

  /// Sends bytes that already are a whole frame (the PS's raw echo).
  void send_bytes(const_buffer whole) {
    out_.reserve(whole.size());
    std::memcpy(out_.frame(), whole.data(), whole.size());
    publish();
  }

  /// Waits for the next frame and copies it out; throws errc::connection_closed
  /// when the peer closed its side or went away.
  frame_view receive() {
    await_frame();
    reserve_rx(frame_header_bytes);
    std::memcpy(rx_.get(), in_.frame(), frame_header_bytes);
    const frame_header h = read_frame_header(rx_.get(), format, peer_);
    const std::size_t bytes = frame_bytes(h);
    in_.follow(bytes);
    reserve_rx(bytes);
    std::memcpy(rx_.get() + frame_header_bytes, in_.frame() + frame_header_bytes, bytes - frame_header_bytes);
    return view_frame(rx_.get(), h, format, peer_);
  }

  /// Tells the peer that this side is done (its wait ends at once) and ends
  /// the watcher; once.
  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    closing_.store(true, std::memory_order_release);
    if (ready_.load()) {
      out_.atomic_word().fetch_or(closed_bit, std::memory_order_release);
      futex_wake_noexcept(out_.word());
    }
    if (sock_.get() >= 0) ::shutdown(sock_.get(), SHUT_RDWR);  // which also wakes the watcher
    if (watcher_.joinable()) {
      try {
        watcher_.join();
      } catch (const std::system_error&) {
        // Only a thread that cannot be joined throws; there is nothing to wait for.
      }
    }
  }

  /// Ends this side's wait, which then finds the stop flag set (a PS's stop()),
  /// or else reports the peer gone (the watcher); from any thread.
  void poke() noexcept {
    if (!ready_.load()) return;
    in_.atomic_word().fetch_or(poked_bit, std::memory_order_acq_rel);
    futex_wake_noexcept(in_.word());
  }

 private:
  /// Starts the thread that sleeps until the peer hangs up, then pokes the
  /// wait: nothing is sent on the socket after the handshake, so its only
  /// event is a hang-up, the peer's (which ends a wait) or this side's close.
  void watch() {
    try {
      watcher_ = std::thread([this] {
        pollfd p{sock_.get(), POLLRDHUP, 0};
        while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
        if (!closing_.load(std::memory_order_acquire)) poke();
      });
    } catch (const std::system_error& e) {
      throw_error(errc::out_of_memory, "futex: a thread to watch " + peer_ + ": " + e.what());
    }
  }

  /// Waits until the socket has something to read (the handshake's message).
  void wait_readable(const std::string& what) {
    const auto deadline = clock_type::now() + handshake_timeout;
    while (true) {
      if (stop_ && stop_->load()) throw_error(errc::cancelled, "futex: stopping");
      pollfd p{sock_.get(), POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(stop_period.count()));
      if (n > 0) return;
      if (n < 0 && errno != EINTR) throw_errno(errc::handshake_failed, "futex: waiting for " + peer_, errno);
      if (clock_type::now() >= deadline) {
        throw_error(errc::timed_out, "futex: " + peer_ + " has not " + what + " within " +
                                         std::to_string(handshake_timeout.count()) + " s");
      }
    }
  }

  void publish() {
    published_ += count_step;
    // The exchange clears the reader's bit: it sets it again before its next sleep.
    const std::uint32_t before = out_.atomic_word().exchange(published_, std::memory_order_acq_rel);
    if ((before & sleeping_bit) != 0) futex_wake(out_.word(), peer_);
  }

  /// Returns when the peer has published a frame after the last one seen.
  void await_frame() {
    const std::atomic_ref<std::uint32_t> word = in_.atomic_word();
    const auto start = mode_ == wait_mode::adaptive ? clock_type::now() : clock_type::time_point{};
    bool sleepy = mode_ == wait_mode::block;
    for (std::uint32_t spins = 1;; ++spins) {
      std::uint32_t v = word.load(std::memory_order_acquire);
      if ((v & count_mask) != seen_) {
        seen_ = v & count_mask;
        return;
      }
      if ((v & closed_bit) != 0) throw_error(errc::connection_closed, "futex: " + peer_ + " closed the connection");
      if ((v & poked_bit) != 0) {
        if (stop_ && stop_->load()) throw_error(errc::cancelled, "futex: stopping");
        throw_error(errc::connection_closed, "futex: " + peer_ + " hung up without closing its side (did it exit?)");
      }
      if (!sleepy) {
        cpu_relax();
        // A clock read every 128 spins keeps it off the round trip.
        if (mode_ == wait_mode::adaptive && spins % 128 == 0 && clock_type::now() - start >= idle_poll_) {
          sleepy = true;
        }
        continue;
      }
      if ((v & sleeping_bit) == 0) {
        if (!word.compare_exchange_strong(v, v | sleeping_bit, std::memory_order_acq_rel, std::memory_order_acquire)) {
          continue;  // the peer published or closed, or the wait was poked, meanwhile
        }
        v |= sleeping_bit;
      }
      futex_wait(in_.word(), v, peer_);
    }
  }

  void reserve_rx(std::size_t bytes) {
    if (bytes <= capacity_) return;
    const std::size_t grown = std::max({bytes, capacity_ * 2, 64 * kib});
    auto bigger = std::make_unique_for_overwrite<std::byte[]>(grown);
    if (capacity_) std::memcpy(bigger.get(), rx_.get(), std::min(capacity_, frame_header_bytes));
    rx_ = std::move(bigger);
    capacity_ = grown;
  }

  unique_fd sock_;
  std::string peer_;
  wait_mode mode_;
  std::chrono::microseconds idle_poll_;
  const std::atomic<bool>* stop_;
  segment out_;
  segment in_;
  std::atomic<bool> ready_{false};    ///< the segments are mapped
  std::atomic<bool> closing_{false};  ///< this side closes: the watcher's wake-up is no hang-up
  bool closed_ = false;
  std::uint32_t published_ = 0;  ///< the count of the last frame this side published
  std::uint32_t seen_ = 0;       ///< the count of the last frame this side received
  std::unique_ptr<std::byte[]> rx_;
  std::size_t capacity_ = 0;
  std::thread watcher_;
};

class futex_server final : public server {
 public:
  explicit futex_server(const server_config& config) : config_(config) {
    // The TCP listener only owns the port: the kernel's choice for port 0, and
    // one that no other PS (of any backend) takes meanwhile.
    tcp_listener owner = listen_tcp(config.listen, 1, format.prefix);
    port_fd_ = std::move(owner.fd);
    port_ = owner.port;

    const endpoint named{config.listen.host, port_};
    sockaddr_un unix_addr;
    const socklen_t unix_len = socket_name(named, unix_addr);
    listen_fd_ = unique_fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (listen_fd_.get() < 0) throw_errno(errc::invalid_argument, "futex: a Unix socket", errno);
    if (::bind(listen_fd_.get(), reinterpret_cast<const sockaddr*>(&unix_addr), unix_len) != 0 ||
        ::listen(listen_fd_.get(), 128) != 0) {
      throw_errno(errc::invalid_argument,
                  "futex: cannot listen on " + named.to_string() + " (its abstract Unix socket)", errno);
    }
  }

  ~futex_server() override {
    stop();
    join_all();
  }

  std::uint16_t port() const override { return port_; }

  void run() override {
    while (!stopping_.load()) {
      // A bounded wait, so that stop() needs nothing more than its flag.
      pollfd p{listen_fd_.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(stop_period.count()));
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
        break;  // shut down by stop(), or the socket failed
      }
      std::lock_guard lock(mutex_);
      if (stopping_.load()) {
        ::close(fd);
        break;
      }
      auto conn = std::make_shared<connection>(unique_fd(fd), "worker connection " + std::to_string(accepted_++),
                                               config_.transport, &stopping_);
      conns_.push_back(conn);
      threads_.emplace_back([this, conn] { serve(*conn); });
    }
    join_all();
  }

  void stop() override {
    std::lock_guard lock(mutex_);
    if (stopping_.exchange(true)) return;
    ::shutdown(listen_fd_.get(), SHUT_RDWR);
    for (auto& l : conns_) l->poke();
  }

 private:
  void join_all() { floors::join_all(mutex_, threads_); }

  void serve(connection& l) {
    payload_codec codec;
    try {
      l.accept_segments();
      while (!stopping_.load()) {
        answer_request(l, l.receive(), config_, codec, format);
      }
    } catch (const std::system_error& e) {
      report_connection_end(e, stopping_.load());
    }
    l.close();
    // The thread holds the last reference: the segments go when it ends, so
    // a PS that serves worker after worker keeps only the open connections'.
    std::lock_guard lock(mutex_);
    std::erase_if(conns_, [&](const std::shared_ptr<connection>& c) { return c.get() == &l; });
  }

  server_config config_;
  unique_fd port_fd_;
  unique_fd listen_fd_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<std::shared_ptr<connection>> conns_;  ///< being served: stop() wakes them
  std::size_t accepted_ = 0;
  std::vector<std::thread> threads_;
};

std::unique_ptr<connection> connect_to(const endpoint& ep, const transport_settings& t, std::string peer) {
  sockaddr_un addr;
  const socklen_t len = socket_name(ep, addr);
  const auto deadline = clock_type::now() + std::chrono::duration<double>(t.connect_timeout_s);
  while (true) {
    unique_fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) throw_errno(errc::connection_refused, "futex: a Unix socket to reach " + peer, errno);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) {
      auto l = std::make_unique<connection>(std::move(fd), std::move(peer), t, nullptr);
      l->offer_segments();
      return l;
    }
    const int err = errno;
    // No listener yet (or its backlog is full): try again until the deadline.
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR) {
      throw_errno(errc::connection_refused, "futex: cannot connect to PS " + ep.to_string(), err);
    }
    if (clock_type::now() >= deadline) {
      throw_error(errc::connection_refused, "futex: cannot connect to PS " + ep.to_string() + " within " +
                                                seconds_text(t.connect_timeout_s) +
                                                " s (is it on this host?): " + std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

class futex_client final : public client {
 public:
  explicit futex_client(const client_config& config) : frames_(config, format) {
    for (std::size_t i = 0; i < config.ps.size(); ++i) {
      conns_.push_back(connect_to(config.ps[i], config.transport,
                                  "PS " + std::to_string(i) + " (" + config.ps[i].to_string() + ")"));
    }
  }

  std::size_t exchange(std::span<const const_buffer> payload, bool verify) override {
    const request_frames::request r = frames_.make(payload);
    for (auto& l : conns_) l->send(r.header, r.sized_buffers, r.body);
    std::size_t replied = 0;
    for (auto& l : conns_) replied += frames_.check_reply(l->peer(), l->receive(), verify);
    return replied;
  }

 private:
  request_frames frames_;
  std::vector<std::unique_ptr<connection>> conns_;
};

}  // namespace

backend_info futex_backend() {
  backend_info info;
  info.name = "futex";
  info.summary =
      "same-host floor, no library (every process on one host): shared memory, woken by futex: busy-polling "
      "(poll), spin-then-sleep (adaptive) or FUTEX_WAIT (block)";
  info.available = true;
  info.honours_wait_mode = true;
  info.same_host = true;
  info.make_server = [](const server_config& c) -> std::unique_ptr<server> {
    return std::make_unique<futex_server>(c);
  };
  info.make_client = [](const client_config& c) -> std::unique_ptr<client> {
    return std::make_unique<futex_client>(c);
  };
  return info;
}

}  // namespace fusewire::bench
