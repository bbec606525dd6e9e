#!/usr/bin/env bash
# Installs fusewire into a fresh prefix and builds and runs the consumer
# projects in this folder against it:
#   package/pkg-config           c++ consumer.cpp $(pkg-config --cflags --libs fusewire)
#                                (and fusewire-uring, when liburing is here)
#   package/meson                dependency('fusewire')
#   package/cmake                find_package(fusewire CONFIG REQUIRED COMPONENTS uring),
#                                against a moved copy of the prefix (relocatable)
#   package/cmake-bad-component  COMPONENTS nonexistent must fail, naming it
#   package/vcpkg-port           ports/fusewire/portfile.cmake run outside vcpkg
#                                (vcpkg/run_portfile.cmake), then the CMake consumer
#
# Usage: tests/package/run.sh [SOURCE_ROOT]   (default: this repository)
# Prints one line per consumer, `PASS package/<name>` or
# `FAIL package/<name>: <reason>` (the failing step's log goes to stderr), and
# exits with the number of failures. Everything it writes is in a temporary
# directory that it removes (FUSEWIRE_PACKAGE_KEEP=1 keeps it, to debug).

set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "${1:-$here/../..}" && pwd) || { echo "FAIL package/install: no source root ${1:-}"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fusewire-package.XXXXXX")
if [[ ${FUSEWIRE_PACKAGE_KEEP:-0} == 1 ]]; then
  echo "package: keeping $tmp" >&2
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix=$tmp/prefix
cxx=${CXX:-c++}
failures=0

pass() { echo "PASS package/$1${2:+ ($2)}"; }
fail() {
  echo "FAIL package/$1: $2"
  failures=$((failures + 1))
  if [[ -n ${3:-} && -s $3 ]]; then
    echo "---- package/$1: last lines of $(basename "$3")" >&2
    tail -n 30 "$3" | sed 's/^/    /' >&2
  fi
}
# run LOG CMD...: runs CMD with its output appended to LOG.
run() { local log=$1; shift; echo "+ $*" >>"$log"; "$@" >>"$log" 2>&1; }
# check_output NAME FILE: the consumer's one line must name fusewire's version.
check_output() {
  local line
  line=$(head -n 1 "$2")
  if [[ $line == "fusewire $version: fusewire:40 'buffer pool exhausted'"* ]]; then
    local detail=${line#*\'buffer pool exhausted\'}
    pass "$1" "${detail#, }"
    return 0
  fi
  fail "$1" "unexpected output '$line'" "$2"
}

# ---- install ------------------------------------------------------------------
log=$tmp/install.log
if ! run "$log" meson setup "$tmp/build" "$src" --prefix="$prefix" --libdir=lib \
       -Dtests=false -Dbench=false -Dexamples=false ||
   ! run "$log" meson install -C "$tmp/build" --quiet; then
  for name in pkg-config meson cmake cmake-bad-component vcpkg-port; do
    fail "$name" "meson setup/install of $src into a fresh prefix failed" "$log"
    log=""  # show it once
  done
  exit "$failures"
fi
version=$(meson introspect --projectinfo "$tmp/build" |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
have_uring=false
if pkg-config --exists 'liburing >= 2.2'; then
  have_uring=true
fi

# ---- plain pkg-config -----------------------------------------------------------
name=pkg-config; log=$tmp/$name.log
flavours=(fusewire)
if $have_uring; then flavours+=(fusewire-uring); fi
for pc in "${flavours[@]}"; do
  # Unquoted on purpose: this is how a Makefile uses pkg-config.
  if ! flags=$(pkg-config --cflags --libs "$pc" 2>>"$log"); then
    fail "$name" "pkg-config --cflags --libs $pc failed" "$log"; break
  fi
  # shellcheck disable=SC2086
  if ! run "$log" "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror \
         -DFUSEWIRE_EXPECTED_VERSION="\"$(pkg-config --modversion "$pc")\"" \
         "$here/consumer.cpp" -o "$tmp/$pc" $flags; then
    fail "$name" "compiling consumer.cpp with \$(pkg-config --cflags --libs $pc) failed" "$log"; break
  fi
  if ! "$tmp/$pc" >"$tmp/$pc.out" 2>>"$log"; then
    fail "$name" "the consumer built with $pc exited non-zero" "$log"; break
  fi
  line=$(head -n 1 "$tmp/$pc.out")
  if [[ $line != "fusewire $version: fusewire:40 'buffer pool exhausted'"* ]]; then
    fail "$name" "unexpected output from the consumer built with $pc: '$line'" "$log"; break
  fi
  if [[ $pc == fusewire-uring && $line != *io_uring* ]]; then
    fail "$name" "fusewire-uring did not give FUSEWIRE_HAS_URING: '$line'" "$log"; break
  fi
  if [[ $pc == "${flavours[-1]}" ]]; then
    pass "$name" "${flavours[*]}"
  fi
done

# ---- meson ----------------------------------------------------------------------
name=meson; log=$tmp/$name.log
if ! run "$log" meson setup "$tmp/meson" "$here/meson"; then
  fail "$name" "meson setup of the consumer failed (dependency('fusewire') not found?)" "$log"
elif ! run "$log" ninja -C "$tmp/meson"; then
  fail "$name" "building the consumer failed" "$log"
elif ! "$tmp/meson/consumer" >"$tmp/$name.out" 2>>"$log"; then
  fail "$name" "the consumer exited non-zero" "$log"
else
  check_output "$name" "$tmp/$name.out"
fi

# ---- cmake ----------------------------------------------------------------------
# The package must not depend on where it was installed: move the prefix.
mv "$prefix" "$tmp/moved"
prefix=$tmp/moved
name=cmake; log=$tmp/$name.log
components=""
if $have_uring; then components=uring; fi
if ! run "$log" cmake -S "$here/cmake" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
       -DFUSEWIRE_COMPONENTS="$components"; then
  fail "$name" "find_package(fusewire CONFIG REQUIRED COMPONENTS $components) failed" "$log"
elif ! grep -qx "fusewire_DIR:PATH=$prefix/lib/cmake/fusewire" "$tmp/cmake/CMakeCache.txt"; then
  fail "$name" "CMake found a fusewire other than the one just installed" "$tmp/cmake/CMakeCache.txt"
elif ! run "$log" cmake --build "$tmp/cmake"; then
  fail "$name" "building the consumer failed" "$log"
elif ! "$tmp/cmake/consumer" >"$tmp/$name.out" 2>>"$log"; then
  fail "$name" "the consumer exited non-zero" "$log"
elif $have_uring && ! grep -q io_uring "$tmp/$name.out"; then
  fail "$name" "COMPONENTS uring did not give FUSEWIRE_HAS_URING" "$tmp/$name.out"
else
  check_output "$name" "$tmp/$name.out"
fi

# ---- cmake, a component that does not exist -------------------------------------
name=cmake-bad-component; log=$tmp/$name.log
expected="fusewire component 'nonexistent' is not available: fusewire has no such component (it has: uring, rdma, crypto)."
if run "$log" cmake -S "$here/cmake" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
     -DFUSEWIRE_COMPONENTS=nonexistent; then
  fail "$name" "find_package(fusewire CONFIG REQUIRED COMPONENTS nonexistent) succeeded" "$log"
elif ! tr -s ' \n' ' ' <"$log" | grep -qF "$expected"; then
  fail "$name" "CMake failed without saying: $expected" "$log"
else
  pass "$name"
fi

# ---- vcpkg port -----------------------------------------------------------------
# The overlay port's portfile, run with stand-ins for vcpkg's variables and
# helpers (vcpkg/run_portfile.cmake), installs a tree the CMake consumer uses.
name=vcpkg-port; log=$tmp/$name.log
port_dir=$src/ports/fusewire
if ! run "$log" cmake -DPORT_DIR="$port_dir" -DCURRENT_PACKAGES_DIR="$tmp/vcpkg" \
       -P "$here/vcpkg/run_portfile.cmake"; then
  fail "$name" "ports/fusewire/portfile.cmake failed" "$log"
elif [[ ! -s $tmp/vcpkg/share/fusewire/copyright || ! -s $tmp/vcpkg/share/fusewire/usage ]]; then
  fail "$name" "the port installed no share/fusewire/copyright or usage" "$log"
elif ! run "$log" cmake -S "$here/cmake" -B "$tmp/vcpkg-cmake" -DCMAKE_PREFIX_PATH="$tmp/vcpkg" \
         -DFUSEWIRE_COMPONENTS="$components"; then
  fail "$name" "find_package(fusewire) against the port's tree failed" "$log"
elif ! grep -qx "fusewire_DIR:PATH=$tmp/vcpkg/share/fusewire" "$tmp/vcpkg-cmake/CMakeCache.txt"; then
  fail "$name" "CMake found a fusewire other than the port's" "$tmp/vcpkg-cmake/CMakeCache.txt"
elif ! run "$log" cmake --build "$tmp/vcpkg-cmake"; then
  fail "$name" "building the consumer against the port's tree failed" "$log"
elif ! "$tmp/vcpkg-cmake/consumer" >"$tmp/$name.out" 2>>"$log"; then
  fail "$name" "the consumer exited non-zero" "$log"
else
  check_output "$name" "$tmp/$name.out"
fi

exit "$failures"
