// optimizer_bench: the time of one ps::apply_update over a dense slice, for
// each optimizer the PS applies. The default size is the main job's model
// (784 x 128 + 128 + 128 x 10 + 10 = 101,770 floats), so the figure is the
// PS's cost of one push of that model.
//
//   optimizer_bench [--size N] [--updates N] [--runs N] [--optimizer sgd,adam,...]
//
// Prints one line per optimizer: the best mean over --runs runs of --updates
// updates each (microseconds per update), and the first weight, which must
// not change between builds that claim the same results.
#include <fusewire/ps/optimizer.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace ps = fusewire::ps;

int main(int argc, char** argv) {
  std::size_t size = 101'770, updates = 2000, runs = 5;
  std::vector<std::string> names{"sgd", "momentum", "adagrad", "adam"};
  CLI::App app{"Times ps::apply_update over a dense slice for each optimizer."};
  app.add_option("--size", size, "floats in the slice (default: the main job's model, 101770)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 28));
  app.add_option("--updates", updates, "updates per run")->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  app.add_option("--runs", runs, "runs; the best one's mean is printed")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000}));
  app.add_option("--optimizer", names, "optimizers to time")->delimiter(',')->check([](const std::string& name) {
    return ps::optimizer_kind_from_string(name) ? std::string()
                                                : "not one of: " + std::string(ps::optimizer_kind_names);
  });
  CLI11_PARSE(app, argc, argv);

  for (const std::string& name : names) {
    // The rate does not change an update's cost.
    const auto cfg = ps::optimizer_config::from_name(name, 1e-3f);
    // Large arrays start at the same offset in their pages; the weights, the
    // slots and the gradient start 1 KiB apart instead, so that the figure
    // is the update's cost, not 4 KiB aliasing between a store to w[i] and
    // a load of grad[i] (which halves an SGD loop's speed on some CPUs).
    constexpr std::size_t stagger = 256;  // floats
    std::vector<float> w_mem(size + stagger, 0.5f), slots_mem(size * cfg.slots() + 2 * stagger),
        grad_mem(size + 3 * stagger, 0.01f);
    const std::span<float> w(w_mem.data(), size), slots(slots_mem.data() + stagger, size * cfg.slots());
    const std::span<const float> grad(grad_mem.data() + 2 * stagger, size);
    std::fill(slots.begin(), slots.end(), ps::initial_slot_value(cfg, 0));
    std::uint64_t t = 0;
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < runs; ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (std::size_t k = 0; k < updates; ++k) ps::apply_update(cfg, w, slots, grad, t);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                        static_cast<double>(updates);
      if (us < best) best = us;
    }
    std::printf("%-9s %9.1f us per update of %zu floats (best of %zu runs of %zu; w[0] = %.6g)\n", name.c_str(), best,
                size, runs, updates, static_cast<double>(w[0]));
  }
  return 0;
}
