"""A fusewire PS process without TensorFlow's Python (starts in a fraction of
a second):

    python fusewire_tf/serve.py --task ps:0 --cluster "ps=h:p,h:p;worker=h:p" --model model.json [--mode sync]
        [--transport auto|uring|asio|shm|shm+asio|shm+uring|verbs]

The model file is the JSON model spec the workers pass to configure(); the
transport is theirs too ("auto" unless they name one). Exits
when a worker calls fusewire_tf.shutdown_ps(), or on SIGINT/SIGTERM.
"""

import argparse
import json
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _clib  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--model", required=True, help="JSON model spec file")
    p.add_argument("--mode", default="async", choices=["async", "sync"])
    p.add_argument("--worker-job", default="worker")
    p.add_argument("--transport", default="auto",
                   help="auto (default) or a name fusewire_tf.available_transports() lists: the one the workers use")
    a = p.parse_args()
    with open(a.model) as f:
        model = json.load(f)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: _clib.stop_serving())
    # On a thread: the main thread stays free to run the signal handlers.
    failure = []

    def run():
        try:
            _clib.serve_ps(a.task, a.cluster, model, a.mode, a.worker_job, a.transport)
        except _clib.Error as e:
            failure.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    while t.is_alive():
        t.join(0.2)
    if failure:
        sys.exit(failure[0])


if __name__ == "__main__":
    main()
