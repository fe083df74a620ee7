#!/usr/bin/env bash
# Run this app with `flwr run .` in Flower's local (Ray-backed) simulation, offline,
# and fail unless the run's status is finished:completed.
#
#   bash scripts/flwr_run.sh [--run-config "method='fedpcd' ..."]... [--federation-config "..."]
#
# --run-config may be repeated (key=value strings or TOML files): a later one replaces the
# keys it names and keeps the others (scripts/run_config.py composes them), so flwr never
# sees a key twice. Every override is checked before anything starts: a bad value
# (an unquoted string such as method=fedpcd, an unknown key, a value out of range) stops
# the script with one line and exit status 2.
#
# Uses the installed environment ($FEDPCD_VENV, default ./.venv; no run-time dependency
# install, no network), a private FLWR_HOME under ./flwr_home, and stops the SuperLink it
# started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_CONFIGS=()
FED_CONFIG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --run-config) RUN_CONFIGS+=("${2-}"); shift $(( $# > 1 ? 2 : 1 )) ;;
    --federation-config) FED_CONFIG="${2-}"; shift $(( $# > 1 ? 2 : 1 )) ;;
    *) echo "error: unknown argument: $1 (use --run-config \"key=value ...\" or --federation-config \"...\")" >&2; exit 2 ;;
  esac
done
VENV=${FEDPCD_VENV:-$ROOT/.venv}
export PATH="$VENV/bin:$PATH"
# Defaults and overrides composed key by key; a malformed value gets one line, no traceback.
RUN_CONFIG=$(python scripts/run_config.py compose ${RUN_CONFIGS[@]+"${RUN_CONFIGS[@]}"}) || exit 2
export FLWR_HOME=${FLWR_HOME:-$ROOT/flwr_home}
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
export FEDPCD_OUTPUT_ROOT=${FEDPCD_OUTPUT_ROOT:-$ROOT/outputs}
mkdir -p "$FLWR_HOME"
FLWR_HOME=$(cd "$FLWR_HOME" && pwd)
# The whole config is validated before any SuperLink or Ray start (one line on error); one
# supernode per client partition: num-clients from the overrides or pyproject.
NUM_CLIENTS=$(python - "$RUN_CONFIG" <<'PY'
import sys
from fedcore.config import load_config
from fedpcd_app.config import check
try:
    cfg = load_config(sys.argv[1])
    check(cfg.as_dict())  # the method's keys, sampler, checkpoints, resume-from: the whole config
    print(cfg.num_clients)
except ValueError as exc:  # ConfigError is a ValueError
    print(f"error: {exc}".splitlines()[0], file=sys.stderr)
    sys.exit(2)
except Exception as exc:  # noqa: BLE001 - e.g. flwr's ClickException: still one line
    print(f"error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
    sys.exit(2)
PY
) || exit 2
# `flwr run` reuses any local SuperLink already listening on its fixed port (39091), even
# one started from another FLWR_HOME without this environment: refuse rather than mix runs.
if python -c 'import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(("127.0.0.1",39091))!=0)'; then
  if ! pgrep -f "flower-superlink.*$FLWR_HOME/local-superlink/" >/dev/null; then
    echo "error: another local SuperLink is running on 127.0.0.1:39091; stop it first (pkill -f flower-superlink)" >&2
    exit 3
  fi
fi

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
