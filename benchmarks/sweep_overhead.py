"""Sweep overhead: a sweep of N short runs against the sum of the same runs' own times.

    flock /tmp/fedpcd-heavy.lock python benchmarks/sweep_overhead.py [--runs 20] [--rounds 3] [--json]

The runs: 3-round digits FedAvg (the default config otherwise), one per seed 0..N-1, on the
local engine with the ClientApps in the run's process (``--workers 0``, as the results pages
run them). Measured, one after another on this machine:

* ``own``: each run as its own command, ``python -m fedpcd_app.simulate --workers 0`` (wall time
  of each command: interpreter, imports, data, the run; ``figures='none'`` as in a sweep);
  the sum over the runs is the reference.
* ``reused``: the N runs as one sweep, ``--jobs 1`` (:func:`fedpcd_app.analysis.sweep.run_sweep`:
  one run process, reused from run to run): wall time from the sweep's start to its last run's
  end (the sweep's report and figures, drawn once at its end, are not included: the separate
  runs draw none either).
* ``fresh``: the same sweep with a new process per run (``--fresh-processes``: what sweeps did
  before their processes were reused).

Printed: a table of each mode's wall time and its ratio to the sum of the runs' own times
(target: reused ≤ 1.3×); ``--json``: one JSON object instead. ``--smoke``: 2 runs of 1 round
(checks that the script works; its figures mean nothing). Timings on a loaded machine mean
nothing either: run it under ``flock /tmp/fedpcd-heavy.lock`` on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))


def run_config(rounds: int, seed: int) -> dict:
    return {"dataset": "digits", "method": "fedavg", "num-server-rounds": rounds, "seed": seed}


def own_times(runs: int, rounds: int, out: Path) -> list[float]:
    """Wall time of each run as its own ``simulate`` command."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    times = []
    for seed in range(runs):
        cfg = {**run_config(rounds, seed), "output-dir": str(out / f"own-seed{seed}"), "figures": "none"}
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in cfg.items())
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fedpcd_app.simulate", "--workers", "0", "--run-config", text],
                              cwd=PROJECT, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"simulate failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return times


def sweep_time(runs: int, rounds: int, out: Path, reuse: bool) -> float:
    """Wall time of the runs as one sweep (one job)."""
    from fedpcd_app.analysis import sweep

    base = {k: v for k, v in run_config(rounds, 0).items() if k != "seed"}
    s = sweep.parse_sweep({"name": "overhead", "seeds": list(range(runs)), "base": base,
                           "methods": [{"name": "fedavg", "method": "fedavg"}]})
    t0 = time.perf_counter()
    failures = sweep.run_sweep(s, out, jobs=1, progress=False, engine={"workers": 0}, reuse=reuse)
    wall = time.perf_counter() - t0
    if failures:
        raise SystemExit(f"the sweep had failed runs: {failures[0][1]}")
    return wall


def measure(runs: int, rounds: int, modes: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        tmp = Path(tmp)
        own = own_times(runs, rounds, tmp)
        result = {"runs": runs, "rounds": rounds, "own_s": own, "own_sum_s": sum(own), "modes": {}}
        for mode in modes:
            wall = sweep_time(runs, rounds, tmp / mode, reuse=(mode == "reused"))
            result["modes"][mode] = {"wall_s": wall, "ratio": wall / sum(own)}
    return result


def table(result: dict) -> str:
    lines = [f"{result['runs']} runs of {result['rounds']}-round digits FedAvg, --workers 0, one job",
             f"{'mode':<8} {'wall s':>8} {'sum of own s':>13} {'ratio':>6}",
             f"{'own':<8} {result['own_sum_s']:>8.1f} {result['own_sum_s']:>13.1f} {1.0:>6.2f}"]
    for mode, row in result["modes"].items():
        lines.append(f"{mode:<8} {row['wall_s']:>8.1f} {result['own_sum_s']:>13.1f} {row['ratio']:>6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="reused,fresh", help="comma-separated: reused, fresh")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--smoke", action="store_true", help="2 runs of 1 round, reused only: the script works")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.rounds, args.modes = 2, 1, "reused"
    modes = [m for m in args.modes.split(",") if m]
    if args.runs < 1 or args.rounds < 1 or not modes or set(modes) - {"reused", "fresh"}:
        print("error: --runs and --rounds must be >= 1; --modes takes reused and/or fresh", file=sys.stderr)
        return 2
    result = measure(args.runs, args.rounds, modes)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
