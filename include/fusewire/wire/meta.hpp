#pragma once
/// The metadata of every built-in frame type except `fused` (see fused.hpp):
/// one struct per type, its encoder and its decoder.
///
/// Decoded structs are views: their strings and byte spans point into the
/// meta buffer that was decoded, which must outlive them. Decoders allocate
/// nothing, never throw, and accept only the canonical encoding (reserved
/// fields zero, no trailing bytes), so re-encoding a decoded meta reproduces
/// its bytes exactly.
///
/// Layouts (integers little-endian; str = u16 length + that many bytes;
/// desc = a tensor descriptor, see descriptor.hpp):
///
///   hello           min_version u8, max_version u8, lane u16, task_index u32,
///                   incarnation u64, features u64, job str
///   hello_ack       version u8, zero u8, lane u16, task_index u32,
///                   incarnation u64, features u64, mac[32], job str
///   auth_challenge  nonce[32]
///   auth_response   mac[32], nonce[32]
///   tensor          key str, desc, segment count u32, count x segment size u64
///   chunk           transfer_id u64, total_len u64, offset u64, index u32,
///                   count u32, key str, desc
///   recv_request    capacity u64, rdma_address u64, rdma_rkey u32, key str
///   placed          size u64, written u8, key str
///   ack             value u64, credits u32
///   error           code i32, message str
///   ping, pong      timestamp u64
///   goodbye         reason i32
///   application     opaque bytes (types 0x40..0x7f)
///   fused           see fused.hpp

#include <fusewire/wire/application_meta.hpp>
#include <fusewire/wire/control_meta.hpp>
#include <fusewire/wire/handshake_meta.hpp>
#include <fusewire/wire/placement_meta.hpp>
#include <fusewire/wire/segment_list.hpp>
#include <fusewire/wire/tensor_meta.hpp>
