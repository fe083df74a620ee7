"""Short runs: a 3-round digits run against the app's import time, and its report step alone.

    flock /tmp/fedpcd-heavy.lock python benchmarks/short_run.py [--repeats 5] [--rounds 3] [--json]

Measured, as wall time and CPU time (user + sys of the command and every process it waited
for: the report's drawing process included) of fresh commands on this machine, each
``--repeats`` times, interleaved (the medians are reported, with the load average beside them;
on a machine shared with other jobs the CPU times are the figures to compare):

* ``imports``: ``python -c "import fedpcd_app.server.server_app"`` (the import floor: the
  interpreter, torch, flwr and the app's modules);
* ``run``: ``python -m fedpcd_app.simulate --workers 0 --run-config "num-server-rounds=3 ..."``
  (the default config: digits FedAvg, ``figures = "auto"``: it returns with ``report.md`` and the
  figures written);
* ``run, no figures``: the same run with ``figures = "none"``;
* ``report``: ``python -m fedpcd_app.analysis.run_report <the run's folder>`` alone (the report
  step as a process of its own; the run overlaps its imports with its rounds, so what the run
  pays for its report is about ``run`` - ``run, no figures``).

Printed: a table of the medians and their ratios to the import floor (target: ``run`` ≤ 2.0×,
the report step ≤ 1 s); ``--json``: one JSON object instead. ``--smoke``: one repeat of a
1-round run (checks that the script works; its figures mean nothing). ``--code DIR``: time the
app checkout in DIR (default: this one), e.g. an older commit's worktree for a before/after. On a
loaded machine the wall times mean little: compare CPU times, or run it under
``flock /tmp/fedpcd-heavy.lock`` on a quiet one.
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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], code: Path = PROJECT) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``cmd`` run with the app in ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}): "
                         f"{(proc.stderr.strip().splitlines() or [''])[-1]}")
    return wall, cpu


def measure(repeats: int, rounds: int, folder: Path, code: Path = PROJECT) -> dict:
    py = sys.executable
    run_cfg = f"num-server-rounds={rounds} overwrite=true output-dir='{folder / 'run'}'"
    steps = {
        "imports": [py, "-c", "import fedpcd_app.server.server_app"],
        "run": [py, "-m", "fedpcd_app.simulate", "--workers", "0", "--run-config", run_cfg],
        "run, no figures": [py, "-m", "fedpcd_app.simulate", "--workers", "0", "--run-config",
                            run_cfg + " figures='none'"],
        "report": [py, "-m", "fedpcd_app.analysis.run_report", str(folder / "run")],
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpus: dict[str, list[float]] = {name: [] for name in steps}
    load = [os.getloadavg()]
    for _ in range(repeats):  # interleaved: a change in the machine's load hits every step alike
        for name, cmd in steps.items():
            wall, cpu = timed(cmd, code)
            times[name].append(wall)
            cpus[name].append(cpu)
    load.append(os.getloadavg())
    for name in ("report.md", "figures/client_hist.png", "figures/convergence.png", "figures/heatmap.png"):
        if not (folder / "run" / name).is_file():
            raise SystemExit(f"error: the run left no {name}")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    cpu_medians = {name: statistics.median(cs) for name, cs in cpus.items()}
    return {"rounds": rounds, "repeats": repeats, "code": str(code), "load_average": list(load[-1]),
            "load_average_start": list(load[0]), "cores": os.cpu_count(), "seconds": medians,
            "all_seconds": times, "cpu_seconds": cpu_medians, "all_cpu_seconds": cpus,
            "ratio_to_imports": {name: t / medians["imports"] for name, t in medians.items()},
            "cpu_ratio_to_imports": {name: c / cpu_medians["imports"] for name, c in cpu_medians.items()},
            "report_cost_in_run": medians["run"] - medians["run, no figures"],
            "report_cpu_in_run": cpu_medians["run"] - cpu_medians["run, no figures"]}


def table(res: dict) -> str:
    load = ", ".join(f"{x:.2f}" for x in res["load_average_start"]) + " → " + \
        ", ".join(f"{x:.2f}" for x in res["load_average"])
    lines = [f"3-round digits run (rounds={res['rounds']}), median of {res['repeats']}; load average {load} "
             f"on {res['cores']} cores; code {res['code']}",
             "", "| step | wall s | × imports | CPU s | × imports (CPU) |", "|---|---:|---:|---:|---:|"]
    for name, t in res["seconds"].items():
        lines.append(f"| {name} | {t:.2f} | {res['ratio_to_imports'][name]:.2f} | {res['cpu_seconds'][name]:.2f} "
                     f"| {res['cpu_ratio_to_imports'][name]:.2f} |")
    lines.append(f"\nthe report's cost inside the run (run - run, no figures): {res['report_cost_in_run']:.2f} s wall, "
                 f"{res['report_cpu_in_run']:.2f} s CPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one repeat of a 1-round run (the script works)")
    parser.add_argument("--code", type=Path, default=PROJECT, help="the app checkout to time (default: this one)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be at least 1")
    repeats, rounds = (1, 1) if args.smoke else (args.repeats, args.rounds)
    with tempfile.TemporaryDirectory(prefix="fedpcd-short-run-") as tmp:
        res = measure(repeats, rounds, Path(tmp), args.code.resolve())
    print(json.dumps(res, indent=2) if args.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
