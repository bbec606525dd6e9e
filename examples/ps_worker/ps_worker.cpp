// ps_worker: trains a one-hidden-layer MLP on Fashion-MNIST, data parallel,
// with parameter servers and workers talking over fusewire.
//
//   ps_worker                         launcher: 2 PS + 4 workers on loopback, one command
//   ps_worker --ps 1 --workers 2      other cluster sizes
//   ps_worker --local                 the same model trained in this one process
//   ps_worker --role ps --task 0 --cluster "ps=h:p;worker=h:p,h:p"
//   ps_worker --role worker --task 1  (cluster from TF_CONFIG when --cluster is absent)
#include <CLI/CLI.hpp>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/cluster_cli.hpp"
#include "common/ports.hpp"
#include "common/ps_cluster.hpp"
#include "common/result_line.hpp"
#include "common/timing.hpp"
#include "fashion_mnist.hpp"
#include "mlp.hpp"
#include "ps_glue.hpp"

namespace {

using namespace example;

struct config : cluster_flags {
  config() { workers = 4; }
  unsigned epochs = 5;
  unsigned batch = 64;
  float lr = 7e-4f;
  std::string optimizer = "adam";
  std::string data = default_fashion_mnist_dir;
  unsigned hidden = 128;
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  bool compare_local = false;
  bool skip_if_no_data = false;
  double min_accuracy = 0.0;
};

glue_options glue(const config& c) { return glue_options{c.fused(), c.optimizer, c.lr, c.sync, c.seed}; }

/// The training data this worker sees: a fixed global shuffle, then every W-th example.
struct shard {
  std::vector<std::size_t> rows;
  std::size_t steps_per_epoch = 0;
};

shard make_shard(const config& c, std::size_t train_count, unsigned workers, unsigned task) {
  std::vector<std::size_t> all(train_count);
  std::iota(all.begin(), all.end(), std::size_t{0});
  std::mt19937_64 rng(c.seed * 7919 + 17);
  std::shuffle(all.begin(), all.end(), rng);
  shard s;
  for (std::size_t i = task; i < all.size(); i += workers) s.rows.push_back(all[i]);
  // Every worker runs the same number of steps (the sync barrier needs it).
  s.steps_per_epoch = (train_count / workers) / c.batch;
  return s;
}

/// Gathers the batch's rows into contiguous memory.
void gather(const image_set& d, const std::vector<std::size_t>& rows, std::size_t from, std::size_t n,
            std::vector<float>& x, std::vector<std::uint8_t>& y) {
  x.resize(n * d.pixels);
  y.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t r = rows[from + i];
    std::copy_n(d.images.begin() + static_cast<std::ptrdiff_t>(r * d.pixels), d.pixels,
                x.begin() + static_cast<std::ptrdiff_t>(i * d.pixels));
    y[i] = d.labels[r];
  }
}

fashion_mnist load(const config& c) {
  fashion_mnist d = load_fashion_mnist(c.data);
  auto trim = [](image_set& s, std::size_t limit) {
    if (limit == 0 || limit >= s.count) return;
    s.count = limit;
    s.images.resize(limit * s.pixels);
    s.labels.resize(limit);
  };
  trim(d.train, c.train_limit);
  trim(d.test, c.test_limit);
  return d;
}

/// The mean loss of the first and last tenth of the steps decide "loss went down".
class loss_tracker {
 public:
  explicit loss_tracker(std::size_t total_steps)
      : window_(std::max<std::size_t>(1, total_steps / 10)), total_(total_steps) {}
  void add(std::size_t step, double loss) {
    if (step < window_) first_ += loss, ++nf_;
    if (step + window_ >= total_) last_ += loss, ++nl_;
  }
  double first() const { return nf_ ? first_ / static_cast<double>(nf_) : 0; }
  double last() const { return nl_ ? last_ / static_cast<double>(nl_) : 0; }

 private:
  std::size_t window_, total_;
  double first_ = 0, last_ = 0;
  std::size_t nf_ = 0, nl_ = 0;
};

/// --local: the same model, data order and optimizer, all in this process.
int run_local(const config& c, double* accuracy_out = nullptr) {
  single_threaded_blas();
  const fashion_mnist d = load(c);
  mlp_shape shape;
  shape.inputs = d.train.pixels;
  shape.hidden = c.hidden;
  mlp model(shape);
  const auto model_spec = make_model(shape, glue(c));
  tensors params = initial_params(model_spec, shape), grads;
  local_optimizer opt(model_spec.optimizer, params);
  const shard sh = make_shard(c, d.train.count, 1, 0);
  const std::size_t total = sh.steps_per_epoch * c.epochs;
  std::printf("local: %zu training / %zu test images, MLP %zu-%zu-%zu, %s lr %g, batch %u, %u epochs, %s\n",
              d.train.count, d.test.count, shape.inputs, shape.hidden, shape.classes, c.optimizer.c_str(),
              static_cast<double>(c.lr), c.batch, c.epochs, blas_name());
  const unsigned log_every = c.log_every ? c.log_every : static_cast<unsigned>(std::max<std::size_t>(1, total / 10));
  loss_tracker lt(total);
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  std::vector<std::size_t> order = sh.rows;
  const auto t0 = steady::now();
  std::size_t step = 0;
  double window_loss = 0;
  auto tw = steady::now();
  for (unsigned e = 0; e < c.epochs; ++e) {
    std::mt19937_64 rng(c.seed + 1000003ull * (e + 1));
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t s = 0; s < sh.steps_per_epoch; ++s, ++step) {
      gather(d.train, order, s * c.batch, c.batch, x, y);
      const float loss = model.train_step(params, x.data(), y.data(), c.batch, grads);
      opt.apply(params, grads);
      lt.add(step, loss);
      window_loss += loss;
      if ((step + 1) % log_every == 0 || step + 1 == total) {
        const std::size_t n = (step % log_every) + 1;
        std::printf("step %6zu/%zu  epoch %u  loss %.4f  %8.0f samples/s\n", step + 1, total, e + 1,
                    window_loss / static_cast<double>(n), static_cast<double>(n * c.batch) / since(tw));
        std::fflush(stdout);
        window_loss = 0;
        tw = steady::now();
      }
    }
  }
  const double secs = since(t0);
  const double acc = model.accuracy(params, d.test.images.data(), d.test.labels.data(), d.test.count);
  std::printf("local: %zu steps in %.1f s, %.0f samples/s; loss %.4f -> %.4f\n", total, secs,
              static_cast<double>(total * c.batch) / secs, lt.first(), lt.last());
  std::printf("local: test accuracy %.4f (%zu images)\n", acc, d.test.count);
  if (accuracy_out != nullptr) *accuracy_out = acc;
  if (c.check_loss && !(lt.last() < lt.first())) {
    std::printf("local: FAILED: the loss did not go down\n");
    return 1;
  }
  if (acc < c.min_accuracy) {
    std::printf("local: FAILED: test accuracy %.4f is below --min-accuracy %.4f\n", acc, c.min_accuracy);
    return 1;
  }
  return 0;
}

/// A worker: pulls the parameters, computes the gradient of its batch, pushes it.
template <class Transport>
int run_worker(const config& c, const fusewire::cluster_spec& spec) {
  single_threaded_blas();
  const unsigned workers = static_cast<unsigned>(spec.job("worker").size());
  const fashion_mnist d = load(c);
  mlp_shape shape;
  shape.inputs = d.train.pixels;
  shape.hidden = c.hidden;
  mlp model(shape);
  const shard sh = make_shard(c, d.train.count, workers, c.task);
  const std::size_t total = sh.steps_per_epoch * c.epochs;
  if (total == 0) {
    std::printf("worker %u: FAILED: no training steps (%zu images over %u workers, batch %u)\n", c.task, d.train.count,
                workers, c.batch);
    return 1;
  }
  ps::client_config<Transport> net = client_config<Transport>(c);
  const std::string mode(fusewire::to_string(net.options.mode));
  ps_session<Transport> session(spec, c.task, shape, glue(c), std::move(net));
  if (c.task == 0) {
    std::printf(
        "worker 0: %zu training images in %u shards, %zu steps each, MLP %zu-%zu-%zu, %s lr %g, %s, "
        "batch %u, %u epochs, transport %s, mode %s, fusion %s, %s\n",
        d.train.count, workers, total, shape.inputs, shape.hidden, shape.classes, c.optimizer.c_str(),
        static_cast<double>(c.lr), c.sync ? "sync" : "async", c.batch, c.epochs,
        (c.transport + " (" + std::string(Transport::name()) + ")").c_str(), mode.c_str(), c.fused() ? "on" : "off",
        blas_name());
    std::fflush(stdout);
  }

  const unsigned log_every = c.log_every ? c.log_every : static_cast<unsigned>(std::max<std::size_t>(1, total / 8));
  loss_tracker lt(total);
  worker_result st;
  st.task = c.task;
  tensors params, grads;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  std::vector<std::size_t> order = sh.rows;
  double window_loss = 0;
  auto tw = steady::now();
  const auto t0 = steady::now();
  {
    scoped_timer t(st.comm_seconds);
    session.pull(params);
  }
  std::size_t step = 0;
  for (unsigned e = 0; e < c.epochs; ++e) {
    std::mt19937_64 rng(c.seed + 1000003ull * (e + 1) + 7ull * c.task);
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t s = 0; s < sh.steps_per_epoch; ++s, ++step) {
      gather(d.train, order, s * c.batch, c.batch, x, y);
      const float loss = model.train_step(params, x.data(), y.data(), c.batch, grads);
      {
        scoped_timer t(st.comm_seconds);
        session.step(grads, params);
      }
      lt.add(step, loss);
      window_loss += loss;
      if ((step + 1) % log_every == 0 || step + 1 == total) {
        const std::size_t n = (step % log_every) + 1;
        std::printf("step %6zu/%zu  epoch %u  loss %.4f  %8.0f samples/s\n", step + 1, total, e + 1,
                    window_loss / static_cast<double>(n), static_cast<double>(n * c.batch) / since(tw));
        std::fflush(stdout);
        window_loss = 0;
        tw = steady::now();
      }
    }
  }
  st.seconds = since(t0);
  st.steps = total;
  st.samples = total * c.batch;
  st.first_loss = lt.first();
  st.last_loss = lt.last();
  st.print();
  int rc = 0;
  if (c.check_loss && !(lt.last() < lt.first())) {
    std::printf("worker %u: FAILED: the loss did not go down (%.4f -> %.4f)\n", c.task, lt.first(), lt.last());
    rc = 1;
  }
  session.finish();  // every worker is done training past this point
  if (c.task == 0) {
    session.pull(params);
    const double acc = model.accuracy(params, d.test.images.data(), d.test.labels.data(), d.test.count);
    std::printf("worker 0: test accuracy %.4f (%zu images)\n", acc, d.test.count);
    std::printf("@accuracy value=%.5f images=%zu\n", acc, d.test.count);
    std::fflush(stdout);
    if (acc < c.min_accuracy) {
      std::printf("worker 0: FAILED: test accuracy %.4f is below --min-accuracy %.4f\n", acc, c.min_accuracy);
      rc = 1;
    }
    session.shutdown_servers();
  }
  return rc;
}

template <class Transport>
int run_ps(const config& c, const fusewire::cluster_spec& spec) {
  // The PS needs the model's shape only: the image size is fixed by the dataset format.
  mlp_shape shape;
  shape.hidden = c.hidden;
  ps::serve_until_signal<Transport>({"ps", c.task}, spec, make_model(shape, glue(c)), server_config<Transport>(c));
  return 0;
}

/// The lanes a launched PS runs when NETWORK_PS_CORE_NUMBER is unset: every
/// task shares this host, and a lane beyond the CPUs that fall to each task
/// only adds threads that wake each other up. So the CPUs this process may
/// use, shared among the tasks, at least 1; the library caps it by the workers.
unsigned launched_ps_lanes(unsigned tasks) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::max(1u, static_cast<unsigned>(cpus) / std::max(1u, tasks));
}

/// Starts every task of a loopback cluster and prints the summary table.
int run_launcher(const CLI::App& app, const config& c) {
  const std::string cluster = host_cluster({{"ps", c.ps}, {"worker", c.workers}}, c.host);
  // The tasks inherit the environment; an explicit NETWORK_PS_CORE_NUMBER stays.
  const char* set_lanes = std::getenv("NETWORK_PS_CORE_NUMBER");
  if (set_lanes == nullptr || *set_lanes == '\0') {
    ::setenv("NETWORK_PS_CORE_NUMBER", std::to_string(launched_ps_lanes(c.ps + c.workers)).c_str(), 1);
  }
  // Also checks the environment's knobs once, before any task starts.
  const std::string mode(fusewire::to_string(net_options(c, fusewire::role::worker).mode));
  std::printf(
      "ps_worker: %u parameter servers + %u workers on %s (%s), transport %s, mode %s, fusion %s, %s, "
      "NETWORK_PS_CORE_NUMBER=%s\n",
      c.ps, c.workers, c.host == "127.0.0.1" ? "loopback" : c.host.c_str(), cluster.c_str(), c.transport.c_str(),
      mode.c_str(), c.fused() ? "on" : "off", c.sync ? "sync" : "async", std::getenv("NETWORK_PS_CORE_NUMBER"));
  std::fflush(stdout);
  const auto t0 = steady::now();
  worker_totals totals;
  std::optional<double> accuracy;
  const bool ok = launch_cluster(app, c, "ps_worker", cluster,
                                 [&](const child_process&, const std::string& line) {
                                   const auto r = parse_result(line);
                                   if (r.at("@") == "@result") {
                                     totals.add(r);
                                   } else if (r.at("@") == "@accuracy") {
                                     accuracy = num(r, "value");
                                   }
                                 },
                                 {"--compare-local", "--skip-if-no-data"});
  const double wall = since(t0);
  std::printf("\n%-28s %s\n", "ps_worker summary", ok ? "" : "(FAILED)");
  if (totals.results > 0) {
    std::printf("  %-26s %.0f (all workers, training only)\n", "samples/s", totals.samples_per_second());
    std::printf("  %-26s %.1f%% (time in pull+push / step time, mean over workers)\n", "communication share",
                totals.comm_percent());
    std::printf("  %-26s %.4f -> %.4f (mean of first/last tenth of steps)\n", "training loss", totals.mean_first_loss(),
                totals.mean_last_loss());
  }
  if (accuracy) std::printf("  %-26s %.4f\n", "test accuracy", *accuracy);
  std::printf("  %-26s %.1f s\n", "wall time", wall);
  if (ok && accuracy && c.compare_local) {
    std::printf("\nps_worker: the same model in one process, for comparison (--local)\n");
    std::fflush(stdout);
    double local_acc = 0;
    const int rc = run_local(c, &local_acc);
    if (rc != 0) return rc;
    std::printf("\n  %-26s %.4f distributed (%u PS, %u workers, %s) vs %.4f local: %+.2f points\n", "test accuracy",
                *accuracy, c.ps, c.workers, c.sync ? "sync" : "async", local_acc, 100.0 * (*accuracy - local_acc));
  }
  return ok && accuracy ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  CLI::App app{
      "Trains a one-hidden-layer MLP on Fashion-MNIST with parameter servers and workers over fusewire.\n"
      "Without --role it launches the whole cluster on loopback; with --role it is one task of a cluster\n"
      "given by --cluster or TF_CONFIG."};
  add_cluster_flags(app, c, "fuse each step's pulls/pushes to one PS into one request (default on)",
                    "seed of initialization and data order");
  app.add_option("--epochs", c.epochs, "passes over the training set")->check(CLI::Range(1u, 1000u));
  app.add_option("--batch", c.batch, "examples per worker step")->check(CLI::Range(1u, 60000u));
  app.add_option("--lr", c.lr, "learning rate")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", c.optimizer, "optimizer applied on the PS")->check([](const std::string& name) {
    return ps::optimizer_kind_from_string(name) ? std::string()
                                                : "not one of: " + std::string(ps::optimizer_kind_names);
  });
  app.add_option("--data", c.data, "directory with the Fashion-MNIST IDX files (.gz or unpacked)");
  app.add_option("--hidden", c.hidden, "hidden units")->check(CLI::Range(1u, 4096u));
  app.add_option("--train-limit", c.train_limit, "use only the first N training images (0 = all)");
  app.add_option("--test-limit", c.test_limit, "use only the first N test images (0 = all)");
  app.add_flag("--compare-local", c.compare_local,
               "launcher: afterwards train the same model in this process (--local) and compare accuracies");
  app.add_flag("--skip-if-no-data", c.skip_if_no_data, "exit 77 (a skipped test) when the dataset is missing");
  app.add_option("--min-accuracy", c.min_accuracy, "exit 1 if the final test accuracy is below this");
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  if (c.sync && !c.fused()) {
    std::fprintf(stderr, "ps_worker: --fusion off needs --async (a sync step must be one request per PS)\n");
    return 2;
  }
  try {
    if (c.role != "ps") {
      try {
        (void)detail::find_idx(c.data, "train-images-idx3-ubyte");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ps_worker: %s\n", e.what());
        return c.skip_if_no_data ? 77 : 1;
      }
    }
    if (c.local) return run_local(c);
    if (c.role.empty()) return run_launcher(app, c);
    return run_task(app, c, "ps_worker", [&]<class Transport>(const fusewire::cluster_spec& spec) {
      return c.role == "ps" ? run_ps<Transport>(c, spec) : run_worker<Transport>(c, spec);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_worker: %s\n", e.what());
    return 1;
  }
}
