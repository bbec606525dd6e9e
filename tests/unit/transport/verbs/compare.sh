#!/bin/sh
# Runs perftest (ib_send_lat / ib_write_bw over rdmacm, -R) and fusewire's
# verbs_bench on the same device in the same (guest) run and prints the ratios
# for 64 B and 64 KiB latency, 64 KiB and 4 MiB bandwidth. With a second build
# dir (e.g. a baseline) its verbs_bench runs too, alternating with the first,
# in every round; with --repeat N the table shows the medians of N rounds.
#
#   tests/unit/transport/verbs/compare.sh [--repeat N] BUILD_DIR [BASELINE_BUILD_DIR]   (in the guest, or on RDMA hardware)
#   tests/qemu/run.sh --timeout 1800 --share /work -- tests/unit/transport/verbs/compare.sh --repeat 3 BUILD_DIR BASE_DIR
#
# Env: FUSEWIRE_RDMA_TEST_ADDR (default 192.0.2.1), TF_RDMA_DEV_NAME (default rxe0).
# perftest's MB/sec are MiB/s (2^20 bytes); verbs_bench prints MiB/s too.
set -u
repeat=1
if [ "${1:-}" = "--repeat" ]; then
  repeat=${2:?usage: compare.sh [--repeat N] BUILD_DIR [BASELINE_BUILD_DIR]}
  shift 2
fi
case $repeat in ''|*[!0-9]*|0) echo "compare.sh: --repeat '$repeat' must be a whole number >= 1" >&2; exit 2 ;; esac
build=${1:?usage: compare.sh [--repeat N] BUILD_DIR [BASELINE_BUILD_DIR]}
base=${2:-}
addr=${FUSEWIRE_RDMA_TEST_ADDR:-192.0.2.1}
dev=${TF_RDMA_DEV_NAME:-rxe0}
out=$(mktemp -d)
for tool in ib_send_lat ib_write_bw; do
  command -v $tool >/dev/null 2>&1 || { echo "compare.sh: $tool not found (apt-get install perftest)"; exit 77; }
done
for b in "$build" $base; do
  [ -x "$b/tests/unit/transport/verbs/verbs_bench" ] || { echo "compare.sh: $b/tests/unit/transport/verbs/verbs_bench not built" >&2; exit 2; }
done

# perftest SERVER_AND_CLIENT_ARGS... ; prints the client's output
perf() {
  tool=$1; shift
  port=$((18515 + $(od -An -N1 -tu1 /dev/urandom)))
  timeout 300 $tool -R -d $dev -F -p $port "$@" >"$out/server.txt" 2>&1 &
  spid=$!
  sleep 2
  timeout 300 $tool -R -d $dev -F -p $port "$@" $addr >"$out/client.txt" 2>&1
  wait $spid
  cat "$out/client.txt"
}
# fusewire BUILD ROUND TAG: runs verbs_bench, appends "TAG measure value" lines to $out/values
fusewire() {
  TF_RDMA_DEV_NAME=$dev timeout 600 "$1/tests/unit/transport/verbs/verbs_bench" --iterations 2000 | tee "$out/fw.txt"
  awk -v t="$3" '/RESULT fusewire send_lat 64 B/ {print t, "lat64", $6}
                 /RESULT fusewire send_lat 65536 B/ {print t, "lat64k", $6}
                 /RESULT fusewire write_bw 65536 B/ {print t, "bw64k", $6}
                 /RESULT fusewire write_bw 4194304 B/ {print t, "bw4m", $6}' "$out/fw.txt" >>"$out/values"
}

: >"$out/values"
round=1
while [ $round -le "$repeat" ]; do
  echo "== round $round of $repeat: perftest ib_send_lat -R -s 64"
  perf ib_send_lat -s 64 -n 2000 | tee "$out/lat.txt"
  echo "== perftest ib_send_lat -R -s 65536"
  perf ib_send_lat -s 65536 -n 500 | tee "$out/lat64k.txt"
  echo "== perftest ib_write_bw -R -s 65536"
  perf ib_write_bw -s 65536 -n 1000 | tee "$out/bw64k.txt"
  echo "== perftest ib_write_bw -R -s 4194304"
  perf ib_write_bw -s 4194304 -n 32 | tee "$out/bw4m.txt"
  # The data line follows perftest's column header; t_avg is column 6, BW average column 4.
  awk '/t_avg/ {getline; print "perftest lat64", $6; exit}' "$out/lat.txt" >>"$out/values"
  awk '/t_avg/ {getline; print "perftest lat64k", $6; exit}' "$out/lat64k.txt" >>"$out/values"
  awk '/BW average/ {getline; print "perftest bw64k", $4; exit}' "$out/bw64k.txt" >>"$out/values"
  awk '/BW average/ {getline; print "perftest bw4m", $4; exit}' "$out/bw4m.txt" >>"$out/values"
  if [ -n "$base" ] && [ $((round % 2)) = 0 ]; then
    echo "== baseline verbs_bench ($base)"; fusewire "$base" $round baseline
    echo "== fusewire verbs_bench ($build)"; fusewire "$build" $round fusewire
  else
    echo "== fusewire verbs_bench ($build)"; fusewire "$build" $round fusewire
    if [ -n "$base" ]; then echo "== baseline verbs_bench ($base)"; fusewire "$base" $round baseline; fi
  fi
  round=$((round + 1))
done

# median TAG MEASURE
median() {
  # Failed runs (perftest prints 0.00 or inf when the guest stalls) are left out.
  awk -v t="$1" -v m="$2" '$1 == t && $2 == m && $3 ~ /^[0-9.]+$/ && $3 + 0 > 0 { v[n++] = $3 + 0 }
    END { if (n == 0) { print "n/a"; exit }
          for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
          print (n % 2) ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2 }' "$out/values"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "n/a" }'; }
echo
echo "== raw values (tag measure value), $repeat round(s)"
cat "$out/values"
echo
echo "== medians of $repeat round(s) (failed runs left out), same guest boot; ratio = fusewire / perftest"
if [ -n "$base" ]; then
  printf '%-30s %12s %12s %12s %9s %9s\n' "measure" "perftest" "fusewire" "baseline" "fw/pt" "fw/base"
else
  printf '%-30s %12s %12s %9s\n' "measure" "perftest" "fusewire" "fw/pt"
fi
for m in "lat64:64 B latency us (lower=better)" "lat64k:64 KiB latency us (lower=b.)" \
         "bw64k:64 KiB bandwidth MiB/s" "bw4m:4 MiB bandwidth MiB/s"; do
  key=${m%%:*} label=${m#*:}
  p=$(median perftest "$key") f=$(median fusewire "$key")
  if [ -n "$base" ]; then
    b=$(median baseline "$key")
    printf '%-30s %12s %12s %12s %9s %9s\n' "$label" "$p" "$f" "$b" "$(ratio "$p" "$f")" "$(ratio "$b" "$f")"
  else
    printf '%-30s %12s %12s %9s\n' "$label" "$p" "$f" "$(ratio "$p" "$f")"
  fi
done
rm -rf "$out"
