#!/usr/bin/env python3
"""fwstat against a small job: the embedding example (1 PS + 2 workers) runs
with counter dumps every 100 ms; fwstat reads them while it runs and after it
ended. Asserts that the live table appears, that every (task, peer) pair with
traffic has a row with bytes moving, and that the final dumps agree: what each
worker sent the PS, the PS received.

usage: fwstat_job.py FWSTAT EMBEDDING_EXE
"""

import json
import os
import subprocess
import sys
import tempfile
import time


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def last_records(d):
    out = {}
    for name in os.listdir(d):
        with open(os.path.join(d, name), encoding="utf-8") as f:
            lines = [l for l in f.read().splitlines() if l.strip()]
        if lines:
            r = json.loads(lines[-1])
            out[r["task"]] = {p["peer"]: p for p in r["peers"]}
    return out


def main():
    fwstat, exe = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="fusewire_fwstat_") as d:
        env = dict(os.environ, FUSEWIRE_STATS_FILE=os.path.join(d, "{task}.jsonl"), FUSEWIRE_STATS_INTERVAL_MS="100")
        job = subprocess.Popen([exe, "--ps", "1", "--workers", "2", "--steps", "400", "--batch", "64",
                                "--eval-examples", "1000", "--mode", "block", "--timeout", "100"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        live = None
        deadline = time.time() + 100
        while job.poll() is None and time.time() < deadline:
            time.sleep(0.3)
            r = subprocess.run([sys.executable, fwstat, "--once", d], capture_output=True, text=True)
            # A worker's row with rates (two dumps seen), while the job still runs.
            if r.returncode == 0 and any(l.startswith("worker:") and " ps:0 " in l and " - " not in l
                                         for l in r.stdout.splitlines()):
                live = r.stdout
        out, _ = job.communicate(timeout=max(1, deadline - time.time()))
        if job.returncode != 0:
            fail(f"the job exited with {job.returncode}:\n{out}")
        print("live table:\n" + (live or "(none)"))
        final = subprocess.run([sys.executable, fwstat, "--once", d], capture_output=True, text=True)
        print("final table:\n" + final.stdout + final.stderr)
        if final.returncode != 0:
            fail("fwstat --once failed")
        if live is None:
            fail("fwstat never showed a live row with a throughput while the job ran")
        table, _, usage = final.stdout.partition("\n\n")
        rows = [l.split() for l in table.splitlines()[1:]]
        pairs = {(r[0], r[1]) for r in rows if len(r) > 1}
        for task in ("ps:0", "worker:0", "worker:1"):
            # "- busy" when its newest two dumps are under a clock tick apart (the last one is written at close)
            if not any(l.startswith(task + ": reactor 0 ") and " busy, pool " in l
                       for l in usage.splitlines()):
                fail(f"no reactor line for {task} (busy share, pool use)")
        for need in [("worker:0", "ps:0"), ("worker:1", "ps:0"), ("ps:0", "worker:0"), ("ps:0", "worker:1")]:
            if need not in pairs:
                fail(f"no row for {need}")
        rec = last_records(d)
        for w in ("worker:0", "worker:1"):
            sent = rec[w]["ps:0"]
            got = rec["ps:0"][w]
            if sent["sends"] == 0 or sent["bytes_sent"] == 0:
                fail(f"{w} sent nothing to ps:0")
            # The PS's last dump is written when it closes, after every request it received.
            if got["recvs"] != sent["sends"] or got["bytes_received"] != sent["bytes_sent"]:
                fail(f"{w} sent {sent['sends']} ops / {sent['bytes_sent']} B, ps:0 received "
                     f"{got['recvs']} / {got['bytes_received']} B")
    print("PASS")


if __name__ == "__main__":
    main()
