#!/usr/bin/env bash
# vs_pslite.sh PSLITE_SOURCE_DIR [PS_BENCH]: ps_bench's RPC/s next to
# ps-lite's (ZeroMQ) in the same shape: P servers x W workers on loopback,
# every worker one step in flight, one key (slice) of FLOATS floats per server
# per step. Builds ps-lite (cmake, against Debian's libzmq3-dev and
# libprotobuf-dev) and pslite_bench.cc outside the repository, then runs
# ps-lite and ps_bench alternately, ROUNDS times, and prints the median RPC/s
# of each and the ratio fusewire / ps-lite per size, op and transport.
#
# Environment: P (2), W (3), FLOATS ("10 256 16384 262144 1572864"),
# OPS ("push pull"), WARMUP (1), TIME (3), ROUNDS (2), TRANSPORTS ("auto uring"),
# WORK (a build directory, default /tmp/pslite-vs), PS_BENCH (default
# build/rel/bench/ps_bench/ps_bench). Not part of the meson build or CI:
# ps-lite is not a Debian package.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1/include/ps/ps.h" ]; then
  echo "usage: $0 PSLITE_SOURCE_DIR [PS_BENCH]   (a checkout of ps-lite: its include/ps/ps.h)" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ps_bench=${2:-${PS_BENCH:-$repo/build/rel/bench/ps_bench/ps_bench}}
[ -x "$ps_bench" ] || { echo "vs_pslite: no ps_bench at $ps_bench (meson setup build/rel -Dbuildtype=release; ninja -C build/rel bench/ps_bench/ps_bench)" >&2; exit 2; }
P=${P:-2} W=${W:-3} WARMUP=${WARMUP:-1} TIME=${TIME:-3} ROUNDS=${ROUNDS:-2}
FLOATS=${FLOATS:-10 256 16384 262144 1572864}
OPS=${OPS:-push pull}
TRANSPORTS=${TRANSPORTS:-auto uring}
work=${WORK:-/tmp/pslite-vs}
mkdir -p "$work"

echo "vs_pslite: building ps-lite from $src in $work"
if [ ! -f "$work/pslite/libpslite.a" ]; then
  cmake -S "$src" -B "$work/pslite" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 ||
    { echo "vs_pslite: cmake failed, see $work/cmake.log (Debian: cmake libzmq3-dev libprotobuf-dev protobuf-compiler)" >&2; exit 1; }
  cmake --build "$work/pslite" --target pslite -j"$(nproc)" >"$work/build.log" 2>&1 ||
    { echo "vs_pslite: building ps-lite failed, see $work/build.log" >&2; exit 1; }
fi
g++ -O2 -std=c++17 -I"$src/include" -I"$work/pslite" "$here/pslite_bench.cc" "$work/pslite/libpslite.a" \
  -lzmq -lprotobuf -pthread -o "$work/pslite_bench"

# One ps-lite measurement: prints the RPC/s of all workers together.
run_pslite() {  # floats op
  local port=$((20000 + RANDOM % 30000)) pids=() out="$work/pslite.out"
  : >"$out"
  export DMLC_NUM_SERVER=$P DMLC_NUM_WORKER=$W DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$port
  local limit=$(awk -v w="$WARMUP" -v t="$TIME" 'BEGIN { print int(w + t + 60) }')
  DMLC_ROLE=scheduler timeout "$limit" "$work/pslite_bench" "$1" "$2" "$WARMUP" "$TIME" >>"$out" 2>&1 & pids+=($!)
  for ((i = 0; i < P; ++i)); do
    DMLC_ROLE=server timeout "$limit" "$work/pslite_bench" "$1" "$2" "$WARMUP" "$TIME" >>"$out" 2>&1 & pids+=($!)
  done
  for ((i = 0; i < W; ++i)); do
    DMLC_ROLE=worker timeout "$limit" "$work/pslite_bench" "$1" "$2" "$WARMUP" "$TIME" >>"$out" 2>&1 & pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  local n=$(grep -c '^@pslite' "$out" || true)
  if [ "$failed" -ne 0 ] || [ "$n" -ne "$W" ]; then
    echo "vs_pslite: ps-lite $1 floats $2 failed (or timed out); its output:" >&2
    tail -20 "$out" >&2
    echo 0
    return
  fi
  awk '/^@pslite/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] } r += f["rpcs"] / f["seconds"] }
       END { printf "%.0f\n", r }' "$out"
}

# One ps_bench measurement over `transport`: prints its RPC/s.
run_fusewire() {  # floats op transport
  local json="$work/ps_bench.json"
  rm -f "$json"
  if ! "$ps_bench" --ps "$P" --workers "$W" --floats "$1" --op "$2" --transport "$3" --warmup "$WARMUP" \
      --time "$TIME" --quiet --json "$json" >"$work/ps_bench.out" 2>&1; then
    echo "vs_pslite: ps_bench $1 floats $2 over $3 failed; its output:" >&2
    tail -20 "$work/ps_bench.out" >&2
    echo 0
    return
  fi
  python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["results"][0]["rpc_per_s"])' "$json"
}

# The median of the rounds that ran (a failed one gave 0, and is left out; "-" when none ran).
median() {
  tr ' ' '\n' | grep -v '^0*$' | sort -n |
    awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.0f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

declare -A got
for ((round = 1; round <= ROUNDS; ++round)); do
  for f in $FLOATS; do
    for op in $OPS; do
      echo "vs_pslite: round $round/$ROUNDS, $f floats, $op" >&2
      got[pslite,$f,$op]+=" $(run_pslite "$f" "$op")"
      for t in $TRANSPORTS; do
        got[$t,$f,$op]+=" $(run_fusewire "$f" "$op" "$t")"
      done
    done
  done
done

echo
echo "RPC/s (median of the rounds that ran, of $ROUNDS alternating), $P PS x $W workers on loopback, ${TIME} s each; one RPC = one"
echo "request a server answered (one key / slice of FLOATS floats); ps-lite over ZeroMQ TCP"
header=$(printf "%-10s %-5s %10s" floats op ps-lite)
for t in $TRANSPORTS; do header+=$(printf " %12s %8s" "fw-$t" "ratio"); done
echo "$header"
for f in $FLOATS; do
  for op in $OPS; do
    base=$(echo "${got[pslite,$f,$op]}" | median)
    line=$(printf "%-10s %-5s %10s" "$f" "$op" "$base")
    for t in $TRANSPORTS; do
      fw=$(echo "${got[$t,$f,$op]}" | median)
      ratio=$(awk -v a="$fw" -v b="$base" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }')
      line+=$(printf " %12s %8s" "$fw" "$ratio")
    done
    echo "$line"
  done
done
