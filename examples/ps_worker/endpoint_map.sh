#!/usr/bin/env bash
# An .endpoint_map applies to a task whose cluster comes from --cluster, as
# docs/ps.md says: a PS given "ps=localhost:A" listens for tensors on the
# map's address for it, and a map that lacks a task is an error naming it.
# Loopback only. Usage: endpoint_map.sh PATH/ps_worker
set -u
exe=$1
dir=$(mktemp -d) || exit 1
ps_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [[ -n $ps_pid ]]; then kill "$ps_pid" 2>/dev/null; wait "$ps_pid" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# Three free loopback ports: the PS's and the worker's control addresses, and
# the PS's fast-path address in the map.
read -r control fast worker < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
cluster="ps=localhost:$control;worker=localhost:$worker"
export TF_SEASTAR_ENDPOINT_MAP_PATH=$dir

# A map without the worker: the task refuses to start and names the file and the task.
printf 'localhost:%s = 127.0.0.1:%s\n' "$control" "$fast" >"$dir/.endpoint_map"
"$exe" --role ps --task 0 --cluster "$cluster" --mode block >"$dir/out" 2>"$dir/err"
rc=$?
want="$dir/.endpoint_map has no entry for worker 0 (localhost:$worker)"
if [[ $rc -eq 0 ]] || ! grep -qF -- "$want" "$dir/err"; then
  fail "ps_worker --role ps --cluster with an incomplete map exited $rc without: $want"
  cat "$dir/out" "$dir/err"
fi

# A whole map: the PS listens on its fast-path address, not on its control address.
printf '# control = fast path\nlocalhost:%s = 127.0.0.1:%s\nlocalhost:%s = 127.0.0.1:%s\n' \
  "$control" "$fast" "$worker" "$worker" >"$dir/.endpoint_map"
# Over TCP (not auto's shm on loopback), so that /dev/tcp sees where it listens.
"$exe" --role ps --task 0 --cluster "$cluster" --mode block --transport asio >"$dir/out" 2>"$dir/err" &
ps_pid=$!
listening=false
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$fast") 2>/dev/null; then listening=true; break; fi
  if ! kill -0 "$ps_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if ! $listening; then
  fail "the PS did not listen on its mapped address 127.0.0.1:$fast"
  cat "$dir/out" "$dir/err"
elif (exec 3<>"/dev/tcp/127.0.0.1/$control") 2>/dev/null; then
  fail "the PS listens on its control address $control although the map moves it to $fast"
fi

exit $failed
