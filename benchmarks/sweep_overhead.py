"""Sweep overhead: a sweep of N short runs against the sum of the same runs' own times.

    flock /tmp/fedpcd-heavy.lock python benchmarks/sweep_overhead.py [--runs 20] [--rounds 3] [--workers W] [--json]

The runs: 3-round digits FedAvg (the default config otherwise, ``figures = 'none'`` on both
sides: a sweep's runs draw no figures of their own), one per seed 0..N-1, on the local engine.
``--workers``: the worker processes of every run, sweep and commands alike (default: each
side's own default, as a user gets it: ``--workers auto`` for a command, the sweep's
:func:`~fedpcd_app.analysis.sweep.default_workers` for one job). Measured, one after another:

* ``own``: each run as its own command, ``python -m fedpcd_app.simulate`` (wall time of each
  command: interpreter, imports, data, the run); the sum over the runs is the reference.
* ``reused``: the N runs as one sweep, one job (:func:`fedpcd_app.analysis.sweep.run_sweep`: one
  run process, and its local engine's workers, reused from run to run): wall time from the
  sweep's start to its last run's end. The sweep's report and figures (drawn once, at its end,
  by ``python -m fedpcd_app.analysis.sweep``) are timed apart: ``report``.
* ``fresh``: the same sweep with a new process per run (``--fresh-processes``).

For each sweep, the **gap** between consecutive runs, from the runs' own files: a run's start
(its ``availability.json``, written as its first round begins, beside its first log line) minus
the previous run's end (its ``summary.json``): what a run costs beyond its own rounds. Printed:
wall and CPU seconds (user + system of the processes waited for: the commands, the run
processes), the ratio to the sum of the runs' own times, the gaps' median and largest;
``--json``: one JSON object instead. ``--smoke``: 2 runs of 1 round (checks the script works).
Timings on a loaded machine are noisy: compare the modes of one invocation, read the CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))


def run_config(rounds: int, seed: int) -> dict:
    return {"dataset": "digits", "method": "fedavg", "num-server-rounds": rounds, "seed": seed}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_times(runs: int, rounds: int, out: Path, workers: int | None) -> tuple[list[float], float]:
    """Wall time of each run as its own ``simulate`` command, and their CPU seconds together."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    times, cpu0 = [], _children_cpu()
    for seed in range(runs):
        cfg = {**run_config(rounds, seed), "output-dir": str(out / f"own-seed{seed}"), "figures": "none"}
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in cfg.items())
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fedpcd_app.simulate", "--workers",
                               "auto" if workers is None else str(workers), "--run-config", text],
                              cwd=PROJECT, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"simulate failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return times, _children_cpu() - cpu0


def gaps(folders: list[Path]) -> list[float]:
    """Seconds between each run's start and the previous run's end (see the module docstring)."""
    spans = sorted(((f / "availability.json").stat().st_mtime, (f / "summary.json").stat().st_mtime)
                   for f in folders)
    return [start - spans[i - 1][1] for i, (start, _) in enumerate(spans) if i]


def sweep_time(runs: int, rounds: int, out: Path, reuse: bool, workers: int | None) -> dict:
    """The runs as one sweep (one job): wall and CPU seconds, the gaps between its runs, and
    the report drawn at its end, timed apart."""
    from fedpcd_app.analysis import sweep

    base = {k: v for k, v in run_config(rounds, 0).items() if k != "seed"}
    s = sweep.parse_sweep({"name": "overhead", "seeds": list(range(runs)), "base": base,
                           "methods": [{"name": "fedavg", "method": "fedavg"}]})
    cpu0, t0 = _children_cpu(), time.perf_counter()
    failures = sweep.run_sweep(s, out, jobs=1, progress=False, engine={"workers": workers}, reuse=reuse)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if failures:
        raise SystemExit(f"the sweep had failed runs: {failures[0][1]}")
    t1 = time.perf_counter()
    with open(os.devnull, "w") as null:
        saved, sys.stdout = sys.stdout, null
        try:
            sweep.report_and_figures(out)
        finally:
            sys.stdout = saved
    report = time.perf_counter() - t1
    between = gaps([r.folder(out) for r in s.runs])
    return {"wall_s": wall, "cpu_s": cpu, "report_s": report, "gaps_s": between,
            "gap_median_s": statistics.median(between) if between else None,
            "gap_max_s": max(between) if between else None}


def measure(runs: int, rounds: int, modes: list[str], workers: int | None = None) -> dict:
    from fedpcd_app.analysis.sweep import default_workers

    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        tmp = Path(tmp)
        own, own_cpu = own_times(runs, rounds, tmp, workers)
        result = {"runs": runs, "rounds": rounds, "workers": workers,
                  "sweep_workers": default_workers(1) if workers is None else workers,
                  "own_s": own, "own_sum_s": sum(own), "own_cpu_s": own_cpu, "modes": {}}
        for mode in modes:
            row = sweep_time(runs, rounds, tmp / mode, reuse=(mode == "reused"), workers=workers)
            result["modes"][mode] = {**row, "ratio": row["wall_s"] / sum(own)}
    return result


def table(result: dict) -> str:
    w = result["workers"]
    how = (f"--workers {w}" if w is not None else
           f"each side's default workers (commands: auto; the sweep: {result['sweep_workers']})")
    lines = [f"{result['runs']} runs of {result['rounds']}-round digits FedAvg, figures='none', {how}, one job",
             "| mode | wall s | CPU s | sum of own s | ratio | gap median s | gap max s | report s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|",
             f"| own | {result['own_sum_s']:.1f} | {result['own_cpu_s']:.1f} | {result['own_sum_s']:.1f} | 1.00 "
             "| | | |"]
    for mode, row in result["modes"].items():
        gap = (f"{row['gap_median_s']:.2f} | {row['gap_max_s']:.2f}" if row["gap_median_s"] is not None
               else " | ")
        lines.append(f"| {mode} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | {result['own_sum_s']:.1f} | "
                     f"{row['ratio']:.2f} | {gap} | {row['report_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="reused,fresh", help="comma-separated: reused, fresh")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes of every run (default: each side's own default)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--smoke", action="store_true", help="2 runs of 1 round, reused only: the script works")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.rounds, args.modes = 2, 1, "reused"
    modes = [m for m in args.modes.split(",") if m]
    if args.runs < 1 or args.rounds < 1 or not modes or set(modes) - {"reused", "fresh"}:
        print("error: --runs and --rounds must be >= 1; --modes takes reused and/or fresh", file=sys.stderr)
        return 2
    result = measure(args.runs, args.rounds, modes, args.workers)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
