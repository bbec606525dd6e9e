#!/bin/sh
# Builds the wire decoder fuzz target with clang's libFuzzer (+ASan, UBSan) and
# runs it for $FUZZ_SECONDS (default 60) from a seed corpus of one valid frame
# per type. Everything it builds or writes lives in a temporary directory,
# removed afterwards unless the fuzzer found something (then it is kept and
# named). Exit: 0 clean, 1 finding or build failure, 77 no clang (skip).
#
#   FUZZ_SECONDS=300 tests/fuzz/run.sh      CXX_FUZZ=clang++-14 tests/fuzz/run.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=${FUZZ_SECONDS:-60}
case $seconds in
  ''|*[!0-9]*) echo "wire fuzz: FUZZ_SECONDS='$seconds' is not a whole number of seconds" >&2; exit 1 ;;
esac

cxx=${CXX_FUZZ:-}
if [ -z "$cxx" ]; then
  for candidate in clang++-14 clang++; do
    if command -v "$candidate" >/dev/null 2>&1; then cxx=$candidate; break; fi
  done
fi
if [ -z "$cxx" ]; then
  echo "wire fuzz: SKIP (no clang++ found; install clang and libclang-rt-dev for libFuzzer)"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fusewire-wire-fuzz.XXXXXX") || exit 1
keep=0
cleanup() { [ "$keep" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT INT TERM

#: clang leaves it off by default; the core headers use sized delete.
# (tests/ is where the tests' own includes start: "support/seed_frames.hpp")
common="-std=c++20 -g -I$root/include -I$root/tests"
if ! "$cxx" $common -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
      "$here/wire_decode_fuzz.cpp" -o "$work/wire_decode_fuzz" 2>"$work/build.log"; then
  keep=1
  cat "$work/build.log" >&2
  echo "wire fuzz: FAIL building the fuzz target with $cxx (log in $work/build.log)"
  exit 1
fi
if ! "$cxx" $common -O1 "$here/make_seeds.cpp" -o "$work/make_seeds" 2>>"$work/build.log"; then
  keep=1
  cat "$work/build.log" >&2
  echo "wire fuzz: FAIL building make_seeds (log in $work/build.log)"
  exit 1
fi
mkdir "$work/seeds" "$work/corpus" "$work/artifacts"
"$work/make_seeds" "$work/seeds" >/dev/null || { keep=1; echo "wire fuzz: FAIL writing seeds"; exit 1; }

# New corpus entries go to $work/corpus (first directory); seeds are read only.
# -malloc_limit_mb: any single allocation above 16 MB counts as a finding.
"$work/wire_decode_fuzz" -max_total_time="$seconds" -max_len=4096 -malloc_limit_mb=16 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" "$work/seeds" >"$work/fuzz.log" 2>&1
status=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)
cov=$(grep -o 'cov: [0-9]*' "$work/fuzz.log" | tail -n 1 | sed 's/cov: //')
corpus=$(ls "$work/corpus" | wc -l)
findings=$(ls "$work/artifacts" | wc -l)
if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
  keep=1
  tail -n 40 "$work/fuzz.log" >&2
  echo "wire fuzz: FAIL after ${runs:-?} runs in ${seconds}s (exit $status); inputs in $work/artifacts, log $work/fuzz.log"
  exit 1
fi
echo "wire fuzz: OK ${runs:-?} runs in ${seconds}s, coverage ${cov:-?} edges, corpus +$corpus inputs, 0 findings ($cxx)"
exit 0
