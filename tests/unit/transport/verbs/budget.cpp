// TF_RDMA_BUF_SIZE on the host (no device needed): it becomes the verbs
// transport's registered-memory limit per reactor, the limit holds the
// reactor's own slots and staging blocks, and registrations past it are
// refused, naming the variable, until memory is given back.

#include <fusewire/transport/verbs/config.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace {

using fusewire::verbs_config;

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;

fusewire::options options_with(std::map<std::string, std::string, std::less<>> env) {
  return fusewire::options::from_env(fusewire::role::worker,
                                     [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
                                       auto it = env.find(name);
                                       if (it == env.end()) return std::nullopt;
                                       return it->second;
                                     });
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("TF_RDMA_BUF_SIZE sets the registered-memory limit of the verbs transport") {
  CHECK(verbs_config::from(options_with({})).registered_limit == gib);
  CHECK(verbs_config::from(options_with({{"TF_RDMA_BUF_SIZE", "4294967296"}})).registered_limit == 4 * gib);
  CHECK(verbs_config::from(options_with({{"TF_RDMA_BUF_SIZE", "1073741824"}})).registered_limit == gib);
}

TEST_CASE("the reactor's slots and staging blocks must fit in TF_RDMA_BUF_SIZE") {
  verbs_config c = verbs_config::from(options_with({}));
  // The defaults: (16 x 64 + 256) x 64 KiB of slots, 16 x 4 MiB of staging.
  CHECK(c.fixed_registered_bytes() == 80 * mib + 64 * mib);
  CHECK_NOTHROW(c.validate());
  c.rdma_write_threshold = 0;  // no RDMA writes: no staging blocks
  CHECK(c.fixed_registered_bytes() == 80 * mib);

  verbs_config big = verbs_config::from(options_with({{"TF_RDMA_CHUNK_SIZE", "67108864"}}));
  CHECK(big.chunk_size == 64 * mib);
  CHECK(big.fixed_registered_bytes() == 80 * mib + 16 * 64 * mib);
  CHECK(error_of([&] { big.validate(); })
            .find("verbs_config.registered_limit = 1073741824 (TF_RDMA_BUF_SIZE): the message slots and staging blocks "
                  "of a reactor alone register 1157627904 bytes") != std::string::npos);
  CHECK_NOTHROW(
      verbs_config::from(options_with({{"TF_RDMA_CHUNK_SIZE", "67108864"}, {"TF_RDMA_BUF_SIZE", "2147483648"}}))
          .validate());
}

TEST_CASE("registrations past TF_RDMA_BUF_SIZE are refused until bytes are given back") {
  fusewire::detail::registered_budget budget(gib);
  budget.take(144 * mib);
  budget.take(gib - 144 * mib);
  CHECK(budget.used() == gib);
  const std::string refused = error_of([&] { budget.take(4096); });
  CHECK(refused.find("verbs: registering 4096 more bytes would pass TF_RDMA_BUF_SIZE = 1073741824 bytes of "
                     "registered memory for this reactor (1073741824 registered") == 0);
  CHECK(budget.used() == gib);  // a refusal takes nothing
  budget.give_back(64 * mib);
  CHECK_NOTHROW(budget.take(64 * mib));
  CHECK_THROWS_AS(budget.take(static_cast<std::size_t>(-1)), std::system_error);  // no wrap-around
  budget.give_back(gib);
  CHECK(budget.used() == 0);
  CHECK(error_of([&] { budget.take(2 * gib); }).find("would pass TF_RDMA_BUF_SIZE") != std::string::npos);
}

TEST_CASE("verbs_config::from_env (the default verbs transport) reads the RDMA knobs") {
  auto env = [](std::map<std::string, std::string, std::less<>> vars) {
    return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  const verbs_config defaults = verbs_config::from_env(env({}));
  CHECK(defaults.registered_limit == gib);
  CHECK(defaults.device == "mlx5_0");
  const verbs_config c = verbs_config::from_env(env({{"TF_RDMA_BUF_SIZE", "2147483648"},
                                                     {"TF_RDMA_DEV_NAME", "rxe0"},
                                                     {"TF_RDMA_CHUNK_SIZE", "3000000"},
                                                     {"TF_RDMA_ACC_SIZE", "16384"},
                                                     {"TF_RDMA_ENABLED", "false"}}));
  CHECK(c.registered_limit == 2 * gib);
  CHECK(c.device == "rxe0");
  CHECK(c.chunk_size == 4 * mib);  // rounded up to a power of two
  CHECK(c.rdma_write_threshold == 16384);
  CHECK(error_of([&] {
          (void)verbs_config::from_env(env({{"TF_RDMA_BUF_SIZE", "1000"}}));
        }) ==
        "TF_RDMA_BUF_SIZE='1000': expected a positive multiple of 1 GiB in bytes (such as 1073741824 or "
        "10737418240): invalid configuration");
}
