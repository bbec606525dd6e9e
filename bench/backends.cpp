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
    out.push_back(floor_backend());
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
