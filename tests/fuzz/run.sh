#!/bin/sh
# Builds every fuzz target with clang's libFuzzer (+ASan, UBSan) and runs each
# for $FUZZ_SECONDS (default 60) from its committed seed corpus, corpus/<target>/
# (written by make_seeds.cpp). Everything it builds or writes lives in a
# temporary directory, removed afterwards unless a target failed to build or
# the fuzzer found something (then it is kept and named; each target has its
# build.log, fuzz.log, artifacts/ and new corpus/ in <dir>/<target>/).
# Prints a line per target and a last line naming them all.
# Exit: 0 clean, 1 a finding or a build failure, 77 no clang (skip).
#
#   FUZZ_SECONDS=300 tests/fuzz/run.sh      CXX_FUZZ=clang++-14 tests/fuzz/run.sh
#   FUZZ_TARGETS="ps_message handshake" tests/fuzz/run.sh
set -u

# target: its source is <target>_fuzz.cpp, its seeds corpus/<target>/.
all_targets="wire_decode ps_message handshake graph_payload shm_peer"

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=${FUZZ_SECONDS:-60}
case $seconds in
  ''|*[!0-9]*) echo "fuzz: FUZZ_SECONDS='$seconds' is not a whole number of seconds" >&2; exit 1 ;;
esac
targets=${FUZZ_TARGETS:-$all_targets}
for t in $targets; do
  case " $all_targets " in
    *" $t "*) ;;
    *) echo "fuzz: unknown target '$t' in FUZZ_TARGETS (targets: $all_targets)" >&2; exit 1 ;;
  esac
done

cxx=${CXX_FUZZ:-}
if [ -z "$cxx" ]; then
  for candidate in clang++-14 clang++; do
    if command -v "$candidate" >/dev/null 2>&1; then cxx=$candidate; break; fi
  done
fi
if [ -z "$cxx" ]; then
  echo "fuzz: SKIP (no clang++ found; install clang and libclang-rt-dev for libFuzzer)"
  exit 77
fi

# The handshake's token paths need HMAC: with libcrypto they are fuzzed too.
crypto_flags='' crypto_libs='' crypto_note=" (no libcrypto: token paths refused)"
if [ -f /usr/include/openssl/hmac.h ]; then
  crypto_flags=-DFUSEWIRE_HAS_CRYPTO=1 crypto_libs=-lcrypto crypto_note=
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fusewire-fuzz.XXXXXX") || exit 1
keep=0
cleanup() { [ "$keep" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT INT TERM

failed=
fail() {  # fail TARGET MESSAGE
  keep=1
  failed="$failed $1"
  echo "fuzz $1: FAIL $2"
}

# Build every target first (one clang invocation each), so a broken build is
# reported before minutes of fuzzing.
built=
for t in $targets; do
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  extra='' libs=''
  if [ "$t" = handshake ]; then extra=$crypto_flags libs=$crypto_libs; fi
  if ! "$cxx" -std=c++20 -g -O1 -I"$root/include" -I"$root/tests" -I"$here" $extra \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        "$here/${t}_fuzz.cpp" -o "$work/$t/fuzz" $libs 2>"$work/$t/build.log"; then
    tail -n 30 "$work/$t/build.log" >&2
    fail "$t" "building ${t}_fuzz.cpp with $cxx (log in $work/$t/build.log)"
    continue
  fi
  if [ -z "$(ls "$here/corpus/$t" 2>/dev/null)" ]; then
    fail "$t" "no seed corpus in $here/corpus/$t (make_seeds writes it)"
    continue
  fi
  built="$built $t"
done

for t in $built; do
  # New inputs go to <target>/corpus (first directory); the seeds are read only.
  # -malloc_limit_mb: any single allocation above 16 MB counts as a finding.
  "$work/$t/fuzz" -max_total_time="$seconds" -max_len=4096 -malloc_limit_mb=16 \
      -timeout=10 -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
      "$work/$t/corpus" "$here/corpus/$t" >"$work/$t/fuzz.log" 2>&1
  status=$?
  log=$work/$t/fuzz.log
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | sed 's/cov: //')
  corpus=$(ls "$work/$t/corpus" | wc -l)
  findings=$(ls "$work/$t/artifacts" | wc -l)
  if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
    tail -n 40 "$log" >&2
    fail "$t" "after ${runs:-?} runs in ${seconds}s (exit $status); inputs in $work/$t/artifacts, log $log"
    continue
  fi
  note=''
  if [ "$t" = handshake ]; then note=$crypto_note; fi
  echo "fuzz $t: OK ${runs:-?} runs in ${seconds}s (${rate:-?} exec/s), coverage ${cov:-?} edges, corpus +$corpus inputs, 0 findings$note"
done

# shellcheck disable=SC2086 # word splitting wanted: one name per word
names=$(echo $targets | sed 's/ /, /g')
if [ -n "$failed" ]; then
  echo "fuzz: FAIL$failed (of $names); kept $work"
  exit 1
fi
echo "fuzz: OK $names, ${seconds}s each, 0 findings ($cxx)"
exit 0
