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
    for name in ("fusewire_tf_transport", "fusewire_tf_available_transports"):
        getattr(lib, name).argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return lib


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = load()
    return _lib


# The absl status codes the C interface returns, by number.
_CODES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(RuntimeError):
    """A call into the op library failed; `code` is its absl status code
    ("UNAVAILABLE", "INTERNAL", ...)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class InvalidArgumentError(Error, ValueError):
    """A bad argument: a transport this build or machine cannot run, a bad
    model, mode, timeout, task or cluster. The message names what is allowed."""


def call(name, *args):
    err = ctypes.create_string_buffer(4096)
    rc = getattr(lib(), name)(*args, err, len(err))
    if rc != 0:
        code = _CODES.get(rc, "UNKNOWN")
        cls = InvalidArgumentError if code == "INVALID_ARGUMENT" else Error
        raise cls("fusewire_tf: " + err.value.decode(errors="replace"), code)


def _text(name):
    out = ctypes.create_string_buffer(256)
    call(name, out, len(out))
    return out.value.decode()


def transport():
    """The transport of this process's configuration, one of the names
    available_transports() lists (what "auto" chose, or the name given);
    None before configure()."""
    return _text("fusewire_tf_transport") or None


def available_transports():
    """The transports this build and machine can run, as configure() and
    serve_ps() name them ("auto" picks among these)."""
    return [n for n in _text("fusewire_tf_available_transports").split(",") if n]


def config(task, cluster, model=None, mode="async", **extra):
    c = {"task": task, "cluster": cluster, "mode": mode}
    if model is not None:
        c["model"] = model
    c.update(extra)
    return json.dumps(c).encode()


def serve_ps(task, cluster, model, mode="async", worker_job="worker", transport="auto"):
    """Serves as PS task `task` ("ps:0") until a worker calls shutdown_ps()
    or stop_serving() is called. Blocks (without holding the GIL).
    `transport` as configure()'s: the workers must reach it, so give the PS
    and the workers the same one."""
    call("fusewire_tf_serve", config(task, cluster, model, mode, worker_job=worker_job, transport=transport))


def stop_serving():
    """Makes a running serve_ps() in this process return."""
    lib().fusewire_tf_stop_serving()
