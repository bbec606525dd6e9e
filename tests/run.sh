#!/usr/bin/env bash
# Runs every fusewire test and ends with the line "N passed, N failed".
#
#   1. the full build (-Werror) and every meson test suite (unit, thread,
#      multiprocess, headers, bench), then the 'netns' suite (fault injection
#      on a cluster of network namespaces) once against that build
#   2. the unit suite again under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. the cross-thread suite under ThreadSanitizer
#   4. the 'rdma' suite (verbs) inside a QEMU guest with soft-RoCE (tests/qemu),
#      and the verbs transport suite again under ASan + UBSan there
#   5. the package consumers (CMake, Meson, pkg-config) against a fresh install
#   6. the fuzzers (wire decoder, PS messages, handshake, graph payload, shm
#      peer) for a bounded time each (FUZZ_SECONDS, default 30 here)
#
# Installs the Debian packages it needs (as root). Build trees go to
# $FUSEWIRE_BUILD_DIR (default: build/tests under the repo).
set -u
cd "$(dirname "$0")/.."
root=$PWD
.ci/deps.sh tests || { echo "0 passed, 1 failed"; exit 1; }

# Compiler cache outside the clone, shared by every build stage and every clone
# (meson picks ccache up by itself). BASEDIR and NOHASHDIR let a fresh clone in
# another folder hit the entries an earlier clone left.
export CCACHE_DIR=${CCACHE_DIR:-/var/cache/fusewire/ccache}
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
mkdir -p "$CCACHE_DIR" 2>/dev/null || export CCACHE_DISABLE=1
ccache -z >/dev/null 2>&1 || true

out=${FUSEWIRE_BUILD_DIR:-$root/build/tests}
mkdir -p "$out"
jobs=${FUSEWIRE_JOBS:-$(nproc)}
passed=0
failed=0
failures=()

note() { printf '\n=== %s (at %d s)\n' "$*" "$SECONDS"; }
pass() { passed=$((passed + 1)); echo "PASS $1"; }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "FAIL $1"; }

# meson_suite NAME BUILDDIR SETUP_ARGS -- TEST_ARGS: configure, build, run a
# meson test selection; every test counts once.
meson_suite() {
  local name=$1 dir=$2; shift 2
  local setup=() testargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do setup+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  testargs=("$@")
  note "$name: configure + build"
  if ! meson setup --wipe "$dir" "$root" "${setup[@]}" >"$dir.setup.log" 2>&1 \
     && ! meson setup "$dir" "$root" "${setup[@]}" >"$dir.setup.log" 2>&1; then
    tail -30 "$dir.setup.log"; fail "$name: meson setup"; return
  fi
  # A stage that runs some suites builds only what their tests need.
  local suites=() targets=() i
  for ((i = 0; i < ${#testargs[@]}; i++)); do
    [ "${testargs[$i]}" = "--suite" ] && suites+=("${testargs[$((i + 1))]}")
  done
  if [ ${#suites[@]} -gt 0 ]; then
    mapfile -t targets < <(python3 tests/tools/suite_targets.py "$dir" "${suites[@]}")
    if [ ${#targets[@]} -eq 0 ]; then fail "$name: no tests in suites ${suites[*]}"; return; fi
  fi
  if ! ninja -C "$dir" -j "$jobs" "${targets[@]}" >"$dir.build.log" 2>&1; then
    grep -E "error|Error" "$dir.build.log" | head -30; fail "$name: build"; return
  fi
  pass "$name: build"
  note "$name: tests"
  meson_tests "$name" "$dir" "$dir.test.log" --num-processes "$jobs" "${testargs[@]}"
}

# meson_tests NAME BUILDDIR LOG TEST_ARGS: run a meson test selection of a built
# tree, print one line per test and count them; skipped tests count neither
# way, and the first skip reason is printed.
meson_tests() {
  local name=$1 dir=$2 log=$3; shift 3
  meson test -C "$dir" --no-rebuild --print-errorlogs "$@" >"$log" 2>&1
  grep -E "^ *[0-9]+/[0-9]+ " "$log" | sed 's/^ *//'
  local ok fl to up sk
  ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  fl=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  to=$(sed -n 's/^Timeout: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  up=$(sed -n 's/^Unexpected Pass: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  sk=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  if [ -z "$ok" ]; then
    tail -40 "$log"; fail "$name: meson test did not run"; return
  fi
  passed=$((passed + ok))
  if [ "${sk:-0}" -gt 0 ]; then
    echo "SKIP $name: ${sk} test(s): $(grep -h -m1 'SKIP:' "$dir/meson-logs/testlog.txt" | sed 's/.*SKIP: //')"
  fi
  failed=$((failed + ${fl:-0} + ${to:-0} + ${up:-0}))
  if [ $(( ${fl:-0} + ${to:-0} + ${up:-0} )) -gt 0 ]; then
    local names
    names=$(grep -E "^ *[0-9]+/[0-9]+ .* (FAIL|TIMEOUT|UNEXPECTEDPASS) " "$log" |
      sed 's|^ *[0-9]*/[0-9]* [^ ]* / \([^ ]*\) .*|\1|' | sort -u | tr '\n' ' ')
    failures+=("$name: $((${fl:-0} + ${to:-0} + ${up:-0})) test(s): ${names% }; see $dir/meson-logs/testlog.txt")
    # what the failing tests printed (--print-errorlogs), then meson's summary
    grep -v -E "^ *[0-9]+/[0-9]+ " "$log" | sed '/^Summary of Failures/q' | grep -v '^Summary of Failures' | tail -150
    sed -n '/^Summary of Failures/,$p' "$log"
  fi
}

# 1. everything, normal build
# (-O1 without debug info: CI's time goes to compiling, and -O1 compiles the
# template-heavy examples and tests in three quarters of -O2's time; the
# tensorflow stage builds at -O2. Every stage builds without -g, which costs a
# fifth of a sanitizer build: the sanitizers' reports still name each frame's
# function, and a local build with -g adds the lines.)
meson_suite "main" "$out/main" -Dbuildtype=plain -Doptimization=1 -Ddebug=false -- --no-suite rdma --no-suite netns

# 1b. fault injection on a cluster of network namespaces, against the main
#     build; its tests exit 77 (skipped) where namespaces cannot be created.
note "netns: fault injection on a cluster of network namespaces"
meson_tests "netns" "$out/main" "$out/netns.test.log" --suite netns

# 2. unit tests under ASan + UBSan (any UB report fails the test)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
meson_suite "asan+ubsan" "$out/asan" -Dbuildtype=debug -Ddebug=false -Db_sanitize=address,undefined \
  -Db_lundef=false -Dcpp_args=-fno-sanitize-recover=all -Dbench=false -Dexamples=false \
  -- --suite unit --suite multiprocess

# 3. cross-thread tests under ThreadSanitizer
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
meson_suite "tsan" "$out/tsan" -Dbuildtype=debug -Ddebug=false -Db_sanitize=thread -Db_lundef=false \
  -Dbench=false -Dexamples=false -- --suite thread
unset ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS

# 4. the 'rdma' suite (verbs transport) inside the soft-RoCE QEMU guest: the
#    host has no RDMA device, so the main stage only skips those tests.
note "rdma: verbs tests in the soft-RoCE QEMU guest"
rdma_status=0
tests/qemu/setup.sh --quiet >"$out/qemu-setup.log" 2>&1 || rdma_status=$?
if [ "$rdma_status" -eq 0 ]; then
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      PASS\ *) pass "rdma/${line#PASS }" >/dev/null ;;
      FAIL\ *) fail "rdma/${line#FAIL }" >/dev/null ;;
    esac
  done < <(tests/qemu/run-rdma-tests.sh --timeout 1800 "$out/main" 2>&1)
  # The verbs transport itself under ASan + UBSan, in a second boot (the asan
  # build dir of stage 2; only this test binary is built).
  # (the guest runner sets halt_on_error for both sanitizers)
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      PASS\ *) pass "rdma-asan/${line#PASS }" >/dev/null ;;
      FAIL\ *) fail "rdma-asan/${line#FAIL }" >/dev/null ;;
    esac
  done < <(tests/qemu/run-rdma-tests.sh --timeout 1200 "$out/asan" verbs_suite verbs_suite_send_only 2>&1)
elif [ "$rdma_status" -eq 77 ]; then
  echo "SKIP rdma suite: $(tail -1 "$out/qemu-setup.log")"
else
  tail -20 "$out/qemu-setup.log"; fail "rdma: tests/qemu/setup.sh"
fi

# 4b. the TensorFlow op library and its tests, against the pinned TensorFlow
# (the venv is cached; its own build directory, only the tensorflow suite)
note "tensorflow: op library (python/fusewire_tf) against the pinned TensorFlow"
if tf_venv=$(.ci/venv.sh tensorflow 2>"$out/tf-venv.log"); then
  meson_suite "tensorflow" "$out/tf" -Dbuildtype=debugoptimized -Ddebug=false -Dtensorflow=enabled \
    -Dtensorflow_python="$tf_venv/bin/python" -Dbench=false -- --suite tensorflow
else
  tail -20 "$out/tf-venv.log"; fail "tensorflow: .ci/venv.sh tensorflow"
fi

# 5. package consumers against a fresh install prefix
note "package consumers"
if [ -x tests/package/run.sh ]; then
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      PASS\ *) pass "${line#PASS }" >/dev/null ;;
      FAIL\ *) fail "${line#FAIL }" >/dev/null ;;
    esac
  done < <(tests/package/run.sh "$root" 2>&1)
else
  fail "tests/package/run.sh missing"
fi

# 6. fuzz the decoders, the handshake and the shm peer for a bounded time each
export FUZZ_SECONDS=${FUZZ_SECONDS:-30}
note "fuzz: wire, ps message, handshake, graph payload, shm peer ($FUZZ_SECONDS s each)"
if [ -x tests/fuzz/run.sh ]; then
  if tests/fuzz/run.sh >"$out/fuzz.log" 2>&1; then
    grep '^fuzz' "$out/fuzz.log"; pass "fuzz: wire, ps message, handshake, graph payload, shm peer"
  else
    tail -40 "$out/fuzz.log"; fail "fuzz: wire, ps message, handshake, graph payload, shm peer"
  fi
else
  fail "tests/fuzz/run.sh missing"
fi

echo
ccache -s 2>/dev/null | grep -iE "hits|misses" | head -3 || true
if [ ${#failures[@]} -gt 0 ]; then
  echo "Failures:"; printf '  %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
