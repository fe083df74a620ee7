#!/usr/bin/env bash
# Install (if needed) and run the default experiment with `flwr run .`, offline.
# Results land in outputs/default/ (summary.json, rounds.jsonl, clients.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bash scripts/flwr_run.sh --run-config "output-dir='$PWD/outputs/default' $*"
