"""Conan test package for fusewire: builds tests/package/cmake (the CMake
consumer of tests/package/run.sh) against the package Conan just created,
linking every component the package's options enable, and checks that the
components they disable have no target.

    conan create . --test-folder=tests/package/conan -s compiler.cppstd=20

With `-c user.fusewire:configure_only=True` it only configures the consumer
(the targets are checked; nothing is compiled or run).
"""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout

COMPONENTS = {"uring": "with_uring", "rdma": "with_rdma", "crypto": "with_crypto"}


class FusewireTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def _split(self):
        options = self.dependencies["fusewire"].options
        on = [c for c, option in COMPONENTS.items() if options.get_safe(option)]
        return on, [c for c in COMPONENTS if c not in on]

    def build(self):
        on, off = self._split()
        cmake = CMake(self)
        cmake.configure(build_script_folder=os.path.join(os.pardir, "cmake"),
                        variables={"FUSEWIRE_COMPONENTS": ";".join(on),
                                   "FUSEWIRE_ABSENT_COMPONENTS": ";".join(off)})
        if not self.conf.get("user.fusewire:configure_only", default=False, check_type=bool):
            cmake.build()

    def test(self):
        if self.conf.get("user.fusewire:configure_only", default=False, check_type=bool) or not can_run(self):
            return
        self.run(os.path.join(self.cpp.build.bindir, "consumer"), env="conanrun")
