#!/usr/bin/env bash
# Install (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
exec "${FEDPCD_VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider "$@"
