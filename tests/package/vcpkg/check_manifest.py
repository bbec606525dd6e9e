#!/usr/bin/env python3
"""Checks that ports/fusewire/vcpkg.json lists every library fusewire's
headers include, in the right place, and nothing they do not use.

    check_manifest.py SOURCE_ROOT

Every `#include <...>` under include/ that is not fusewire's own, the C++
standard library's or the system's (POSIX, Linux) maps to a vcpkg port:
boost/<lib>/... and boost/<lib>.hpp to boost-<lib>, nlohmann/ to
nlohmann-json, liburing.h to liburing (feature uring), infiniband/ and rdma/
to rdma-core (feature rdma), openssl/ to openssl (feature crypto). An
include that maps to nothing is an error too: add it to the map. Prints what
is wrong, one line each, and exits 1; silent and 0 when the manifest is right.
"""

import json
import pathlib
import re
import sys

# Headers with no directory part that belong to the C and POSIX system, or to
# the compiler (x86 intrinsics).
SYSTEM_HEADERS = {"fcntl.h", "netdb.h", "pthread.h", "sched.h", "signal.h", "time.h", "unistd.h", "errno.h",
                  "poll.h", "string.h", "stdlib.h", "stdio.h", "stdint.h", "ifaddrs.h",
                  "emmintrin.h", "immintrin.h"}
SYSTEM_DIRS = ("sys/", "netinet/", "arpa/", "linux/", "net/")
# Port -> the manifest feature it belongs to (None: the core dependencies).
FEATURE_OF = {"liburing": "uring", "rdma-core": "rdma", "openssl": "crypto"}
# Ports listed for the CMake package rather than for an include:
# fusewireConfig.cmake finds Boost and links Boost::headers.
FOR_CMAKE = {"boost-headers": "fusewireConfig.cmake's find_dependency(Boost) and Boost::headers"}

INCLUDE = re.compile(r"^\s*#\s*include\s*<([^>]+)>", re.M)


def port_of(header):
    """The vcpkg port for `header`, "" for the standard library or the system, None if unknown."""
    if header.startswith("fusewire/"):
        return ""
    if "/" not in header:
        if header == "liburing.h":
            return "liburing"
        if header in SYSTEM_HEADERS or re.fullmatch(r"[a-z_]+", header):  # <vector>, <cstdio>, ...
            return ""
        return None
    if header.startswith(SYSTEM_DIRS):
        return ""
    if header.startswith("boost/"):
        lib = header.split("/")[1]
        return "boost-" + (lib[:-4] if lib.endswith(".hpp") else lib).replace("_", "-")
    for prefix, port in (("nlohmann/", "nlohmann-json"), ("infiniband/", "rdma-core"), ("rdma/", "rdma-core"),
                         ("openssl/", "openssl")):
        if header.startswith(prefix):
            return port
    return None


def names(deps):
    return {d if isinstance(d, str) else d["name"] for d in deps}


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[3])
    manifest_path = root / "ports" / "fusewire" / "vcpkg.json"
    manifest = json.loads(manifest_path.read_text())
    listed = {None: names(manifest.get("dependencies", []))}
    for feature, body in manifest.get("features", {}).items():
        listed[feature] = names(body.get("dependencies", []))

    problems = []
    needed = {}  # port -> first header that includes it
    for path in sorted((root / "include").rglob("*.hpp")):
        for header in INCLUDE.findall(path.read_text()):
            port = port_of(header)
            where = f"{path.relative_to(root)}: <{header}>"
            if port is None:
                problems.append(f"{where} maps to no vcpkg port; add it to tests/package/vcpkg/check_manifest.py")
            elif port:
                needed.setdefault(port, where)

    for port, where in sorted(needed.items()):
        feature = FEATURE_OF.get(port)
        if port not in listed.get(feature, set()):
            place = f'feature "{feature}"' if feature else '"dependencies"'
            problems.append(f"{manifest_path.relative_to(root)}: {port} is missing from {place} ({where})")
    for feature, ports in listed.items():
        for port in sorted(ports):
            if port not in needed and port not in FOR_CMAKE:
                place = f'feature "{feature}"' if feature else '"dependencies"'
                problems.append(f"{manifest_path.relative_to(root)}: {place} lists {port}, which no header includes")

    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
