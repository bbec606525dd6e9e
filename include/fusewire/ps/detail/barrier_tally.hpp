#pragma once
/// ps::detail::barrier_tally: the worker barrier PS 0 keeps for
/// client::barrier() — which workers reached the current generation, and with
/// which request, so that all of them can be answered when the last arrives.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace fusewire {
inline namespace v0 {
namespace ps {
namespace detail {

/// See the file comment. One thread (the shard's) calls every member.
class barrier_tally {
 public:
  enum class outcome {
    waiting,      ///< counted; others are still missing
    released,     ///< the last worker arrived: answer every sequence number of take_released()
    passed,       ///< the generation was released already (a resend whose reply was lost): answer now
    out_of_step,  ///< the worker is ahead of the others still waiting
  };

  explicit barrier_tally(std::size_t workers) : seq_(workers, 0) {}

  /// Worker `worker` reached `generation` with request `seq` (sequence numbers
  /// start at 1). A resend is counted once; its latest sequence number is kept,
  /// since the client matches the reply by it.
  outcome arrive(std::uint32_t worker, std::uint64_t generation, std::uint64_t seq) {
    if (generation < generation_) return outcome::passed;
    if (generation > generation_) {
      if (arrived_ != 0) return outcome::out_of_step;
      generation_ = generation;  // this PS restarted and lost the count; the workers know it
    }
    if (seq_[worker] == 0) ++arrived_;
    seq_[worker] = seq;
    if (arrived_ < seq_.size()) return outcome::waiting;
    ++generation_;
    arrived_ = 0;
    return outcome::released;
  }

  /// After outcome::released: each worker's sequence number (index = worker); resets the tally.
  std::vector<std::uint64_t> take_released() { return std::exchange(seq_, std::vector<std::uint64_t>(seq_.size(), 0)); }

  /// Whether `worker` has reached the current generation.
  bool arrived(std::uint32_t worker) const noexcept { return worker < seq_.size() && seq_[worker] != 0; }
  /// Whether some worker waits at the current generation.
  bool waiting() const noexcept { return arrived_ != 0; }

  /// Gives up the current generation (a worker it waits for is lost): the
  /// (worker, sequence number) of each one waiting, to be answered with an
  /// error; the tally restarts at the same generation.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> abandon() {
    std::vector<std::pair<std::uint32_t, std::uint64_t>> out;
    for (std::uint32_t w = 0; w < seq_.size(); ++w) {
      if (seq_[w] != 0) out.emplace_back(w, seq_[w]);
      seq_[w] = 0;
    }
    arrived_ = 0;
    return out;
  }

  /// Generations every worker passed so far.
  std::uint64_t generation() const noexcept { return generation_; }

 private:
  std::uint64_t generation_ = 0;
  std::size_t arrived_ = 0;
  std::vector<std::uint64_t> seq_;  ///< per worker: sequence number of its arrival, 0 = not arrived
};

}  // namespace detail
}  // namespace ps
}  // namespace v0
}  // namespace fusewire
