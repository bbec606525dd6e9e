"""Conan test package for fusewire: builds tests/package/cmake (the CMake
consumer of tests/package/run.sh) against the package Conan just created.

    conan create . --test-folder=tests/package/conan
"""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class FusewireTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        with_uring = self.dependencies["fusewire"].options.get_safe("with_uring")
        cmake = CMake(self)
        cmake.configure(build_script_folder=os.path.join(os.pardir, "cmake"),
                        variables={"FUSEWIRE_COMPONENTS": "uring" if with_uring else ""})
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "consumer"), env="conanrun")
