"""Prints the flags to build an op library against the installed TensorFlow,
one a line: compile flags, a line "--", link flags. Used by meson.build and
setup.py. TensorFlow's include directory becomes a system directory (its
headers' warnings are not ours) and its --std=c++17 is dropped (its headers
compile as C++20, which fusewire needs)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402


def compile_flags():
    out = []
    for f in tf.sysconfig.get_compile_flags():
        if f.startswith("--std") or f.startswith("-std"):
            continue
        out.append("-isystem" + f[2:] if f.startswith("-I") else f)
    return out


def link_flags():
    lib = tf.sysconfig.get_lib()
    return tf.sysconfig.get_link_flags() + ["-Wl,-rpath," + lib]


if __name__ == "__main__":
    print("\n".join(compile_flags() + ["--"] + link_flags()))
