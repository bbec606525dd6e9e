#!/usr/bin/env bash
# The fusewire_tf package builds with pip and imports from a fresh virtual
# environment. TensorFlow comes from the venv named by $1 (a .pth file adds
# its site-packages) so nothing is downloaded; the op library is compiled by
# setup.py (through ccache when installed).
#
#   package_test.sh TF_VENV_PYTHON SOURCE_ROOT
set -euo pipefail
tf_python=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tf_python" -c 'import sys; sys.exit(0)'
base=$("$tf_python" -c 'import sys; print(sys._base_executable)')
site=$("$tf_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$base" -m venv "$work/venv"
newsite=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$newsite/tensorflow-venv.pth"
# pip builds in place; a copy keeps the clone clean (build/, *.egg-info).
mkdir -p "$work/src"
# ccache sees paths relative to the copy: the next run (another temp dir) hits.
export CCACHE_BASEDIR=$work/src CCACHE_NOHASHDIR=true
cp -r "$src/python" "$src/include" "$work/src/"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-build-isolation \
  --no-deps "$work/src/python"
cd "$work"
env -u FUSEWIRE_TF_OPS TF_CPP_MIN_LOG_LEVEL=2 "$work/venv/bin/python" - <<'PY'
import os
import fusewire_tf as fw
import tensorflow as tf
path = fw.ops_path()
assert path.startswith(os.path.realpath(os.getcwd())) or "/venv/" in path, path
assert os.path.exists(path), path
# The ops are registered and run: a bad key is refused by the kernel.
try:
    fw.recv("not-a-key", tf.float32)
except tf.errors.FailedPreconditionError as e:
    assert "configure" in str(e), e
else:
    raise SystemExit("recv before configure did not fail")
print("fusewire_tf imported from", path)
PY
