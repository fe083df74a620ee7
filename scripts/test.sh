#!/usr/bin/env bash
# Install (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
py="${FEDPCD_VENV:-.venv}/bin/python"
# pytest workers (pytest-xdist, the test extra; FEDPCD_TEST_WORKERS=0 runs the suite in
# this process, as a later `-n 0` among the arguments does), each test file on one worker (a module's
# costly fixtures, a Ray cluster, a built wheel or virtualenv, a copy of the checkout, built once);
# the 25 slowest tests listed at the end; the files in collection order (tests/conftest.py puts those
# that start real processes first; xdist's default order, the most tests first, left a 3-minute
# deployment file to run alone at the end)
# one worker more than the cores: the slowest files wait part of the time (a killed SuperNode ~50 s on
# Flower's 2 x 30 s heartbeat patience, SuperNodes polling every ~3 s, Ray starting), and the extra worker
# runs tests meanwhile (2 cores, quiet, 2026-12-07: 12:38 with two workers, 12:15 with three from a clean clone,
# 13:31 with four)
workers=(-n "${FEDPCD_TEST_WORKERS:-$(( $(nproc) + 1 ))}" --dist loadfile --no-loadscope-reorder --durations 25)
if ! "$py" -c "import xdist" 2>/dev/null; then
  echo "setup: pytest-xdist is not installed in $py's environment: the suite runs in one process" >&2
  workers=()
fi
exec "$py" -m pytest -q -p no:cacheprovider "${workers[@]}" "$@"
