#!/usr/bin/env bash
# Creates (once) and reuses a Python virtual environment per requirement group,
# outside the clone, and prints its path. Python packages never go into the
# system Python.
#
#   .ci/venv.sh GROUP        GROUP is a file .ci/requirements/GROUP.txt
#
# The environment lives in $FUSEWIRE_VENV_ROOT/GROUP (default
# /var/cache/fusewire/venv/GROUP). It is rebuilt when the requirement file
# changes (its hash is kept beside it), so pins are the single source of truth.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
group=${1:?usage: .ci/venv.sh GROUP}
req=$here/requirements/$group.txt
[ -f "$req" ] || { echo "venv.sh: no requirement file $req" >&2; exit 2; }
root=${FUSEWIRE_VENV_ROOT:-/var/cache/fusewire/venv}
venv=$root/$group
want=$(sha256sum "$req" | cut -d' ' -f1)

if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  mkdir -p "$root"
  # Debian's python3 has no ensurepip without python3-venv; prefer whichever
  # python3 can make a venv.
  py=
  for cand in python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import venv, ensurepip' 2>/dev/null; then
      py=$cand; break
    fi
  done
  if [ -z "$py" ]; then
    "$here/deps.sh" venv >&2
    py=/usr/bin/python3
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
  echo "$want" >"$venv/.requirements.sha256"
fi
echo "$venv"
