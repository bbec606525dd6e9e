"""Builds fusewire_tf with its op library compiled against the installed
TensorFlow. Install with the TensorFlow it is for:

    pip install --no-build-isolation ./python

$CXX picks the compiler (default g++, through ccache when installed);
$FUSEWIRE_INCLUDE the fusewire headers (default: this clone's include/).
"""

import os
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fusewire_tf", "cc", "fusewire_tf_ops.cc")


class build_with_ops(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, os.path.join(HERE, "fusewire_tf"))
        import tf_flags  # imports tensorflow

        include = os.environ.get("FUSEWIRE_INCLUDE", os.path.join(HERE, "..", "include"))
        if not os.path.exists(os.path.join(include, "fusewire", "fusewire.hpp")):
            sys.exit("fusewire_tf: fusewire headers not found in %s (set FUSEWIRE_INCLUDE)" % include)
        cxx = shlex.split(os.environ.get("CXX", "g++"))
        if shutil.which("ccache") and os.path.basename(cxx[0]) != "ccache":
            cxx = ["ccache"] + cxx
        out = os.path.join(self.build_lib, "fusewire_tf", "_fusewire_tf_ops.so")
        obj = os.path.join(self.build_lib, "fusewire_tf_ops.o")
        # Compile and link apart: ccache caches compiles only.
        compile_cmd = (cxx + ["-std=c++20", "-O2", "-DNDEBUG", "-fPIC", "-I" + include]
                       + tf_flags.compile_flags() + ["-c", SOURCE, "-o", obj])
        link_cmd = cxx[-1:] + ["-shared", obj, "-o", out] + tf_flags.link_flags()
        for cmd in (compile_cmd, link_cmd):
            print(" ".join(cmd))
            subprocess.check_call(cmd)
        os.remove(obj)


setup(
    packages=["fusewire_tf"],
    package_data={"fusewire_tf": ["cc/*.cc", "tf_flags.py"]},
    cmdclass={"build_py": build_with_ops},
)
