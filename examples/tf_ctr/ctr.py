"""Wide-and-deep click-through-rate model trained three ways, side by side:

  local     one process, plain TensorFlow variables (the accuracy reference)
  fusewire  PS tasks and worker processes on this host; variables on fusewire's
            PS (fusewire_tf ops), asynchronous training
  fusewire-sync  the same, synchronous training (each PS averages one push of
            every worker per step)
  local-sync  one process, one step on one batch of each worker at a time
            (what fusewire-sync computes; its accuracy reference)
  tf-grpc   the same cluster shape with TensorFlow's ParameterServerStrategy
            over gRPC (a coordinator schedules steps on the workers)

    python examples/tf_ctr/ctr.py                    # all three, 2 PS + 2 workers
    python examples/tf_ctr/ctr.py --runs local,fusewire --check-auc 0.01
    python examples/tf_ctr/ctr.py --api keras --runs local,fusewire,fusewire-sync

With --api keras the model is a keras.Model trained with model.fit: Keras's
Embedding and Dense layers locally, fusewire_tf.Embedding and PSDense on
fusewire (tf-grpc has no Keras variant).

The data is synthetic and has a known logistic ground truth: each row has
FIELDS categorical ids and DENSE real features, and clicks with probability
sigmoid(bias + sum of per-id weights + dense . beta + an interaction of the
first two fields' weights), so the AUC of the true probabilities bounds what a
model can reach. Every run does the same number of steps in all (split over
the workers) with the same batch size, the same Adagrad rule and initial
values from the same distributions; the AUC is measured on one held-out set.

Prints one line per run: samples/s, milliseconds per step (per worker), AUC.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

FIELDS = 8
VOCAB = 200  # ids per field; id = field * VOCAB + value
DENSE = 4
EMB = 8
H1, H2 = 64, 32
LR = 0.2
INIT_ACC = 0.1

# ---- data --------------------------------------------------------------------------


def _truth():
    import numpy as np
    rng = np.random.default_rng(2024)
    return rng.normal(0.0, 0.8, FIELDS * VOCAB), rng.normal(0.0, 0.5, DENSE), -1.0


def make_batch(seed, n):
    """n rows: (ids int64 [n, FIELDS], dense float32 [n, DENSE], label float32 [n, 1], true p)."""
    import numpy as np
    w, beta, bias = _truth()
    rng = np.random.default_rng(seed)
    u = rng.random((n, FIELDS))
    values = np.minimum((VOCAB * u * u).astype(np.int64), VOCAB - 1)  # skewed: low values are frequent
    ids = values + np.arange(FIELDS, dtype=np.int64) * VOCAB
    dense = rng.normal(0.0, 1.0, (n, DENSE)).astype(np.float32)
    wi = w[ids]
    logit = bias + wi.sum(axis=1) + dense @ beta + 0.5 * wi[:, 0] * wi[:, 1]
    p = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(n) < p).astype(np.float32)[:, None]
    return ids, dense, label, p


def auc(labels, scores):
    """Area under the ROC curve (rank statistic; ties averaged)."""
    import numpy as np
    labels = np.asarray(labels).ravel()
    scores = np.asarray(scores).ravel()
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = labels > 0.5
    npos, nneg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


TEST_SEED = 999_999


def batch_seed(worker, step):
    return 1_000_003 * (worker + 1) + step


# ---- the model, over any variable store --------------------------------------------

SHAPES = {
    "lin/w": [DENSE, 1], "lin/b": [1],
    "h1/w": [FIELDS * EMB + DENSE, H1], "h1/b": [H1],
    "h2/w": [H1, H2], "h2/b": [H2],
    "out/w": [H2, 1], "out/b": [1],
}
TABLES = {"wide": 1, "deep": EMB}


def glorot_limit(name):
    shape = SHAPES[name]
    return (6.0 / (shape[0] + shape[1])) ** 0.5


def initial_dense(name):
    """Glorot-uniform kernels, zero biases (fusewire's PS draws from the same
    distributions with its own initializers)."""
    import numpy as np
    shape = SHAPES[name]
    if name.endswith("/b"):
        return np.zeros(shape, np.float32)
    limit = glorot_limit(name)
    return np.random.default_rng(len(name) * 31 + shape[0]).uniform(-limit, limit, shape).astype(np.float32)


def forward(store, ids, dense):
    import tensorflow as tf
    store.begin(ids)
    wide = tf.reduce_sum(store.rows("wide", ids), axis=[1, 2])[:, None]
    wide += tf.matmul(dense, store.var("lin/w")) + store.var("lin/b")
    e = tf.reshape(store.rows("deep", ids), [-1, FIELDS * EMB])
    h = tf.nn.relu(tf.matmul(tf.concat([e, dense], 1), store.var("h1/w")) + store.var("h1/b"))
    h = tf.nn.relu(tf.matmul(h, store.var("h2/w")) + store.var("h2/b"))
    return wide + tf.matmul(h, store.var("out/w")) + store.var("out/b")


def loss_of(logits, label):
    import tensorflow as tf
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))


class VariableStore:
    """Plain tf.Variables (local, or placed on PS tasks by a strategy) with Adagrad."""

    def __init__(self):
        import numpy as np
        import tensorflow as tf
        self.v, self.acc = {}, {}
        for name in SHAPES:
            self.v[name] = tf.Variable(initial_dense(name), name=name.replace("/", "_"))
        for name, dim in TABLES.items():
            init = np.random.default_rng(7 + dim).uniform(-0.05, 0.05, (FIELDS * VOCAB, dim)).astype(np.float32)
            self.v[name] = tf.Variable(init, name=name)
        for name, var in self.v.items():
            self.acc[name] = tf.Variable(tf.fill(var.shape, INIT_ACC), name=name.replace("/", "_") + "_acc")

    def begin(self, ids):
        pass

    def var(self, name):
        return self.v[name]

    def rows(self, name, ids):
        import tensorflow as tf
        return tf.nn.embedding_lookup(self.v[name], ids)

    def apply(self, grads):
        """TensorFlow's Adagrad: acc += g^2; var -= lr * g / sqrt(acc)."""
        import tensorflow as tf
        names = list(self.v)
        for name, g in zip(names, grads):
            var, acc = self.v[name], self.acc[name]
            if isinstance(g, tf.IndexedSlices):
                idx, pos = tf.unique(g.indices)
                vals = tf.math.unsorted_segment_sum(g.values, pos, tf.shape(idx)[0])
                acc.scatter_add(tf.IndexedSlices(vals * vals, idx))
                step = LR * vals / tf.sqrt(tf.gather(acc, idx))
                var.scatter_sub(tf.IndexedSlices(step, idx))
            else:
                acc.assign_add(g * g)
                var.assign_sub(LR * g / tf.sqrt(acc))

    def variables(self):
        return [self.v[n] for n in self.v]


def evaluate(store):
    import tensorflow as tf
    ids, dense, label, _ = make_batch(TEST_SEED, 20000)
    logits = forward(store, tf.constant(ids), tf.constant(dense))
    return auc(label, tf.sigmoid(logits).numpy())


# ---- the same model in Keras, trained with model.fit ----------------------------

# PSDense / keras.layers.Dense name -> (inputs, units).
KERAS_DENSE = {"lin": (DENSE, 1), "h1": (FIELDS * EMB + DENSE, H1), "h2": (H1, H2), "out": (H2, 1)}


def keras_model(on_ps):
    """The wide-and-deep model as a keras.Model, compiled: its tables and dense
    layers are fusewire_tf.Embedding / PSDense (on_ps: values on the PS, which
    applies the model spec's Adagrad) or Keras's own layers with Keras's Adagrad."""
    import keras
    import tensorflow as tf
    import fusewire_tf as fw
    from fusewire_tf.keras import PullGroup
    group = PullGroup()  # a step's dense pulls (and the wide rows) in one request per PS

    def table(name, dim):
        if on_ps:
            return fw.Embedding(name, dim, group=group, name=name)
        return keras.layers.Embedding(FIELDS * VOCAB, dim, name=name, embeddings_initializer=keras.initializers
                                      .RandomUniform(-0.05, 0.05, seed=7 + dim))

    def dense(name, activation=None):
        units = KERAS_DENSE[name][1]
        if on_ps:
            return fw.PSDense(name, units, activation=activation, group=group, name=name)
        return keras.layers.Dense(units, activation=activation, name=name,
                                  kernel_initializer=keras.initializers.GlorotUniform(seed=len(name)))

    class WideAndDeep(keras.Model):
        def __init__(self):
            super().__init__()
            self.wide, self.deep = table("wide", 1), table("deep", EMB)
            self.lin, self.h1, self.h2, self.out = dense("lin"), dense("h1", "relu"), dense("h2", "relu"), dense("out")

        def call(self, inputs):
            ids, x = inputs
            wide = tf.reduce_sum(self.wide(ids), axis=[1, 2])[:, None] + self.lin(x)
            e = tf.reshape(self.deep(ids), [-1, FIELDS * EMB])
            return wide + self.out(self.h2(self.h1(tf.concat([e, x], 1))))

    m = WideAndDeep()
    # On the PS the Keras optimizer sees only the layers' zero triggers.
    opt = "sgd" if on_ps else keras.optimizers.Adagrad(LR, initial_accumulator_value=INIT_ACC)
    m.compile(optimizer=opt, loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return m


def keras_data(seeds, n):
    """The batches of `seeds` (n rows each) as fit's arrays: ([ids, dense], label)."""
    import numpy as np
    parts = [make_batch(s, n) for s in seeds]
    return [np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])], np.concatenate(
        [p[2] for p in parts])


def keras_fit(model, seeds, a, group=1):
    """model.fit over the batches of `seeds`, one epoch, in order, `group`
    batches a step: (seconds, steps)."""
    x, y = keras_data(seeds, a.batch)
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=a.batch * group, epochs=1, shuffle=False, verbose=0)
    return time.perf_counter() - t0, len(seeds) // group


def keras_auc(model):
    ids, dense, label, _ = make_batch(TEST_SEED, 20000)
    return auc(label, model.predict([ids, dense], batch_size=5000, verbose=0))


# ---- local -----------------------------------------------------------------------------


def run_local(a, group=1):
    import tensorflow as tf
    if a.api == "keras":
        seeds = [batch_seed(s % a.workers, s) for s in range(a.steps)]
        dt, n = keras_fit(model := keras_model(False), seeds, a, group)
        return {"samples_per_s": n * a.batch * group / dt, "ms_per_step": 1000 * dt / n, "auc": keras_auc(model)}
    store = VariableStore()

    @tf.function
    def step(ids, dense, label):
        with tf.GradientTape() as tape:
            loss = loss_of(forward(store, ids, dense), label)
        store.apply(tape.gradient(loss, store.variables()))
        return loss

    def data(s):  # step s: batches s * group ... (s + 1) * group - 1, concatenated
        import numpy as np
        parts = [make_batch(batch_seed(i % a.workers, i), a.batch)[:3] for i in range(s * group, (s + 1) * group)]
        return [tf.constant(np.concatenate([p[k] for p in parts])) for k in range(3)]

    total = a.steps // group
    step(*data(0))
    t0 = time.perf_counter()
    for s in range(1, total):
        step(*data(s))
    dt = time.perf_counter() - t0
    return {"samples_per_s": (total - 1) * a.batch * group / dt, "ms_per_step": 1000 * dt / (total - 1),
            "auc": evaluate(store)}


# ---- fusewire ------------------------------------------------------------------------------


def fusewire_model(api="tape"):
    """The PS model spec: SHAPES' dense variables (api "tape"), or the Keras
    model's PSDense kernels and biases (api "keras"), plus TABLES."""
    variables = []
    if api == "keras":
        from fusewire_tf.keras import dense_spec
        for name, (n_in, units) in KERAS_DENSE.items():
            limit = (6.0 / (n_in + units)) ** 0.5
            variables += dense_spec(name, n_in, units, init={"type": "uniform", "a": -limit, "b": limit, "seed": 1})
    else:
        for name, shape in SHAPES.items():
            v = {"name": name, "kind": "dense", "shape": shape}
            if not name.endswith("/b"):
                limit = glorot_limit(name)
                v["init"] = {"type": "uniform", "a": -limit, "b": limit, "seed": 1}
            variables.append(v)
    for name, dim in TABLES.items():
        variables.append({"name": name, "kind": "embedding", "dim": dim, "num_ids": FIELDS * VOCAB,
                          "init": {"type": "uniform", "a": -0.05, "b": 0.05, "seed": 2}})
    return {"variables": variables, "optimizer": {"kind": "adagrad", "learning_rate": LR,
                                                   "initial_accumulator": INIT_ACC, "epsilon": 0.0}}


class FusewireStore:
    """Variables on fusewire's PS: pulled in the forward pass, their gradients
    pushed by the ops' registered gradients. fused: the whole step's pulls in
    one op (one request per PS, and one push request per PS); else one op per
    variable."""

    def __init__(self, trigger, fused):
        self.t, self.fused, self.cache = trigger, fused, None

    def begin(self, ids):
        import fusewire_tf as fw
        if self.fused:
            dense, rows = fw.pull_many([(n, s) for n, s in SHAPES.items()],
                                       [(n, ids, d) for n, d in TABLES.items()], trigger=self.t)
            self.cache = dict(zip(list(SHAPES) + list(TABLES), dense + rows))

    def var(self, name):
        import fusewire_tf as fw
        if self.cache is not None:
            return self.cache[name]
        return fw.pull(name, SHAPES[name], trigger=self.t)

    def rows(self, name, ids):
        import fusewire_tf as fw
        if self.cache is not None:
            return self.cache[name]
        return fw.pull_rows(name, ids, TABLES[name], trigger=self.t)


def fusewire_worker(a):
    import tensorflow as tf
    import fusewire_tf as fw
    fw.configure("worker:%d" % a.task, a.cluster, model=fusewire_model(a.api), mode=a.mode, step_timeout_ms=60000)
    if a.api == "keras":
        return fusewire_keras_worker(a)
    trigger = tf.Variable(0.0)
    store = FusewireStore(trigger, not a.unfused)
    fw.barrier()

    @tf.function
    def step(ids, dense, label):
        with tf.GradientTape() as tape:
            loss = loss_of(forward(store, ids, dense), label)
        return loss + tape.gradient(loss, trigger)

    steps = a.steps // a.workers
    step(*map(tf.constant, make_batch(batch_seed(a.task, 0), a.batch)[:3]))
    fw.barrier()
    t0 = time.perf_counter()
    for s in range(1, steps):
        ids, dense, label, _ = make_batch(batch_seed(a.task, s * a.workers + a.task), a.batch)
        step(tf.constant(ids), tf.constant(dense), tf.constant(label))
    dt = time.perf_counter() - t0
    fw.barrier()
    out = {"samples_per_s": (steps - 1) * a.batch / dt, "ms_per_step": 1000 * dt / (steps - 1)}
    if a.task == 0:
        out["auc"] = evaluate(store)
        fw.shutdown_ps()
    print("RESULT " + json.dumps(out), flush=True)


def fusewire_keras_worker(a):
    import fusewire_tf as fw
    model = keras_model(True)
    fw.barrier()
    steps = a.steps // a.workers
    dt, n = keras_fit(model, [batch_seed(a.task, s * a.workers + a.task) for s in range(steps)], a)
    fw.barrier()
    out = {"samples_per_s": n * a.batch / dt, "ms_per_step": 1000 * dt / n}
    if a.task == 0:
        out["auc"] = keras_auc(model)
        fw.shutdown_ps()
    print("RESULT " + json.dumps(out), flush=True)


def run_local_sync(a):
    """What synchronous training computes: each step the mean gradient of one
    batch per worker, i.e. one step on their concatenation."""
    return run_local(a, group=a.workers)


def run_fusewire_sync(a):
    a.mode = "sync"
    try:
        return run_fusewire(a)
    finally:
        a.mode = "async"


def run_fusewire(a):
    ports = _free_ports(a.ps + a.workers)
    cluster = "ps=%s;worker=%s" % (",".join("127.0.0.1:%d" % p for p in ports[:a.ps]),
                                   ",".join("127.0.0.1:%d" % p for p in ports[a.ps:]))
    model_file = os.path.join(a.tmp, "model.json")
    with open(model_file, "w") as f:
        json.dump(fusewire_model(a.api), f)
    serve = os.path.join(ROOT, "python", "fusewire_tf", "serve.py")
    procs = [subprocess.Popen([sys.executable, serve, "--task", "ps:%d" % i, "--cluster", cluster,
                               "--model", model_file, "--mode", a.mode]) for i in range(a.ps)]
    workers = [subprocess.Popen([sys.executable, __file__, "--role", "fusewire-worker", "--task", str(i),
                                 "--cluster", cluster] + _common_args(a), stdout=subprocess.PIPE, text=True)
               for i in range(a.workers)]
    try:
        return _collect(workers, procs)
    finally:  # a failed worker leaves the PS tasks waiting: end them
        for p in procs + workers:
            if p.poll() is None:
                p.kill()
                p.wait()


# ---- TensorFlow ParameterServerStrategy (gRPC) --------------------------------------------------


def tf_server(a):
    import tensorflow as tf
    spec = json.loads(a.cluster)
    job, _ = a.role.split("-")[1], None
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=a.task, protocol="grpc",
                                  start=True)
    server.join()


def tf_coordinator(a):
    import tensorflow as tf
    spec = json.loads(a.cluster)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        store = VariableStore()

    @tf.function
    def step(ids, dense, label):
        def replica(ids, dense, label):
            with tf.GradientTape() as tape:
                loss = loss_of(forward(store, ids, dense), label)
            store.apply(tape.gradient(loss, store.variables()))
            return loss
        return strategy.run(replica, args=(ids, dense, label))

    batches = [make_batch(batch_seed(s % a.workers, s), a.batch)[:3] for s in range(a.steps)]
    coordinator.schedule(step, args=tuple(map(tf.constant, batches[0])))
    coordinator.join()
    t0 = time.perf_counter()
    for s in range(1, a.steps):
        coordinator.schedule(step, args=tuple(map(tf.constant, batches[s])))
    coordinator.join()
    dt = time.perf_counter() - t0
    # Per-worker time per step: the workers run steps in parallel.
    out = {"samples_per_s": (a.steps - 1) * a.batch / dt, "ms_per_step": 1000 * dt * a.workers / (a.steps - 1)}
    with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
        out["auc"] = evaluate(store)
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # the coordinator's threads never end on their own


def run_tf(a):
    ports = _free_ports(a.ps + a.workers + 1)
    spec = {"ps": ["127.0.0.1:%d" % p for p in ports[:a.ps]],
            "worker": ["127.0.0.1:%d" % p for p in ports[a.ps:a.ps + a.workers]],
            "chief": ["127.0.0.1:%d" % ports[-1]]}
    cluster = json.dumps(spec)
    servers = [subprocess.Popen([sys.executable, __file__, "--role", "tf-%s" % job, "--task", str(i),
                                 "--cluster", cluster] + _common_args(a))
               for job in ("ps", "worker") for i in range(len(spec[job]))]
    chief = subprocess.Popen([sys.executable, __file__, "--role", "tf-chief", "--cluster", cluster]
                             + _common_args(a), stdout=subprocess.PIPE, text=True)
    try:
        return _collect([chief], [])
    finally:
        for p in servers:
            p.kill()
            p.wait()


# ---- plumbing ----------------------------------------------------------------------------------


def _free_ports(n):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _common_args(a):
    return (["--ps", str(a.ps), "--workers", str(a.workers), "--steps", str(a.steps), "--batch", str(a.batch)]
            + ["--api", a.api, "--mode", a.mode] + (["--unfused"] if a.unfused else []))


def _collect(workers, others, timeout=900):
    results = []
    deadline = time.time() + timeout
    for p in workers:
        out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        if p.returncode != 0:
            raise SystemExit("a worker failed (exit %s)" % p.returncode)
        results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    for p in others:
        p.wait(timeout=max(1, deadline - time.time()))
    merged = {"samples_per_s": sum(r["samples_per_s"] for r in results),
              "ms_per_step": sum(r["ms_per_step"] for r in results) / len(results)}
    merged["auc"] = next(r["auc"] for r in results if "auc" in r)
    return merged


def main():
    p = argparse.ArgumentParser(description="wide-and-deep CTR: local vs fusewire vs TensorFlow gRPC PS")
    p.add_argument("--runs", default="local,fusewire,tf-grpc")
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=600, help="steps in all (split over the workers)")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--unfused", action="store_true",
                   help="fusewire: one pull op per variable instead of one per step")
    p.add_argument("--api", default="tape", choices=["tape", "keras"],
                   help="tape: a GradientTape step with pull_many; keras: a keras.Model (fusewire_tf.Embedding and "
                   "PSDense on the PS) trained with model.fit")
    p.add_argument("--mode", default="async", choices=["async", "sync"], help=argparse.SUPPRESS)
    p.add_argument("--check-auc", type=float, default=None,
                   help="exit 1 unless each multi-process run's AUC is within this of its one-process reference")
    p.add_argument("--role", default=None, help=argparse.SUPPRESS)
    p.add_argument("--task", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if a.role == "fusewire-worker":
        return fusewire_worker(a)
    if a.role in ("tf-ps", "tf-worker"):
        return tf_server(a)
    if a.role == "tf-chief":
        return tf_coordinator(a)

    import tempfile
    a.tmp = tempfile.mkdtemp(prefix="fusewire-ctr-")
    _, _, label, p_true = make_batch(TEST_SEED, 20000)
    print("wide-and-deep CTR (%s): %d PS, %d workers, %d steps of %d, ground-truth AUC %.4f"
          % (a.api, a.ps, a.workers, a.steps, a.batch, auc(label, p_true)))
    if a.api == "keras" and "tf-grpc" in a.runs.split(","):
        p.error("--api keras has no tf-grpc run")
    runners = {"local": run_local, "fusewire": run_fusewire, "fusewire-sync": run_fusewire_sync,
               "local-sync": run_local_sync, "tf-grpc": run_tf}
    results = {}
    for name in a.runs.split(","):
        t0 = time.time()
        results[name] = runners[name](a)
        r = results[name]
        print("%-9s %10.0f samples/s %8.2f ms/step  AUC %.4f  (%.0f s)"
              % (name, r["samples_per_s"], r["ms_per_step"], r["auc"], time.time() - t0), flush=True)
    if "fusewire" in results and "tf-grpc" in results:
        print("fusewire / tf-grpc samples/s: %.2fx" % (results["fusewire"]["samples_per_s"]
                                                     / results["tf-grpc"]["samples_per_s"]))
    if a.check_auc is not None:
        # Each multi-process run against its one-process reference (when it ran).
        refs = {"fusewire": "local", "tf-grpc": "local", "fusewire-sync": "local-sync"}
        bad = ["%s %.4f vs %s %.4f" % (n, results[n]["auc"], ref, results[ref]["auc"])
               for n, ref in refs.items() if n in results and ref in results
               and abs(results[ref]["auc"] - results[n]["auc"]) > a.check_auc]
        if bad:
            print("AUC off by more than %g: %s" % (a.check_auc, "; ".join(bad)))
            sys.exit(1)


if __name__ == "__main__":
    main()
