"""Two TensorFlow processes exchange every dtype and size class (dead tensors
included) through fusewire's rendezvous ops on the default transport (auto:
shm on one host); byte-exact (see rendezvous_peer.py)."""

import os
import subprocess
import sys

import common


def main():
    cluster = common.cluster(0, 2)
    peer = os.path.join(common.HERE, "rendezvous_peer.py")
    procs = [subprocess.Popen([sys.executable, peer, role, cluster]) for role in ("recv", "send")]
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=240))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append("timeout")
    print("receiver exit %s, sender exit %s" % tuple(rcs))
    sys.exit(0 if rcs == [0, 0] else 1)


if __name__ == "__main__":
    main()
