// embedding: a click-through-rate model on hashed categorical features,
// trained with parameter servers holding a sparse embedding table.
//
// Each example has F categorical fields (an ad id, a site, a device, ...);
// field f's value v becomes the id hash(f, v) of one row of a shared
// embedding table that grows on first touch. The F rows are concatenated and
// fed to a small MLP (ReLU hidden layer, sigmoid output, log loss). Workers
// pull only the rows their batch uses (sparse pull), push gradients for those
// rows (sparse push; the PS applies Adagrad to the touched rows only), and the
// dense MLP weights as well — all in one fused request per PS per step.
//
// The data is synthetic: a seeded rule gives every (field, value) a hidden
// weight and adds an interaction between fields 0 and 1, so the model has
// something to learn; the program prints the loss going down and, at the end,
// the AUC on held-out examples next to the AUC of the true rule.
//
//   embedding                      launcher: 2 PS + 2 workers on loopback
//   embedding --role ps --task 0 --cluster "ps=h:p;worker=h:p,h:p"   (or TF_CONFIG)
#include <CLI/CLI.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/cluster_cli.hpp"
#include "common/ports.hpp"
#include "common/ps_cluster.hpp"
#include "common/result_line.hpp"
#include "common/timing.hpp"

namespace {

using namespace example;

struct config : cluster_flags {
  unsigned steps = 600;
  unsigned batch = 256;
  unsigned fields = 8;
  unsigned vocab = 1000;
  unsigned dim = 8;
  unsigned hidden = 32;
  float lr = 0.4f;
  unsigned eval_examples = 20000;
  double min_auc = 0.0;
};

// ---- the synthetic data ----------------------------------------------------

/// A uniform float in [0, 1) from a 64-bit hash.
float unit(std::uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

/// The embedding id of value `v` of field `f` (as a hashing trick on raw feature strings would give).
std::int64_t feature_id(unsigned f, std::uint64_t v) {
  return static_cast<std::int64_t>(ps::hash_id((std::uint64_t{f} << 40) ^ v) >> 1);
}

/// The rule the labels come from: every (field, value) has a hidden weight;
/// fields 0 and 1 also interact (agreeing signs add, disagreeing subtract).
class click_rule {
 public:
  explicit click_rule(const config& c) : c_(c) {}

  float weight(unsigned f, std::uint64_t v) const {
    const std::uint64_t h = ps::hash_id(c_.seed * 0x51ed27ull + (std::uint64_t{f} << 32) + v);
    return (unit(h) * 2.0f - 1.0f) * (f < 4 ? 1.2f : 0.5f);
  }

  /// The true log-odds of a click for field values `v`.
  float logit(const std::uint64_t* v) const {
    float z = -1.0f;
    for (unsigned f = 0; f < c_.fields; ++f) z += weight(f, v[f]);
    if (c_.fields >= 2) z += (weight(0, v[0]) * weight(1, v[1]) > 0 ? 1.0f : -1.0f);
    return z;
  }

  /// Example `i` of stream `stream`: field values (skewed: small values are popular) and a label.
  void example(std::uint64_t stream, std::uint64_t i, std::uint64_t* v, float& label, float& p_true) const {
    std::uint64_t h = ps::hash_id(ps::hash_id(c_.seed ^ (stream << 48)) + i);
    for (unsigned f = 0; f < c_.fields; ++f) {
      h = ps::hash_id(h);
      const float u = unit(h);
      v[f] = static_cast<std::uint64_t>(static_cast<float>(c_.vocab) * u * u * u);
    }
    p_true = 1.0f / (1.0f + std::exp(-logit(v)));
    label = unit(ps::hash_id(h + 1)) < p_true ? 1.0f : 0.0f;
  }

 private:
  const config& c_;
};

// ---- the model -------------------------------------------------------------

constexpr const char* emb_name = "ctr/embedding";
constexpr const char* dense_names[4] = {"ctr/w1", "ctr/b1", "ctr/w2", "ctr/b2"};

ps::model_spec make_model(const config& c) {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::adagrad(c.lr);
  const auto in = static_cast<std::int64_t>(c.fields * c.dim), h = static_cast<std::int64_t>(c.hidden);
  m.add_embedding(emb_name, c.dim, ps::initializer::uniform(-0.05f, 0.05f, c.seed));
  const float l1 = std::sqrt(6.0f / static_cast<float>(in + h)), l2 = std::sqrt(6.0f / static_cast<float>(h + 1));
  m.add_dense(dense_names[0], {in, h}, ps::initializer::uniform(-l1, l1, c.seed));
  m.add_dense(dense_names[1], {h});
  m.add_dense(dense_names[2], {h, 1}, ps::initializer::uniform(-l2, l2, c.seed));
  m.add_dense(dense_names[3], {1});
  return m;
}

/// One batch: unique ids, and for each example and field the index of its row among them.
struct sparse_batch {
  std::vector<std::int64_t> ids;
  std::vector<std::uint32_t> slot;  // examples * fields
  std::vector<float> labels;
  std::vector<float> p_true;
};

void make_batch(const config& c, const click_rule& rule, std::uint64_t stream, std::uint64_t first, std::size_t n,
                sparse_batch& b) {
  b.ids.clear();
  b.slot.resize(n * c.fields);
  b.labels.resize(n);
  b.p_true.resize(n);
  std::unordered_map<std::int64_t, std::uint32_t> where;
  std::vector<std::uint64_t> v(c.fields);
  for (std::size_t i = 0; i < n; ++i) {
    rule.example(stream, first + i, v.data(), b.labels[i], b.p_true[i]);
    for (unsigned f = 0; f < c.fields; ++f) {
      const std::int64_t id = feature_id(f, v[f]);
      auto [it, fresh] = where.try_emplace(id, static_cast<std::uint32_t>(b.ids.size()));
      if (fresh) b.ids.push_back(id);
      b.slot[i * c.fields + f] = it->second;
    }
  }
}

/// Dense weights (w1 [F*D x H], b1, w2 [H x 1], b2) and scratch for forward/backward.
struct ctr_model {
  const config& c;
  std::vector<float> dense[4];
  std::vector<float> x, h, out;

  /// Forward on `b` with rows `rows` (ids.size() x dim); fills out (probabilities).
  void forward(const sparse_batch& b, const float* rows) {
    const std::size_t n = b.labels.size(), in = c.fields * c.dim, hid = c.hidden;
    x.resize(n * in);
    h.resize(n * hid);
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      for (unsigned f = 0; f < c.fields; ++f) {
        const float* r = rows + std::size_t{b.slot[i * c.fields + f]} * c.dim;
        std::copy(r, r + c.dim, x.begin() + static_cast<std::ptrdiff_t>(i * in + f * c.dim));
      }
      float* hi = h.data() + i * hid;
      std::copy(dense[1].begin(), dense[1].end(), hi);
      for (std::size_t k = 0; k < in; ++k) {
        const float xv = x[i * in + k];
        const float* w = dense[0].data() + k * hid;
        for (std::size_t j = 0; j < hid; ++j) hi[j] += xv * w[j];
      }
      float z = dense[3][0];
      for (std::size_t j = 0; j < hid; ++j) {
        hi[j] = std::max(hi[j], 0.0f);
        z += hi[j] * dense[2][j];
      }
      out[i] = 1.0f / (1.0f + std::exp(-z));
    }
  }

  /// Backward after forward(): mean log-loss gradients of the dense weights and of the rows.
  float backward(const sparse_batch& b, std::vector<float> (&g)[4], std::vector<float>& grows) {
    const std::size_t n = b.labels.size(), in = c.fields * c.dim, hid = c.hidden;
    for (int k = 0; k < 4; ++k) g[k].assign(dense[k].size(), 0.0f);
    grows.assign(b.ids.size() * c.dim, 0.0f);
    std::vector<float> dh(hid), dx(in);
    double loss = 0;
    const float inv = 1.0f / static_cast<float>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float p = std::clamp(out[i], 1e-7f, 1.0f - 1e-7f);
      loss -= b.labels[i] > 0.5f ? std::log(p) : std::log(1.0f - p);
      const float dz = (out[i] - b.labels[i]) * inv;
      g[3][0] += dz;
      const float* hi = h.data() + i * hid;
      for (std::size_t j = 0; j < hid; ++j) {
        g[2][j] += dz * hi[j];
        dh[j] = hi[j] > 0.0f ? dz * dense[2][j] : 0.0f;
        g[1][j] += dh[j];
      }
      for (std::size_t k = 0; k < in; ++k) {
        const float xv = x[i * in + k];
        const float* w = dense[0].data() + k * hid;
        float* gw = g[0].data() + k * hid;
        float s = 0;
        for (std::size_t j = 0; j < hid; ++j) {
          gw[j] += xv * dh[j];
          s += w[j] * dh[j];
        }
        dx[k] = s;
      }
      for (unsigned f = 0; f < c.fields; ++f) {
        float* r = grows.data() + std::size_t{b.slot[i * c.fields + f]} * c.dim;
        for (unsigned d = 0; d < c.dim; ++d) r[d] += dx[f * c.dim + d];
      }
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }
};

/// Area under the ROC curve of `score` against 0/1 `label` (ties count half).
double auc(const std::vector<float>& score, const std::vector<float>& label) {
  std::vector<std::size_t> idx(score.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return score[a] < score[b]; });
  double rank_sum = 0, pos = 0;
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j < idx.size() && score[idx[j]] == score[idx[i]]) ++j;
    const double mid = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2.0 + 1.0;
    for (std::size_t k = i; k < j; ++k) {
      if (label[idx[k]] > 0.5f) rank_sum += mid, ++pos;
    }
    i = j;
  }
  const double neg = static_cast<double>(score.size()) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

// ---- where the parameters live ------------------------------------------------

/// One exchange per step: push the gradients of the last step (if any) and
/// pull the dense weights and the rows of `pull_ids` (if not empty).
struct exchange {
  const std::vector<float>* dense_grads = nullptr;  // 4 tensors, or null: nothing to push
  std::span<const std::int64_t> push_ids;
  std::span<const float> row_grads;
  std::span<const std::int64_t> pull_ids;
  bool pull = false;
};

/// The parameter servers, through a ps::client: one fused request per PS per exchange.
template <class Transport>
class remote_params {
 public:
  remote_params(const config& c, const fusewire::cluster_spec& spec, const ps::model_spec& model)
      : client_({"worker", c.task}, spec, model, client_config<Transport>(c)), emb_(client_.variable(emb_name)) {
    for (const char* n : dense_names) dense_.push_back(client_.variable(n));
  }

  void run(const exchange& x, ctr_model& m, std::vector<float>& rows) {
    b_.clear();
    if (x.dense_grads != nullptr) {
      for (int k = 0; k < 4; ++k) b_.push(dense_[static_cast<std::size_t>(k)], x.dense_grads[k]);
      b_.push_rows(emb_, x.push_ids, x.row_grads);
    }
    if (x.pull) {
      // Straight into the model's tensors and the row buffer.
      for (int k = 0; k < 4; ++k) {
        m.dense[k].resize(dense_[static_cast<std::size_t>(k)].size());
        b_.pull_into(dense_[static_cast<std::size_t>(k)], m.dense[k]);
      }
      rows.resize(x.pull_ids.size() * emb_.size());
      b_.pull_rows_into(emb_, x.pull_ids, rows);
    }
    client_.run(b_);
  }
  ps::client<Transport>& client() { return client_; }

 private:
  ps::client<Transport> client_;
  std::vector<ps::variable_handle> dense_;  ///< dense_names' variables, resolved once
  ps::variable_handle emb_;
  ps::batch b_;
};

/// --local: the same variables and update rules in this process (rows created on first touch).
class local_params {
 public:
  explicit local_params(const ps::model_spec& model) : model_(model) {
    for (int k = 0; k < 4; ++k) {
      const ps::variable_spec& v = model_.variables[model_.index_of(dense_names[k])];
      const auto n = static_cast<std::size_t>(v.num_elements()), row = static_cast<std::size_t>(v.row_size());
      dense_[k].resize(n);
      for (std::size_t e = 0; e < n; ++e) dense_[k][e] = v.init.value(v.name, e / row, e % row);
      slots_[k].assign(n * opt(k).slots(), ps::initial_slot_value(opt(k), 0));
    }
  }

  void run(const exchange& x, ctr_model& m, std::vector<float>& rows) {
    const ps::variable_spec& ev = model_.variables[model_.index_of(emb_name)];
    const auto dim = static_cast<std::size_t>(ev.row_size());
    if (x.dense_grads != nullptr) {
      for (int k = 0; k < 4; ++k) ps::apply_update(opt(k), dense_[k], slots_[k], x.dense_grads[k], updates_[k]);
      const ps::optimizer_config& eo = model_.optimizer_of(model_.index_of(emb_name));
      for (std::size_t i = 0; i < x.push_ids.size(); ++i) {
        row& r = touch(ev, x.push_ids[i]);
        ps::apply_update(eo, r.w, r.slots, x.row_grads.subspan(i * dim, dim), r.updates);
      }
    }
    if (!x.pull) return;
    for (int k = 0; k < 4; ++k) m.dense[k] = dense_[k];
    rows.resize(x.pull_ids.size() * dim);
    for (std::size_t i = 0; i < x.pull_ids.size(); ++i) {
      const row& r = touch(ev, x.pull_ids[i]);
      std::copy(r.w.begin(), r.w.end(), rows.begin() + static_cast<std::ptrdiff_t>(i * dim));
    }
  }

 private:
  struct row {
    std::vector<float> w, slots;
    std::uint64_t updates = 0;
  };
  const ps::optimizer_config& opt(int k) const { return model_.optimizer_of(model_.index_of(dense_names[k])); }
  row& touch(const ps::variable_spec& ev, std::int64_t id) {
    auto [it, fresh] = table_.try_emplace(id);
    if (fresh) {
      const auto dim = static_cast<std::size_t>(ev.row_size());
      const ps::optimizer_config& eo = model_.optimizer_of(model_.index_of(emb_name));
      it->second.w.resize(dim);
      for (std::size_t d = 0; d < dim; ++d) it->second.w[d] = ev.init.value(ev.name, static_cast<std::uint64_t>(id), d);
      it->second.slots.assign(dim * eo.slots(), ps::initial_slot_value(eo, 0));
    }
    return it->second;
  }
  ps::model_spec model_;
  std::vector<float> dense_[4], slots_[4];
  std::uint64_t updates_[4] = {};
  std::unordered_map<std::int64_t, row> table_;
};

// ---- roles -----------------------------------------------------------------

/// A worker's training loop over `params` (remote or local); worker 0 also
/// evaluates the final model. Returns the exit status.
template <class Params, class Finish>
int train(const config& c, Params& params, Finish&& finish) {
  const click_rule rule(c);
  ctr_model m{c, {}, {}, {}, {}};
  const std::uint64_t stream = 1 + c.task;  // stream 0 is the held-out set
  sparse_batch cur, next;
  std::vector<float> g[4], grows, rows;
  double comm = 0, first = 0, last = 0, window_loss = 0;
  const std::size_t window = std::max<unsigned>(1, c.steps / 10);
  const unsigned log_every = c.log_every ? c.log_every : std::max<unsigned>(1, c.steps / 8);
  std::size_t rows_pulled = 0;
  make_batch(c, rule, stream, 0, c.batch, cur);
  {
    scoped_timer t(comm);
    params.run(exchange{nullptr, {}, {}, cur.ids, true}, m, rows);
  }
  const auto t0 = steady::now();
  auto tw = t0;
  for (unsigned s = 0; s < c.steps; ++s) {
    rows_pulled += cur.ids.size();
    m.forward(cur, rows.data());
    const float loss = m.backward(cur, g, grows);
    if (s < window) first += loss;
    if (s + window >= c.steps) last += loss;
    window_loss += loss;
    if ((s + 1) % log_every == 0 || s + 1 == c.steps) {
      const unsigned n = s % log_every + 1;
      std::printf("step %5u/%u  log loss %.4f  %6.0f examples/s  %zu rows in this batch\n", s + 1, c.steps,
                  window_loss / n, static_cast<double>(n) * c.batch / since(tw), cur.ids.size());
      std::fflush(stdout);
      window_loss = 0;
      tw = steady::now();
    }
    // Push this step's gradients and pull the next step's rows in one exchange.
    const bool more = s + 1 < c.steps;
    if (more) make_batch(c, rule, stream, std::uint64_t{s + 1} * c.batch, c.batch, next);
    {
      scoped_timer t(comm);
      params.run(exchange{g, cur.ids, grows,
                          more ? std::span<const std::int64_t>(next.ids) : std::span<const std::int64_t>{}, more},
                 m, rows);
    }
    std::swap(cur, next);
  }
  const double secs = since(t0);
  first /= static_cast<double>(window);
  last /= static_cast<double>(window);
  worker_result{c.task, std::size_t{c.steps} * c.batch, c.steps, secs, comm, first, last}.print(
      " rows=" + std::to_string(rows_pulled));
  int rc = 0;
  if (c.check_loss && !(last < first)) {
    std::printf("worker %u: FAILED: the loss did not go down (%.4f -> %.4f)\n", c.task, first, last);
    rc = 1;
  }
  if (!finish()) return rc;

  // Held-out examples (stream 0): the model's AUC next to the true rule's.
  sparse_batch eval;
  make_batch(c, rule, 0, 0, c.eval_examples, eval);
  params.run(exchange{nullptr, {}, {}, eval.ids, true}, m, rows);
  m.forward(eval, rows.data());
  const double model_auc = auc(m.out, eval.labels), rule_auc = auc(eval.p_true, eval.labels);
  double ll = 0;
  for (std::size_t i = 0; i < eval.labels.size(); ++i) {
    const double p = std::clamp(static_cast<double>(m.out[i]), 1e-7, 1 - 1e-7);
    ll -= eval.labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  std::printf("@auc value=%.5f rule=%.5f logloss=%.5f examples=%zu rows=%zu\n", model_auc, rule_auc,
              ll / static_cast<double>(eval.labels.size()), eval.labels.size(), eval.ids.size());
  std::fflush(stdout);
  if (model_auc < c.min_auc) {
    std::printf("worker 0: FAILED: held-out AUC %.4f is below --min-auc %.4f\n", model_auc, c.min_auc);
    rc = 1;
  }
  return rc;
}

void print_setup(const config& c) {
  std::printf(
      "worker 0: %u fields, %u values each (skewed), embedding dim %u, MLP %u-%u-1, adagrad lr %g, "
      "batch %u, %u steps per worker, %s, transport %s\n",
      c.fields, c.vocab, c.dim, c.fields * c.dim, c.hidden, static_cast<double>(c.lr), c.batch, c.steps,
      c.sync ? "sync" : "async", c.transport.c_str());
  std::fflush(stdout);
}

template <class Transport>
int run_worker(const config& c, const fusewire::cluster_spec& spec) {
  remote_params<Transport> params(c, spec, make_model(c));
  if (c.task == 0) print_setup(c);
  const int rc = train(c, params, [&] {
    params.client().barrier();  // every worker finished training
    return c.task == 0;
  });
  if (c.task == 0) params.client().shutdown_servers();
  return rc;
}

/// --local: one worker's loop with the parameters in this process; prints the summary lines itself.
int run_local(const config& c) {
  local_params params(make_model(c));
  print_setup(c);
  std::printf("(local: no parameter servers, everything in this process)\n");
  return train(c, params, [] { return true; });
}

int run_launcher(const CLI::App& app, const config& c) {
  const std::string cluster = host_cluster({{"ps", c.ps}, {"worker", c.workers}}, c.host);
  (void)net_options(c, fusewire::role::worker);  // checks the environment's knobs once, before any task starts
  std::printf("embedding: %u parameter servers + %u workers on %s (%s), transport %s, %s\n", c.ps, c.workers,
              c.host == "127.0.0.1" ? "loopback" : c.host.c_str(), cluster.c_str(), c.transport.c_str(),
              c.sync ? "sync" : "async");
  std::fflush(stdout);
  const auto t0 = steady::now();
  worker_totals totals;
  std::optional<result_fields> final_auc;
  const bool ok = launch_cluster(app, c, "embedding", cluster, [&](const child_process&, const std::string& line) {
    const auto r = parse_result(line);
    if (r.at("@") == "@result") {
      totals.add(r);
    } else if (r.at("@") == "@auc") {
      final_auc = r;
    }
  });
  std::printf("\nembedding summary %s\n", ok ? "" : "(FAILED)");
  if (totals.results > 0) {
    std::printf("  %-24s %.0f (all workers)\n", "examples/s", totals.samples_per_second());
    std::printf("  %-24s %.1f%% (time in pull+push / step time)\n", "communication share", totals.comm_percent());
    std::printf("  %-24s %.4f -> %.4f (first/last tenth of steps)\n", "training log loss", totals.mean_first_loss(),
                totals.mean_last_loss());
  }
  if (final_auc) {
    std::printf("  %-24s %.4f (the true rule: %.4f; log loss %.4f on %s examples)\n", "held-out AUC",
                num(*final_auc, "value"), num(*final_auc, "rule"), num(*final_auc, "logloss"),
                final_auc->at("examples").c_str());
  }
  std::printf("  %-24s %.1f s\n", "wall time", since(t0));
  return ok && final_auc ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  CLI::App app{
      "Trains a click-through model (hashed categorical features -> sparse embedding -> MLP) with\n"
      "parameter servers over fusewire, on synthetic data from a seeded rule. Without --role it\n"
      "launches the whole cluster on loopback."};
  add_cluster_flags(app, c, "coalesce small sends (the step is always one request per PS; default on)",
                    "seed of the data rule and the initial values");
  app.add_option("--steps", c.steps, "steps per worker")->check(CLI::Range(1u, 10000000u));
  app.add_option("--batch", c.batch, "examples per step")->check(CLI::Range(1u, 65536u));
  app.add_option("--fields", c.fields, "categorical fields per example")->check(CLI::Range(1u, 64u));
  app.add_option("--vocab", c.vocab, "distinct values per field")->check(CLI::Range(2u, 100000000u));
  app.add_option("--dim", c.dim, "embedding width")->check(CLI::Range(1u, 256u));
  app.add_option("--hidden", c.hidden, "hidden units")->check(CLI::Range(1u, 1024u));
  app.add_option("--lr", c.lr, "Adagrad learning rate (embedding and dense)")->check(CLI::PositiveNumber);
  app.add_option("--eval-examples", c.eval_examples, "held-out examples for the final AUC")
      ->check(CLI::Range(10u, 10000000u));
  app.add_option("--min-auc", c.min_auc, "exit 1 if the held-out AUC is below this");
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  try {
    if (c.local) return run_local(c);
    if (c.role.empty()) return run_launcher(app, c);
    return run_task(app, c, "embedding", [&]<class Transport>(const fusewire::cluster_spec& spec) {
      if (c.role == "ps") {
        ps::serve_until_signal<Transport>({"ps", c.task}, spec, make_model(c), server_config<Transport>(c));
        return 0;
      }
      return run_worker<Transport>(c, spec);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embedding: %s\n", e.what());
    return 1;
  }
}
