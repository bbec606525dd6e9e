#pragma once
/// endpoint::op_batch: sends and recvs collected on one thread, handed to the reactors in one task.

#include <fusewire/rendezvous/endpoint.hpp>

namespace fusewire {
inline namespace v0 {
namespace rendezvous {

/// Sends and recvs collected on one thread and handed to the reactor in ONE
/// task by submit(): a step that starts hundreds of operations pays one
/// cross-thread hand-off instead of one per operation. Each operation behaves
/// exactly as the same send/recv called at submit() time, in the order they
/// were added (so per-(peer, key) FIFO holds, also against the thread's
/// earlier direct calls); timeouts count from the moment the reactor starts
/// them. If the endpoint is closed at submit(), every handler runs inline with
/// errc::cancelled, in order. The destructor submits what is left. Not
/// thread-safe: one batch per thread; it must not outlive its endpoint.
///
/// Streaming (`hand_off` > 0): every `hand_off` operations added are
/// submitted at once, so the reactor starts them (and the peer receives
/// them) while the thread is still adding more; their handlers may then run
/// before submit() (inline from the adding call if the endpoint is closed).
/// Everything else above holds, per group (`rendezvous_bench --stream N`
/// measures it).
template <transport Transport>
class endpoint<Transport>::op_batch {
 public:
  /// A batch of `ep`'s operations; `hand_off` = 0 submits only at submit(), else in groups of that many.
  explicit op_batch(endpoint& ep, std::size_t hand_off = 0)
      : ep_(&ep), hand_off_(hand_off), sends_(ep.send_blocks_), recvs_(ep.recv_blocks_) {}
  op_batch(const op_batch&) = delete;
  op_batch& operator=(const op_batch&) = delete;
  ~op_batch() { submit(); }

  /// As endpoint::send (tensor form).
  template <send_completion H>
  void send(const task_id& peer, std::string key, tensor_buffer tensor, H&& h, clock::duration timeout = no_deadline) {
    auto op = sends_.make();
    op->sg.push_back(tensor.bytes());
    op->owned = std::move(tensor);
    ops_.push_back(
        ep_->prepare_send(peer_of(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
    streamed();
  }

  /// As endpoint::send (scatter-gather form): the bytes must stay valid until `h` ran.
  template <send_completion H>
  void send(const task_id& peer, std::string key, std::span<const const_buffer> payload, H&& h,
            clock::duration timeout = no_deadline) {
    auto op = sends_.make();
    op->sg.assign(payload.begin(), payload.end());
    ops_.push_back(
        ep_->prepare_send(peer_of(peer), std::move(key), std::move(op), send_handler(std::forward<H>(h)), timeout));
    streamed();
  }

  /// As endpoint::recv.
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, H&& h, clock::duration timeout = no_deadline) {
    ops_.push_back(ep_->prepare_recv(recvs_.make(), peer_of(peer), std::move(key), tensor_buffer(), false,
                                     recv_handler(std::forward<H>(h)), timeout));
    streamed();
  }

  /// As endpoint::recv into `destination`.
  template <recv_completion H>
  void recv(const task_id& peer, std::string key, tensor_buffer destination, H&& h,
            clock::duration timeout = no_deadline) {
    ops_.push_back(ep_->prepare_recv(recvs_.make(), peer_of(peer), std::move(key), std::move(destination), true,
                                     recv_handler(std::forward<H>(h)), timeout));
    streamed();
  }

  /// Operations collected since the last submit().
  std::size_t size() const noexcept { return ops_.size(); }

  /// Hands every collected operation to the reactor in one task; the batch is then empty and reusable.
  void submit() {
    if (ops_.empty()) return;
    const std::size_t n = ops_.size();
    std::vector<pending_op> ops = std::move(ops_);
    ops_.clear();
    ops_.reserve(n);  // a steady step adds as many again
    ep_->start_many(std::move(ops));
  }

 private:
  void streamed() {
    if (hand_off_ != 0 && ops_.size() >= hand_off_) submit();
  }

  /// Resolves `peer` once per run of operations to the same peer.
  const peer_info& peer_of(const task_id& peer) {
    if (!last_peer_ || peer.index != last_peer_->index || peer.job != last_peer_->job) {
      last_peer_ = peer;
      last_info_ = ep_->resolve(peer);
    }
    return last_info_;
  }

  endpoint* ep_;
  std::size_t hand_off_ = 0;
  std::vector<pending_op> ops_;
  std::optional<task_id> last_peer_;
  peer_info last_info_;
  detail::op_blocks<send_op> sends_;
  detail::op_blocks<recv_op> recvs_;
};

}  // namespace rendezvous
}  // namespace v0
}  // namespace fusewire
