"""One side of the two-process rendezvous test (run by test_rendezvous.py).

    rendezvous_peer.py send|recv CLUSTER

worker:0 sends, worker:1 receives, on the default transport ("auto": shm,
both tasks being on this host). Every supported dtype in every size class
(empty, scalar, small of rank 8, above the coalescing threshold, above the
chunk size) goes twice — once with the recvs already posted, once with the
tensors sent before any recv — plus dead tensors. The receiver compares every
byte with what the sender generated from the same seed and exits 1 on any
difference.
"""

import sys
import time

import common  # noqa: F401  (puts python/ on sys.path)
import numpy as np
import tensorflow as tf

import fusewire_tf as fw

SHAPES = {
    "empty": [0],
    "scalar": [],
    "rank8": [1, 2, 1, 3, 1, 2, 1, 2],
    "medium": [25000],           # 25000 elements: above the 8 KiB coalescing threshold
    "large": [5 * 1024 * 1024],  # 5 Mi elements: several 4 MiB chunks
}


def cases():
    for i, dt in enumerate(fw.SUPPORTED_DTYPES):
        for j, (size, shape) in enumerate(SHAPES.items()):
            if size == "large" and dt.size > 1:
                shape = [5 * 1024 * 1024 // dt.size]  # ~5 MiB whatever the element size
            yield dt, size, shape, i * 100 + j


def make(dt, shape, seed):
    """A tensor of random bytes (0/1 for bool) of `dt` and `shape`."""
    n = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(seed)
    if dt == tf.bool:
        return tf.reshape(tf.constant(rng.integers(0, 2, n, dtype=np.uint8) != 0), shape)
    raw = rng.integers(0, 256, n * dt.size, dtype=np.uint8)
    flat = tf.bitcast(tf.reshape(tf.constant(raw), [n, dt.size]), dt) if dt.size > 1 else tf.bitcast(
        tf.constant(raw), dt)
    return tf.reshape(flat, shape)


def as_bytes(t):
    if t.dtype == tf.bool:
        return tf.cast(t, tf.uint8).numpy().tobytes()
    if t.dtype.size == 1:
        return tf.bitcast(t, tf.uint8).numpy().tobytes()
    return tf.bitcast(t, tf.uint8).numpy().tobytes()


def name(phase, dt, size):
    return "%s/%s/%s" % (phase, dt.name, size)


DEAD = [tf.float32, tf.int64, tf.bool, tf.complex128]


def sender():
    def send_phase(phase):
        ops = []
        for dt, size, shape, seed in cases():
            ops.append(fw.send(make(dt, shape, seed), common.key(0, 1, name(phase, dt, size))))
        for dt in DEAD:
            ops.append(fw.send(tf.zeros([2], dt), common.key(0, 1, "%s/dead/%s" % (phase, dt.name)), is_dead=True))
        return ops

    time.sleep(2.0)  # the receiver's phase-1 recvs are posted by now (it imports TF at the same time)
    send_phase("recv_first")
    send_phase("send_first")
    ack, dead = fw.recv(common.key(1, 0, "ack"), tf.int32, timeout_ms=120000)
    assert int(ack) == 1 and not bool(dead)


def receiver():
    def recv_phase(phase):
        @tf.function
        def all_recvs():
            out = []
            for dt, size, _, _ in cases():
                out.append(fw.recv(common.key(0, 1, name(phase, dt, size)), dt, timeout_ms=120000))
            for dt in DEAD:
                out.append(fw.recv(common.key(0, 1, "%s/dead/%s" % (phase, dt.name)), dt, timeout_ms=120000))
            return out

        got = all_recvs()
        bad = 0
        for (dt, size, shape, seed), (t, dead) in zip(cases(), got):
            want = make(dt, shape, seed)
            if bool(dead) or t.dtype != dt or t.shape.as_list() != list(shape) or as_bytes(t) != as_bytes(want):
                print("MISMATCH %s %s: dead=%s shape=%s" % (phase, name(phase, dt, size), bool(dead), t.shape))
                bad += 1
        for dt, (t, dead) in zip(DEAD, got[-len(DEAD):]):
            if not bool(dead) or t.dtype != dt or t.shape.num_elements() != 0:
                print("MISMATCH %s dead %s: dead=%s shape=%s" % (phase, dt.name, bool(dead), t.shape))
                bad += 1
        return bad

    bad = recv_phase("recv_first")
    time.sleep(1.0)  # every phase-2 tensor is sent (or on its way) before its recv
    bad += recv_phase("send_first")
    fw.send(tf.constant(1, tf.int32), common.key(1, 0, "ack"))
    n = 2 * (len(list(cases())) + len(DEAD))
    print("received %d tensors, %d mismatches" % (n, bad))
    return bad


def main():
    role, cluster = sys.argv[1], sys.argv[2]
    fw.configure("worker:0" if role == "send" else "worker:1", cluster)
    print("%s: transport %s" % (role, fw.transport()))
    if "shm" in fw.available_transports() and fw.transport() != "shm":
        print("%s: transport auto chose %s, not shm, for a cluster on this host" % (role, fw.transport()))
        sys.exit(1)
    if role == "send":
        sender()
        rc = 0
    else:
        rc = 1 if receiver() else 0
    fw.reset()
    sys.exit(rc)


if __name__ == "__main__":
    main()
