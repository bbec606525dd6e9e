#!/usr/bin/env bash
# The Fashion-MNIST trainer over RDMA verbs must train exactly as over TCP:
# 2 PS + 2 sync workers, seed 7, once over asio_tcp on loopback and once over
# verbs on the RDMA interface; every step's loss of every worker and the final
# accuracy must be identical (sync training with a fixed seed is deterministic),
# and the accuracy must clear --min-accuracy.
#
#   verbs_vs_tcp.sh PS_WORKER_EXE
#
# Runs in the soft-RoCE QEMU guest (suite 'rdma'): FUSEWIRE_RDMA_TEST_ADDR is the
# address of the RDMA interface (default 192.0.2.1, the guest's rxe0 netdev).
# Exit 0 = pass, 1 = fail, 77 = skipped (no dataset, or no RDMA device outside
# the guest).
set -u
exe=${1:?usage: verbs_vs_tcp.sh PS_WORKER_EXE}
addr=${FUSEWIRE_RDMA_TEST_ADDR:-192.0.2.1}
work=$(mktemp -d /tmp/fw-verbs-vs-tcp.XXXXXX)
trap 'rm -rf "$work"' EXIT
say() { printf 'verbs_vs_tcp: %s\n' "$*"; }

if ! ls /sys/class/infiniband/ 2>/dev/null | grep -q .; then
  if [ "${FUSEWIRE_RDMA_REQUIRED:-0}" = 1 ]; then say "FAIL: no RDMA device"; exit 1; fi
  say "SKIP: no RDMA device here (the rdma suite runs in tests/qemu)"; exit 77
fi

# Small registered memory: the guest has 2 GiB for four processes.
export TF_RDMA_DEV_NAME=${TF_RDMA_DEV_NAME:-rxe0}
train=(--ps 2 --workers 2 --sync --seed 7 --epochs 1 --batch 50 --train-limit 2000 --test-limit 500
       --hidden 32 --mode block --log-every 1 --check-loss --min-accuracy 0.4 --timeout 240
       --skip-if-no-data)

# result FILE: every step's loss per worker and the accuracy, in a fixed order.
result() {
  grep -E '^\[worker:[0-9]+\] step ' "$1" | sort -s -k1,1 | awk '{ print $1, $3, $7 }'
  grep -E 'test accuracy' "$1" | sed 's/.*test accuracy/accuracy/'
}

for t in asio verbs; do
  host=127.0.0.1
  [ $t = verbs ] && host=$addr
  start=$SECONDS
  "$exe" "${train[@]}" --transport $t --host "$host" >"$work/$t.out" 2>&1
  rc=$?
  if [ $rc = 77 ]; then say "SKIP: $(tail -1 "$work/$t.out")"; exit 77; fi
  if [ $rc != 0 ]; then
    # The verdict first, then every line that is not a step line (errors,
    # lost peers, stall reports, the launcher's summary): a log cut short
    # after its first lines still says why.
    say "FAIL: the $t run exited with $rc after $((SECONDS - start)) s; its lines other than steps:"
    grep -v '\] step ' "$work/$t.out" | tail -40
    echo "--- its last step lines:"
    grep '\] step ' "$work/$t.out" | tail -4
    exit 1
  fi
  result "$work/$t.out" >"$work/$t.result"
  say "$t run passed in $((SECONDS - start)) s: $(tail -1 "$work/$t.result"), $(grep -c ' step ' "$work/$t.out") step lines"
done
if [ "$(grep -c . "$work/asio.result")" -lt 10 ]; then
  cat "$work/asio.out" | tail -20
  say "FAIL: too few result lines in the TCP run"
  exit 1
fi
if ! diff -u "$work/asio.result" "$work/verbs.result" >"$work/diff"; then
  head -40 "$work/diff"
  say "FAIL: the verbs run's losses or accuracy differ from the TCP run's"
  exit 1
fi
say "identical: $(wc -l <"$work/asio.result") lines (every step's loss of both workers, the accuracy)"
