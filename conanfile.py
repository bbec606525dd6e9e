"""Conan 2 recipe for fusewire, a header-only C++20 tensor transport.

From the repository root:
    conan create . --test-folder=tests/package/conan -s compiler.cppstd=20 -o "fusewire/*:with_uring=True"

The package holds the headers only. Consumers get them through Conan's
generators (CMakeDeps, PkgConfigDeps) with the same names as an installed
fusewire: CMake `find_package(fusewire)` with targets fusewire::fusewire (core),
fusewire::uring, fusewire::rdma and fusewire::crypto (one per enabled
option), and pkg-config modules fusewire, fusewire-uring, fusewire-rdma,
fusewire-crypto. `fusewire::all` / `fusewire-all` is Conan's aggregate of all
enabled ones.
"""

import os
import re

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0.9"


class FusewireConan(ConanFile):
    name = "fusewire"
    description = ("Header-only C++20 library that moves tensors between parameter servers "
                   "and workers: io_uring, RDMA verbs and Boost.Asio transports")
    license = "Apache-2.0"
    topics = ("distributed-training", "rdma", "io-uring", "tensor", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {
        "with_uring": [True, False],   # fusewire::uring, needs liburing
        "with_rdma": [True, False],    # fusewire::rdma, needs rdma-core (ibverbs + rdmacm)
        "with_crypto": [True, False],  # fusewire::crypto, needs OpenSSL's libcrypto
    }
    default_options = {
        "with_uring": True,
        "with_rdma": False,
        "with_crypto": False,
    }
    exports_sources = "include/*", "LICENSE"
    no_copy_source = True

    def set_version(self):
        # One version for every build system: meson.build's project() is the source.
        if self.version:
            return
        meson_build = load(self, os.path.join(self.recipe_folder, "meson.build"))
        match = re.search(r"project\([^)]*?(?<![\w])version\s*:\s*'([^']+)'", meson_build)
        if not match:
            raise ConanException("fusewire: no version: '...' in meson.build's project()")
        self.version = match.group(1)

    def config_options(self):
        # io_uring and RDMA verbs are Linux interfaces.
        if self.settings.os != "Linux":
            del self.options.with_uring
            del self.options.with_rdma

    def configure(self):
        if self.options.get_safe("with_rdma"):
            # rdma-core builds librdmacm only on request.
            self.options["rdma-core/*"].build_librdmacm = True

    def layout(self):
        basic_layout(self)

    def requirements(self):
        # Public headers include these, so consumers need their headers too.
        self.requires("boost/[>=1.74 <2]", transitive_headers=True)
        self.requires("nlohmann_json/[>=3.9 <4]", transitive_headers=True)
        if self.options.get_safe("with_uring"):
            self.requires("liburing/[>=2.2 <3]", transitive_headers=True, transitive_libs=True)
        if self.options.get_safe("with_rdma"):
            self.requires("rdma-core/[>=44]", transitive_headers=True, transitive_libs=True)
        if self.options.with_crypto:
            self.requires("openssl/[>=3 <4]", transitive_headers=True, transitive_libs=True)

    def package_id(self):
        self.info.clear()

    def validate(self):
        if self.settings.compiler.get_safe("cppstd"):
            check_min_cppstd(self, 20)
        if self.options.get_safe("with_rdma") and not self.dependencies["rdma-core"].options.build_librdmacm:
            raise ConanInvalidConfiguration(
                "fusewire:with_rdma=True needs rdma-core/*:build_librdmacm=True")

    def source(self):
        pass  # the sources are exported with the recipe

    def build(self):
        pass  # header-only

    def package(self):
        copy(self, "LICENSE", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        # Same names as the CMake package and .pc files that `meson install` writes.
        self.cpp_info.set_property("cmake_file_name", "fusewire")
        self.cpp_info.set_property("cmake_target_name", "fusewire::all")
        self.cpp_info.set_property("pkg_config_name", "fusewire-all")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "fusewire::fusewire")
        core.set_property("pkg_config_name", "fusewire")
        core.requires = ["boost::headers", "nlohmann_json::nlohmann_json"]
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]
        core.bindirs = []
        core.libdirs = []

        flavours = {
            "uring": ("with_uring", "FUSEWIRE_HAS_URING=1", ["liburing::liburing"]),
            "rdma": ("with_rdma", "FUSEWIRE_HAS_RDMA=1",
                     ["rdma-core::libibverbs", "rdma-core::librdmacm"]),
            "crypto": ("with_crypto", "FUSEWIRE_HAS_CRYPTO=1", ["openssl::crypto"]),
        }
        for flavour, (option, define, requires) in flavours.items():
            if not self.options.get_safe(option):
                continue
            component = self.cpp_info.components[flavour]
            component.set_property("cmake_target_name", f"fusewire::{flavour}")
            component.set_property("pkg_config_name", f"fusewire-{flavour}")
            component.defines = [define]
            component.requires = ["core"] + requires
            component.bindirs = []
            component.libdirs = []
            component.includedirs = []
