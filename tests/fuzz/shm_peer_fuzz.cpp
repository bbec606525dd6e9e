// libFuzzer target for the shm transport's accepting side against a peer
// process that lies (include/fusewire/transport/shm/): the peer owns half of
// the shared segment and may write anything there, at any time.
//
// A reactor and listener per server setup (mode bits 1, 2 and 16) live for
// the whole run; each input is a new connection from a hand-made peer
// (tests/support/shm_raw_peer.hpp) with rings of 4 KiB, then a script of the
// peer's writes and the server's operations. An input is [mode u8][ops...].
// Mode bits:
//   1  the server's reactor polls (else it blocks on its eventfd)
//   2  single copy on the server (single_copy_min 4096): it reads "process"
//      pieces out of the peer's memory (this process)
//   4  the peer publishes its probe word, so that single copy can work
//   8  the peer sends a pool (1 MiB memfd) before anything else
//  16  the server writes from its own pool (its pieces go by reference)
// Ops, each a byte and its fields (fuzz_support.hpp's reader: past the end
// of the input every field is 0):
//   0 publish a well-formed record of the next stream bytes (len u16)
//   1 store a word anywhere in the client's ring (at u16, value u64)
//   2 announce a piece (kind u8, offset u8, addr u32, size u16); kind 0 and 1
//     at the write position with a good address are what a real peer sends
//   3 store the server->client read index (u64)
//   4 store the server->client piece acknowledgement (u64)
//   5 store one of the client's flags (which u8, value u64)
//   6 write the server's eventfd
//   7 server: async_read (n u16)       8 server: async_read_some
//   9 server: try_read (n u8)          10 server: async_write (n u16, bit 15: from its pool)
//  11 the peer reads what the server wrote and acknowledges its pieces
//  12 junk on the control socket (n u8)
//  13 the peer hangs up its socket     14 wait for a reactor round trip
// Checked: every operation's handler runs exactly once by the time the
// connection is closed; a read that succeeded delivered what it asked for
// (try_read: all or nothing); while the peer only did what a real one does
// (publish, well-formed pieces, its flag `closed`, its eventfd), the bytes the
// server read, in order, are a prefix of the stream it was sent, and no
// operation fails with errc::malformed_frame. Out-of-bounds reads or writes
// are ASan findings.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include <fusewire/reactor/reactor.hpp>
#include <fusewire/transport/shm.hpp>

#include "fuzz_support.hpp"
#include "shm_peer_seeds.hpp"
#include "support/shm_raw_peer.hpp"

namespace {

namespace fw = fusewire;
namespace seg = fusewire::detail::shm;
using namespace std::chrono_literals;
using fusewire::test::input_reader;
using fusewire::test::shm::shm_raw_peer;

using namespace fusewire::test::shm_peer;  // the mode bits and operations
constexpr std::size_t ring = 4096;
constexpr std::size_t pool_bytes = seg::min_pool_size;
constexpr std::size_t max_ops = 64;

/// The stream's byte at position `i`: what the peer sends and the check expects.
std::byte stream_byte(std::uint64_t i) noexcept { return static_cast<std::byte>((i * 131 + (i >> 8) * 7 + 1) & 0xff); }

/// A process-wide reactor with a listener that stays open; one per mode
/// bits 1, 2 and 16 (the transport's config is the listener's).
struct server_side {
  using group_t = fw::basic_reactor_group<fw::asio_engine>;
  fw::shm transport;
  std::unique_ptr<group_t> group;
  fw::shm::listener_type listener;
  std::uint16_t port = 0;
  std::mutex mu;
  std::deque<fw::shm_connection> accepted;

  /// Runs `f` on the reactor and returns its result.
  template <class F>
  auto on(F&& f) {
    auto fut = group->submit(0, std::forward<F>(f));
    FUZZ_CHECK(fut.wait_for(30s) == std::future_status::ready);
    return fut.get();
  }

  server_side(bool poll, bool single_copy, bool pool)
      : transport(fw::shm_config{.single_copy_min = single_copy ? std::size_t{4096} : 0,
                                 .pool_size = pool ? pool_bytes : 0}) {
    fw::reactor_config cfg;
    cfg.mode = poll ? fw::reactor_mode::poll : fw::reactor_mode::block;
    cfg.count = 1;
    cfg.on_error = [](unsigned, std::string_view) {};  // protocol errors are expected here
    group = std::make_unique<group_t>(cfg);
    port = on([&] {
      listener = transport.listen(*fw::asio_reactor::current(), "127.0.0.1", 0);
      accept_next();
      return listener.port();
    });
  }
  void accept_next() {
    listener.async_accept([this](std::error_code ec, fw::shm_connection c) {
      if (ec) return;
      {
        std::lock_guard lock(mu);
        accepted.push_back(std::move(c));
      }
      accept_next();
    });
  }
  /// The connection accepted next (waits for it).
  fw::shm_connection take() {
    for (int i = 0; i < 100000; ++i) {  // at least 10 s: only a lost hello waits that long
      {
        std::lock_guard lock(mu);
        if (!accepted.empty()) {
          fw::shm_connection c = std::move(accepted.front());
          accepted.pop_front();
          return c;
        }
      }
      std::this_thread::sleep_for(100us);
    }
    FUZZ_CHECK(!"a good hello was accepted");
    return {};
  }
};

server_side& server_for(std::uint8_t mode) {
  // Leaked on purpose: reachable until exit, and never torn down while libFuzzer exits.
  static server_side* servers[8] = {};
  const unsigned i =
      (mode & mode_poll ? 1u : 0u) | (mode & mode_single_copy ? 2u : 0u) | (mode & mode_server_pool ? 4u : 0u);
  if (servers[i] == nullptr) servers[i] = new server_side(i & 1, (i & 2) != 0, (i & 4) != 0);
  return *servers[i];
}

/// One server operation's outcome, written on the reactor, read after the close.
struct op_result {
  enum kind_t { read, read_some, try_read, write } kind = read;
  std::size_t asked = 0;
  std::vector<std::byte> dst;  ///< read, try_read: where the bytes went
  fw::tensor_buffer got;       ///< read_some
  std::error_code ec;
  std::size_t n = 0;
  int calls = 0;
};

/// The completion of an exact read or a write: records it in `r`.
auto record_io(op_result& r) {
  return [&r](std::error_code ec, std::size_t n) {
    r.ec = ec;
    r.n = n;
    ++r.calls;
  };
}

/// The peer's side of the script.
struct peer_state {
  shm_raw_peer p;
  std::uint64_t wpos = 0;    ///< where the next record goes in the client's ring
  std::uint64_t stream = 0;  ///< stream bytes sent so far (records and pieces)
  std::uint64_t rtail = 0;   ///< how far the peer read the server's ring
  seg::mapping pool_map;     ///< the peer's pool, when it sent one
  seg::unique_fd pool_fd;
  std::byte* pool_base = nullptr;
  std::size_t pool_used = 0;
  std::uint64_t probe = 0x6a09e667f3bcc908ull;
  std::vector<std::byte> process_src = std::vector<std::byte>(64 * 1024);  ///< "process" pieces come from here
  std::size_t process_used = 0;
  bool honest = true;  ///< only what a real peer does so far
};

bool make_pool(peer_state& s) {
  seg::unique_fd fd(::memfd_create("fusewire-shm-fuzz-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(pool_bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
    return false;
  void* base = ::mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return false;
  s.pool_map = seg::mapping(base, pool_bytes);
  s.pool_base = static_cast<std::byte*>(base);
  s.pool_fd = std::move(fd);
  return s.p.send_message(seg::pool_hello{seg::pool_magic, seg::segment_version, 0, pool_bytes}, {s.pool_fd.get()});
}

/// Room in the client's ring for `bytes` more at wpos, by the read index the server showed.
bool room_for(const peer_state& s, std::uint64_t bytes) {
  const std::uint64_t shown = s.p.map.header()->ring[0].tail.load();
  return s.wpos >= shown && s.wpos - shown + bytes + 8 <= ring;
}

void publish(peer_state& s, std::size_t len) {
  if (len == 0 || len > ring - 24 || !room_for(s, 8 + ((len + 7) & ~std::size_t{7}))) return;
  std::vector<std::byte> bytes(len);
  for (std::size_t i = 0; i < len; ++i) bytes[i] = stream_byte(s.stream + i);
  s.wpos = s.p.publish_record(s.wpos, bytes);
  s.stream += len;
}

/// A piece at the write position (what a real peer announces) or anywhere.
/// A real one's bytes come from memory the peer does not touch again (a
/// bump allocation: a real peer reuses a piece's memory only once the
/// server acknowledged it); an odd `addr` is taken as it is.
void announce(peer_state& s, input_reader& in) {
  const unsigned kind = in.u8() % 3;
  const std::uint8_t offset = in.u8();
  const std::uint32_t addr = in.u32();
  const std::uint16_t size = in.u16();
  seg::segment_header* h = s.p.map.header();
  seg::remote_queue& q = h->remote[0];
  const std::uint64_t head = q.head.load();
  seg::remote_piece piece{s.wpos + offset * 8u, addr, size, static_cast<seg::piece_kind>(kind)};
  bool real = offset == 0 && size != 0 && (addr & 1) == 0 && head - q.tail.load() < seg::remote_slots;
  std::byte* src = nullptr;
  if (kind == 0) {
    // Only where the server said it reads this process's memory.
    real = real && h->side[1].reads_peer.load() == static_cast<std::uint32_t>(seg::single_copy::works) &&
           s.process_used + size <= s.process_src.size();
    if (real) {
      src = s.process_src.data() + s.process_used;
      s.process_used += size;
      piece.addr = reinterpret_cast<std::uintptr_t>(src);
    }
  } else if (kind == 1) {
    real = real && s.pool_base != nullptr && s.pool_used + size <= pool_bytes;
    if (real) {
      src = s.pool_base + s.pool_used;
      piece.addr = s.pool_used;
      s.pool_used += size;
    }
  } else {
    real = false;  // a kind no peer sends
  }
  if (real) {
    for (std::size_t i = 0; i < size; ++i) src[i] = stream_byte(s.stream + i);
    s.stream += size;
  } else {
    s.honest = false;
  }
  q.slot[head % seg::remote_slots] = piece;
  q.head.store(head + 1);
}

/// The peer consumes every record the server published and acknowledges its pieces.
void consume(peer_state& s) {
  seg::segment_header* h = s.p.map.header();
  std::byte* data = s.p.map.ring_data(1);
  for (int records = 0; records < 1024; ++records) {
    const std::uint64_t w =
        std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(data + (s.rtail & (ring - 1)))).load();
    const std::uint64_t len = w & 0xffffffffu;
    if (len == 0 || len > ring || w != seg::record_header(s.rtail, len)) break;  // none (yet) at rtail
    s.rtail += 8 + ((len + 7) & ~std::uint64_t{7});
  }
  h->ring[1].tail.store(s.rtail);
  h->remote[1].tail.store(h->remote[1].head.load());
  s.p.ring_server();
}

void run(std::span<const std::byte> data) {
  input_reader in(data);
  const std::uint8_t mode = in.u8();
  server_side& srv = server_for(mode);

  peer_state s;
  if (!s.p.connect(srv.port) || !s.p.make_segment(ring)) return;  // out of descriptors: not the code under test
  if (mode & mode_probe) {
    s.p.map.header()->side[0].probe_value.store(s.probe);
    s.p.map.header()->side[0].probe_addr.store(reinterpret_cast<std::uintptr_t>(&s.probe));
  }
  FUZZ_CHECK(s.p.send_hello({seg::segment_magic, seg::segment_version, 0, ring},
                            {s.p.memfd.get(), s.p.client_bell.get(), s.p.server_bell.get()}));
  auto conn = std::make_shared<fw::shm_connection>(srv.take());
  if ((mode & mode_peer_pool) && !make_pool(s)) return;

  std::deque<op_result> results;  // stable addresses: the handlers write into them
  std::vector<std::byte> out(70000);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i);
  fw::tensor_buffer pool_out;
  if (mode & mode_server_pool) {
    pool_out = srv.on([&] { return srv.transport.allocate_shared(out.size()); });
    if (pool_out.size() != 0) std::memcpy(pool_out.data(), out.data(), out.size());
  }

  for (std::size_t ops = 0; ops < max_ops && in.left() != 0; ++ops) {
    switch (in.u8() % op_count) {
      case op_publish:
        publish(s, in.u16() % 4200);
        break;
      case op_store_word: {
        const std::uint16_t at = in.u16();
        s.p.store_word(at & ~7u, in.u64());
        s.honest = false;
        break;
      }
      case op_announce:
        announce(s, in);
        break;
      case op_read_index:
        s.p.map.header()->ring[1].tail.store(in.u64());
        s.honest = false;
        break;
      case op_acknowledge:
        s.p.map.header()->remote[1].tail.store(in.u64());
        s.honest = false;
        break;
      case op_flag: {
        seg::side_flags& f = s.p.map.header()->side[0];
        const std::uint8_t which = in.u8() % 6;
        const std::uint64_t v = in.u64();
        if (which == 0) {
          f.closed.store(1);  // a real peer's close
        } else {
          s.honest = false;
          if (which == 1) f.sleeping.store(static_cast<std::uint32_t>(v));
          if (which == 2) f.wants_room.store(static_cast<std::uint32_t>(v));
          if (which == 3) f.ack_wanted.store(v);
          if (which == 4) f.reads_peer.store(static_cast<std::uint32_t>(v));
          if (which == 5) f.probe_addr.store(v);
        }
        break;
      }
      case op_bell:
        (void)s.p.ring_server();
        break;
      case op_read: {
        op_result& r = results.emplace_back();
        r.kind = op_result::read;
        r.asked = in.u16() % 6000;
        r.dst.resize(r.asked);
        srv.on([&] {
          conn->async_read(fw::mutable_buffer(r.dst.data(), r.dst.size()), record_io(r));
          return 0;
        });
        break;
      }
      case op_read_some: {
        op_result& r = results.emplace_back();
        r.kind = op_result::read_some;
        srv.on([&] {
          conn->async_read_some([&r](std::error_code ec, fw::tensor_buffer b) {
            r.ec = ec;
            r.n = b.size();
            r.got = std::move(b);
            ++r.calls;
          });
          return 0;
        });
        break;
      }
      case op_try_read: {
        op_result& r = results.emplace_back();
        r.kind = op_result::try_read;
        r.asked = in.u8();
        r.dst.resize(r.asked);
        r.calls = 1;
        const bool took = srv.on([&] { return conn->try_read(fw::mutable_buffer(r.dst.data(), r.dst.size())); });
        r.n = took ? r.asked : 0;
        break;
      }
      case op_write: {
        op_result& r = results.emplace_back();
        r.kind = op_result::write;
        const std::uint16_t v = in.u16();
        r.asked = std::min<std::size_t>(v & 0x7fff, out.size());
        const std::byte* from = (v & 0x8000) && pool_out.size() != 0 ? pool_out.data() : out.data();
        srv.on([&, from] {
          const fw::const_buffer one[] = {fw::const_buffer(from, r.asked)};
          conn->async_write(one, record_io(r));
          return 0;
        });
        break;
      }
      case op_consume:
        consume(s);
        break;
      case op_junk: {
        std::array<std::byte, 255> junk{};
        const std::size_t n = in.u8();
        in.bytes(std::span(junk).first(n));
        (void)::send(s.p.sock.get(), junk.data(), n, MSG_DONTWAIT | MSG_NOSIGNAL);
        s.honest = false;
        break;
      }
      case op_hang_up:
        s.p.sock.reset();
        break;
      case op_settle:
        srv.on([] { return 0; });
        break;
    }
  }

  // Close on the reactor: every pending operation completes (cancelled).
  srv.on([&] {
    conn->close();
    return 0;
  });
  for (int i = 0; i < 100000; ++i) {  // at least 10 s: only a lost handler waits that long
    const bool all = srv.on(
        [&] { return std::all_of(results.begin(), results.end(), [](const op_result& r) { return r.calls != 0; }); });
    if (all) break;
    std::this_thread::sleep_for(100us);
  }
  srv.on([&] {
    *conn = fw::shm_connection();
    return 0;
  });

  // FUZZ_SHM_VERBOSE=1: what each operation did (to read a finding).
  static const bool verbose = std::getenv("FUZZ_SHM_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "mode %u honest %d stream %llu:", mode, s.honest ? 1 : 0,
                 static_cast<unsigned long long>(s.stream));
    for (const op_result& r : results) {
      std::fprintf(stderr, " [%d asked %zu n %zu calls %d %s]", static_cast<int>(r.kind), r.asked, r.n, r.calls,
                   r.ec ? r.ec.message().c_str() : "ok");
    }
    std::fprintf(stderr, "\n");
  }
  std::vector<std::byte> delivered;
  for (const op_result& r : results) {
    FUZZ_CHECK(r.calls == 1);
    if (r.kind == op_result::write) continue;
    if (r.kind == op_result::read && !r.ec) FUZZ_CHECK(r.n == r.asked);
    if (r.kind == op_result::read) FUZZ_CHECK(r.n <= r.asked);
    if (r.kind == op_result::read_some) {
      FUZZ_CHECK(r.ec || r.n != 0);
      delivered.insert(delivered.end(), r.got.data(), r.got.data() + r.got.size());
    } else {
      delivered.insert(delivered.end(), r.dst.begin(), r.dst.begin() + static_cast<std::ptrdiff_t>(r.n));
    }
    if (r.ec) {
      const bool expected = r.ec == fw::errc::malformed_frame || r.ec == fw::errc::connection_closed ||
                            r.ec == fw::errc::connection_reset || r.ec == fw::errc::cancelled;
      FUZZ_CHECK(expected);
    }
  }
  if (s.honest) {
    FUZZ_CHECK(delivered.size() <= s.stream);
    for (std::size_t i = 0; i < delivered.size(); ++i) FUZZ_CHECK(delivered[i] == stream_byte(i));
    for (const op_result& r : results) FUZZ_CHECK(r.ec != fw::errc::malformed_frame);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  run(std::span(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
