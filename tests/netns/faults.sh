#!/usr/bin/env bash
# Fault injection on a cluster of network namespaces: real ps_worker training
# (1 PS + 2 workers, sync, fixed seed) with each task on its own "host" (a
# namespace) wired by a veth to a bridge in a "switch" namespace, 10.213.0.0/24.
#
#   faults.sh PS_WORKER SCENARIO
#
#   baseline     two clean runs: both pass their own checks (loss goes down,
#                accuracy above the floor) and give the same result, bit for bit
#   delay        every switch port delays (netem) or rate-limits (tbf) its traffic
#   loss         5% of the packets are dropped (netem, or iptables' statistic match)
#   link_cut     the PS's switch port goes down for a few seconds mid-training
#   link_cut_long  worker 1's switch port goes down for longer than the
#                keepalive and four of the workers' resend intervals
#   ps_vanishes  the PS's port goes down for good and the PS is SIGKILLed
#   worker_partitioned  worker 1's port goes down for good (keepalive 2 s)
#
# A fault that the network can recover from must leave the result exactly as a
# clean run in the same namespaces gives it (the loss of every step, the final
# accuracy). A vanished PS must make every worker exit non-zero within
# --step-timeout plus a margin, naming the PS and the timeout; a partitioned
# worker must make the PS drop it by keepalive and fail worker 0's step
# naming it, and fail itself by its step timeout naming the PS.
#
# Needs root (namespaces, tc, iptables). Exit status: 0 passed, 1 failed,
# 77 skipped (no namespaces here, or no Fashion-MNIST), with the reason.
# Touches nothing outside the namespaces it creates (fwf-<pid>-*), and deletes
# them and its processes on every exit.
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 PS_WORKER baseline|delay|loss|link_cut|link_cut_long|ps_vanishes|worker_partitioned" >&2
  exit 2
fi
exe=$1
scenario=$2
case "$scenario" in
  baseline | delay | loss | link_cut | link_cut_long | ps_vanishes | worker_partitioned) ;;
  *)
    echo "$0: unknown scenario '$scenario'" \
      "(allowed: baseline delay loss link_cut link_cut_long ps_vanishes worker_partitioned)" >&2
    exit 2
    ;;
esac

data=/usr/share/datasets/fashion-mnist
# --step-timeout: ps_worker's 60 s where the run must survive the fault (after
# a cut, TCP's retransmission backoff alone can take longer than the cut);
# 10 s where a task vanishes, which must then fail the workers within
# step_timeout (or the keepalive's judgement) + vanish_margin.
step_timeout=60
keepalive_ms=10000  # FUSEWIRE_KEEPALIVE_MS: a peer silent for 2x this is dropped
case "$scenario" in
  ps_vanishes) step_timeout=10 ;;
  worker_partitioned) step_timeout=10 keepalive_ms=2000 ;;
esac
vanish_margin=10
run_limit=90     # seconds a clean or recoverable run may take before it counts as hung
loss_percent=5
cut_port=ps0
cut_seconds=4
if [ "$scenario" = link_cut_long ]; then
  # Longer than four resends of the waiting worker's step (2 s apart), and
  # than FUSEWIRE_KEEPALIVE_MS (a ping is due in it), shorter than the
  # twice that after which keepalive drops a silent peer.
  cut_port=w1
  cut_seconds=12
fi
# Every step's loss is printed (--log-every 1) and compared. Delay and loss
# slow every step down, so their run is short (30 steps per worker); a cut or
# a vanished PS must land mid-training, so theirs is long (1500 steps, a few
# seconds: the fault comes at step 20).
long_batch=20
train=(--sync --seed 7 --epochs 1 --hidden 32 --test-limit 1000 --mode block --log-every 1 --check-loss
       --min-accuracy 0.5 --step-timeout "$step_timeout" --data "$data")
case "$scenario" in
  baseline | delay | loss) train+=(--batch 50 --train-limit 3000) ;;
  *) train+=(--batch "$long_batch" --train-limit 60000) ;;
esac
fault_step=20

prefix=fwf-$$
sw=$prefix-sw
hosts=(ps0 w0 w1)
declare -A addr=([ps0]=10.213.0.1 [w0]=10.213.0.11 [w1]=10.213.0.12)
cluster="ps=${addr[ps0]}:7000;worker=${addr[w0]}:7000,${addr[w1]}:7000"
namespaces=()
work=$(mktemp -d /tmp/fwf-$$.XXXXXX)

cleanup() {
  local pid ns
  # Only this script's own children that still run (jobs -p): never a reused pid.
  for pid in $(jobs -p); do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "netns: interrupted"; exit 1' INT TERM

say() { printf 'netns %s: %s\n' "$scenario" "$*"; }
skip() { say "SKIP: $*"; exit 77; }
die() { say "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
ns_of() { echo "$prefix-$1"; }
in_sw() { ip netns exec "$sw" "$@"; }

# ---- preconditions ----------------------------------------------------------
[ -x "$exe" ] || die "ps_worker '$exe' is not an executable"
compgen -G "$data/train-images-idx3-ubyte*" >/dev/null ||
  skip "Fashion-MNIST is not in $data (apt-get install dataset-fashion-mnist)"
if ! err=$(ip netns add "$sw" 2>&1); then
  skip "cannot create a network namespace (needs root and CAP_SYS_ADMIN): $err"
fi
namespaces+=("$sw")

# ---- topology: a switch namespace with a bridge, a namespace per host --------
setup_topology() {
  local h ns
  ip -n "$sw" link set lo up &&
    ip -n "$sw" link add br0 type bridge &&
    ip -n "$sw" link set br0 up || return 1
  for h in "${hosts[@]}"; do
    ns=$(ns_of "$h")
    ip netns add "$ns" || return 1
    namespaces+=("$ns")
    # Both ends are created inside namespaces: the root namespace never sees them.
    ip -n "$sw" link add "$h" type veth peer name eth0 netns "$ns" &&
      ip -n "$sw" link set "$h" master br0 up &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" addr add "${addr[$h]}/24" dev eth0 &&
      ip -n "$ns" link set eth0 up || return 1
  done
}
setup_topology || die "could not build the namespace topology"

# A non-loopback cluster needs a token; a file keeps it out of every environment.
token_file=$work/token
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$token_file")

# ---- running the cluster ----------------------------------------------------
declare -A pid_of
run_dir=
run_started=0
rc=

# start_cluster LABEL: starts the PS and both workers, outputs in $work/LABEL/.
start_cluster() {
  run_dir=$work/$1
  mkdir -p "$run_dir"
  local h role task
  for h in "${hosts[@]}"; do
    case "$h" in
      ps0) role=ps task=0 ;;
      w0) role=worker task=0 ;;
      w1) role=worker task=1 ;;
    esac
    ip netns exec "$(ns_of "$h")" env -u FUSEWIRE_CLUSTER_TOKEN FUSEWIRE_CLUSTER_TOKEN_FILE="$token_file" \
      FUSEWIRE_KEEPALIVE_MS="$keepalive_ms" \
      "$exe" --role "$role" --task "$task" --cluster "$cluster" "${train[@]}" \
      >"$run_dir/$h.out" 2>"$run_dir/$h.err" &
    pid_of[$h]=$!
  done
}

# wait_exit HOST SECONDS: waits for HOST's process; sets rc to its exit
# status, or to "running" if it has not exited within SECONDS.
wait_exit() {
  local pid=${pid_of[$1]} end
  end=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$end" ]; then rc=running; return; fi
    sleep 0.1
  done
  wait "$pid"
  rc=$?
}

show_output() {
  local h
  for h in "${hosts[@]}"; do
    echo "--- $h stdout (last lines)"; tail -n 8 "$run_dir/$h.out"
    echo "--- $h stderr"; tail -n 20 "$run_dir/$h.err"
  done
}

# finish_cluster: every task must exit 0 within run_limit of the run's start.
# The PS stops when worker 0 tells it to at the end: after a failed worker it
# would serve on, so it is not waited for then.
finish_cluster() {
  local h left bad=0
  for h in w0 w1 ps0; do
    [ "$h" = ps0 ] && [ "$bad" -ne 0 ] && break
    left=$((run_limit - SECONDS + run_started))
    [ "$left" -lt 1 ] && left=1
    wait_exit "$h" "$left"
    if [ "$rc" = running ]; then
      say "$h still running ${run_limit} s after the start: hung"
      bad=1
    elif [ "$rc" -ne 0 ]; then
      say "$h exited with status $rc"
      bad=1
    fi
  done
  if [ "$bad" -ne 0 ]; then show_output; return 1; fi
}

# wait_for_step N: until worker 0 has printed step N (or has exited).
wait_for_step() {
  local end=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$end" ]; do
    grep -qE "^step +$1/" "$run_dir/w0.out" 2>/dev/null && return 0
    kill -0 "${pid_of[w0]}" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# The result of a run: every step's loss and the summary line of both workers,
# and worker 0's test accuracy; the timings are left out.
result_of() {
  local h
  for h in w0 w1; do
    awk -v h="$h" '/^step / { print h, "step", $2, "loss", $6 }
      /^@result / { for (i = 2; i <= NF; ++i) if ($i ~ /^(task|steps|samples|first_loss|last_loss)=/) printf "%s %s ", h, $i; print "" }' \
      "$1/$h.out"
  done
  grep '^@accuracy' "$1/w0.out"
}

# run_clean LABEL: one run without faults; it must pass.
run_clean() {
  local t0
  t0=$(now)
  run_started=$SECONDS
  start_cluster "$1"
  finish_cluster || die "the $1 run failed"
  say "$1 run passed in $(elapsed "$t0") s: $(grep '^worker 0: test accuracy' "$work/$1/w0.out")"
}

# same_result A B: the two runs' results must be identical.
same_result() {
  result_of "$work/$1" >"$work/$1.result"
  result_of "$work/$2" >"$work/$2.result"
  [ -s "$work/$1.result" ] || die "no result lines in the $1 run"
  if ! diff -u "$work/$1.result" "$work/$2.result" >"$work/diff"; then
    head -40 "$work/diff"
    die "the $2 run's result differs from the $1 run's (a silent wrong result)"
  fi
  say "the $2 run's result is identical to the $1 run's ($(wc -l <"$work/$1.result") lines: every step's loss, the accuracy)"
}

# ---- fault methods ------------------------------------------------------------
# netem when the kernel has it (probed once, on the switch's loopback);
# otherwise tbf for a slow link and iptables' statistic match for loss.
have_netem=0
if in_sw tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
  have_netem=1
  in_sw tc qdisc del dev lo root 2>/dev/null
fi
iptables_cmd=
for c in iptables iptables-legacy; do
  if command -v "$c" >/dev/null; then iptables_cmd=$c; break; fi
done

# Every packet leaves the switch through exactly one host port: shaping each
# port's egress affects both directions of every connection once.
add_delay() {
  local h
  if [ "$have_netem" -eq 1 ]; then
    say "delay: netem delay 20ms on every switch port (40 ms more per round trip)"
    for h in "${hosts[@]}"; do in_sw tc qdisc add dev "$h" root netem delay 20ms || return 1; done
  else
    say "delay: this kernel has no netem; tbf on every switch port instead (a 10 Mbit/s link, queueing delay up to 200 ms)"
    for h in "${hosts[@]}"; do
      in_sw tc qdisc add dev "$h" root tbf rate 10mbit burst 16kb latency 200ms || return 1
    done
  fi
}

add_loss() {
  local h
  if [ "$have_netem" -eq 1 ]; then
    say "loss: netem loss ${loss_percent}% on every switch port"
    for h in "${hosts[@]}"; do in_sw tc qdisc add dev "$h" root netem loss "${loss_percent}%" || return 1; done
  elif [ -n "$iptables_cmd" ]; then
    say "loss: this kernel has no netem; $iptables_cmd -m statistic drops ${loss_percent}% of every host's input instead"
    for h in "${hosts[@]}"; do
      ip netns exec "$(ns_of "$h")" "$iptables_cmd" -A INPUT -i eth0 -m statistic --mode random \
        --probability "$(awk -v p="$loss_percent" 'BEGIN { print p / 100 }')" -j DROP || return 1
    done
  else
    skip "loss needs netem or iptables, and this machine has neither (apt-get install iptables)"
  fi
}

# Packets the loss rules dropped, over every host.
dropped_packets() {
  local h n total=0
  for h in "${hosts[@]}"; do
    if [ "$have_netem" -eq 1 ]; then
      n=$(in_sw tc -s qdisc show dev "$h" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
    else
      n=$(ip netns exec "$(ns_of "$h")" "$iptables_cmd" -L INPUT -v -n -x | awk '$3 == "DROP" { s += $1 } END { print s + 0 }')
    fi
    total=$((total + ${n:-0}))
  done
  echo "$total"
}

# check_mid_training: the fault came before either worker finished.
check_mid_training() {
  if grep -q '^@result' "$run_dir/w0.out" "$run_dir/w1.out"; then
    die "training ended before the fault: it did not test anything (make the run longer)"
  fi
}

# expect_failure HOST SECONDS PATTERN: HOST must exit non-zero within SECONDS
# of the fault (fault_at, t0) with PATTERN (an extended regular expression) in
# its error output; sets bad=1 if not.
expect_failure() {
  local h=$1 limit=$2 pattern=$3 msg
  wait_exit "$h" "$((limit - SECONDS + fault_at))"
  if [ "$rc" = running ]; then
    say "$h still running $limit s after the fault: hung"
    bad=1
    return
  fi
  msg=$(grep -m1 'ps_worker:' "$run_dir/$h.err")
  say "$h exited with status $rc after $(elapsed "$t0") s (limit $limit s): ${msg:-<no error message>}"
  if [ "$rc" -eq 0 ]; then
    say "$h exited 0 after the fault"
    bad=1
  elif ! grep -qE "$pattern" "$run_dir/$h.err"; then
    say "$h's error does not name the cause ('$pattern')"
    bad=1
  fi
}

# ---- scenarios ------------------------------------------------------------------
case "$scenario" in
  baseline)
    run_clean reference
    run_clean again
    same_result reference again
    ;;

  delay | loss)
    run_clean reference
    "add_$scenario" || die "could not set up the $scenario"
    run_clean "$scenario"
    if [ "$scenario" = loss ]; then
      n=$(dropped_packets)
      say "the loss rules dropped $n packets"
      [ "$n" -gt 0 ] || die "no packet was dropped: the loss did not test anything"
    fi
    same_result reference "$scenario"
    ;;

  link_cut | link_cut_long)
    run_clean reference
    t0=$(now)
    run_started=$SECONDS
    start_cluster cut
    wait_for_step "$fault_step" || { show_output; die "worker 0 did not reach step $fault_step"; }
    say "cutting $cut_port's switch port for $cut_seconds s at worker 0's step $fault_step"
    in_sw ip link set "$cut_port" down || die "ip link set $cut_port down failed"
    sleep "$cut_seconds"
    in_sw ip link set "$cut_port" up || die "ip link set $cut_port up failed"
    check_mid_training
    finish_cluster || die "the run with the link cut failed"
    for h in "${hosts[@]}"; do sed "s/^/  $h: /" "$run_dir/$h.err"; done  # what the tasks logged about it
    say "the run with the cut passed in $(elapsed "$t0") s"
    same_result reference cut
    ;;

  ps_vanishes)
    run_started=$SECONDS
    start_cluster vanish
    wait_for_step "$fault_step" || { show_output; die "worker 0 did not reach step $fault_step"; }
    say "PS vanishes at worker 0's step $fault_step: its switch port goes down and it is SIGKILLed"
    t0=$(now)
    fault_at=$SECONDS
    in_sw ip link set ps0 down || die "ip link set ps0 down failed"
    kill -9 "${pid_of[ps0]}"
    wait "${pid_of[ps0]}" 2>/dev/null
    check_mid_training
    limit=$((step_timeout + vanish_margin))
    bad=0
    expect_failure w0 "$limit" "ps:0( lane [0-9]+)? did not answer within $((step_timeout * 1000)) ms"
    expect_failure w1 "$limit" "ps:0( lane [0-9]+)? did not answer within $((step_timeout * 1000)) ms"
    if [ "$bad" -ne 0 ]; then show_output; die "the workers did not fail cleanly when the PS vanished"; fi
    ;;

  worker_partitioned)
    run_started=$SECONDS
    start_cluster partition
    wait_for_step "$fault_step" || { show_output; die "worker 0 did not reach step $fault_step"; }
    say "worker 1 is cut off for good at worker 0's step $fault_step (FUSEWIRE_KEEPALIVE_MS=$keepalive_ms)"
    t0=$(now)
    fault_at=$SECONDS
    in_sw ip link set w1 down || die "ip link set w1 down failed"
    check_mid_training
    bad=0
    # The PS drops worker 1 after 2 keepalive intervals without a pong (a ping
    # goes out at most one interval after the cut) and fails the step that
    # waits for it; worker 1 hears nothing and fails by its step timeout.
    # Worker 0's error names keepalive as the cause, not the bare reset the
    # PS's receive got.
    expect_failure w0 "$((3 * keepalive_ms / 1000 + vanish_margin))" \
      "worker:1 was lost \((did not answer keepalive pings|deadline exceeded \(no frame for [0-9]+ ms \(keepalive)"
    expect_failure w1 "$((step_timeout + vanish_margin))" "ps:0( lane [0-9]+)? did not answer within $((step_timeout * 1000)) ms"
    if [ "$bad" -ne 0 ]; then show_output; die "the workers did not fail cleanly when worker 1 was cut off"; fi
    ;;
esac
say "PASS"
