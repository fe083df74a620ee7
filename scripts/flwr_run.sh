#!/usr/bin/env bash
# Run this app with `flwr run .` in Flower's local (Ray-backed) simulation, offline, and exit
# with the run's own outcome: 0 only when the run that `flwr run` started ends
# finished:completed; 1 for a failed run (or none started); 2 for a bad argument or config
# (one line, before anything starts); 130 after Ctrl-C (the run is stopped with `flwr stop`,
# and every process this script started with it).
#
#   bash scripts/flwr_run.sh [--run-config "method='fedpcd' ..."]... [--federation-config "..."]... [--ray-address HOST:PORT|auto]
#
# Ray: a private local instance (RAY_ADDRESS=local for the simulation: never a cluster this
# shell or a stale /tmp/ray/ray_current_cluster names); --ray-address joins an existing
# cluster on purpose (docs/deployment.md, section 5).
#
# --run-config may be repeated (key=value strings or TOML files): a later one replaces the
# keys it names and keeps the others (fedcore/overrides.py composes them), so flwr never
# sees a key twice. --federation-config composes the same way over this script's defaults
# (num-supernodes=<num-clients> client-resources-num-cpus=1): "num-supernodes=2" replaces
# the default. Every override is checked before anything starts: a bad value (an unquoted
# string such as method=fedpcd, an unknown key, a value out of range, an output-dir that
# cannot be written) stops the script with one line and exit status 2.
#
# Uses the installed environment ($FEDPCD_VENV, default ./.venv; no run-time dependency
# install, no network), a private FLWR_HOME (a temporary folder) and a free port per
# invocation, so runs started at once from one checkout never share a SuperLink; it follows
# the run id `flwr run` printed. The work is done by fedpcd_app/runtime/flwr_run.py.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --run-config|--federation-config|--ray-address) i=$((i + 1)) ;;
    *) echo "error: unknown argument: ${!i} (use --run-config \"key=value ...\", --federation-config \"...\" or --ray-address HOST:PORT|auto)" >&2; exit 2 ;;
  esac
done
VENV=${FEDPCD_VENV:-$ROOT/.venv}
export PATH="$VENV/bin:$PATH"
export FEDPCD_OUTPUT_ROOT=${FEDPCD_OUTPUT_ROOT:-$ROOT/outputs}
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
exec python -m fedpcd_app.flwr_run "$@"
