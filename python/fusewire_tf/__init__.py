"""fusewire inside TensorFlow: parameter-server and rendezvous ops.

    import fusewire_tf as fw
    fw.configure("worker:0", "ps=127.0.0.1:7000;worker=127.0.0.1:7100", model=spec)
    rows = fw.pull_rows("emb", ids, dim=8)        # gradient pushes the rows back
    fw.send(t, key); value, dead = fw.recv(key, tf.float32)

The transport is "auto" unless configure() names one: shm when every task
is on this host, verbs when RDMA is enabled and usable, shm+uring (shm to
this host's tasks, TCP to the others; shm+asio without io_uring) when the
job spans hosts, else uring, else asio.

The op library is ``_fusewire_tf_ops.so`` beside this file (as installed by
setup.py), or the file named by $FUSEWIRE_TF_OPS (the meson build's output).
"""

import tensorflow as tf

__all__ = [
    "configure", "reset", "serve_ps", "stop_serving", "shutdown_ps", "barrier", "transport",
    "available_transports", "Error", "InvalidArgumentError",
    "send", "recv", "pull", "push", "pull_rows", "push_rows", "pull_many", "ops_path",
    "SUPPORTED_DTYPES", "Embedding", "PSDense", "PullGroup",
]

# Every dtype fusewire carries (its dtype numbers are TensorFlow's).
SUPPORTED_DTYPES = (
    tf.float32, tf.float64, tf.int32, tf.uint8, tf.int16, tf.int8, tf.complex64,
    tf.int64, tf.bool, tf.bfloat16, tf.uint16, tf.complex128, tf.float16,
    tf.uint32, tf.uint64,
)


from fusewire_tf import _clib  # noqa: E402
from fusewire_tf._clib import (  # noqa: E402,F401
    Error, InvalidArgumentError, available_transports, ops_path, serve_ps, stop_serving, transport)

_ops = tf.load_op_library(ops_path())
# ctypes opens the same file: dlopen returns the handle TensorFlow already
# holds, so the C interface and the ops share the process-wide runtime.
_lib = _clib.lib()
_call = _clib.call
_config = _clib.config


def configure(task, cluster, model=None, mode="async", step_timeout_ms=30000, rendezvous_timeout_ms=600000,
              transport="auto"):
    """Makes this process task `task` ("worker:0") of `cluster` (a
    "ps=h:p,h:p;worker=h:p" string or a TF_CONFIG-style {"ps": [...], ...}
    dict). With `model` (a dict: {"variables": [...], "optimizer": {...}})
    the PS ops talk to the cluster's "ps" tasks; the rendezvous ops work
    either way. `step_timeout_ms` bounds a PS op's round trip,
    `rendezvous_timeout_ms` (> 0) a send or recv whose timeout_ms is 0.
    `transport` is "auto" (decided from the cluster and this machine),
    or one of the names available_transports() lists; transport() says which one
    runs. Every task of the cluster must reach the others: give them the same
    choice.
    Replaces an earlier configuration (its connections close). A transport
    this build or machine cannot run, or a bad model, mode or
    rendezvous_timeout_ms, is refused (InvalidArgumentError, naming what is
    allowed) before the earlier configuration closes."""
    _call("fusewire_tf_configure", _config(task, cluster, model, mode, step_timeout_ms=step_timeout_ms,
                                           rendezvous_timeout_ms=rendezvous_timeout_ms, transport=transport))


def reset():
    """Drops this process's fusewire runtime (closes its connections)."""
    _lib.fusewire_tf_reset()


def shutdown_ps():
    """Asks every PS task to stop serving (their serve_ps() returns)."""
    _call("fusewire_tf_shutdown_ps")


def barrier(timeout_ms=300000):
    """Waits until every worker called barrier() as often as this one."""
    _call("fusewire_tf_barrier", int(timeout_ms))


# ---- rendezvous -----------------------------------------------------------------

def send(tensor, key, is_dead=False, timeout_ms=0):
    """Sends `tensor` under TensorFlow rendezvous key `key`
    ("src_device;incarnation;dst_device;name;frame:iter") to its dst task.
    Fails with DeadlineExceeded after `timeout_ms` (0: configure()'s
    rendezvous_timeout_ms), with Cancelled when the step is cancelled."""
    return _ops.fusewire_send(tensor, key, is_dead, timeout_ms=timeout_ms)


def recv(key, dtype, timeout_ms=0):
    """Receives what the key's src task sends under `key`: (tensor, is_dead).
    A dead tensor arrives as an empty tensor with is_dead True. Deadline and
    cancellation as send()."""
    return _ops.fusewire_recv(key, dtype=dtype, timeout_ms=timeout_ms)


# ---- parameter server ----------------------------------------------------------------

def _trigger(trigger):
    if trigger is not None:
        return trigger
    return tf.zeros([], tf.float32)


def pull(var, shape, trigger=None):
    """The dense PS variable `var` (of `shape`). Its gradient is pushed to the
    PS; `trigger` (a float scalar the tape watches) puts the pull on the
    gradient path."""
    return _ops.fusewire_pull(_trigger(trigger), var=var, shape=shape)


def push(var, grad):
    """Pushes the gradient of dense `var`."""
    return _ops.fusewire_push(tf.convert_to_tensor(grad, tf.float32), var=var)


def pull_rows(var, ids, dim, trigger=None):
    """Rows `ids` (any shape, int64) of embedding `var`: shape ids.shape + [dim].
    Its gradient pushes the row gradients to the PS."""
    return _ops.fusewire_pull_rows(tf.cast(ids, tf.int64), _trigger(trigger), var=var, dim=dim)


def push_rows(var, ids, grads):
    """Pushes row gradients (ids.size x dim) of embedding `var`."""
    return _ops.fusewire_push_rows(tf.cast(ids, tf.int64), tf.convert_to_tensor(grads, tf.float32), var=var)


def pull_many(dense=(), rows=(), trigger=None):
    """One step's pulls in one request per PS: `dense` is [(var, shape)],
    `rows` is [(var, ids, dim)]. Returns (dense values, row tensors), lists in
    the given orders. Its gradient pushes every gradient in one request per PS."""
    dense, rows = list(dense), list(rows)
    out = _ops.fusewire_pull_many(
        [tf.cast(ids, tf.int64) for _, ids, _ in rows], _trigger(trigger),
        dense_vars=[v for v, _ in dense], dense_shapes=[s for _, s in dense],
        table_vars=[v for v, _, _ in rows], dims=[d for _, _, d in rows], num_dense=len(dense))
    return list(out[0]), list(out[1])


@tf.RegisterGradient("FusewirePullMany")
def _pull_many_grad(op, *grads):
    nd, nt = op.get_attr("num_dense"), op.get_attr("num_tables")
    dense_vars, table_vars, dims = op.get_attr("dense_vars"), op.get_attr("table_vars"), op.get_attr("dims")
    # Only what the loss depends on is pushed (a zero gradient still moves some optimizers).
    dv = [(dense_vars[i], grads[i]) for i in range(nd) if grads[i] is not None]
    rv = [(table_vars[j], tf.reshape(op.inputs[j], [-1]), tf.reshape(grads[nd + j], [-1, dims[j]]))
          for j in range(nt) if grads[nd + j] is not None]
    push_op = _ops.fusewire_push_many([g for _, g in dv], [i for _, i, _ in rv], [g for _, _, g in rv],
                                      dense_vars=[v for v, _ in dv], table_vars=[v for v, _, _ in rv])
    with tf.control_dependencies([push_op]):
        return [None] * nt + [tf.zeros_like(op.inputs[nt])]


@tf.RegisterGradient("FusewirePull")
def _pull_grad(op, grad):
    push_op = _ops.fusewire_push(grad, var=op.get_attr("var"))
    with tf.control_dependencies([push_op]):
        return [tf.zeros_like(op.inputs[0])]


@tf.RegisterGradient("FusewirePullRows")
def _pull_rows_grad(op, grad):
    dim = op.get_attr("dim")
    ids = tf.reshape(op.inputs[0], [-1])
    push_op = _ops.fusewire_push_rows(ids, tf.reshape(grad, [-1, dim]), var=op.get_attr("var"))
    with tf.control_dependencies([push_op]):
        return [None, tf.zeros_like(op.inputs[1])]


from fusewire_tf.keras import Embedding, PSDense, PullGroup  # noqa: E402
