"""Where the Flower path's seconds go: ``scripts/flwr_run.sh`` timed step by step, with the CPU
time of every process it starts.

    python benchmarks/flwr_startup.py [--run-config "method='craft' num-server-rounds=3"] [--json OUT] [--code DIR]

Runs ``python -m fedpcd_app.flwr_run --run-config ...`` (what ``scripts/flwr_run.sh`` runs) once
and prints:

* **the timeline**: the wall second at which each step's first output line arrived (the
  script's ``run N started`` after the SuperLink's start and ``flwr run``; the ServerApp's
  first log line; each round; the report; ``done``; the final status line) and the time
  between consecutive steps;
* **the CPU time per process kind** (user + sys from ``/proc/<pid>/stat``, sampled every
  ``--interval`` s over the whole process tree, each process's last sample): this driver
  (``fedpcd_app.flwr_run``), each ``flwr`` CLI call (``run``, ``log``, ``ls``), the SuperLink,
  the SuperExec, the simulation process (Flower's ServerApp runner), Ray's own processes (GCS,
  raylet, dashboard, log monitor, ...), Ray's workers (the ClientApp actors), the report's
  drawing process. A process that ends between two samples loses at most one interval's CPU;
  processes that hand their work to others (the CLI's) are counted where the work runs.

``--code DIR``: time the app checkout in DIR (default: this one), e.g. main's for a before/after.
Linux only (``/proc``). On a machine shared with other jobs the wall times move with the load;
the CPU times much less.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from fedpcd_app.runtime.flwr_run import descendants

PROJECT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# (step name, pattern of the output line that starts it), in the order they happen
STEPS = (
    ("run started (config checked, SuperLink up, flwr run)", re.compile(r"^run \d+ started")),
    ("ServerApp's first line (simulation process: imports, data)", re.compile(r"\] \S+ on \S+: \d+ clients")),
    ("round 1 (Ray actors start, import the ClientApp)", re.compile(r"round +1/")),
    ("last round", None),  # set from --rounds
    ("report and figures", re.compile(r"report and figures|report/figures not written")),
    ("done line", re.compile(r"\] done: ")),
    ("final status (log stream ends, flwr ls)", re.compile(r"^run \d+ status: ")),
)

KINDS = (  # (kind, pattern of /proc/<pid>/cmdline joined by spaces), first match wins
    ("report drawing", re.compile(r"fedpcd_app\.analysis\.run_report")),
    ("driver (fedpcd_app.flwr_run)", re.compile(r"fedpcd_app\.flwr_run")),
    ("flwr CLI: run", re.compile(r"/flwr run ")),
    ("flwr CLI: log", re.compile(r"/flwr log ")),
    ("flwr CLI: ls", re.compile(r"/flwr ls ")),
    ("flwr CLI: other", re.compile(r"/flwr \w")),
    ("SuperLink", re.compile(r"flower-superlink")),
    ("SuperExec", re.compile(r"flower-superexec")),
    ("simulation process (ServerApp)", re.compile(r"flwr-simulation")),
    ("Ray workers (ClientApp actors)", re.compile(r"ray::|default_worker\.py")),
    ("Ray processes (GCS, raylet, dashboard, ...)", re.compile(r"ray|gcs_server|raylet")),
)


def cpu_seconds(pid: int) -> tuple[float, str] | None:
    """(user + sys seconds, cmdline) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK, cmd


def kind_of(cmd: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(cmd):
            return kind
    return f"other: {Path(cmd.split()[0]).name}" if cmd else "other"


def measure(run_config: str, rounds: int, interval: float, code: Path = PROJECT) -> dict:
    cmd = [sys.executable, "-m", "fedpcd_app.flwr_run", "--run-config", run_config]
    env = {**os.environ, "PYTHONPATH": str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    steps = [(name, re.compile(rf"round +{rounds}/") if pattern is None else pattern) for name, pattern in STEPS]
    seen: dict[int, tuple[float, str]] = {}  # pid -> (last CPU seconds, cmdline)
    done = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)

    def sample() -> None:
        while True:
            for pid in [proc.pid, *descendants(proc.pid)]:
                got = cpu_seconds(pid)
                if got is not None and got[1]:
                    seen[pid] = got
            if done.wait(interval):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        now = time.perf_counter() - t0
        lines.append(f"{now:8.2f}  {line.rstrip()}")
        for name, pattern in steps:
            if name not in marks and pattern.search(line):
                marks[name] = now
    proc.wait()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit("error: the run failed (exit %d):\n%s" % (proc.returncode, "\n".join(lines[-20:])))
    by_kind: dict[str, list[float]] = {}
    for cpu, cmdline in seen.values():
        by_kind.setdefault(kind_of(cmdline), []).append(cpu)
    timeline, last = [], 0.0
    for name, _ in steps:
        if name in marks:
            timeline.append({"step": name, "at_s": marks[name], "took_s": marks[name] - last})
            last = marks[name]
    timeline.append({"step": "exit", "at_s": wall, "took_s": wall - last})
    return {"run_config": run_config, "code": str(code), "wall_s": wall, "timeline": timeline,
            "cpu_s": {k: {"processes": len(v), "cpu_s": sum(v)} for k, v in
                      sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))},
            "cpu_total_s": sum(cpu for cpu, _ in seen.values()), "load_average": list(os.getloadavg()),
            "cores": os.cpu_count(), "output": lines}


def table(res: dict) -> str:
    out = [f"`python -m fedpcd_app.flwr_run --run-config \"{res['run_config']}\"`: {res['wall_s']:.1f} s wall, "
           f"{res['cpu_total_s']:.1f} s CPU in all; load average {', '.join(f'{x:.2f}' for x in res['load_average'])} "
           f"on {res['cores']} cores; code {res['code']}", "",
           "| step (first line of) | at s | took s |", "|---|---:|---:|"]
    out += [f"| {t['step']} | {t['at_s']:.1f} | {t['took_s']:.1f} |" for t in res["timeline"]]
    out += ["", "| process kind | processes | CPU s |", "|---|---:|---:|"]
    out += [f"| {k} | {v['processes']} | {v['cpu_s']:.1f} |" for k, v in res["cpu_s"].items()]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="method='craft' num-server-rounds=3")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between CPU samples")
    parser.add_argument("--json", default="", help="also write the results (and the run's output) to this file")
    parser.add_argument("--show-output", action="store_true", help="print the run's output lines, timestamped")
    parser.add_argument("--code", type=Path, default=PROJECT, help="the app checkout to time (default: this one)")
    args = parser.parse_args(argv)
    if not os.path.isdir("/proc"):
        parser.error("needs Linux's /proc")
    found = re.search(r"num-server-rounds\s*=\s*(\d+)", args.run_config)
    res = measure(args.run_config, int(found.group(1)) if found else 60, args.interval, args.code.resolve())
    if args.show_output:
        print("\n".join(res["output"]) + "\n")
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
