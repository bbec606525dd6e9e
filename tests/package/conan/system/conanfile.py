"""A Conan package that stands for a library the system's package manager
installed (Debian: .ci/deps.sh), so that `conan create` of fusewire's recipe
resolves boost, nlohmann_json, liburing, rdma-core and openssl without a
remote: tests/package/run.sh exports it once per library, named and
versioned as ConanCenter's recipe, into a Conan home of its own:

    conan export tests/package/conan/system --name liburing --version 2.3

It packages nothing. Its cpp_info comes from the library's pkg-config
module(s) as system libraries, with ConanCenter's component names
(boost::headers, rdma-core::libibverbs, openssl::crypto, ...), so the
fusewire recipe's package_info works unchanged.
"""

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.gnu import PkgConfig

# Package name -> {component (None: the package itself): pkg-config module (None: headers only)}.
LIBRARIES = {
    "boost": {"headers": None},
    "nlohmann_json": {None: "nlohmann_json"},
    "liburing": {None: "liburing"},
    "rdma-core": {"libibverbs": "libibverbs", "librdmacm": "librdmacm"},
    "openssl": {"crypto": "libcrypto", "ssl": "libssl"},
}


class SystemLibraryConan(ConanFile):
    description = "A system library, found through pkg-config (test stand-in for a ConanCenter package)"
    license = "the system package's"
    package_type = "shared-library"
    # rdma-core's recipe builds librdmacm only when asked; the system has it.
    options = {"build_librdmacm": [True, False]}
    default_options = {"build_librdmacm": True}

    def config_options(self):
        if self.name != "rdma-core":
            del self.options.build_librdmacm

    def validate(self):
        if self.name not in LIBRARIES:
            raise ConanInvalidConfiguration(
                f"{self.name}: no system mapping (known: {', '.join(sorted(LIBRARIES))})")

    def package_id(self):
        self.info.clear()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.includedirs = []
        self.cpp_info.libdirs = []
        for component, module in LIBRARIES[self.name].items():
            info = self.cpp_info if component is None else self.cpp_info.components[component]
            info.bindirs = []
            info.includedirs = []
            info.libdirs = []
            if module is not None:
                PkgConfig(self, module).fill_cpp_info(info, is_system=True)
