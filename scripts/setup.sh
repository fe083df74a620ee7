#!/usr/bin/env bash
# Create .venv (if missing) and install this app with its pinned dependencies, every extra
# (.[all,test,docs]: the server, the simulation, the analysis, hub data, the tests and the
# documentation site's tools; a SuperNode needs only the base set, docs/deployment.md)
# (FEDPCD_VENV=<venv>: use that environment as is instead). Each step is one line on stderr
# (the first install takes minutes); pip's own progress shows when stdout is a terminal, and
# pip stays quiet (-q) otherwise (CI logs).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "setup: $*" >&2; }
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
  say "creating the virtual environment .venv ($("$PY" --version 2>&1))"
  "$PY" -m venv .venv
fi
# Re-install only when pyproject.toml changed since the last successful install.
stamp=.venv/.fedpcd-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
  if [ -t 1 ]; then
    quiet=(--progress-bar on)
    say "installing the app and its pinned dependencies into .venv (torch, flwr, ray: a few minutes the first time)"
  else
    quiet=(-q)
    say "installing the app and its pinned dependencies into .venv (torch, flwr, ray: a few minutes the first time; pip -q)"
  fi
  # (the filter drops pip's notes about this machine's local package mirrors; stdout stays pip's own)
  .venv/bin/python -m pip install "${quiet[@]}" -e ".[all,test,docs]" 2> >(grep -v "^WARNING: Location" >&2 || true)
  cp pyproject.toml "$stamp"
  say "done: .venv is ready"
else
  say ".venv is up to date (pyproject.toml unchanged since its install)"
fi
