#!/usr/bin/env bash
# Create .venv (if missing) and install this app with its pinned dependencies
# (FEDPCD_VENV=<venv>: use that environment as is instead).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${FEDPCD_VENV:-}" ]; then
  # An environment the caller manages (e.g. one shared by several checkouts): used as is,
  # nothing is created or installed into it.
  if [ ! -x "$FEDPCD_VENV/bin/python" ]; then
    echo "error: FEDPCD_VENV=$FEDPCD_VENV has no bin/python; unset it to use ./.venv" >&2
    exit 2
  fi
  exit 0
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Re-install only when pyproject.toml changed since the last successful install.
stamp=.venv/.fedpcd-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
  # (the filter drops pip's notes about this machine's local package mirrors)
  .venv/bin/python -m pip install -q -e ".[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
  cp pyproject.toml "$stamp"
fi
