"""The op library's C interface through ctypes, without importing
TensorFlow: a PS process (serve.py) needs nothing else. The library itself
links libtensorflow_framework, which it finds through its rpath."""

import ctypes
import json
import os


def ops_path():
    """Where the op library is loaded from: $FUSEWIRE_TF_OPS, else beside this file."""
    env = os.environ.get("FUSEWIRE_TF_OPS")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fusewire_tf_ops.so")


def load():
    path = ops_path()
    if not os.path.exists(path):
        raise ImportError(
            "fusewire_tf: op library %s not found; build it (meson -Dtensorflow=enabled, "
            "or pip install --no-build-isolation python/) or set FUSEWIRE_TF_OPS" % path)
    lib = ctypes.CDLL(path)
    lib.fusewire_tf_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.fusewire_tf_serve.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.fusewire_tf_shutdown_ps.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.fusewire_tf_barrier.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    return lib


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = load()
    return _lib


def call(name, *args):
    err = ctypes.create_string_buffer(4096)
    if getattr(lib(), name)(*args, err, len(err)) != 0:
        raise RuntimeError("fusewire_tf: " + err.value.decode(errors="replace"))


def config(task, cluster, model=None, mode="async", **extra):
    c = {"task": task, "cluster": cluster, "mode": mode}
    if model is not None:
        c["model"] = model
    c.update(extra)
    return json.dumps(c).encode()


def serve_ps(task, cluster, model, mode="async", worker_job="worker"):
    """Serves as PS task `task` ("ps:0") until a worker calls shutdown_ps()
    or stop_serving() is called. Blocks (without holding the GIL)."""
    call("fusewire_tf_serve", config(task, cluster, model, mode, worker_job=worker_job))


def stop_serving():
    """Makes a running serve_ps() in this process return."""
    lib().fusewire_tf_stop_serving()
