#pragma once
/// shm: the shared segment of one connection (its layout, its creation by the
/// connecting side, its checks and mapping by the accepting side) and the
/// abstract Unix socket names listeners bind. Private to the transport layer.
///
/// Layout (`header_size` bytes of control, then two rings of `ring_size` bytes):
/// ring 0 carries client -> server, ring 1 server -> client. Each ring is a
/// byte stream cut into records: an 8-byte header (the record's length, and
/// its position / 8 in the high half), the bytes, and padding to a multiple
/// of 8. The producer writes a record's bytes, zeroes the word after it (the
/// next header: "nothing yet"), then stores the header; the consumer polls
/// the header where it stands, so a small message moves only the cache lines
/// its record is on. Positions count bytes since the start, headers and
/// padding included; the consumer's `tail` is how far it read. It shows
/// its `tail` lazily (after a quarter ring, when the producer sleeps, and
/// before it sleeps itself), so a producer's view of the free room is a lower
/// bound, loaded again only when a write does not fit. Beside each ring, a
/// queue of pieces the consumer copies straight out of the producer's memory
/// (process_vm_readv) or shared pool: each piece sits in the stream at ring position `at`,
/// after the ring's bytes before `at` and before those from `at` on; the
/// consumer's `tail` of that queue is the producer's acknowledgement that it
/// may reuse the piece's memory. Every value in the
/// segment is the peer's to scribble on: a side keeps its own copy of its
/// index and of the ring size, and checks each index it loads from the peer
/// before it uses it, so nothing is read or written outside the segment.

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fusewire/core/error.hpp>

namespace fusewire {
inline namespace v0 {
namespace detail::shm {

inline constexpr std::uint64_t segment_magic = 0x4d48532d45525746ull;  // "FWRE-SHM", little-endian
inline constexpr std::uint32_t segment_version = 5;
inline constexpr std::size_t header_size = 4096;

/// One direction's read index, on a cache line of its own.
struct ring_indices {
  alignas(64) std::atomic<std::uint64_t> tail;  ///< bytes consumed (the consumer stores)
};

/// A record's header word in a ring: its length `len` (1 to the ring size
/// less 24), and in the high half its position `at` / 8, so that no word
/// left from a lap before passes for it. Zero: no record there yet.
inline constexpr std::uint64_t record_header(std::uint64_t at, std::uint64_t len) noexcept {
  return (std::uint64_t{static_cast<std::uint32_t>(at >> 3)} << 32) | (len & 0xffffffffu);
}

/// Where a remote piece's bytes are: in the producer's process memory (read
/// with process_vm_readv), or in the producer's shared pool (shm/pool.hpp),
/// which the consumer has mapped.
enum class piece_kind : std::uint64_t { process = 0, pool = 1 };

/// A piece of the stream left in the producer's memory: `size` bytes at
/// `addr` (an address in the producer's process, or an offset in its pool),
/// read by the consumer at ring position `at`.
struct remote_piece {
  std::uint64_t at;
  std::uint64_t addr;
  std::uint64_t size;
  piece_kind kind;
};
inline constexpr std::size_t remote_slots = 16;

/// One direction's queue of remote pieces: the producer fills slot
/// `head % remote_slots` and then advances `head`; the consumer advances
/// `tail` once it copied the piece in full.
struct remote_queue {
  alignas(64) std::atomic<std::uint64_t> head;
  alignas(64) std::atomic<std::uint64_t> tail;
  remote_piece slot[remote_slots];
};

/// What a side found when it tried to read its peer's memory.
enum class single_copy : std::uint32_t { unknown = 0, works = 1, off = 2 };

/// One side's flags: `sleeping` (set by the side before it waits on its
/// eventfd; the peer clears it and signals), `wants_room` and `ack_wanted`
/// (stored before `sleeping`: what the peer's consuming may wake this side
/// for; room in the ring when it has writes queued, or the acknowledgement
/// of piece `ack_wanted`, which completes its oldest unfinished write; bytes
/// the peer produces wake it whatever they say), `closed` (the side closed: no
/// more bytes come; what was produced before stays readable), `probe_addr`
/// and `probe_value` (a word in this side's process, and the random value the
/// peer must find there to know that it reads this very process) and
/// `reads_peer` (a single_copy: whether this side can and will copy the
/// peer's pieces).
struct side_flags {
  alignas(64) std::atomic<std::uint32_t> sleeping;
  std::atomic<std::uint32_t> wants_room;
  std::atomic<std::uint64_t> ack_wanted;
  std::atomic<std::uint32_t> closed;
  std::atomic<std::uint64_t> probe_value;
  std::atomic<std::uint64_t> probe_addr;
  std::atomic<std::uint32_t> reads_peer;
};

struct segment_header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t reserved;
  std::uint64_t ring_size;
  ring_indices ring[2];    ///< 0: client -> server, 1: server -> client
  side_flags side[2];      ///< 0: client, 1: server
  remote_queue remote[2];  ///< beside ring[i]
};
static_assert(sizeof(segment_header) <= header_size);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free);

/// The hello the connecting side sends with its descriptors (memfd, the
/// client's eventfd, the server's eventfd).
struct hello {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t reserved;
  std::uint64_t ring_size;
};
inline constexpr int hello_fds = 3;

inline constexpr std::size_t segment_size(std::size_t ring_size) noexcept { return header_size + 2 * ring_size; }

/// An owned file descriptor.
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// A shared mapping of a segment; unmapped on destruction.
class mapping {
 public:
  mapping() noexcept = default;
  mapping(void* base, std::size_t size) noexcept : base_(base), size_(size) {}
  mapping(mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapping& operator=(mapping o) noexcept {
    std::swap(base_, o.base_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~mapping() { reset(); }
  void reset() noexcept {
    if (base_ != nullptr) ::munmap(std::exchange(base_, nullptr), std::exchange(size_, 0));
  }
  segment_header* header() const noexcept { return static_cast<segment_header*>(base_); }
  std::byte* ring_data(int i) const noexcept {
    return static_cast<std::byte*>(base_) + header_size + static_cast<std::size_t>(i) * ring_size_of();
  }
  std::size_t size() const noexcept { return size_; }
  const std::byte* data() const noexcept { return static_cast<const std::byte*>(base_); }
  explicit operator bool() const noexcept { return base_ != nullptr; }

 private:
  std::size_t ring_size_of() const noexcept { return (size_ - header_size) / 2; }
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

inline std::error_code last_error() noexcept { return {errno, std::system_category()}; }

/// The most descriptors one message on a connection's Unix socket carries.
inline constexpr std::size_t max_message_fds = 8;

/// Sends `len` bytes at `data` and the descriptors `fds` (SCM_RIGHTS) as one
/// message on a Unix socket: the bytes sent, or -1 with errno set.
inline ssize_t send_with_fds(int sock, const void* data, std::size_t len, std::span<const int> fds,
                             int flags = 0) noexcept {
  if (fds.size() > max_message_fds) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * max_message_fds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = cbuf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
}

/// One message taken off a Unix socket by receive_with_fds.
struct received_message {
  ssize_t bytes = -1;  ///< as recvmsg: -1 with errno set, 0 at the peer's hang-up
  std::array<unique_fd, max_message_fds> fds;
  std::size_t fd_count = 0;
  bool truncated = false;  ///< longer than the buffer, or with more descriptors than fit (those are closed)
};

/// Takes one message of at most `len` bytes into `data`, and its descriptors
/// (close-on-exec; closed with the result unless moved out), without waiting.
inline received_message receive_with_fds(int sock, void* data, std::size_t len) noexcept {
  received_message r;
  iovec iov{data, len};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * max_message_fds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  r.bytes = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r.bytes < 0) return r;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int one = -1;
      std::memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      unique_fd fd(one);
      if (r.fd_count < max_message_fds) r.fds[r.fd_count++] = std::move(fd);
    }
  }
  r.truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  return r;
}

/// A ring size is a power of two from 4 KiB to 1 GiB.
inline bool valid_ring_size(std::uint64_t n) noexcept {
  return n >= 4096 && n <= (std::uint64_t{1} << 30) && (n & (n - 1)) == 0;
}

/// The connecting side's segment: a sealed memfd (it can neither shrink nor
/// grow, so the peer's mapping can never fault), mapped and initialised.
inline std::pair<unique_fd, mapping> create_segment(std::size_t ring_size, std::error_code& ec) {
  unique_fd fd(::memfd_create("fusewire-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) {
    ec = last_error();
    return {};
  }
  const std::size_t size = segment_size(ring_size);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ec = last_error();
    return {};
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    ec = last_error();
    return {};
  }
  mapping m(base, size);
  segment_header* h = m.header();  // a fresh memfd reads as zeros: indices and flags start at 0
  h->magic = segment_magic;
  h->version = segment_version;
  h->ring_size = ring_size;
  return {std::move(fd), std::move(m)};
}

/// What readlink says a descriptor is ("anon_inode:[eventfd]", "/memfd:..."), or "".
inline std::string fd_kind(int fd) {
  char buf[256];
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

/// The accepting side's checks of a hello and its descriptors; maps the
/// segment. On failure `why` names what was wrong.
inline mapping accept_segment(const hello& h, int memfd, int efd_a, int efd_b, std::size_t max_ring, std::string& why) {
  if (h.magic != segment_magic) {
    why = "the hello does not start with the shm magic";
    return {};
  }
  if (h.version != segment_version) {
    why = "the hello's version " + std::to_string(h.version) + " is not " + std::to_string(segment_version);
    return {};
  }
  if (!valid_ring_size(h.ring_size) || h.ring_size > max_ring) {
    why = "the hello's ring size " + std::to_string(h.ring_size) + " is not a power of two from 4096 to the limit " +
          std::to_string(max_ring);
    return {};
  }
  for (int e : {efd_a, efd_b}) {
    if (fd_kind(e) != "anon_inode:[eventfd]") {
      why = "a descriptor in the hello is not an eventfd";
      return {};
    }
    const int fl = ::fcntl(e, F_GETFL);
    if (fl < 0 || ::fcntl(e, F_SETFL, fl | O_NONBLOCK) != 0) {
      why = "an eventfd in the hello cannot be made non-blocking";
      return {};
    }
  }
  const int seals = ::fcntl(memfd, F_GET_SEALS);
  const int need = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & need) != need) {
    why = "the segment is not a memfd sealed against shrinking and growing";
    return {};
  }
  struct stat st {};
  const std::size_t size = segment_size(h.ring_size);
  if (::fstat(memfd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) {
    why = "the segment's size is not " + std::to_string(size) + " bytes";
    return {};
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) {
    why = "mmap of the segment failed: " + last_error().message();
    return {};
  }
  return mapping(base, size);
}

/// A host names a namespace of ports: 1..64 characters of [A-Za-z0-9._:-].
inline bool valid_host(std::string_view host) noexcept {
  if (host.empty() || host.size() > 64) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/// The abstract Unix socket address of host:port ("\0fusewire-shm/HOST:PORT").
inline socklen_t socket_name(std::string_view host, std::uint16_t port, sockaddr_un& addr) noexcept {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  std::string name = "fusewire-shm/";
  name.append(host);
  name += ':';
  name += std::to_string(port);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // <= 13 + 64 + 6 < 107
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace detail::shm
}  // namespace v0
}  // namespace fusewire
