#!/usr/bin/env bash
# The paper's Ethernet-vs-RDMA comparison, on the soft-RoCE QEMU guest: the
# same payloads through fusewire over TCP (fusewire-uring and fusewire-asio)
# and over RDMA verbs (fusewire-verbs), next to perftest's raw verbs figures
# (ib_send_lat, ib_write_bw) from the same guest boot.
#
#   bench/rdma/ethernet_vs_rdma.sh [--fwbench PATH] [--time S] [--repetitions N] [--json FILE]
#
# Payloads: one buffer of 64 B, 64 KiB and 4 MiB (perftest's sizes), and the
# paper's uniform and skew payloads of 10 buffers. Benchmarks: p2p-latency
# (round trip p50) and p2p-bandwidth (MB/s). Every process runs in one guest on
# 192.0.2.1 (rxe0's netdev): TCP there goes over the guest's loopback and
# soft-RoCE loops its packets back inside the kernel, so the table compares the
# two software paths of one host, not two NICs; the ratios are what it shows.
# Build fwbench first (release: meson setup build/bench-rel -Dbuildtype=release;
# ninja -C build/bench-rel bench/fwbench). Exit 77 when QEMU cannot start.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

if [ "${1:-}" = "--in-guest" ]; then
  fwbench=$2 out=$3 time_s=$4 reps=$5
  export TF_RDMA_DEV_NAME=rxe0
  for payload in 64 64K 4M uniform skew; do
    case $payload in
      uniform | skew) sel=(--scheme "$payload") ;;
      *) sel=(--buffers "$payload") ;;
    esac
    echo "ethernet_vs_rdma: payload $payload" >&2
    "$fwbench" --backend fusewire-uring,fusewire-asio,fusewire-verbs --host 192.0.2.1 \
      --benchmark p2p-latency,p2p-bandwidth "${sel[@]}" --warmup 1 --time "$time_s" \
      --repetitions "$reps" --quiet --json "$out/fwbench.$payload.json" >"$out/fwbench.$payload.log" 2>&1 \
      || echo "ethernet_vs_rdma: fwbench failed for payload $payload (see its log)" >&2
  done
  exit 0
fi

fwbench=$repo/build/bench-rel/bench/fwbench
time_s=3
reps=3
json=
while [ $# -gt 0 ]; do
  case $1 in
    --fwbench) fwbench=${2:?}; shift 2 ;;
    --time) time_s=${2:?}; shift 2 ;;
    --repetitions) reps=${2:?}; shift 2 ;;
    --json) json=${2:?}; shift 2 ;;
    -h | --help) sed -n '7p' "$0" | sed 's/^# *//'; exit 0 ;;
    *) echo "ethernet_vs_rdma.sh: unknown option '$1' (allowed: --fwbench PATH, --time S, --repetitions N, --json FILE)" >&2; exit 2 ;;
  esac
done
[ -x "$fwbench" ] || { echo "ethernet_vs_rdma.sh: no fwbench at '$fwbench' (build it, or pass --fwbench)" >&2; exit 2; }
fwbench=$(cd "$(dirname "$fwbench")" && pwd)/$(basename "$fwbench")
mkdir -p "$repo/build"
out=$(mktemp -d "$repo/build/ethernet-vs-rdma.XXXXXX")
trap 'rm -rf "$out"' EXIT

"$here/perftest.sh" --json "$out/perftest.json" --timeout 1800 -- \
  bash "$here/ethernet_vs_rdma.sh" --in-guest "$fwbench" "$out" "$time_s" "$reps"
rc=$?
[ $rc = 77 ] && exit 77

python3 - "$out" "${json}" <<'PY'
import glob, json, os, sys
out, dest = sys.argv[1], sys.argv[2]
perf = {}
try:
    for r in json.load(open(os.path.join(out, "perftest.json")))["results"]:
        perf[(r["test"], r["bytes"])] = r
except (OSError, ValueError, KeyError):
    pass
rows, doc = [], {"perftest": list(perf.values()), "fwbench": {}}
for payload in ["64", "64K", "4M", "uniform", "skew"]:
    path = os.path.join(out, f"fwbench.{payload}.json")
    if not os.path.exists(path):
        print(f"fwbench: no result for payload {payload}:")
        log = os.path.join(out, f"fwbench.{payload}.log")
        if os.path.exists(log):
            print("".join(open(log).readlines()[-10:]))
        continue
    cells = json.load(open(path))["results"]
    doc["fwbench"][payload] = cells
    med = {}
    for c in cells:
        h = c.get("headline")
        med[(c["backend"], c["benchmark"])] = h["median"] if h else None
    size = {"64": 64, "64K": 65536, "4M": 4194304}.get(payload)
    lat = perf.get(("ib_send_lat", size))
    bw = perf.get(("ib_write_bw", size))
    rows.append((payload,
                 2 * lat["lat_typical_us"] if lat else None,
                 med.get(("fusewire-verbs", "p2p-latency")), med.get(("fusewire-uring", "p2p-latency")),
                 med.get(("fusewire-asio", "p2p-latency")),
                 bw["bw_avg_MBps"] * 1.048576 if bw else None,
                 med.get(("fusewire-verbs", "p2p-bandwidth")), med.get(("fusewire-uring", "p2p-bandwidth")),
                 med.get(("fusewire-asio", "p2p-bandwidth"))))
def f(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"
def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}x"
print("\nround trip p50 (us; perftest: ib_send_lat typical one-way x 2) and bandwidth (MB/s = 10^6 B/s)")
print(f"{'payload':8} {'perftest':>9} {'verbs':>9} {'uring':>9} {'asio':>9} {'tcp/verbs':>9}   "
      f"{'perftest':>9} {'verbs':>9} {'uring':>9} {'asio':>9} {'verbs/tcp':>9}")
for p, pl, vl, ul, al, pb, vb, ub, ab in rows:
    best_tcp_lat = min([x for x in (ul, al) if x] or [0]) or None
    best_tcp_bw = max([x for x in (ub, ab) if x] or [0]) or None
    print(f"{p:8} {f(pl):>9} {f(vl):>9} {f(ul):>9} {f(al):>9} {ratio(best_tcp_lat, vl):>9}   "
          f"{f(pb, 0):>9} {f(vb, 0):>9} {f(ub, 0):>9} {f(ab, 0):>9} {ratio(vb, best_tcp_bw):>9}")
if dest:
    json.dump(doc, open(dest, "w"), indent=2)
    print(f"ethernet_vs_rdma.sh: wrote {dest}")
PY
