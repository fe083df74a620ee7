#!/usr/bin/env bash
# Create .venv (if missing) and install this app with its pinned dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
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
