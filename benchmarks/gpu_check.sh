#!/usr/bin/env bash
# The GPU measurements of docs/performance.md (rule 12, "On a GPU") in one go, or the parts named:
#
#   bash benchmarks/gpu_check.sh OUT_DIR [simulation] [rows] [aggregation]     (no part: all three)
#
# simulation: benchmarks/simulation.py, CNN setting on CIFAR-10-shaped data (50,000/10,000
#    images, 100 clients, 10 per round): the local engine (4 worker processes sharing the GPU)
#    and Ray (flwr run; 4 CPUs and 0.25 GPU per actor), each next to a plain loop on the GPU
#    -> OUT_DIR/simulation.json, OUT_DIR/simulation.txt
# rows: a round's clients trained at once on the GPU (client_app/vectorised.py), for the digits
#    MLP and the CIFAR-size CNN at 10, 50 and 100 clients per round:
#    - the rows against the loop on the GPU, TF32 off (tests/test_vectorised.py's CUDA tests,
#      where pytest is installed) -> OUT_DIR/rows_equality.txt
#    - client training alone, loop vs rows (the CNN's rows as grouped and as unrolled
#      convolutions) -> OUT_DIR/rows_training.jsonl
#    - the app's round in process (--workers 0) with the loop (engine local) and with the rows
#      (engine vectorised), next to the plain loop on the GPU -> OUT_DIR/rows_app.json, .txt
#    - the table of docs/performance-archive.md §4 "Rows on the GPU" and the models whose rows' round beat
#      the loop's at every size (what AUTO_MODELS["cuda"] may name) -> OUT_DIR/rows_table.md
# aggregation: benchmarks/aggregation.py at ResNet-18 size (on the GPU when it has --device)
#    -> OUT_DIR/aggregation.jsonl
# plus OUT_DIR/machine.json (date, GPU, driver). On a machine without CUDA it says "not
# measured here: no GPU" in one line and exits 0. GPU_CHECK_SMOKE=1 runs the same steps on the
# CPU at a tiny size (to test this script where there is no GPU; the figures mean nothing, and
# rows_table.md says "Not measured here: no GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: bash benchmarks/gpu_check.sh OUT_DIR [simulation] [rows] [aggregation]" >&2
  exit 2
fi
OUT=$1
shift
PARTS=" ${*:-simulation rows aggregation} "
for part in $PARTS; do
  case "$part" in simulation|rows|aggregation) ;; *) echo "gpu_check: unknown part '$part'" >&2; exit 2 ;; esac
done
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
SMOKE=${GPU_CHECK_SMOKE:-0}
if [ "$SMOKE" != 1 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: not measured here: no GPU (no CUDA device on $(hostname)); nothing written"
  exit 0
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
start=$(date +%s)
wants() { [[ "$PARTS" == *" $1 "* ]]; }

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

if [ "$SMOKE" = 1 ]; then
  DEVICE=()
  IMAGES=(--train-images 5000 --test-images 1000)
  PER_ROUND=2,4
  ROUNDS=(--rounds 3 --eval-every 3)
  TRAIN_SPECS=(mlp:4:24:64:16 cnn:2:40:3072:16)
  TRAIN_REPEATS=1
else
  DEVICE=(--device cuda)
  IMAGES=()
  PER_ROUND=10,50,100
  ROUNDS=(--rounds 6 --eval-every 6)
  TRAIN_SPECS=(mlp:10:72:64:16 mlp:50:72:64:16 mlp:100:72:64:16 cnn:10:500:3072:128 cnn:50:500:3072:128
               cnn:100:500:3072:128)
  TRAIN_REPEATS=3
fi

if wants simulation; then
  # Ray where it is installed (its wheel is too big to carry to a bare GPU machine): the local
  # engine alone otherwise, said in one line; GPU_CHECK_ENGINES overrides.
  ENGINES=${GPU_CHECK_ENGINES:-}
  if [ -z "$ENGINES" ]; then
    if "$PY" -c 'import ray' 2>/dev/null; then ENGINES=local,ray; else ENGINES=local; echo "gpu_check: ray not installed: local engine only"; fi
  fi
  if [ "$SMOKE" = 1 ]; then
    SIM=(--settings cnn "${IMAGES[@]}" --rounds 3 --eval-every 3 --floor-repeats 1 --workers 2
         --num-cpus 1 --no-e2e --engines "$ENGINES")
  else
    SIM=(--settings cnn --device cuda --rounds 9 --eval-every 3 --floor-repeats 2 --workers 4
         --num-cpus 4 --ray-num-gpus 0.25 --eval-batch-size 1024 --no-e2e --engines "$ENGINES")
  fi
  echo "== simulation: ${SIM[*]}"
  "$PY" benchmarks/simulation.py "${SIM[@]}" --json "$OUT/simulation.json" 2>"$OUT/simulation.log" \
    | tee "$OUT/simulation.txt"
  echo "== simulation done after $(( $(date +%s) - start )) s"
fi

if wants rows; then
  if "$PY" -c 'import pytest' 2>/dev/null; then
    echo "== rows: equality with the loop on the device"
    if "$PY" -m pytest -q -p no:cacheprovider tests/test_vectorised.py -k "cuda" >"$OUT/rows_equality.txt" 2>&1; then
      tail -n 1 "$OUT/rows_equality.txt"
    else
      echo "gpu_check: the rows differ from the loop on this device (OUT_DIR/rows_equality.txt)"
    fi
  else
    echo "gpu_check: pytest not installed: the rows' equality on the device not checked"
  fi
  echo "== rows: client training alone"
  : >"$OUT/rows_training.jsonl"
  for spec in "${TRAIN_SPECS[@]}"; do
    forms=("")
    [[ $spec == cnn:* ]] && forms=(grouped unrolled)
    for form in "${forms[@]}"; do
      "$PY" benchmarks/simulation.py --training-only "$spec" "${DEVICE[@]}" --repeats "$TRAIN_REPEATS" \
        --conv-form "$form" --json "$OUT/rows_training_one.json" >/dev/null 2>>"$OUT/rows.log"
      "$PY" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$OUT/rows_training_one.json" \
        >>"$OUT/rows_training.jsonl"
    done
  done
  rm -f "$OUT/rows_training_one.json"
  ROWS=(--settings digits,cnn --per-round "$PER_ROUND" --engines local,vectorised --workers 0 "${DEVICE[@]}"
        "${IMAGES[@]}" "${ROUNDS[@]}" --floor-repeats 1 --eval-batch-size 1024 --no-e2e)
  echo "== rows: the app's round, loop and rows: ${ROWS[*]}"
  "$PY" benchmarks/simulation.py "${ROWS[@]}" --json "$OUT/rows_app.json" 2>>"$OUT/rows.log" | tee "$OUT/rows_app.txt"
  "$PY" benchmarks/simulation.py --rows-table "$OUT"
  echo "== rows done after $(( $(date +%s) - start )) s"
fi

if wants aggregation; then
  if [ "$SMOKE" = 1 ]; then
    AGG=(--sizes mlp --rounds 3 --timed 1 --methods fedavg,fedpcd)
  else
    AGG=(--sizes resnet18)
  fi
  # --device only where aggregation.py offers it (another change adds it)
  if "$PY" benchmarks/aggregation.py --help | grep -q -- "--device"; then
    [ "$SMOKE" = 1 ] || AGG+=(--device cuda)
  fi
  echo "== aggregation: ${AGG[*]}"
  "$PY" benchmarks/aggregation.py "${AGG[@]}" --json >"$OUT/aggregation.jsonl" 2>"$OUT/aggregation.log"
fi
echo "== done after $(( $(date +%s) - start )) s: $OUT"
