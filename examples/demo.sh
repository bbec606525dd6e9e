#!/usr/bin/env bash
# The main job: builds fusewire's examples and moves tensors between two
# processes on loopback, printing what it did. Installs the Debian packages it
# needs (as root). Extra arguments go to the demo program (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/deps.sh build demo
build=${FUSEWIRE_DEMO_BUILD_DIR:-build/demo}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dbuildtype=release -Dtests=false -Dbench=false -Dexamples=true >/dev/null
fi
echo "demo: building (meson/ninja in $build)"
ninja -C "$build" examples/rendezvous_demo/rendezvous_demo >/dev/null
exec "$build/examples/rendezvous_demo/rendezvous_demo" "$@"
