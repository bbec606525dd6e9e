#!/usr/bin/env bash
# fusewire next to the peers it is measured against, side by side in ONE run
# (a shared machine is noisy: only ratios within one run mean much):
#
#   10 B round trip p50, poll mode  fusewire-uring/asio vs floor:poll (busy-polling C ping-pong)
#                                   and UCX over TCP (ucx_perftest tag_lat, UCX_TLS=tcp)
#   10 B round trip p50, block mode fusewire-uring/asio vs floor:block, ZeroMQ, gRPC
#   skew payload (6.03 MiB)         bandwidth and round trip vs ZeroMQ and gRPC, next to the
#                                   TCP ceiling (iperf3, one stream) and the copy ceiling (memcpy)
#   same host (second table)        the futex floor (shared memory, futex wake-ups; poll and
#                                   block), fusewire-shm (through its ring, and for the skew payload
#                                   also from its shared pool), TensorPipe (uv and shm transports, basic
#                                   and cma channels) and UCX shared memory (posix, sysv, cma), as
#                                   ratios to fusewire-uring over loopback and to the futex floor:
#                                   10 B and skew round trip, skew bandwidth
#
# Usage: bench/peers.sh [--time SEC] [--repetitions N] [--build DIR] [--out DIR] [--quick]
#   --time SEC        measured seconds per backend and repetition (default 3; --quick: 0.5)
#   --repetitions N   repetitions; the table shows medians (default 3; --quick: 1)
#   --build DIR       release build dir for fwbench and memcpy_floor (default build/bench-rel)
#   --out DIR         where the JSON of each run goes (default DIR/peers)
# Installs what it needs (Debian packages, as root): .ci/deps.sh bench peers. A peer whose
# tool is missing (not root) is left out with a note. Pinned: server on the first CPU of the
# cpuset, client on the second; under `chrt -r 1` when allowed (see bench/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=3 reps=3 build=build/bench-rel out=
while [ $# -gt 0 ]; do
  case "$1" in
    --time) secs=${2:?--time needs seconds}; shift 2 ;;
    --repetitions) reps=${2:?--repetitions needs a number}; shift 2 ;;
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --quick) secs=0.5 reps=1; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "peers.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case $reps in ''|*[!0-9]*|0) echo "peers.sh: --repetitions '$reps' must be a whole number >= 1" >&2; exit 2 ;; esac
if ! python3 -c "import sys; v = float(sys.argv[1]); sys.exit(0 if 0 < v <= 600 else 1)" "$secs" 2>/dev/null; then
  echo "peers.sh: --time '$secs' must be a number of seconds, more than 0 and at most 600" >&2; exit 2
fi
out=${out:-$build/peers}

# Packages (the peers' tools are optional: without root they are skipped).
if ! .ci/deps.sh bench peers; then
  echo "peers.sh: continuing with the tools that are here" >&2
fi
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dbuildtype=release -Dtests=false -Dexamples=false >/dev/null
fi
echo "peers: building fwbench and memcpy_floor in $build"
ninja -C "$build" bench/fwbench bench/memcpy_floor >/dev/null
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.txt

read -r c0 c1 < <(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(c[0], c[min(1, len(c) - 1)])')
rt=()
if chrt -r 1 true 2>/dev/null; then rt=(chrt -r 1); else echo "peers: no real-time priority here (chrt -r 1 refused): noisier numbers"; fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
fw=("${rt[@]}" "$build/bench/fwbench" --warmup 1 --time "$secs" --repetitions "$reps" --quiet)

# fwbench's backends on this build (a peer it lacks is left out with a note).
built=$("$build/bench/fwbench" list | awk '$2 == "built" { print $1 }')
have() {
  local b
  for b in "$@"; do grep -qx "$b" <<<"$built" || return 1; done
}
# TensorPipe has no wait mode to choose (its threads wait their own way; its shm
# transport busy-polls): it runs with the block-mode rows.
tp=()
if have tensorpipe-uv-basic; then
  tp=(tensorpipe-uv-basic tensorpipe-uv-cma tensorpipe-shm-basic tensorpipe-shm-cma)
else
  echo "peers: fwbench has no tensorpipe backends (Debian: libtensorpipe-dev): TensorPipe left out"
fi
join() { local IFS=,; echo "$*"; }

echo "peers: 10 B round trip, poll mode"
"${fw[@]}" --buffers 10 --backend fusewire-uring:poll,fusewire-asio:poll,fusewire-shm:poll,floor:poll,futex:poll --pin \
  --json "$out/lat_poll.json"
echo "peers: 10 B round trip, block mode"
block=$(join fusewire-uring:block fusewire-asio:block fusewire-shm:block floor:block futex:block zmq:block grpc "${tp[@]}")
"${fw[@]}" --buffers 10 --backend "$block" --pin --json "$out/lat_block.json"
echo "peers: skew payload, bandwidth and round trip"
"${fw[@]}" --benchmark p2p-bandwidth,p2p-latency --scheme skew \
  --backend "$(join fusewire-uring:block fusewire-asio:block fusewire-shm:block futex:block zmq:block grpc "${tp[@]}")" \
  --json "$out/skew.json"
skew_bytes=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["results"][0]["payload_bytes"])' "$out/skew.json")
echo "peers: skew payload over fusewire-shm from its shared pool (--shared-pool)"
"${fw[@]}" --benchmark p2p-bandwidth,p2p-latency --scheme skew --shared-pool --backend fusewire-shm:block \
  --json "$out/skew_pool.json"

# UCX over TCP: tag_lat's latency column is one way (half the round trip).
if command -v ucx_perftest >/dev/null; then
  echo "peers: UCX tag_lat 10 B over TCP (ucx_perftest)"
  iters=$(python3 -c "import sys; print(max(1000, int(float(sys.argv[1]) * 50000)))" "$secs")
  for ((r = 1; r <= reps; r++)); do
    port=$(free_port)
    UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 "${rt[@]}" taskset -c "$c0" ucx_perftest -p "$port" \
      >"$out/ucx_server.$r.txt" 2>&1 &
    server=$!
    sleep 0.5
    UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 "${rt[@]}" taskset -c "$c1" ucx_perftest 127.0.0.1 -p "$port" \
      -t tag_lat -s 10 -n "$iters" -w 1000 >"$out/ucx.$r.txt" 2>&1 || echo "peers: ucx_perftest failed (see $out/ucx.$r.txt)"
    wait "$server" 2>/dev/null || true
  done
else
  echo "peers: ucx_perftest not here (Debian: ucx-utils): UCX left out"
fi

# UCX shared memory, each transport with `self` (a process's sends to itself):
# posix and sysv are UCX's shared-memory rings; cma (process_vm_readv) carries
# only rendezvous data, so it needs a transport for everything else: posix.
# tag_lat: the 10 B and the skew payload's round trip (one message of its
# bytes); tag_bw: the skew payload's bytes streamed one way, many in flight.
ucx_shm=(posix:posix,self sysv:sysv,self cma:posix,cma,self)
if command -v ucx_perftest >/dev/null; then
  iters_small=$(python3 -c "import sys; print(max(1000, int(float(sys.argv[1]) * 50000)))" "$secs")
  iters_large=$(python3 -c "import sys; print(max(20, int(float(sys.argv[1]) * 100)))" "$secs")
  for entry in "${ucx_shm[@]}"; do
    name=${entry%%:*} tls=${entry#*:}
    echo "peers: UCX $name ($tls): tag_lat 10 B, tag_lat and tag_bw of the skew payload's bytes"
    for ((r = 1; r <= reps; r++)); do
      for run in "lat_small tag_lat 10 $iters_small 1000" "lat_skew tag_lat $skew_bytes $iters_large 10" \
        "bw_skew tag_bw $skew_bytes $iters_large 10"; do
        read -r what test size iters warm <<<"$run"
        port=$(free_port)
        UCX_TLS=$tls timeout 120 "${rt[@]}" taskset -c "$c0" ucx_perftest -p "$port" \
          >"$out/ucx_shm_server.txt" 2>&1 &
        server=$!
        sleep 0.5
        UCX_TLS=$tls timeout 120 "${rt[@]}" taskset -c "$c1" ucx_perftest 127.0.0.1 -p "$port" \
          -t "$test" -s "$size" -n "$iters" -w "$warm" >"$out/ucx_shm_${name}_$what.$r.txt" 2>&1 \
          || echo "peers: ucx_perftest $name $test failed (see $out/ucx_shm_${name}_$what.$r.txt)"
        wait "$server" 2>/dev/null || true
      done
    done
  done
fi

# iperf3: one TCP stream over loopback, the ceiling of any one-connection transport.
if command -v iperf3 >/dev/null; then
  echo "peers: iperf3, one stream over loopback"
  whole=$(python3 -c "import math, sys; print(max(1, math.ceil(float(sys.argv[1]))))" "$secs")  # iperf3 -t: whole seconds
  for ((r = 1; r <= reps; r++)); do
    port=$(free_port)
    timeout $((whole + 60)) "${rt[@]}" taskset -c "$c0" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    timeout $((whole + 60)) "${rt[@]}" taskset -c "$c1" iperf3 -c 127.0.0.1 -p "$port" -t "$whole" -J >"$out/iperf3.$r.json" 2>&1 \
      || echo "peers: iperf3 failed (see $out/iperf3.$r.json)"
    wait "$server" 2>/dev/null || true
  done
else
  echo "peers: iperf3 not here (Debian: iperf3): left out"
fi

echo "peers: memcpy of the skew payload's $skew_bytes bytes"
"${rt[@]}" taskset -c "$c1" "$build/bench/memcpy_floor" --bytes "$skew_bytes" --time "$secs" \
  --repetitions "$reps" >"$out/memcpy.txt"

python3 - "$out" "$reps" <<'EOF'
import glob, json, re, statistics, sys

out, reps = sys.argv[1], int(sys.argv[2])

def fwbench(name):
    got = {}
    for r in json.load(open(f"{out}/{name}.json"))["results"]:
        got[(r["backend"], r["benchmark"])] = r["headline"]["median"]
    return got

lat_poll, lat_block, skew = fwbench("lat_poll"), fwbench("lat_block"), fwbench("skew")
skew_pool = fwbench("skew_pool")

def ucx():
    v = []
    for f in glob.glob(f"{out}/ucx.*.txt"):
        for line in open(f):
            if line.startswith("Final:"):
                v.append(2 * float(line.split()[2]))  # 50th percentile, one way -> round trip
    return statistics.median(v) if v else None

def iperf3():
    v = []
    for f in glob.glob(f"{out}/iperf3.*.json"):
        try:
            bps = json.load(open(f))["end"]["sum_received"]["bits_per_second"]
            if bps > 0:
                v.append(bps / 8e6)
        except (ValueError, KeyError):
            pass
    return statistics.median(v) if v else None

def memcpy():
    m = re.search(r"median (\d+) MB/s", open(f"{out}/memcpy.txt").read())
    return float(m.group(1)) if m else None

rows = []  # (what, unit, better, {fusewire backend: value}, [(peer, value)])
lat = "p2p-latency"
rows.append(("10 B round trip p50, poll, pinned", "us", "lower",
             {b: lat_poll.get((f"fusewire-{b}:poll", lat)) for b in ("uring", "asio")},
             [("floor:poll (busy-polling C)", lat_poll.get(("floor:poll", lat))), ("UCX tcp tag_lat", ucx())]))
rows.append(("10 B round trip p50, block, pinned", "us", "lower",
             {b: lat_block.get((f"fusewire-{b}:block", lat)) for b in ("uring", "asio")},
             [("floor:block (blocking C)", lat_block.get(("floor:block", lat))),
              ("zmq:block", lat_block.get(("zmq:block", lat))), ("grpc", lat_block.get(("grpc", lat)))]))
bw = "p2p-bandwidth"
rows.append(("skew bandwidth, non-serialized", "MB/s", "higher",
             {b: skew.get((f"fusewire-{b}:block", bw)) for b in ("uring", "asio")},
             [("zmq:block", skew.get(("zmq:block", bw))), ("grpc", skew.get(("grpc", bw))),
              ("iperf3, 1 stream (TCP ceiling)", iperf3()), ("memcpy (copy ceiling)", memcpy())]))
rows.append(("skew round trip p50, non-serialized", "us", "lower",
             {b: skew.get((f"fusewire-{b}:block", lat)) for b in ("uring", "asio")},
             [("zmq:block", skew.get(("zmq:block", lat))), ("grpc", skew.get(("grpc", lat)))]))

def ucx_shm(name, what):
    v = []
    for f in glob.glob(f"{out}/ucx_shm_{name}_{what}.*.txt"):
        for line in open(f):
            if line.startswith("Final:"):
                cols = line.split()
                # tag_lat: the one-way median, doubled; tag_bw: overall MB/s,
                # UCX's MB being 2^20 bytes
                v.append(2 * float(cols[2]) if what.startswith("lat") else float(cols[6]) * 1.048576)
    return statistics.median(v) if v else None

def fmt(v):
    return "-" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}")

print(f"\npeers: medians of {reps} repetition(s); ratio = fusewire / peer "
      "(latency: lower is better, bandwidth: higher is better)")
print(f"{'what':38} {'unit':5} {'uring':>8} {'asio':>8}  {'peer':32} {'peer':>8} {'uring/peer':>10} {'asio/peer':>9}")
for what, unit, better, fws, peers in rows:
    for i, (peer, pv) in enumerate(peers):
        u, a = fws["uring"], fws["asio"]
        ru = "-" if u is None or not pv else f"{u / pv:.2f}x"
        ra = "-" if a is None or not pv else f"{a / pv:.2f}x"
        print(f"{what if i == 0 else '':38} {unit if i == 0 else '':5} {fmt(u) if i == 0 else '':>8} "
              f"{fmt(a) if i == 0 else '':>8}  {peer:32} {fmt(pv):>8} {ru:>10} {ra:>9}")

# Same host: every peer as a ratio to fusewire-uring over loopback, the
# transport a PS and a worker on one host use without fusewire-shm, and to
# the futex floor in the row's mode, what a shared-memory transport can reach.
tp = [f"tensorpipe-{t}-{c}" for t in ("uv", "shm") for c in ("basic", "cma")]
ucx_names = {"posix": "posix,self", "sysv": "sysv,self", "cma": "posix,cma,self"}
same = []  # (what, unit, reference value, futex floor value, [(peer, value)])
futex_poll, futex_block = lat_poll.get(("futex:poll", lat)), lat_block.get(("futex:block", lat))
same.append(("10 B round trip p50, poll, pinned", "us", lat_poll.get(("fusewire-uring:poll", lat)), futex_poll,
             [("futex:poll (busy-polling C)", futex_poll),
              ("fusewire-shm:poll", lat_poll.get(("fusewire-shm:poll", lat)))] +
             [(f"UCX {n} tag_lat ({t})", ucx_shm(n, "lat_small")) for n, t in ucx_names.items()]))
same.append(("10 B round trip p50, block, pinned", "us", lat_block.get(("fusewire-uring:block", lat)), futex_block,
             [("futex:block (futex-waking C)", futex_block),
              ("fusewire-shm:block", lat_block.get(("fusewire-shm:block", lat)))] +
             [(b, lat_block.get((b, lat))) for b in tp]))
futex_skew = skew.get(("futex:block", lat))
same.append(("skew round trip p50", "us", skew.get(("fusewire-uring:block", lat)), futex_skew,
             [("futex:block", futex_skew), ("fusewire-shm:block", skew.get(("fusewire-shm:block", lat))),
              ("fusewire-shm:block, shared pool", skew_pool.get(("fusewire-shm:block", lat)))] +
             [(b, skew.get((b, lat))) for b in tp] +
             [(f"UCX {n} tag_lat ({t})", ucx_shm(n, "lat_skew")) for n, t in ucx_names.items()]))
futex_bw = skew.get(("futex:block", bw))
same.append(("skew bandwidth", "MB/s", skew.get(("fusewire-uring:block", bw)), futex_bw,
             [("futex:block", futex_bw), ("fusewire-shm:block", skew.get(("fusewire-shm:block", bw))),
              ("fusewire-shm:block, shared pool", skew_pool.get(("fusewire-shm:block", bw)))] +
             [(b, skew.get((b, bw))) for b in tp] +
             [(f"UCX {n} tag_bw, streamed ({t})", ucx_shm(n, "bw_skew")) for n, t in ucx_names.items()]))

print(f"\npeers, same host: medians of {reps} repetition(s); x = peer / fusewire-uring over loopback, "
      "x futex = peer / the futex floor in the row's mode (latency: below 1 is faster, bandwidth: above 1 is faster)")
print(f"{'what':36} {'unit':5} {'fusewire-uring':>14}  {'peer':40} {'peer':>8} {'x':>7} {'x futex':>8}")
for what, unit, ref, floor, peers in same:
    for i, (peer, pv) in enumerate(peers):
        x = "-" if pv is None or not ref else f"{pv / ref:.2f}x"
        xf = "-" if pv is None or not floor else f"{pv / floor:.2f}x"
        print(f"{what if i == 0 else '':36} {unit if i == 0 else '':5} {fmt(ref) if i == 0 else '':>14}  "
              f"{peer:40} {fmt(pv):>8} {x:>7} {xf:>8}")
EOF
