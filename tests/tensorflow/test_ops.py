"""Op unit tests (tf.test): one process is both a PS (serve_ps on a thread)
and worker:0, on the default transport ("auto": shm, every task being on
this host); TransportTest runs a PS and a worker on named transports."""

import re
import threading
import time

import common
import keras
import numpy as np
import tensorflow as tf

import fusewire_tf as fw
from fusewire_tf.keras import dense_spec

CLUSTER = common.cluster(1, 2)  # worker:1 never starts: recvs from it wait
MODEL = {
    "variables": [
        {"name": "w", "kind": "dense", "shape": [2, 3], "init": {"type": "constant", "a": 1.0}},
        {"name": "emb", "kind": "embedding", "dim": 4, "init": {"type": "constant", "a": 0.5}},
        {"name": "kemb", "kind": "embedding", "dim": 2, "init": {"type": "uniform", "a": -0.1, "b": 0.1, "seed": 3}},
    ] + dense_spec("dense", 2, 1, init={"type": "constant", "a": 0.1}),
    "optimizer": {"kind": "sgd", "learning_rate": 0.1},
}
_server = None


def setUpModule():
    global _server
    _server = threading.Thread(target=fw.serve_ps, args=("ps:0", CLUSTER, MODEL))
    _server.start()
    fw.configure("worker:0", CLUSTER, model=MODEL, step_timeout_ms=20000)


def tearDownModule():
    fw.configure("worker:0", CLUSTER, model=MODEL)
    fw.shutdown_ps()
    _server.join(30)
    fw.reset()


class PsOpsTest(tf.test.TestCase):
    def test_dense_pull_push(self):
        self.assertAllClose(fw.pull("w", [2, 3]), np.ones([2, 3]))
        fw.push("w", tf.ones([2, 3]))
        self.assertAllClose(fw.pull("w", [2, 3]), np.full([2, 3], 0.9))
        fw.push("w", -tf.ones([2, 3]))  # back to 1 for the other tests

    def test_rows_pull_push(self):
        rows = fw.pull_rows("emb", tf.constant([[10, 11], [12, 10]]), 4)
        self.assertEqual(rows.shape, [2, 2, 4])
        self.assertAllClose(rows, np.full([2, 2, 4], 0.5))
        # A repeated id's gradients are summed.
        fw.push_rows("emb", tf.constant([10, 10, 11]), tf.ones([3, 4]))
        self.assertAllClose(fw.pull_rows("emb", tf.constant([10, 11, 12]), 4),
                            [[0.3] * 4, [0.4] * 4, [0.5] * 4])

    def test_gradient_pushes_rows_eager_and_function(self):
        trig = tf.Variable(0.0)
        ids = tf.constant([20, 21])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fw.pull_rows("emb", ids, 4, trigger=trig))
        self.assertAllClose(tape.gradient(loss, trig), 0.0)
        self.assertAllClose(fw.pull_rows("emb", ids, 4), np.full([2, 4], 0.4))

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(fw.pull_rows("emb", ids, 4, trigger=trig))
            return tape.gradient(loss, trig)

        step()
        self.assertAllClose(fw.pull_rows("emb", ids, 4), np.full([2, 4], 0.3))

    def test_dense_gradient(self):
        trig = tf.Variable(0.0)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fw.pull("w", [2, 3], trigger=trig))
        tape.gradient(loss, trig)
        self.assertAllClose(fw.pull("w", [2, 3]), np.full([2, 3], 0.9))
        fw.push("w", -tf.ones([2, 3]))

    def test_pull_many_and_its_gradient(self):
        trig = tf.Variable(0.0)
        ids = tf.constant([[30, 31], [30, 32]])
        with tf.GradientTape() as tape:
            (w,), (rows,) = fw.pull_many([("w", [2, 3])], [("emb", ids, 4)], trigger=trig)
            self.assertEqual(rows.shape, [2, 2, 4])
            self.assertAllClose(w, np.ones([2, 3]))
            self.assertAllClose(rows, np.full([2, 2, 4], 0.5))
            loss = tf.reduce_sum(rows)  # w unused: no push for it
        tape.gradient(loss, trig)
        self.assertAllClose(fw.pull("w", [2, 3]), np.ones([2, 3]))
        # id 30 twice: its two gradients are summed.
        self.assertAllClose(fw.pull_rows("emb", tf.constant([30, 31, 32]), 4),
                            [[0.3] * 4, [0.4] * 4, [0.4] * 4])

    def test_keras_fit_trains_ps_variables(self):
        before = fw.pull_rows("kemb", tf.constant([1, 2, 3]), 2).numpy()
        ids = keras.Input(shape=(1,), dtype="int64")
        h = keras.layers.Flatten()(fw.Embedding("kemb", 2)(ids))
        out = fw.PSDense("dense", 1)(h)
        model = keras.Model(ids, out)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        x = np.array([[1], [2], [3]], np.int64)
        y = np.array([[1.0], [1.0], [1.0]], np.float32)
        model.fit(x, y, epochs=2, batch_size=3, verbose=0)
        after = fw.pull_rows("kemb", tf.constant([1, 2, 3]), 2).numpy()
        self.assertFalse(np.allclose(before, after), "model.fit did not change the PS embedding rows")
        self.assertFalse(np.allclose(fw.pull("dense/kernel", [2, 1]), 0.1), "model.fit did not push the kernel")
        for layer in model.layers:  # the triggers only carry the gradient path
            for w in layer.trainable_weights:
                self.assertAllClose(w.numpy(), np.zeros(w.shape))

    def test_pull_group_pulls_a_step_in_one_op(self):
        from fusewire_tf.keras import PullGroup
        group = PullGroup()
        emb, emb2 = fw.Embedding("kemb", 2, group=group), fw.Embedding("emb", 4, group=group)
        dense = fw.PSDense("dense", 1, group=group)
        ids = tf.constant([[1], [2]], tf.int64)

        def forward():
            return dense(tf.reshape(emb(ids), [-1, 2])) + tf.reduce_sum(emb2(ids))

        forward()  # builds the layers (eager: each pulls its own)
        before = fw.pull("dense/kernel", [2, 1]).numpy()
        weights = [emb.trigger, emb2.trigger, dense.trigger]

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(forward())
            return tape.gradient(loss, weights)

        graph = step.get_concrete_function().graph
        types = [op.type for op in graph.get_operations()]
        # kemb's rows with dense/kernel and dense/bias; emb, called second, on its own.
        self.assertEqual(types.count("FusewirePullMany"), 1)
        self.assertEqual(types.count("FusewirePullRows"), 1)
        self.assertEqual(types.count("FusewirePull"), 0)
        self.assertEqual(types.count("FusewirePushMany"), 1)
        step()
        self.assertFalse(np.allclose(fw.pull("dense/kernel", [2, 1]), before), "the group's push did not happen")

    def test_errors_name_what_is_wrong(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "unknown variable 'nope'.*model has: w"):
            fw.pull("nope", [1])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "'emb' is an embedding"):
            fw.pull("emb", [1])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "gradient of 5 values, the variable has 6"):
            fw.push("w", tf.ones([5]))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "3 gradient values for 2 ids of dim 4"):
            fw.push_rows("emb", tf.constant([1, 2]), tf.ones([3]))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "'w' is dense; this op needs an embedding"):
            fw.pull_rows("w", tf.constant([1]), 4)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "unknown variable 'nope'"):
            fw.pull_many([("w", [2, 3])], [("nope", tf.constant([1]), 4)])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "'emb' is an embedding"):
            fw._ops.fusewire_push_many([tf.ones([4])], [], [], dense_vars=["emb"], table_vars=[])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "dense_vars names 2 variables and table_vars 0 tables, for 1 dense"):
            fw._ops.fusewire_push_many([tf.ones([6])], [], [], dense_vars=["w", "w"], table_vars=[])
        # Empty ids pull nothing and push nothing.
        self.assertEqual(fw.pull_rows("emb", tf.zeros([0], tf.int64), 4).shape, [0, 4])
        fw.push_rows("emb", tf.zeros([0], tf.int64), tf.zeros([0, 4]))


class RendezvousOpsTest(tf.test.TestCase):
    def test_every_supported_dtype_is_accepted(self):
        # The kernel is built (and the dtype checked) when the op first runs;
        # an unknown key fails after that check, naming the key.
        for dt in fw.SUPPORTED_DTYPES:
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "bad rendezvous key"):
                fw.recv("x", dt)

    def test_unsupported_dtypes_are_refused(self):
        for dt in (tf.string, tf.qint8, tf.variant, tf.resource):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        "fusewire cannot carry dtype .*supported: float32, float64"):
                fw.recv(common.key(0, 0, "t"), dt)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "cannot carry dtype string"):
            fw.send(tf.constant(["a"]), common.key(0, 1, "t"))

    def test_bad_keys(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "it has 1 part"):
            fw.send(tf.ones([1]), "no-key")
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "iter_id"):
            fw.send(tf.ones([1]), common.key(0, 1, "t", frame="0:x"))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "src device is task worker:1 but this process is worker:0"):
            fw.send(tf.ones([1]), common.key(1, 0, "t"))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "dst device is task worker:1 but this process is worker:0"):
            fw.recv(common.key(0, 1, "t"), tf.float32)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "rank up to 8"):
            fw.send(tf.ones([1] * 9), common.key(0, 1, "t"))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"key must be a scalar string, not of shape \[2\]"):
            fw.recv([common.key(0, 1, "t")] * 2, tf.float32)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"is_dead must be a scalar bool"):
            fw.send(tf.ones([1]), common.key(0, 1, "t"), is_dead=[False, True])

    def test_recv_times_out(self):
        with self.assertRaisesRegex(tf.errors.DeadlineExceededError, "fusewire recv of .* from worker:1"):
            fw.recv(common.key(1, 0, "never"), tf.float32, timeout_ms=300)


class CancelTest(tf.test.TestCase):
    """A recv whose sender never sends ends when TensorFlow cancels its step,
    or at its deadline, with a message naming the key and the peer. Bound: the
    cancel comes after 0.5 s; 15 s leaves room for a loaded machine."""

    def test_cancelled_function_call_fails_the_recv(self):
        from tensorflow.python.eager import cancellation

        @tf.function
        def wait():
            return fw.recv(common.key(1, 0, "never-cancelled"), tf.float32)

        cm = cancellation.CancellationManager()
        call = cm.get_cancelable_function(wait.get_concrete_function())
        timer = threading.Timer(0.5, cm.start_cancel)
        timer.start()
        t0 = time.monotonic()
        with self.assertRaisesRegex(tf.errors.CancelledError,
                                    "fusewire recv of '.*never-cancelled.*' from worker:1: the step was cancelled"):
            call()
        self.assertLess(time.monotonic() - t0, 15)
        timer.join()

    def test_session_timeout_cancels_the_recv(self):
        # The session reports its own DeadlineExceeded ("Timed out waiting for
        # notification"); it returns only once the cancelled recv completed.
        with tf.Graph().as_default():
            value, _ = fw.recv(common.key(1, 0, "never-session"), tf.float32)
            with tf.compat.v1.Session() as sess:
                t0 = time.monotonic()
                with self.assertRaises(tf.errors.DeadlineExceededError):
                    sess.run(value, options=tf.compat.v1.RunOptions(timeout_in_ms=500))
                self.assertLess(time.monotonic() - t0, 15)

    def test_default_deadline_names_key_and_peer(self):
        fw.configure("worker:0", CLUSTER, model=MODEL, rendezvous_timeout_ms=300)
        try:
            t0 = time.monotonic()
            with self.assertRaisesRegex(tf.errors.DeadlineExceededError,
                                        "fusewire recv of '.*never-default.*' from worker:1"):
                fw.recv(common.key(1, 0, "never-default"), tf.float32)
            self.assertLess(time.monotonic() - t0, 15)
        finally:
            fw.configure("worker:0", CLUSTER, model=MODEL)

    def test_bad_timeouts(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"timeout_ms -1: must be >= 0"):
            fw.recv(common.key(1, 0, "t"), tf.float32, timeout_ms=-1)
        try:
            with self.assertRaisesRegex(fw.InvalidArgumentError, "rendezvous_timeout_ms 0: must be > 0"):
                fw.configure("worker:0", CLUSTER, model=MODEL, rendezvous_timeout_ms=0)
        finally:
            fw.configure("worker:0", CLUSTER, model=MODEL)


class ResetTest(tf.test.TestCase):
    def test_reset_fails_a_waiting_recv_and_frees_the_port(self):
        errors = []

        def waiter():
            try:
                fw.recv(common.key(1, 0, "waits"), tf.float32)
            except tf.errors.CancelledError as e:
                errors.append(str(e))

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.5)  # the recv is posted
        fw.reset()
        t.join(20)
        self.assertFalse(t.is_alive(), "reset() left a recv waiting")
        fw.configure("worker:0", CLUSTER, model=MODEL)  # listens on the same port again
        self.assertEqual(len(errors), 1)
        self.assertRegex(errors[0], "fusewire recv of .*waits.* from worker:1: .*cancel")


class NotConfiguredTest(tf.test.TestCase):
    def test_ops_before_configure(self):
        fw.reset()
        try:
            with self.assertRaisesRegex(tf.errors.FailedPreconditionError, "call fusewire_tf.configure"):
                fw.pull("w", [2, 3])
            with self.assertRaisesRegex(tf.errors.FailedPreconditionError, "call fusewire_tf.configure"):
                fw.send(tf.ones([1]), common.key(0, 1, "t"))
        finally:
            fw.configure("worker:0", CLUSTER, model=MODEL)


TRANSPORT_MODEL = {
    "variables": [{"name": "v", "kind": "dense", "shape": [4], "init": {"type": "constant", "a": 1.0}}],
    "optimizer": {"kind": "sgd", "learning_rate": 0.1},
}


class TransportTest(tf.test.TestCase):
    """configure() and serve_ps() run the transport they name; the default,
    "auto", is shm when every task is on this host. On a named transport a PS
    on a thread and worker:0 make a pull/push round trip, and worker:0 sends
    tensors to itself through its endpoint (a real connection to its own
    listener): small, above the coalescing threshold, and chunked."""

    def tearDown(self):
        fw.configure("worker:0", CLUSTER, model=MODEL)

    def run_on(self, name):
        if name not in fw.available_transports():
            self.skipTest("%s is not available here (available: %s)" % (name, fw.available_transports()))
        cluster = common.cluster(1, 1)
        server = threading.Thread(target=fw.serve_ps, args=("ps:0", cluster, TRANSPORT_MODEL),
                                  kwargs={"transport": name}, daemon=True)
        server.start()
        try:
            fw.configure("worker:0", cluster, model=TRANSPORT_MODEL, step_timeout_ms=20000, transport=name)
            self.assertEqual(fw.transport(), name)
            self.assertAllClose(fw.pull("v", [4]), np.ones(4))
            fw.push("v", tf.ones([4]))
            self.assertAllClose(fw.pull("v", [4]), np.full(4, 0.9))
            for n in (3, 100000, 1500000):
                want = tf.random.uniform([n])
                key = common.key(0, 0, "%s/%d" % (name, n))
                fw.send(want, key, timeout_ms=20000)
                got, dead = fw.recv(key, tf.float32, timeout_ms=20000)
                self.assertFalse(bool(dead))
                self.assertAllEqual(got, want)
            fw.shutdown_ps()
            server.join(30)
        finally:
            if server.is_alive():  # the round trip failed: stop every PS of this process
                fw.stop_serving()
                server.join(30)
        self.assertFalse(server.is_alive(), "serve_ps(transport=%r) did not return" % name)

    def test_asio(self):
        self.run_on("asio")

    def test_uring(self):
        self.run_on("uring")

    def test_shm_asio(self):
        self.run_on("shm+asio")

    def test_default_is_auto_shm_on_one_host(self):
        self.assertIn("asio", fw.available_transports())
        if "shm" in fw.available_transports():
            self.assertEqual(fw.transport(), "shm")
        else:
            self.assertIn(fw.transport(), fw.available_transports())

    def test_bad_names_are_refused_naming_the_allowed_ones(self):
        before = fw.transport()
        allowed = re.escape("expected one of auto, " + ", ".join(fw.available_transports()))
        with self.assertRaisesRegex(fw.InvalidArgumentError, "transport 'pigeon': unknown transport; " + allowed) as e:
            fw.configure("worker:0", CLUSTER, model=MODEL, transport="pigeon")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaisesRegex(fw.InvalidArgumentError, "transport 5: must be a string"):
            fw.configure("worker:0", CLUSTER, model=MODEL, transport=5)
        with self.assertRaisesRegex(fw.InvalidArgumentError, "transport 'TCP': unknown transport; " + allowed):
            fw.serve_ps("ps:0", CLUSTER, MODEL, transport="TCP")
        if "verbs" not in fw.available_transports():
            with self.assertRaisesRegex(fw.InvalidArgumentError, "transport 'verbs': .*; " + allowed):
                fw.configure("worker:0", CLUSTER, model=MODEL, transport="verbs")
        # A refused configuration leaves the earlier one running.
        self.assertEqual(fw.transport(), before)
        self.assertAllClose(fw.pull_rows("emb", tf.constant([99]), 4), np.full([1, 4], 0.5))


if __name__ == "__main__":
    tf.test.main()
