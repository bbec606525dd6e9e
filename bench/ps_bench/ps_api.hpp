#pragma once
/// The one place where ps_bench touches fusewire's PS API: the benchmark's
/// model, the check that it puts exactly one dense slice on every PS, the
/// request a worker repeats (one ps::batch, one client::run per step), and
/// serving as a PS. Everything else in ps_bench sees only `step_maker` and
/// `serve_ps`.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/core/error.hpp>
#include <fusewire/ps/ps.hpp>

#include "settings.hpp"

namespace fusewire::bench::psb {

namespace ps = fusewire::ps;

inline constexpr const char* dense_name = "w";
inline constexpr const char* embedding_name = "emb";

/// The benchmark's model: a dense variable of shape {P, V} (one row per PS)
/// whose minimum slice is one row, so placement cuts it into P slices of V
/// floats; or an embedding table of `dim` floats over `id_range` ids. SGD:
/// the cheapest update rule, so the PS's time is the transport's and the
/// request handling's.
inline ps::model_spec make_model(const cell_spec& c, unsigned num_ps) {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.01f);
  if (c.embedding) {
    m.add_embedding(embedding_name, static_cast<std::int64_t>(c.dim), ps::initializer::zeros(),
                    static_cast<std::int64_t>(c.id_range));
  } else {
    m.min_slice_bytes = c.floats * sizeof(float);
    m.add_dense(dense_name, {static_cast<std::int64_t>(num_ps), static_cast<std::int64_t>(c.floats)},
                ps::initializer::constant(0.5f));
  }
  return m;
}

/// Throws errc::invalid_argument unless placement gives every PS exactly one
/// slice of the dense variable (so a step is one slice request per PS).
inline void check_placement(const ps::model_spec& m, unsigned num_ps) {
  if (m.variables.front().kind != ps::variable_kind::dense) return;
  const ps::placement place(m, num_ps);
  const auto slices = place.slices(0);
  std::vector<int> per_ps(num_ps, 0);
  for (const auto& s : slices) ++per_ps.at(s.ps);
  for (unsigned p = 0; p < num_ps; ++p) {
    if (per_ps[p] != 1) {
      throw_error(errc::invalid_argument, "ps_bench: the model puts " + std::to_string(per_ps[p]) + " slices on PS " +
                                              std::to_string(p) + " (expected exactly 1)");
    }
  }
}

/// One worker's repeated step: the batch of `op` for every PS, run by client::run.
template <class Transport>
class step_maker {
 public:
  step_maker(const ::fusewire::cluster_spec& spec, unsigned task, const cell_spec& c,
             ps::client_config<Transport> config)
      : cell_(c),
        num_ps_(static_cast<unsigned>(spec.job("ps").size())),
        client_({"worker", task}, spec, make_model(c, num_ps_), std::move(config)) {
    check_placement(client_.model(), num_ps_);
    if (c.embedding) {
      // Ids drawn at random over the range, kept so that every PS gets
      // exactly `rows` of them per step; a few batches, used in turn.
      std::mt19937_64 rng(0x5eed + task);
      std::uniform_int_distribution<std::int64_t> id(0, static_cast<std::int64_t>(c.id_range) - 1);
      ids_.resize(id_batches);
      for (auto& batch_ids : ids_) {
        std::vector<unsigned> have(num_ps_, 0);
        std::size_t missing = static_cast<std::size_t>(num_ps_) * c.rows;
        for (std::size_t draws = 0; missing > 0; ++draws) {
          if (draws > 1000 * static_cast<std::size_t>(num_ps_) * c.rows) {
            throw_error(errc::invalid_argument, "ps_bench: --id-range " + std::to_string(c.id_range) +
                                                    " gives some PS no ids; use a larger range");
          }
          const std::int64_t x = id(rng);
          unsigned& n = have[client_.place().ps_of_id(x)];
          if (n == c.rows) continue;
          ++n;
          --missing;
          batch_ids.push_back(x);
        }
      }
      grads_.assign(ids_.front().size() * c.dim, 1e-6f);
    } else {
      grads_.assign(static_cast<std::size_t>(num_ps_) * c.floats, 1e-6f);
    }
    var_ = client_.variable(c.embedding ? embedding_name : dense_name);
    out_.resize(c.embedding ? ids_.front().size() * c.dim : grads_.size());
  }

  /// One step; throws std::system_error (naming the PS) on failure.
  void run() {
    batch_.clear();
    const bool push = cell_.op != op_kind::pull, pull = cell_.op != op_kind::push;
    // By handle, pulled values straight into out_, as a trainer would.
    if (cell_.embedding) {
      const std::vector<std::int64_t>& ids = ids_[next_++ % ids_.size()];
      if (push) batch_.push_rows(var_, ids, grads_);
      if (pull) batch_.pull_rows_into(var_, ids, out_);
    } else {
      if (push) batch_.push(var_, grads_);
      if (pull) batch_.pull_into(var_, out_);
    }
    client_.run(batch_);
  }

  /// Waits for every worker (all of them measure at once); throws on timeout.
  void barrier(std::chrono::milliseconds timeout) { client_.barrier(timeout); }
  unsigned num_ps() const noexcept { return num_ps_; }

 private:
  static constexpr std::size_t id_batches = 16;
  cell_spec cell_;
  unsigned num_ps_;
  ps::client<Transport> client_;
  ps::batch batch_;
  ps::variable_handle var_;
  std::vector<float> grads_, out_;
  std::vector<std::vector<std::int64_t>> ids_;
  std::size_t next_ = 0;
};

/// Serves as PS `task` until `stop` becomes true (or a worker calls
/// client::shutdown_servers); returns the requests it received.
template <class Transport>
std::uint64_t serve_ps(const ::fusewire::cluster_spec& spec, unsigned task, unsigned num_ps, const cell_spec& c,
                       ps::server_config<Transport> config, const std::atomic<bool>& stop) {
  ps::server<Transport> srv({"ps", task}, spec, make_model(c, num_ps), std::move(config));
  while (!stop.load(std::memory_order_relaxed) && !srv.wait_for(std::chrono::milliseconds(50))) {
  }
  srv.stop();
  return srv.stats().requests;
}

}  // namespace fusewire::bench::psb
