#!/usr/bin/env bash
# Install (if needed) and run the default experiment with `flwr run .`, offline: FedPCD on
# the digits data with the pyproject defaults. Arguments are further run-config overrides
# (e.g. "method='fedavg' seed=1"). Results land in outputs/default/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bash scripts/flwr_run.sh --run-config "method='fedpcd' output-dir='$PWD/outputs/default' $*"
