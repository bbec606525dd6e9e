#!/usr/bin/env bash
# perftest reference numbers on the soft-RoCE QEMU guest: ib_write_bw and
# ib_send_lat (rdmacm, -R), server and client both in the guest on rxe0 /
# 192.0.2.1, for 64 B, 64 KiB and 4 MiB; prints a table, optionally JSON.
#
#   bench/rdma/perftest.sh [--json FILE] [--iters-scale F] [--timeout S] [-- CMD ARGS...]
#
# CMD (optional) runs in the same guest boot right after perftest, e.g.
# fusewire's own benchmark, so that ratios compare runs on the same guest.
# Its output follows the table's raw logs on stdout; its exit code is
# reported. Exit: 0 when every perftest run produced a number, 1 otherwise,
# 77 when QEMU cannot start here.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
sizes=(64 65536 4194304)

if [ "${1:-}" = "--in-guest" ]; then
  # Guest side: $2 = output folder, $3 = iteration scale, rest = CMD.
  out=$2 scale=$3; shift 3
  iters() {  # tool size -> iterations (small sizes need more to be stable)
    local n
    case $1:$2 in
      ib_write_bw:64) n=2000 ;; ib_write_bw:65536) n=400 ;; ib_write_bw:*) n=20 ;;
      ib_send_lat:64) n=500 ;; ib_send_lat:65536) n=100 ;; ib_send_lat:*) n=10 ;;
    esac
    n=$(awk -v n="$n" -v s="$scale" 'BEGIN { v = int(n * s); print (v < 5 ? 5 : v) }')
    echo "$n"
  }
  uname -r >"$out/kernel"
  # perftest times with rdtsc; guest vCPUs' TSCs differ, so keep each side on
  # one vCPU (server on 0, client on the last one).
  spin=() cpin=()
  last=$(( $(nproc) - 1 ))
  if command -v taskset >/dev/null; then spin=(taskset -c 0); cpin=(taskset -c "$last"); fi
  pair() {  # tool size iterations: one server + client run; 0 when the client succeeded
    local tool=$1 size=$2 n=$3 spid ok=1
    timeout 120 "${spin[@]}" $tool -R -F -d rxe0 -s "$size" -n "$n" >"$out/$tool.$size.server.log" 2>&1 &
    spid=$!
    sleep 1
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      if timeout 120 "${cpin[@]}" $tool -R -F -d rxe0 -s "$size" -n "$n" 192.0.2.1 \
           >"$out/$tool.$size.client.log" 2>&1; then ok=0; break; fi
      kill -0 $spid 2>/dev/null || break
      sleep 1
    done
    wait $spid
    return $ok
  }
  for tool in ib_write_bw ib_send_lat; do
    for size in "${sizes[@]}"; do
      n=$(iters $tool "$size")
      echo "$n" >"$out/$tool.$size.iters"
      # perftest calibrates rdtsc against gettimeofday; on a loaded host the fit
      # can fail ("Correlation coefficient ... < 0.9") and it then reports
      # 0.00 MB/s or inf us: run again, up to 3 times.
      for attempt in 1 2 3; do
        echo "perftest: $tool -s $size -n $n (attempt $attempt)" >&2
        if ! pair $tool "$size" "$n"; then
          echo "perftest: $tool -s $size failed" >&2
        elif ! grep -q 'Correlation coefficient' "$out/$tool.$size.client.log"; then
          break
        fi
      done
    done
  done
  if [ $# -gt 0 ]; then
    echo "perftest: running $*" >&2
    "$@"
    echo $? >"$out/cmd.rc"
  fi
  exit 0
fi

json=
scale=1
timeout_s=400
while [ $# -gt 0 ]; do
  case $1 in
    --json) json=${2:?}; shift 2 ;;
    --iters-scale) scale=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '6p' "$0" | sed 's/^# *//'; exit 0 ;;
    *) echo "perftest.sh: unknown option '$1' (allowed: --json FILE, --iters-scale F, --timeout S, -- CMD...)" >&2; exit 2 ;;
  esac
done
case $scale in ''|*[!0-9.]*) echo "perftest.sh: --iters-scale '$scale' is not a positive number" >&2; exit 2 ;; esac

mkdir -p "$repo/build"
out=$(mktemp -d "$repo/build/perftest.XXXXXX")
[ "${FUSEWIRE_PERFTEST_KEEP:-0}" = 1 ] && echo "perftest.sh: logs kept in $out" >&2 || trap 'rm -rf "$out"' EXIT
shares=(--share "$out")
[ -d /work ] && case $out/ in /work/*) shares=(--share /work) ;; *) shares+=(--share /work) ;; esac

start=$(date +%s)
"$repo/tests/qemu/run.sh" --timeout "$timeout_s" "${shares[@]}" -- \
  bash "$here/perftest.sh" --in-guest "$out" "$scale" "$@"
rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc = 77 ] && { echo "perftest.sh: skipped (QEMU cannot start here)"; exit 77; }
[ $rc = 0 ] || echo "perftest.sh: guest run exited $rc" >&2

# ib_write_bw client: "#bytes #iterations BW_peak BW_average MsgRate" (MB/sec = 2^20 B/s).
# ib_send_lat client: "#bytes #iter t_min t_max t_typical t_avg t_stdev p99 p99.9" (usec, one-way).
row() { awk -v s="$2" '$1 == s && $2 ~ /^[0-9]+$/ { print; exit }' "$out/$1.$2.client.log" 2>/dev/null; }
status=0
records=()
printf '\nperftest on soft-RoCE (rxe0) in QEMU/TCG, kernel %s, %s s total\n' "$(cat "$out/kernel" 2>/dev/null)" "$elapsed"
printf '%-12s %10s %7s %14s %14s %12s\n' test bytes iters bw_avg_MBps bw_peak_MBps msg_Mpps
for size in "${sizes[@]}"; do
  r=$(row ib_write_bw "$size")
  case $r in *' 0.00 '*|*inf*) r=; echo "  (ib_write_bw $size: perftest's clock calibration failed 3 times on this loaded host)" ;; esac
  if [ -z "$r" ]; then
    status=1; printf '%-12s %10s %7s %14s\n' ib_write_bw "$size" - FAILED
    tail -5 "$out/ib_write_bw.$size.client.log" 2>/dev/null | sed 's/^/  | /'
    continue
  fi
  set -- $r
  printf '%-12s %10s %7s %14s %14s %12s\n' ib_write_bw "$1" "$2" "$4" "$3" "$5"
  records+=("{\"test\": \"ib_write_bw\", \"bytes\": $1, \"iterations\": $2, \"bw_avg_MBps\": $4, \"bw_peak_MBps\": $3, \"msg_rate_Mpps\": $5}")
done
printf '%-12s %10s %7s %14s %14s %12s\n' test bytes iters lat_typ_us lat_avg_us lat_p99_us
for size in "${sizes[@]}"; do
  r=$(row ib_send_lat "$size")
  case $r in *inf*|*nan*) r=; echo "  (ib_send_lat $size: perftest's clock calibration failed 3 times on this loaded host)" ;; esac
  if [ -z "$r" ]; then
    status=1; printf '%-12s %10s %7s %14s\n' ib_send_lat "$size" - FAILED
    tail -5 "$out/ib_send_lat.$size.client.log" 2>/dev/null | sed 's/^/  | /'
    continue
  fi
  set -- $r
  printf '%-12s %10s %7s %14s %14s %12s\n' ib_send_lat "$1" "$2" "$5" "$6" "$8"
  records+=("{\"test\": \"ib_send_lat\", \"bytes\": $1, \"iterations\": $2, \"lat_typical_us\": $5, \"lat_avg_us\": $6, \"lat_min_us\": $3, \"lat_max_us\": $4, \"lat_p99_us\": $8}")
done
if [ -s "$out/cmd.rc" ]; then
  echo "perftest.sh: CMD exited $(cat "$out/cmd.rc")"
  [ "$(cat "$out/cmd.rc")" = 0 ] || status=1
fi

if [ -n "$json" ]; then
  {
    printf '{\n  "tool": "perftest",\n  "device": "rxe0",\n  "guest": "qemu-tcg",\n'
    printf '  "kernel": "%s",\n  "elapsed_s": %s,\n  "results": [\n' "$(cat "$out/kernel" 2>/dev/null)" "$elapsed"
    for i in "${!records[@]}"; do
      sep=,; [ "$i" = $(( ${#records[@]} - 1 )) ] && sep=
      printf '    %s%s\n' "${records[$i]}" "$sep"
    done
    printf '  ]\n}\n'
  } >"$json"
  echo "perftest.sh: wrote $json"
fi
exit $status
