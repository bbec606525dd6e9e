#!/usr/bin/env bash
# The main job: builds fusewire's examples and trains an MLP on Fashion-MNIST
# with 2 parameter servers + 4 workers (separate processes) on loopback, then
# the same model in one process for comparison; prints both test accuracies.
# Installs the Debian packages it needs (as root). Extra arguments go to the demo program (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/deps.sh build demo
build=${FUSEWIRE_DEMO_BUILD_DIR:-build/demo}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dbuildtype=release -Dtests=false -Dbench=false -Dexamples=true >/dev/null
fi
echo "demo: building (meson/ninja in $build)"
ninja -C "$build" examples/ps_worker/ps_worker >/dev/null
exec "$build/examples/ps_worker/ps_worker" --compare-local "$@"
