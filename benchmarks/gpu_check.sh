#!/usr/bin/env bash
# The GPU measurements of docs/performance.md in one go (under 8 minutes on one CUDA GPU):
#
#   bash benchmarks/gpu_check.sh OUT_DIR
#
# 1. benchmarks/simulation.py, CNN setting on CIFAR-10-shaped data (50,000/10,000 images,
#    100 clients, 10 per round): the local engine (4 worker processes sharing the GPU) and
#    Ray (flwr run; 4 CPUs and 0.25 GPU per actor), each next to a plain loop on the GPU
#    -> OUT_DIR/simulation.json, OUT_DIR/simulation.txt
# 1b. the same setting on the vectorised engine (client-execution = 'vectorised': the round's
#    10 clients trained at once in one worker process on the GPU), next to its own plain GPU loop
#    -> OUT_DIR/simulation_vectorised.json, OUT_DIR/simulation_vectorised.txt
# 2. benchmarks/aggregation.py at ResNet-18 size (on the GPU when it has --device)
#    -> OUT_DIR/aggregation.jsonl
# plus OUT_DIR/machine.json (date, GPU, driver). On a machine without CUDA it says so in one
# line and exits 0. GPU_CHECK_SMOKE=1 runs the same steps on the CPU at a tiny size (to test
# this script where there is no GPU; the figures mean nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 1 ]; then
  echo "usage: bash benchmarks/gpu_check.sh OUT_DIR" >&2
  exit 2
fi
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
SMOKE=${GPU_CHECK_SMOKE:-0}
if [ "$SMOKE" != 1 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA GPU on this machine ($(hostname)); nothing measured"
  exit 0
fi
OUT=$1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
start=$(date +%s)

"$PY" - "$OUT/machine.json" <<'PY'
import json, os, platform, subprocess, sys, time
import torch
info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                         "--format=csv,noheader"], capture_output=True, text=True,
                                        timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    pass
open(sys.argv[1], "w").write(json.dumps(info, indent=1))
print(json.dumps(info))
PY

# Ray where it is installed (its wheel is too big to carry to a bare GPU machine): the local
# engine alone otherwise, said in one line; GPU_CHECK_ENGINES overrides.
ENGINES=${GPU_CHECK_ENGINES:-}
if [ -z "$ENGINES" ]; then
  if "$PY" -c 'import ray' 2>/dev/null; then ENGINES=local,ray; else ENGINES=local; echo "gpu_check: ray not installed: local engine only"; fi
fi
if [ "$SMOKE" = 1 ]; then
  SIM=(--settings cnn --train-images 5000 --test-images 1000 --rounds 3 --eval-every 3 --floor-repeats 1 --workers 2
       --num-cpus 1 --no-e2e --engines "$ENGINES")
  AGG=(--sizes mlp --rounds 3 --timed 1 --methods fedavg,fedpcd)
else
  SIM=(--settings cnn --device cuda --rounds 9 --eval-every 3 --floor-repeats 2 --workers 4
       --num-cpus 4 --ray-num-gpus 0.25 --eval-batch-size 1024 --no-e2e --engines "$ENGINES")
  AGG=(--sizes resnet18)
fi
echo "== simulation: ${SIM[*]}"
"$PY" benchmarks/simulation.py "${SIM[@]}" --json "$OUT/simulation.json" 2>"$OUT/simulation.log" \
  | tee "$OUT/simulation.txt"
echo "== simulation done after $(( $(date +%s) - start )) s"

# the vectorised engine: one worker, so that a round's clients train together
VEC=()
skip=0
for a in "${SIM[@]}"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in --engines|--workers) skip=1 ;; *) VEC+=("$a") ;; esac
done
VEC+=(--engines vectorised --workers 1)
echo "== simulation (vectorised): ${VEC[*]}"
"$PY" benchmarks/simulation.py "${VEC[@]}" --json "$OUT/simulation_vectorised.json" \
  2>"$OUT/simulation_vectorised.log" | tee "$OUT/simulation_vectorised.txt"
echo "== simulation (vectorised) done after $(( $(date +%s) - start )) s"

# --device only where aggregation.py offers it (another change adds it)
if "$PY" benchmarks/aggregation.py --help | grep -q -- "--device"; then
  [ "$SMOKE" = 1 ] || AGG+=(--device cuda)
fi
echo "== aggregation: ${AGG[*]}"
"$PY" benchmarks/aggregation.py "${AGG[@]}" --json >"$OUT/aggregation.jsonl" 2>"$OUT/aggregation.log"
echo "== done after $(( $(date +%s) - start )) s: $OUT"
