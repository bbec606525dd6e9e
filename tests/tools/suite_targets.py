#!/usr/bin/env python3
"""Prints the ninja targets (paths relative to the build dir) that the tests
of the given meson suites need, so a sanitizer stage builds only those.

Usage: suite_targets.py BUILD_DIR SUITE...
"""
import json
import os
import subprocess
import sys


def introspect(build, what):
    out = subprocess.run(["meson", "introspect", what, build], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: suite_targets.py BUILD_DIR SUITE...")
    build, suites = os.path.abspath(sys.argv[1]), set(sys.argv[2:])
    wanted = set()
    for test in introspect(build, "--tests"):
        names = {s.split(":", 1)[-1] for s in test["suite"]}
        if names & suites:
            wanted.update(test.get("depends", []))
    outputs = set()
    for target in introspect(build, "--targets"):
        if target["id"] in wanted:
            outputs.update(os.path.relpath(f, build) for f in target["filename"])
    print("\n".join(sorted(outputs)))


if __name__ == "__main__":
    main()
