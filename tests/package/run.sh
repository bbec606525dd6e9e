#!/usr/bin/env bash
# Installs fusewire into a fresh prefix and builds and runs the consumer
# projects in this folder against it. Each consumer requests and uses every
# component whose system library is here (uring, rdma, crypto):
#   package/pkg-config           c++ consumer.cpp $(pkg-config --cflags --libs fusewire),
#                                then with fusewire-uring fusewire-rdma fusewire-crypto
#   package/meson                dependency('fusewire') and dependency('fusewire-<c>')
#   package/cmake                find_package(fusewire CONFIG REQUIRED COMPONENTS uring rdma crypto),
#                                against a moved copy of the prefix (relocatable)
#   package/cmake-bad-component  COMPONENTS nonexistent must fail, naming it
#   package/vcpkg-port           ports/fusewire/portfile.cmake run outside vcpkg
#                                (vcpkg/run_portfile.cmake), then the CMake consumer
#   package/vcpkg-manifest       ports/fusewire/vcpkg.json lists what the headers include
#                                (vcpkg/check_manifest.py)
#   package/conan                conan create of conanfile.py with the test package
#                                conan/, offline: the requirements are the system's
#                                libraries (conan/system); conan from .ci/venv.sh conan
#                                (or $FUSEWIRE_CONAN)
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
  for name in pkg-config meson cmake cmake-bad-component vcpkg-port vcpkg-manifest conan; do
    fail "$name" "meson setup/install of $src into a fresh prefix failed" "$log"
    log=""  # show it once
  done
  exit "$failures"
fi
version=$(meson introspect --projectinfo "$tmp/build" |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# The components whose system libraries this machine has: every consumer
# requests and uses each of them (fusewire-<c>.pc, COMPONENTS <c>).
components=()
pkg-config --exists 'liburing >= 2.2' && components+=(uring)
pkg-config --exists libibverbs librdmacm && components+=(rdma)
pkg-config --exists libcrypto && components+=(crypto)
# check_components NAME FILE: the consumer's line shows each component at work.
check_components() {
  local line c want
  line=$(head -n 1 "$2")
  for c in "${components[@]}"; do
    case $c in
      uring) want=io_uring ;;
      rdma) want=", rdma " ;;
      crypto) want=", crypto token ok" ;;
    esac
    if [[ $line != *"$want"* ]]; then
      fail "$1" "component $c requested but not at work (no '$want'): '$line'" "$2"
      return 1
    fi
  done
}

# ---- plain pkg-config -----------------------------------------------------------
# Twice: the core alone, then every flavour at once (a compile is the costly part).
name=pkg-config; log=$tmp/$name.log
sets=(fusewire)
if ((${#components[@]})); then sets+=("$(printf 'fusewire-%s ' "${components[@]}")"); fi
for set in "${sets[@]}"; do
  out=$tmp/pkg-config-$((${#set})).out
  # shellcheck disable=SC2086  # unquoted on purpose: several modules, and as a Makefile uses pkg-config
  if ! flags=$(pkg-config --cflags --libs $set 2>>"$log"); then
    fail "$name" "pkg-config --cflags --libs $set failed" "$log"; break
  fi
  # shellcheck disable=SC2086
  if ! run "$log" "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror \
         -DFUSEWIRE_EXPECTED_VERSION="\"$(pkg-config --modversion fusewire)\"" \
         "$here/consumer.cpp" -o "$tmp/pkg-config-consumer" $flags; then
    fail "$name" "compiling consumer.cpp with \$(pkg-config --cflags --libs $set) failed" "$log"; break
  fi
  if ! "$tmp/pkg-config-consumer" >"$out" 2>>"$log"; then
    fail "$name" "the consumer built with $set exited non-zero" "$log"; break
  fi
  line=$(head -n 1 "$out")
  if [[ $line != "fusewire $version: fusewire:40 'buffer pool exhausted'"* ]]; then
    fail "$name" "unexpected output from the consumer built with $set: '$line'" "$log"; break
  fi
  if [[ $set == fusewire ]]; then
    if [[ $line == *", "* ]]; then fail "$name" "the core alone switched a component on: '$line'" "$log"; break; fi
  elif ! check_components "$name" "$out"; then
    break
  fi
  if [[ $set == "${sets[-1]}" ]]; then
    detail=fusewire
    if ((${#sets[@]} > 1)); then detail+=", then ${sets[1]% }"; fi
    pass "$name" "$detail"
  fi
done

# ---- meson ----------------------------------------------------------------------
name=meson; log=$tmp/$name.log
if ! run "$log" meson setup "$tmp/meson" "$here/meson" -Dcomponents="$(IFS=,; echo "${components[*]}")"; then
  fail "$name" "meson setup of the consumer failed (dependency('fusewire') not found?)" "$log"
elif ! run "$log" ninja -C "$tmp/meson"; then
  fail "$name" "building the consumer failed" "$log"
elif ! "$tmp/meson/consumer" >"$tmp/$name.out" 2>>"$log"; then
  fail "$name" "the consumer exited non-zero" "$log"
elif check_components "$name" "$tmp/$name.out"; then
  check_output "$name" "$tmp/$name.out"
fi

# ---- cmake ----------------------------------------------------------------------
# The package must not depend on where it was installed: move the prefix.
mv "$prefix" "$tmp/moved"
prefix=$tmp/moved
name=cmake; log=$tmp/$name.log
cmake_components=$(IFS=';'; echo "${components[*]}")
if ! run "$log" cmake -S "$here/cmake" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
       -DFUSEWIRE_COMPONENTS="$cmake_components"; then
  fail "$name" "find_package(fusewire CONFIG REQUIRED COMPONENTS ${components[*]}) failed" "$log"
elif ! grep -qx "fusewire_DIR:PATH=$prefix/lib/cmake/fusewire" "$tmp/cmake/CMakeCache.txt"; then
  fail "$name" "CMake found a fusewire other than the one just installed" "$tmp/cmake/CMakeCache.txt"
elif ! run "$log" cmake --build "$tmp/cmake"; then
  fail "$name" "building the consumer failed" "$log"
elif ! "$tmp/cmake/consumer" >"$tmp/$name.out" 2>>"$log"; then
  fail "$name" "the consumer exited non-zero" "$log"
elif check_components "$name" "$tmp/$name.out"; then
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
         -DFUSEWIRE_COMPONENTS="$cmake_components"; then
  fail "$name" "find_package(fusewire) against the port's tree failed" "$log"
elif ! grep -qx "fusewire_DIR:PATH=$tmp/vcpkg/share/fusewire" "$tmp/vcpkg-cmake/CMakeCache.txt"; then
  fail "$name" "CMake found a fusewire other than the port's" "$tmp/vcpkg-cmake/CMakeCache.txt"
elif ! run "$log" cmake --build "$tmp/vcpkg-cmake"; then
  fail "$name" "building the consumer against the port's tree failed" "$log"
elif ! "$tmp/vcpkg-cmake/consumer" >"$tmp/$name.out" 2>>"$log"; then
  fail "$name" "the consumer exited non-zero" "$log"
elif check_components "$name" "$tmp/$name.out"; then
  check_output "$name" "$tmp/$name.out"
fi

# ---- vcpkg manifest -------------------------------------------------------------
# ports/fusewire/vcpkg.json lists every library the headers include (and no other).
name=vcpkg-manifest; log=$tmp/$name.log
if python3 "$here/vcpkg/check_manifest.py" "$src" >"$log" 2>&1; then
  pass "$name"
else
  fail "$name" "ports/fusewire/vcpkg.json does not match the headers' includes" "$log"
fi

# ---- conan ----------------------------------------------------------------------
# `conan create` of the recipe (conanfile.py) with its test package (conan/),
# in a Conan home of its own with no remote: each requirement is the system's
# library, through a stand-in package (conan/system) with ConanCenter's name
# and the system's version. Every option combination the machine can satisfy:
# the one with every available component is built, linked and run; the others
# are configured (each component's target must exist exactly when its option is on).
name=conan; log=$tmp/$name.log
conan=${FUSEWIRE_CONAN:-}
if [[ -z $conan ]] && venv=$("$src/.ci/venv.sh" conan 2>>"$log"); then conan=$venv/bin/conan; fi
export CONAN_HOME=$tmp/conan-home
mkdir -p "$CONAN_HOME"
echo '{"remotes": []}' >"$CONAN_HOME/remotes.json"
cp -r "$here" "$tmp/conan-src"  # the test package builds in its folder: not in the clone
conan_test=$tmp/conan-src/conan
# system_version NAME: the version of the system's library, as the stand-in is named.
system_version() {
  case $1 in
    boost) printf '#include <boost/version.hpp>\nBOOST_VERSION\n' | "$cxx" -E -P -x c++ - 2>/dev/null |
             awk 'NF { v = $1 } END { if (v) printf "%d.%d.%d\n", v / 100000, v / 100 % 1000, v % 100 }' ;;
    nlohmann_json) pkg-config --modversion nlohmann_json ;;
    liburing) pkg-config --modversion liburing ;;
    rdma-core) pkg-config --modversion libibverbs | awk -F. '{ print $(NF - 1) "." $NF }' ;;
    openssl) pkg-config --modversion libcrypto ;;
  esac
}
libs=(boost nlohmann_json)
for c in "${components[@]}"; do
  case $c in uring) libs+=(liburing) ;; rdma) libs+=(rdma-core) ;; crypto) libs+=(openssl) ;; esac
done
conan_ok=true
if [[ -z $conan || ! -x $conan ]]; then
  fail "$name" "no conan (.ci/venv.sh conan failed)" "$log"; conan_ok=false
elif ! run "$log" "$conan" profile detect; then
  fail "$name" "conan profile detect failed" "$log"; conan_ok=false
else
  # fusewire needs C++20; the detected profile says the compiler's default.
  sed -i 's/^compiler.cppstd=.*/compiler.cppstd=20/' "$CONAN_HOME/profiles/default"
  for lib in "${libs[@]}"; do
    v=$(system_version "$lib")
    if [[ -z $v ]] || ! run "$log" "$conan" export "$conan_test/system" --name "$lib" --version "$v"; then
      fail "$name" "exporting the system stand-in for $lib${v:+ $v} failed" "$log"; conan_ok=false; break
    fi
  done
fi
if $conan_ok; then
  options=()
  for c in uring rdma crypto; do
    on=False
    if [[ " ${components[*]} " == *" $c "* ]]; then on=True; fi
    options+=(-o "fusewire/*:with_$c=$on")
  done
  if ! run "$log" "$conan" create "$src" --test-folder="$conan_test" --build=missing "${options[@]}"; then
    fail "$name" "conan create (${options[*]}) failed" "$log"; conan_ok=false
  elif ! grep -a "^fusewire $version: " "$log" | tail -n 1 >"$tmp/$name.out" || [[ ! -s $tmp/$name.out ]]; then
    fail "$name" "the test package's consumer printed nothing" "$log"; conan_ok=false
  elif ! check_components "$name" "$tmp/$name.out"; then
    conan_ok=false
  fi
fi
if $conan_ok; then
  combos=0
  for uring in True False; do
    for rdma in True False; do
      for crypto in True False; do
        combo=(-o "fusewire/*:with_uring=$uring" -o "fusewire/*:with_rdma=$rdma" -o "fusewire/*:with_crypto=$crypto")
        [[ " ${combo[*]} " == " ${options[*]} " ]] && continue  # built above
        [[ $uring == True && " ${components[*]} " != *" uring "* ]] && continue
        [[ $rdma == True && " ${components[*]} " != *" rdma "* ]] && continue
        [[ $crypto == True && " ${components[*]} " != *" crypto "* ]] && continue
        if ! run "$log" "$conan" test "$conan_test" "fusewire/$version" -c user.fusewire:configure_only=True \
               "${combo[@]}"; then
          fail "$name" "conan test (${combo[*]}) failed" "$log"; conan_ok=false; break 3
        fi
        combos=$((combos + 1))
      done
    done
  done
fi
if $conan_ok; then
  sed -i "1s/\$/; $combos other option combinations configured/" "$tmp/$name.out"
  check_output "$name" "$tmp/$name.out"
fi

exit "$failures"
