#pragma once
/// A shard's send path: fusion of small sends, plain and chunked writes, send deadlines.

#include <fusewire/rendezvous/detail/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

// Small sends are batched until the end of the reactor tick (or until
// acc_size bytes), then go out as one fused frame; anything else first
// flushes the batch, so the peer sees every send in call order.
template <transport Transport>
inline void endpoint<Transport>::shard::enqueue(out_peer& p, std::shared_ptr<send_op> op) {
  if constexpr (rdma_transport<Transport>) {  // RDMA direct placement: write into an advertised dst
    if (direct_.on_send(*this, p, op)) return;
  }
  const std::size_t n = total_size(op->sg.view());
  const bool small = ep_.opts_.coalesce && n <= ep_.opts_.acc_size;
  if (!small) {
    flush(p);
    if (ep_.opts_.chunking && n > ep_.opts_.chunk_size) return write_chunked(p, std::move(op));
    return write(p, std::move(op));
  }
  // 2 + key + descriptor (2 + 8) + size (8): one fused entry; the peer takes at most 64 KiB of meta.
  const std::size_t meta = 20 + op->key.size();
  if (p.batch_bytes + n > ep_.opts_.acc_size || p.batch_meta + meta > wire::limits{}.max_meta_bytes) flush(p);
  p.batch_bytes += n;
  p.batch_meta += meta;
  p.batch.push_back(std::move(op));
  if (!p.flush_posted) {
    p.flush_posted = true;
    if (ep_.opts_.fuse_delay.count() == 0) {
      reactor_->post([this, pp = &p] {
        pp->flush_posted = false;
        if (!closing_) flush(*pp);
      });
    } else {
      p.flush_timer = reactor_->run_after(ep_.opts_.fuse_delay, [this, pp = &p](std::error_code ec) {
        if (ec) return;  // cancelled: the batch already left
        pp->flush_timer = {};
        pp->flush_posted = false;
        if (!closing_) flush(*pp);
      });
    }
  }
}

template <transport Transport>
inline void endpoint<Transport>::shard::flush(out_peer& p) {
  if (p.flush_timer) {
    const timer_id t = p.flush_timer;
    p.flush_timer = {};
    p.flush_posted = false;
    reactor_->cancel(t);
  }
  std::vector<std::shared_ptr<send_op>> batch;
  batch.reserve(p.batch.size());
  for (auto& op : p.batch) {
    if (!op->done) batch.push_back(std::move(op));
  }
  p.batch.clear();
  p.batch_bytes = 0;
  p.batch_meta = 4;
  if (batch.empty()) return;
  if (!p.ready) {
    for (auto& op : batch) complete(*op, make_error_code(errc::connection_reset));
    return;
  }
  if (batch.size() == 1) return write(p, std::move(batch.front()));
  // Every entry is uint8[n] (the meta size of an entry does not depend on n).
  tensor_descriptor desc;
  desc.type = dtype::uint8;
  desc.rank = 1;
  std::size_t meta_bytes = 4;
  std::size_t segment_count = 0;
  for (auto& op : batch) {
    meta_bytes += wire::fused_builder::entry_size(op->key, desc);
    segment_count += op->sg.size();
  }
  auto meta_buffer = std::make_shared<std::vector<std::byte>>(meta_bytes);
  wire::limits lim;
  lim.max_meta_bytes = static_cast<std::uint32_t>(std::min<std::size_t>(meta_bytes, 0xffffffffu));
  wire::fused_builder builder(*meta_buffer, lim);
  auto sg = std::make_shared<std::vector<const_buffer>>();
  sg->reserve(segment_count);
  for (auto& op : batch) {
    desc.dims[0] = static_cast<std::int64_t>(total_size(op->sg.view()));
    if (builder.append(op->key, desc)) {
      for (auto& o : batch) complete(*o, make_error_code(errc::invalid_argument));
      return;
    }
    for (const_buffer b : op->sg) sg->push_back(b);
    op->in_flight = true;
  }
  ep_.fused_frames_.fetch_add(1, std::memory_order_relaxed);
  ep_.tensors_fused_.fetch_add(batch.size(), std::memory_order_relaxed);
  if (peer_cells* c = ep_.cells(p.index)) {
    bump(c->fused_frames);
    bump(c->tensors_fused, batch.size());
  }
  p.last_write = util::coarse_now();
  auto ch = p.ch;
  ch->write(builder.meta(), *sg, [this, pp = &p, ch, batch = std::move(batch), meta_buffer, sg](std::error_code ec) {
    if (ec) {
      pp->last_error = ec;
      drop_outbound(*pp, ch);
    }
    for (auto& op : batch) {
      if (op->timed_out) {
        complete(*op, make_error_code(errc::timed_out));
      } else if (ec) {
        complete(*op, make_error_code(closing_ ? errc::cancelled : errc::connection_reset));
      } else {
        complete(*op, {});
      }
    }
  });
}

template <transport Transport>
inline void endpoint<Transport>::shard::write(out_peer& p, std::shared_ptr<send_op> op) {
  wire::tensor_meta meta;
  meta.key = op->key;
  const auto payload = op->sg.view();  // views into *op, which the handler keeps
  const std::uint64_t n = total_size(payload);
  meta.descriptor = tensor_descriptor::make(dtype::uint8, {static_cast<std::int64_t>(n)});
  meta.segments = wire::segment_list(payload);
  op->in_flight = true;
  ep_.tensor_frames_.fetch_add(1, std::memory_order_relaxed);
  if (peer_cells* c = ep_.cells(p.index)) bump(c->tensor_frames);
  p.last_write = util::coarse_now();
  // One reference count taken for the handler (the lane), none for a local
  // copy, and the op moved in: this runs between a frame's arrival and the
  // answer's sendmsg.
  channel_type& lane = *p.ch;
  lane.write(meta, payload, [this, pp = &p, op = std::move(op), ch = p.ch](std::error_code ec) {
    if (op->timed_out) return complete(*op, make_error_code(errc::timed_out));
    if (ec) {
      pp->last_error = ec;
      drop_outbound(*pp, ch);
      return complete(*op, make_error_code(closing_ ? errc::cancelled : errc::connection_reset));
    }
    complete(*op, {});
  });
}

// A tensor above options.chunk_size leaves as chunk frames: chunk 0 on the
// peer's ordered lane (so the receiver matches it to a recv in send order),
// the others round-robin over the striping lanes. The send completes when
// every chunk write did; any failed one drops the peer's lanes.
template <transport Transport>
inline void endpoint<Transport>::shard::write_chunked(out_peer& p, std::shared_ptr<send_op> op) {
  const std::uint64_t n = total_size(op->sg.view());
  // Chunks of equal size (rounded up to 64 bytes, at most chunk_size): 6.3 MB
  // over two lanes goes as 2 x 3.16 MB, not 4 MiB + 2.1 MB with one lane idle
  // half the time.
  const std::uint64_t max_cs = ep_.opts_.chunk_size;
  const std::uint64_t even = (n + (n + max_cs - 1) / max_cs - 1) / ((n + max_cs - 1) / max_cs);
  const std::uint64_t cs = std::min(max_cs, (even + 63) / 64 * 64);
  const auto count = static_cast<std::uint32_t>((n + cs - 1) / cs);
  if (ep_.tuning_.stripes > 1 && !p.extra_started) connect_lanes(p);
  op->in_flight = true;
  op->pending_chunks = count;
  if (peer_cells* c = ep_.cells(p.index)) bump(c->chunk_frames, count);
  p.last_write = util::coarse_now();
  wire::chunk_meta meta;
  meta.transfer_id = ep_.next_id_.fetch_add(1, std::memory_order_relaxed);
  meta.total_len = n;
  meta.count = count;
  meta.key = op->key;
  meta.descriptor = tensor_descriptor::make(dtype::uint8, {static_cast<std::int64_t>(n)});
  std::size_t seg = 0, seg_off = 0;
  std::vector<const_buffer> part;
  for (std::uint32_t i = 0; i < count; ++i) {
    meta.offset = std::uint64_t{i} * cs;
    std::uint64_t need = std::min(cs, n - meta.offset);
    meta.index = i;
    part.clear();
    while (need != 0 && seg < op->sg.size()) {
      const const_buffer b = op->sg[seg];
      const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(need, b.size() - seg_off));
      if (take != 0) part.push_back(b.subspan(seg_off, take));
      seg_off += take;
      need -= take;
      if (seg_off == b.size()) {
        ++seg;
        seg_off = 0;
      }
    }
    std::shared_ptr<channel_type> lane = p.ch;
    if (i != 0 && !p.extra.empty()) lane = p.extra[p.next_extra++ % p.extra.size()];
    ep_.chunk_frames_.fetch_add(1, std::memory_order_relaxed);
    lane->write(meta, part, [this, pp = &p, op, lane](std::error_code ec) {
      if (ec) {
        if (!op->chunk_error) op->chunk_error = ec;
        pp->last_error = ec;
        drop_outbound(*pp, lane);
      }
      if (--op->pending_chunks != 0) return;
      if (op->timed_out) return complete(*op, make_error_code(errc::timed_out));
      if (op->chunk_error) return complete(*op, make_error_code(closing_ ? errc::cancelled : errc::connection_reset));
      complete(*op, {});
    });
  }
}

template <transport Transport>
inline void endpoint<Transport>::shard::on_send_deadline(const std::shared_ptr<send_op>& op) {
  if (op->done) return;
  op->timer = {};
  auto it = out_.find(op->peer);
  if (!op->in_flight || it == out_.end()) {
    if (it != out_.end()) {
      std::erase(it->second.waiting, op);
      std::erase(it->second.batch, op);
    }
    return complete(*op, make_error_code(errc::timed_out));
  }
  op->timed_out = true;
  if (it->second.ch) drop_outbound(it->second, it->second.ch);
}

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
