"""Short runs: a 3-round digits run against the app's import time, and its report step alone.

    flock /tmp/fedpcd-heavy.lock python benchmarks/short_run.py [--repeats 5] [--rounds 3] [--json]

Measured, as wall time of fresh commands on this machine, each ``--repeats`` times (the median
is reported, with the load average beside it):

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
1-round run (checks that the script works; its figures mean nothing). On a loaded machine the
figures mean little: run it under ``flock /tmp/fedpcd-heavy.lock`` on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(PROJECT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=PROJECT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}): "
                         f"{(proc.stderr.strip().splitlines() or [''])[-1]}")
    return wall


def measure(repeats: int, rounds: int, folder: Path) -> dict:
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
    for _ in range(repeats):  # interleaved: a change in the machine's load hits every step alike
        for name, cmd in steps.items():
            times[name].append(timed(cmd))
    for name in ("report.md", "figures/client_hist.png", "figures/convergence.png", "figures/heatmap.png"):
        if not (folder / "run" / name).is_file():
            raise SystemExit(f"error: the run left no {name}")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    floor = medians["imports"]
    return {"rounds": rounds, "repeats": repeats, "load_average": list(os.getloadavg()),
            "cores": os.cpu_count(), "seconds": medians, "all_seconds": times,
            "ratio_to_imports": {name: t / floor for name, t in medians.items()},
            "report_cost_in_run": medians["run"] - medians["run, no figures"]}


def table(res: dict) -> str:
    lines = [f"3-round digits run (rounds={res['rounds']}), median of {res['repeats']}; load average "
             f"{', '.join(f'{x:.2f}' for x in res['load_average'])} on {res['cores']} cores",
             "", "| step | seconds | × imports |", "|---|---:|---:|"]
    for name, t in res["seconds"].items():
        lines.append(f"| {name} | {t:.2f} | {res['ratio_to_imports'][name]:.2f} |")
    lines.append(f"\nthe report's cost inside the run (run - run, no figures): {res['report_cost_in_run']:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one repeat of a 1-round run (the script works)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be at least 1")
    repeats, rounds = (1, 1) if args.smoke else (args.repeats, args.rounds)
    with tempfile.TemporaryDirectory(prefix="fedpcd-short-run-") as tmp:
        res = measure(repeats, rounds, Path(tmp))
    print(json.dumps(res, indent=2) if args.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
