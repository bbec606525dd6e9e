#!/bin/sh
# Runs the tf_rendezvous example the ways its --help offers and checks its
# exit status and the lines a person reads. Usage: check.sh PATH/tf_rendezvous
exe=$1
out=$(mktemp) || exit 1
err=$(mktemp) || exit 1
trap 'rm -f "$out" "$err"' EXIT
failed=0
shown=""

# run STATUS ARGS...: runs the example, expecting exit status STATUS.
run() {
  want=$1
  shift
  shown="tf_rendezvous $*"
  "$exe" "$@" >"$out" 2>"$err"
  got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: $shown exited $got, expected $want; it printed:"
    cat "$out" "$err"
    failed=1
  fi
}

# has stdout|stderr TEXT: the last run printed TEXT (a whole line piece, literally).
has() {
  file=$out
  [ "$1" = stderr ] && file=$err
  if ! grep -qF -- "$2" "$file"; then
    echo "FAIL: $shown: $1 lacks: $2"
    echo "--- $1 was:"
    cat "$file"
    failed=1
  fi
}

run 0 --help
has stdout "usage: tf_rendezvous [--protocol NAME] [--tensor-fuse[=BOOL]]"

run 0
has stdout "session: protocol star_server, tensor_fuse off -> partition mode star_server"
has stdout "graph: 25 nodes (ps:0 6, ps:1 4, worker:0 15)"
has stdout "per step: 6 messages (3 calls), 10 tensors, 224 bytes"
has stdout "  grpc              10 / 6"
has stdout "  star_server       6 / 6   <- this session"
has stdout "   1    1.992564         6       10     224"
has stdout "   3    0.124535         6       10     224"
has stdout "results match one process running the whole graph: yes"
has stdout "  receiver     /job:ps/replica:0/task:1/device:CPU:0 -> task ps:1 at localhost:2224"
has stdout "  channel key  /job:worker/replica:0/task:0/device:CPU:0;7f3a9c21b4e8d0aa;/job:ps/replica:0/task:1/device:CPU:0;edge_12_ids_1;0:0"

run 0 --protocol grpc++ --tensor-fuse --steps 1
has stdout "session: protocol grpc++, tensor_fuse on -> partition mode send_recv"
has stdout "plan: send_recv, tensor_fuse on, 3 tasks"

# Without --tensor-fuse the session takes TENSOR_FUSE from the environment;
# the command line wins over it.
export TENSOR_FUSE=true
run 0 --protocol grpc --steps 1
has stdout "session: protocol grpc, tensor_fuse on -> partition mode send_recv"
has stdout "plan: send_recv, tensor_fuse on, 3 tasks"
has stdout "per step: 6 messages"
run 0 --protocol grpc --tensor-fuse=false --steps 1
has stdout "session: protocol grpc, tensor_fuse off -> partition mode send_recv"
has stdout "per step: 10 messages"
export TENSOR_FUSE=maybe
run 2
has stderr "TENSOR_FUSE='maybe': expected a boolean (true/false, 1/0, yes/no, on/off)"
unset TENSOR_FUSE

run 0 --protocol=grpc --loop
has stdout "per iteration of frame 'scale/while': 3 messages, 3 tensors, 12 bytes"
has stdout "  star_server_lite  refused / refused"
has stdout "   1    1.993677        22       22     264"
has stdout "results match one process running the whole graph: yes"

# The same steps with one process per task over loopback: the same losses and
# traffic over every transport; auto picks shm, every task being on this host.
for transport in asio uring auto; do
  run 0 --processes $transport
  case $transport in
    auto) has stdout "steps: 3 processes, one per task, over loopback (shm)" ;;
    *) has stdout "steps: 3 processes, one per task, over loopback (${transport}_tcp)" ;;
  esac
  has stdout "   1    1.992564         6       10     224"
  has stdout "   3    0.124535         6       10     224"
  has stdout "results match one process running the whole graph: yes"
done
run 0 --processes asio --protocol grpc --loop
has stdout "   1    1.993677        22       22     264"
has stdout "results match one process running the whole graph: yes"

run 0 --key '/job:worker/replica:0/task:0/cpu:0;BEEF;/job:ps/task:0/device:CPU:0;w/read;3:1'
has stdout "  tensor       w/read (frame 3, iteration 1, sender incarnation 000000000000beef)"
has stdout "  channel key  /job:worker/replica:0/task:0/cpu:0;000000000000beef;/job:ps/task:0/device:CPU:0;w/read;3:1"

run 2 --protocol grpc+verbs
has stderr "tf_rendezvous: unknown protocol 'grpc+verbs' (allowed: grpc, grpc++, star_server, star_server_lite)"

run 2 --tensor-fuse=maybe
has stderr "tensor_fuse='maybe': expected a boolean (true/false, 1/0, yes/no, on/off)"

run 2 --key '/job:worker/task:0;1;/job:ps/task:0;t'
has stderr "bad rendezvous key '/job:worker/task:0;1;/job:ps/task:0;t': it has 4 part(s)"

run 2 --processes tcp
has stderr "tf_rendezvous: --processes tcp: unknown transport; expected one of auto, "

run 2 --steps 0
has stderr "tf_rendezvous: --steps 0: expected a whole number from 1 to 1000 (see --help)"

run 2 --frobnicate
has stderr "tf_rendezvous: unknown option '--frobnicate' (see --help)"

run 1 --protocol star_server_lite --loop
has stderr "star_server_lite cannot merge the ps graphs: the graph has loop frame 'scale/while'"

exit $failed
