#!/usr/bin/env python3
"""ps_bench_smoke: one tiny sweep (2 PS x 2 workers, 10 floats and 1 KiB,
push and pull) must write a JSON with every field and non-zero rates; a bad
argument must fail with a message naming it."""
import json
import os
import subprocess
import sys
import tempfile

exe = sys.argv[1]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "ps_bench.json")
    run = subprocess.run(
        [exe, "--ps", "2", "--workers", "2", "--floats", "10,256", "--op", "push,pull",
         "--warmup", "0.1", "--time", "0.3", "--transport", "auto", "--json", path],
        capture_output=True, text=True, timeout=50)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    check(run.returncode == 0, f"sweep exited {run.returncode}")
    check("RPC/s" in run.stdout, "no table in the output")
    if os.path.exists(path):
        doc = json.load(open(path))
        for key in ("ps_bench", "host", "settings", "results"):
            check(key in doc, f"JSON lacks '{key}'")
        results = doc.get("results", [])
        check(len(results) == 4, f"{len(results)} results, expected 4 (2 sizes x 2 ops)")
        seen = set()
        for r in results:
            name = f"{r.get('op')} {r.get('floats')}"
            seen.add((r.get("op"), r.get("floats")))
            for key in ("ok", "rpc_per_s", "mb_per_s", "calls", "seconds", "latency", "usage", "bytes_per_rpc",
                        "transport", "steps", "ps_requests_total"):
                check(key in r, f"{name}: lacks '{key}'")
            check(r.get("ok") is True, f"{name}: not ok ({r.get('error')})")
            check(r.get("rpc_per_s", 0) > 0, f"{name}: rpc_per_s is 0")
            check(r.get("mb_per_s", 0) > 0, f"{name}: mb_per_s is 0")
            check(r.get("calls", 0) == 2 * r.get("steps", -1), f"{name}: calls != steps x 2 PS")
            lat = r.get("latency", {})
            check(0 < lat.get("p50_us", 0) <= lat.get("p99_us", 0), f"{name}: latency p50/p99 {lat}")
            roles = sorted(u.get("role") for u in r.get("usage", []))
            check(roles == ["ps", "ps", "worker", "worker"], f"{name}: usage roles {roles}")
            for u in r.get("usage", []):
                check(u.get("max_rss_kib", 0) > 0, f"{name}: {u.get('role')} {u.get('task')} has no RSS")
            # A PS answered at least the measured steps of every worker.
            check(all(n >= r.get("steps", 0) for n in r.get("ps_requests_total", [0])),
                  f"{name}: PS requests {r.get('ps_requests_total')} < steps {r.get('steps')}")
        check(seen == {("push", 10), ("pull", 10), ("push", 256), ("pull", 256)}, f"cells {seen}")
    else:
        failures.append("no JSON written")

bad = subprocess.run([exe, "--floats", "0"], capture_output=True, text=True, timeout=20)
check(bad.returncode != 0, "--floats 0 exited 0")
check("--floats" in bad.stderr, f"--floats 0: the error does not name the option: {bad.stderr!r}")
bad = subprocess.run([exe, "--op", "jump"], capture_output=True, text=True, timeout=20)
check(bad.returncode != 0 and "jump" in bad.stderr, f"--op jump: {bad.returncode} {bad.stderr!r}")

for f in failures:
    print("ps_bench_smoke: FAILED:", f)
if failures:
    sys.exit(1)
print("ps_bench_smoke: ok")
