#!/usr/bin/env bash
# Creates (once) and reuses the Python venv that the qhead package is built
# and tested in, and installs python/requirements.txt into it from PyPI when
# the file has changed since the last install. Prints the venv's python.
#
#   VENV: $QHEAD_VENV, default ~/.cache/qhead/venv (outside the repository,
#   so a fresh clone on the same machine reuses it)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${QHEAD_VENV:-$HOME/.cache/qhead/venv}"
REQ="$ROOT/python/requirements.txt"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" >&2
fi
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
stamp="$VENV/.qhead-requirements"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-python: installing python/requirements.txt into $VENV" >&2
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQ" >&2
  echo "$want" > "$stamp"
fi
echo "$VENV/bin/python"
