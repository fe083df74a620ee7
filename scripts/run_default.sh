# Install (if needed) and run the default experiment with `flwr run .`, offline: FedPCD on
# the digits data with the pyproject defaults. Results land in outputs/default/.
#
#   bash scripts/run_default.sh ["method='fedavg' seed=1"] ["num-server-rounds=2"] [preset.toml] ...
#
# Each argument is a run-config override string (or a TOML preset); it replaces this
# script's defaults (method, output-dir) and earlier arguments key by key. Strings need
# quotes inside the argument: "method='fedavg'" (a bare method=fedavg is refused in one line).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=(--run-config "method='fedpcd' output-dir='$PWD/outputs/default'")
for override in "$@"; do
  args+=(--run-config "$override")
done
exec bash scripts/flwr_run.sh "${args[@]}"
