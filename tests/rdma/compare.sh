#!/bin/sh
# Runs perftest (ib_send_lat / ib_write_bw over rdmacm, -R) and fusewire's
# verbs_bench on the same device in the same (guest) run and prints the ratios
# for 64 B latency, 64 KiB and 4 MiB bandwidth.
#
#   tests/rdma/compare.sh BUILD_DIR              (inside the guest, or on RDMA hardware)
#   /work/wt/qemu/tests/qemu/run.sh --timeout 900 -- tests/rdma/compare.sh BUILD_DIR
#
# Env: FUSEWIRE_RDMA_TEST_ADDR (default 192.0.2.1), TF_RDMA_DEV_NAME (default rxe0).
# perftest's MB/sec are MiB/s (2^20 bytes); verbs_bench prints MiB/s too.
set -u
build=${1:?usage: compare.sh BUILD_DIR}
addr=${FUSEWIRE_RDMA_TEST_ADDR:-192.0.2.1}
dev=${TF_RDMA_DEV_NAME:-rxe0}
out=$(mktemp -d)
for tool in ib_send_lat ib_write_bw; do
  command -v $tool >/dev/null 2>&1 || { echo "compare.sh: $tool not found (apt-get install perftest)"; exit 77; }
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

echo "== perftest ib_send_lat -R -s 64"
perf ib_send_lat -s 64 -n 2000 | tee "$out/lat.txt"
echo "== perftest ib_write_bw -R -s 65536"
perf ib_write_bw -s 65536 -n 1000 | tee "$out/bw64k.txt"
echo "== perftest ib_write_bw -R -s 4194304"
perf ib_write_bw -s 4194304 -n 32 | tee "$out/bw4m.txt"
echo "== fusewire verbs_bench"
TF_RDMA_DEV_NAME=$dev "$build/tests/rdma/verbs_bench" --iterations 2000 | tee "$out/fw.txt"

# The data line follows perftest's column header; t_avg is column 6, BW average column 4.
p_lat=$(awk '/t_avg/ {getline; print $6; exit}' "$out/lat.txt")
p_bw64k=$(awk '/BW average/ {getline; print $4; exit}' "$out/bw64k.txt")
p_bw4m=$(awk '/BW average/ {getline; print $4; exit}' "$out/bw4m.txt")
f_lat=$(awk '/RESULT fusewire send_lat/ {print $6}' "$out/fw.txt")
f_bw64k=$(awk '/RESULT fusewire write_bw 65536/ {print $6}' "$out/fw.txt")
f_bw4m=$(awk '/RESULT fusewire write_bw 4194304/ {print $6}' "$out/fw.txt")
echo
echo "== fusewire verbs vs perftest (same guest, same run)"
printf '%-28s %14s %14s %10s\n' "measure" "perftest" "fusewire" "ratio"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "n/a" }'; }
printf '%-28s %11s us %11s us %10s\n' "64 B latency (lower=better)" "$p_lat" "$f_lat" "$(ratio "$p_lat" "$f_lat")"
printf '%-28s %8s MiB/s %8s MiB/s %10s\n' "64 KiB bandwidth" "$p_bw64k" "$f_bw64k" "$(ratio "$p_bw64k" "$f_bw64k")"
printf '%-28s %8s MiB/s %8s MiB/s %10s\n' "4 MiB bandwidth" "$p_bw4m" "$f_bw4m" "$(ratio "$p_bw4m" "$f_bw4m")"
rm -rf "$out"
