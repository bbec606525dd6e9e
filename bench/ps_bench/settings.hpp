#pragma once
/// ps_bench's vocabulary: what one measurement (a "cell") is, and the
/// settings every process of the run is started with.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fusewire::bench::psb {

/// What a worker's step does with its slice on every PS.
enum class op_kind : std::uint8_t { push, pull, both };

constexpr std::string_view option_name(op_kind o) noexcept {
  switch (o) {
    case op_kind::push:
      return "push";
    case op_kind::pull:
      return "pull";
    case op_kind::both:
      return "both";
  }
  return "?";
}

/// One measurement: a size (or the embedding shape) and an op.
struct cell_spec {
  op_kind op = op_kind::push;
  bool embedding = false;
  std::size_t floats = 10;   ///< dense: floats of the slice each PS holds
  unsigned rows = 0;         ///< embedding: rows per request (per PS per step)
  std::size_t dim = 0;       ///< embedding: floats per row
  std::size_t id_range = 0;  ///< embedding: ids are drawn from [0, id_range)

  /// Payload floats of one request in one direction.
  std::size_t request_floats() const noexcept { return embedding ? static_cast<std::size_t>(rows) * dim : floats; }
  /// Payload bytes one RPC moves: the pushed gradient and/or the pulled values.
  std::size_t rpc_bytes() const noexcept { return request_floats() * sizeof(float) * (op == op_kind::both ? 2 : 1); }
};

/// Everything a PS or worker process needs besides its cell.
struct run_settings {
  unsigned ps = 2;
  unsigned workers = 3;
  std::string transport = "auto";
  std::string reactor_mode;  ///< empty: the environment's, else block
  bool sync = false;
  double warmup_s = 1;
  double time_s = 3;
  unsigned sync_warmup_steps = 10;
  unsigned sync_steps = 100;
  unsigned step_timeout_s = 20;
};

}  // namespace fusewire::bench::psb
