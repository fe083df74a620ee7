#!/usr/bin/env bash
# Run this app with `flwr run .` in Flower's local (Ray-backed) simulation, offline,
# and fail unless the run's status is finished:completed.
#
#   bash scripts/flwr_run.sh [--run-config "method='fedpcd' ..."] [--federation-config "..."]
#
# Uses the installed environment (no run-time dependency install, no network), a
# private FLWR_HOME under ./flwr_home, and stops the SuperLink it started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_CONFIG=""
FED_CONFIG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --run-config) RUN_CONFIG="$2"; shift 2 ;;
    --federation-config) FED_CONFIG="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
export PATH="$ROOT/.venv/bin:$PATH"
export FLWR_HOME=${FLWR_HOME:-$ROOT/flwr_home}
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
export FEDPCD_OUTPUT_ROOT=${FEDPCD_OUTPUT_ROOT:-$ROOT/outputs}
mkdir -p "$FLWR_HOME"
FLWR_HOME=$(cd "$FLWR_HOME" && pwd)
# `flwr run` reuses any local SuperLink already listening on its fixed port (39091), even
# one started from another FLWR_HOME without this environment: refuse rather than mix runs.
if python -c 'import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(("127.0.0.1",39091))!=0)'; then
  if ! pgrep -f "flower-superlink.*$FLWR_HOME/local-superlink/" >/dev/null; then
    echo "error: another local SuperLink is running on 127.0.0.1:39091; stop it first (pkill -f flower-superlink)" >&2
    exit 3
  fi
fi

# One supernode per client partition: num-clients from the overrides or pyproject.
NUM_CLIENTS=$(python - "$RUN_CONFIG" <<'PY'
import sys
from fedcore.config import load_config
print(load_config(sys.argv[1]).num_clients)
PY
)
FED="num-supernodes=$NUM_CLIENTS client-resources-num-cpus=1 ${FED_CONFIG}"

args=(run . --stream --federation-config "$FED")
[ -n "$RUN_CONFIG" ] && args+=(--run-config "$RUN_CONFIG")
start=$(date +%s)
set +e
flwr "${args[@]}"
set -e
# `flwr run --stream` exits 0 even when the ServerApp fails: read the run's status.
STATUS=$(flwr ls --format json 2>/dev/null | python -c '
import json, sys
runs = json.load(sys.stdin).get("runs", [])
runs.sort(key=lambda r: r.get("created-at", ""))
print(runs[-1].get("status", "unknown") if runs else "unknown")
')
# Stop the local SuperLink that `flwr run` started for this FLWR_HOME (it outlives the
# run); its command line names its log file under $FLWR_HOME/local-superlink/.
pkill -f "flower-superlink.*$FLWR_HOME/local-superlink/" 2>/dev/null || true
echo "run status: $STATUS ($(( $(date +%s) - start )) s)"
[ "$STATUS" = "finished:completed" ]
