// The backend registry: every backend fwbench knows, built or not.

#include "backend.hpp"

namespace fusewire::bench {

namespace {

[[maybe_unused]] backend_info missing(std::string name, std::string summary, std::string reason) {
  backend_info info;
  info.name = std::move(name);
  info.summary = std::move(summary);
  info.unavailable_reason = std::move(reason);
  return info;
}

}  // namespace

std::string replied_problem(std::size_t replied, std::size_t expected) {
  if (replied == expected) return {};
  return "the PSs answered for " + std::to_string(replied) + " bytes, expected " + std::to_string(expected) +
         "; do they run the same --benchmark and --mode?";
}

void check_replied(std::size_t replied, std::size_t expected) {
  if (replied != expected) throw_error(errc::size_mismatch, replied_problem(replied, expected));
}

std::uint64_t client::run(const exchange_run& r) {
  std::uint64_t done = 0;
  auto next_tick = bench_clock::now() + std::chrono::seconds(1);
  auto now = bench_clock::now();
  while (now < r.until) {
    const auto t0 = now;
    check_replied(exchange(r.payload, false), r.expected_reply);
    now = bench_clock::now();
    ++done;
    if (r.samples) r.samples->push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count());
    if (now >= next_tick) {
      next_tick += std::chrono::seconds(1);
      if (r.tick) r.tick(done);
    }
  }
  return done;
}

const std::vector<backend_info>& backends() {
  static const std::vector<backend_info> all = [] {
    std::vector<backend_info> out = fusewire_backends();
#if FWBENCH_HAS_GRPC
    out.push_back(grpc_backend());
#else
    out.push_back(
        missing("grpc", "gRPC C++", "grpc: not built (libgrpc++-dev and protobuf-compiler-grpc were not found)"));
#endif
#if FWBENCH_HAS_ZMQ
    out.push_back(zmq_backend());
#else
    out.push_back(missing("zmq", "ZeroMQ", "zmq: not built (libzmq3-dev was not found)"));
#endif
#if FWBENCH_HAS_TENSORPIPE
    for (backend_info& b : tensorpipe_backends()) out.push_back(std::move(b));
#else
    for (const char* v : {"uv-basic", "uv-cma", "shm-basic", "shm-cma"}) {
      out.push_back(missing(std::string("tensorpipe-") + v, "TensorPipe",
                            "tensorpipe: not built (libtensorpipe-dev was not found)"));
    }
#endif
    out.push_back(floor_backend());
    out.push_back(futex_backend());
#if !FWBENCH_HAS_PROTOBUF
    for (backend_info& b : out) b.serialized = false;
#endif
    return out;
  }();
  return all;
}

const backend_info* find_backend(std::string_view name) {
  for (const backend_info& b : backends()) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

const backend_info& require_backend(const backend_choice& choice) {
  const backend_info* info = find_backend(choice.name);
  if (!info) {
    std::string known;
    for (const backend_info& b : backends()) known += (known.empty() ? "" : ", ") + b.name;
    throw_error(errc::invalid_argument, "--backend '" + choice.name + "' is not a backend; known: " + known);
  }
  if (!info->available) {
    throw_error(errc::not_supported, "--backend " + choice.name + ": " + info->unavailable_reason);
  }
  if (choice.mode && !info->honours_wait_mode) {
    throw_error(errc::invalid_argument, "--backend " + choice.label() + ": " + choice.name +
                                            " has no reactor mode; use plain '" + choice.name + "'");
  }
  return *info;
}

}  // namespace fusewire::bench
