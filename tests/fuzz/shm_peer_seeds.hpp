#pragma once
/// The shm peer fuzz target's input language (its mode bits and operations,
/// shm_peer_fuzz.cpp says what each does) and its seeds: scripts of what a
/// real peer does (records, pieces from its memory and its pool, its close,
/// its death) and a few of what it never would.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "support/seed_frames.hpp"

namespace fusewire::test::shm_peer {

inline constexpr std::uint8_t mode_poll = 1, mode_single_copy = 2, mode_probe = 4, mode_peer_pool = 8,
                              mode_server_pool = 16;

enum op : std::uint8_t {
  op_publish,      ///< len u16
  op_store_word,   ///< at u16, value u64
  op_announce,     ///< kind u8, offset u8, addr u32, size u16
  op_read_index,   ///< value u64
  op_acknowledge,  ///< value u64
  op_flag,         ///< which u8, value u64
  op_bell,
  op_read,  ///< n u16
  op_read_some,
  op_try_read,  ///< n u8
  op_write,     ///< n u16 (bit 15: from the server's pool)
  op_consume,
  op_junk,  ///< n u8, then n bytes
  op_hang_up,
  op_settle,
  op_count
};

/// Builds an input: the mode byte, then operations with their fields (little-endian).
class script {
 public:
  explicit script(std::uint8_t mode) { put(mode, 1); }
  script& publish(std::uint16_t len) { return op(op_publish).put(len, 2); }
  script& store_word(std::uint16_t at, std::uint64_t value) { return op(op_store_word).put(at, 2).put(value, 8); }
  script& announce(std::uint8_t kind, std::uint8_t offset, std::uint32_t addr, std::uint16_t size) {
    return op(op_announce).put(kind, 1).put(offset, 1).put(addr, 4).put(size, 2);
  }
  script& flag(std::uint8_t which, std::uint64_t value) { return op(op_flag).put(which, 1).put(value, 8); }
  script& bell() { return op(op_bell); }
  script& read(std::uint16_t n) { return op(op_read).put(n, 2); }
  script& read_some() { return op(op_read_some); }
  script& try_read(std::uint8_t n) { return op(op_try_read).put(n, 1); }
  script& write(std::uint16_t n) { return op(op_write).put(n, 2); }
  script& consume() { return op(op_consume); }
  script& junk(std::string_view s) {
    op(op_junk).put(s.size(), 1);
    for (char c : s) bytes_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  script& hang_up() { return op(op_hang_up); }
  script& settle() { return op(op_settle); }
  seed_frame named(std::string name) const { return {std::move(name), bytes_}; }

 private:
  script& op(std::uint8_t o) { return put(o, 1); }
  script& put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
    return *this;
  }
  bytes bytes_;
};

inline std::vector<seed_frame> shm_peer_seeds() {
  std::vector<seed_frame> s;
  s.push_back(script(0).publish(100).bell().read(100).named("block_record_read"));
  s.push_back(script(mode_poll)
                  .publish(3000)
                  .publish(2000)
                  .read_some()
                  .read(500)
                  .write(9000)
                  .consume()
                  .settle()
                  .consume()
                  .named("poll_records_some_write"));
  s.push_back(script(mode_poll).publish(64).settle().try_read(64).named("try_read"));
  // Pieces: a read first (the server probes the peer's memory then), then
  // one piece from the peer's pool and one from its memory between records.
  for (const std::uint8_t mode : {std::uint8_t{mode_single_copy | mode_probe | mode_peer_pool},
                                  std::uint8_t{mode_poll | mode_single_copy | mode_probe | mode_peer_pool}}) {
    s.push_back(script(mode)
                    .read(10)
                    .settle()
                    .publish(10)
                    .bell()
                    .settle()
                    .announce(1, 0, 0, 5000)
                    .announce(0, 0, 0, 6000)
                    .publish(20)
                    .bell()
                    .read(5000)
                    .read(5999)
                    .read(21)
                    .named(mode & mode_poll ? "pieces_poll" : "pieces_block"));
  }
  s.push_back(script(mode_poll | mode_server_pool)
                  .write(0x8000 | 20000)
                  .settle()
                  .consume()
                  .settle()
                  .consume()
                  .named("server_pool_write"));
  s.push_back(script(0).publish(50).flag(0, 1).bell().read(50).read(10).named("closed_drain"));
  s.push_back(script(mode_poll).publish(50).hang_up().read(50).read(10).named("hang_up"));
  // Regression: an empty read in front of a piece once reached a memcpy to
  // its null destination, and on no bytes waited for some.
  s.push_back(script(mode_poll | mode_peer_pool)
                  .read(0)
                  .settle()
                  .announce(1, 0, 0, 5000)
                  .read(0)
                  .bell()
                  .settle()
                  .read(5000)
                  .named("regress_empty_read_at_piece"));
  // What a real peer never does.
  s.push_back(script(mode_poll).publish(64).store_word(72, ~std::uint64_t{0}).read(200).named("bad_header"));
  s.push_back(script(mode_poll).junk("12345678").read(10).named("junk_on_socket"));
  s.push_back(script(mode_poll | mode_peer_pool)
                  .read(10)
                  .announce(1, 0, 0xfffff001, 4096)
                  .bell()
                  .settle()
                  .settle()
                  .named("piece_outside_pool"));
  return s;
}

}  // namespace fusewire::test::shm_peer
