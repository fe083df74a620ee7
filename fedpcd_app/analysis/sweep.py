"""Paired-seed sweeps: settings × method variants × hyperparameter grid × seeds.

    python -m fedpcd_app.sweep run_configs/sweeps/<x>.toml [--jobs N] [--out DIR] [--dry-run]

A sweep file (TOML)::

    name = "fedpcd-ablation-digits"
    seeds = [0, 1, 2]
    [base]                      # run-config keys shared by every run
    dataset = "digits"
    [[settings]]                # optional: one entry per dataset/partition setting
    name = "alpha0.1"
    dirichlet-alpha = 0.1
    [[methods]]                 # one entry per method variant
    name = "fedpcd"             # the label in tables and figures
    method = "fedpcd"
    fedpcd-tau = [0.01, 0.02]   # a list forms a grid (Cartesian product over list keys)
    [methods.by-setting."alpha0.1"] # optional: keys (or grids) for one setting only
    fedpcd-tau = 0.05

Tuning (optional; :mod:`fedpcd_app.analysis.tuning`)::

    [tuning]
    budget = 8                  # configurations per method entry and seed, equal for all
    extend-edges = true         # extend a grid whose selected value is on its edge
    max-extensions = 4          # extension passes at most
    fedavg-both-weightings = true  # add FedAvg under a missing weighting (default true)
    [tuning.grids.fedpcd]       # optional: an entry's own grid over its declared space
    fedpcd-tau = [0.01, 0.02]

With ``[tuning]`` every method entry is tuned over its method's declared space
(``tuning.SPACES``, the papers' grids) plus ``lr`` (keys the entry sets to a scalar are fixed;
lists in the entry or in ``[tuning.grids.<entry>]`` replace a declared grid; a tuned key set
in ``[base]`` or a setting is overridden by the grid); the lr grid is extended geometrically
until the entry has exactly ``budget`` configurations (an entry with more is refused). After
the pass, a selected (validation) value on the edge of its grid is extended one geometric
step per pass, up to its declared bound, and the new points run in the same output folder
(rerunning the command recomputes them and skips finished runs). When the entries' methods
weight clients differently, entries ``fedavg-data-size`` / ``fedavg-uniform`` are added for
a FedAvg weighting no entry runs (the baselines the report requires).

Precedence (later wins): pyproject defaults < ``[base]`` < setting < method (its
``by-setting`` table over its other keys) < grid point <
``seed`` and ``output-dir``. Paired seeds come from the run config: ``seed`` alone fixes the
partition, initial model, sampled clients and batch order, so every method under one seed
sees the same federation (FedPCD paper, Sec. 5: "five paired random seeds").

Each run goes to ``<out>/<setting>/<method>/<grid point>/seed<k>`` (deterministic from its
labels) with a ``run.json`` (its labels and overrides) and, once finished, the results of
:mod:`fedpcd_app.server.results`. A run whose folder already holds ``summary.json`` is skipped, so
an interrupted sweep is restarted by rerunning the command: a run interrupted by Ctrl-C/SIGTERM
(its summary says so) continues from its checkpoint (``resume-from``), any other pending run
starts again from round 1 with ``overwrite = true``, replacing what an earlier attempt left.
Every run's config is validated (method registered, keys known, values in range) before the first run starts.
Runs execute through :func:`fedpcd_app.runtime.simulate.simulate`, each in a fresh process
(``--jobs`` processes in parallel), on the local engine (default; ``--workers`` worker
processes per run, default the usable cores shared among the jobs) or with ``--engine ray``
on Flower's Ray engine (``flwr run`` against a private local SuperLink per run).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import itertools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcore.config import ConfigError, Scalar, resolve
from fedpcd_app.runtime.simulate import add_engine_arguments
from fedpcd_app.server.config import check
from fedpcd_app.server.results import SUMMARY, write_json_atomic

RUN_FILE = "run.json"
MANIFEST = "sweep.json"
LOG_FILE = "run.log"
DEFAULT_SETTING = "default"
NO_GRID = "base"


class SweepError(ValueError):
    """A sweep file is malformed or one of its runs has an invalid config (one line)."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its labels and the run-config overrides that define it."""

    setting: str
    method: str  # the method entry's label (not necessarily the registered method name)
    grid: tuple[tuple[str, Scalar], ...]  # the grid point: (key, value) of every list-valued key
    seed: int
    overrides: dict[str, Scalar]  # everything except output-dir

    @property
    def variant(self) -> str:
        """The grid point as a label, ``key=value,key=value`` (``base`` without a grid)."""
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.grid) or NO_GRID

    def folder(self, out: Path) -> Path:
        return out / _safe(self.setting) / _safe(self.method) / _safe(self.variant) / f"seed{self.seed}"

    def labels(self) -> dict[str, Any]:
        return {"setting": self.setting, "method": self.method, "variant": self.variant,
                "grid": dict(self.grid), "seed": self.seed, "overrides": self.overrides}


def _fmt(value: Scalar) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _safe(label: str) -> str:
    """A folder name from a label: keep letters, digits and ``._=,+-``; map the rest to ``_``."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", label)


# -- parsing ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Sweep:
    name: str
    seeds: list[int]
    runs: list[RunSpec]
    source: dict[str, Any]
    tuning: Any = None  # fedpcd_app.analysis.tuning.Tuning of a [tuning] table, else None


def _scalars(table: Mapping[str, Any], where: str, allow_lists: bool) -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        if isinstance(value, list):
            if not allow_lists:
                raise SweepError(f"{where}: key '{key}' is a list; grids go in [[methods]] entries only")
            if not value:
                raise SweepError(f"{where}: key '{key}' is an empty list; give at least one value")
            bad = [v for v in value if isinstance(v, (list, dict))]
        else:
            bad = [value] if isinstance(value, dict) else []
        if bad:
            raise SweepError(f"{where}: key '{key}' must be a scalar or a list of scalars")
        out[key] = value
    return out


def _named(entries: Any, what: str) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SweepError(f"'{what}' must be an array of tables ([[{what}]])")
    out, seen = [], set()
    for i, entry in enumerate(entries):
        entry = dict(entry)
        name = entry.pop("name", None)
        if not isinstance(name, str) or not name:
            raise SweepError(f"[[{what}]] entry {i + 1} has no 'name'; add name = \"<label>\"")
        if name in seen:
            raise SweepError(f"[[{what}]] name '{name}' is used twice; labels must be unique")
        seen.add(name)
        out.append((name, entry))
    return out


def parse_sweep(source: Mapping[str, Any]) -> Sweep:
    """Expand a parsed sweep file into its runs (no validation of run-config keys yet)."""
    known = {"name", "seeds", "base", "settings", "methods", "tuning"}
    unknown = sorted(set(source) - known)
    if unknown:
        raise SweepError(f"unknown top-level key(s) {', '.join(unknown)}: a sweep has {', '.join(sorted(known))}")
    name = source.get("name")
    if not isinstance(name, str) or not name:
        raise SweepError("the sweep has no 'name'; add name = \"<sweep name>\" at the top")
    seeds = source.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise SweepError("'seeds' must be a non-empty list of integers >= 0, e.g. seeds = [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise SweepError("'seeds' has duplicates")
    base = _scalars(source.get("base", {}), "[base]", allow_lists=False)
    settings = _named(source.get("settings", [{"name": DEFAULT_SETTING}]), "settings")
    if "methods" not in source:
        raise SweepError("the sweep has no [[methods]] entry; add at least one (name, method, ...)")
    methods = _named(source["methods"], "methods")
    tuning = None
    if "tuning" in source:
        from fedpcd_app.analysis import tuning as tuning_mod

        try:
            tuning = tuning_mod.parse_tuning(source["tuning"], [n for n, _ in methods])
        except tuning_mod.TuningError as exc:
            raise SweepError(str(exc)) from None
        methods += tuning_mod.fedavg_baselines(methods, base, tuning)
    for key in ("seed", "output-dir"):
        if key in base or any(key in e for _, e in settings + methods):
            raise SweepError(f"key '{key}' is set by the sweep itself; use 'seeds' at the top instead" if key == "seed"
                             else f"key '{key}' is set by the sweep itself; use --out")
    runs = []
    for setting, skeys in settings:
        skeys = _scalars(skeys, f"[[settings]] '{setting}'", allow_lists=False)
        for label, mkeys in methods:
            mkeys = dict(mkeys)
            per_setting = mkeys.pop("by-setting", {})
            if not isinstance(per_setting, dict) or set(per_setting) - {n for n, _ in settings}:
                raise SweepError(f"[[methods]] '{label}': 'by-setting' must be a table keyed by setting names "
                                 f"({', '.join(n for n, _ in settings)})")
            mkeys.update(per_setting.get(setting, {}))
            mkeys = _scalars(mkeys, f"[[methods]] '{label}'", allow_lists=True)
            if tuning is not None:  # the declared search space, filled to the budget
                method = str(mkeys.get("method", skeys.get("method", base.get("method", "fedavg"))))
                try:
                    mkeys = tuning_mod.entry_grid(label, method, mkeys, tuning)
                except tuning_mod.TuningError as exc:
                    raise SweepError(str(exc)) from None
            grid_keys = [k for k, v in mkeys.items() if isinstance(v, list)]
            fixed = {k: v for k, v in mkeys.items() if not isinstance(v, list)}
            for point in itertools.product(*(mkeys[k] for k in grid_keys)):
                grid = tuple(zip(grid_keys, point))
                for seed in seeds:
                    overrides = {**base, **skeys, **fixed, **dict(grid), "seed": seed}
                    runs.append(RunSpec(setting, label, grid, seed, overrides))
    return Sweep(name, list(seeds), runs, dict(source), tuning)


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            source = tomllib.load(fh)
    except FileNotFoundError:
        raise SweepError(f"no sweep file {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{path} is not valid TOML: {exc}") from None
    return parse_sweep(source)


def validate(sweep: Sweep) -> None:
    """Check every run's config (method registered, keys known, values in range, the
    method's own hyperparameters) before any run starts; raise one-line SweepError."""
    from strategies import registry

    methods = registry.names()
    for run in sweep.runs:
        where = f"sweep '{sweep.name}', setting '{run.setting}', method entry '{run.method}'"
        method = run.overrides.get("method", resolve()["method"])
        if method not in methods:
            raise SweepError(f"{where}: method '{method}' is not registered (available: {', '.join(methods)})")
        try:
            check(resolve(run.overrides))
        except ConfigError as exc:
            raise SweepError(f"{where} ({run.variant}, seed {run.seed}): {exc}") from None


# -- running ---------------------------------------------------------------------------------
def is_done(folder: Path) -> bool:
    """A summary.json that is not an interrupted run's (that one is continued: :func:`_run_one`)."""
    return (folder / SUMMARY).is_file() and not was_interrupted(folder)


def was_interrupted(folder: Path) -> bool:
    """The run in ``folder`` was stopped by SIGINT/SIGTERM (its summary says so)."""
    try:
        reason = json.loads((folder / SUMMARY).read_text()).get("incomplete_reason") or ""
    except (OSError, ValueError, AttributeError):
        return False
    return str(reason).startswith("interrupted at round")


def _run_one(overrides: dict[str, Scalar], folder: str, engine: Mapping[str, Any] | None = None) -> str:
    """Process body: one run, its output (and its engine's) to ``run.log``; ``engine`` holds
    :func:`~fedpcd_app.runtime.simulate.simulate`'s engine arguments."""
    log = open(Path(folder) / LOG_FILE, "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    from fedpcd_app.runtime.engine import stop_forkserver
    from fedpcd_app.runtime.simulate import simulate

    try:
        from fedpcd_app.server.checkpoint import rounds_in

        # figures = 'none': the sweep draws its report and figures once, over all its runs, at its end.
        # A pending run's folder may hold what an earlier attempt left: an interrupted run with a
        # checkpoint is continued from it, anything else replaced (overwrite; a finished run is never rerun).
        again = ({"resume-from": folder} if was_interrupted(Path(folder)) and rounds_in(folder)
                 else {"overwrite": True})
        return str(simulate({**overrides, "output-dir": folder, "figures": "none", **again}, **(engine or {})))
    finally:
        stop_forkserver()  # this process ends with the run (max_tasks_per_child=1)


def default_workers(jobs: int) -> int:
    """Local-engine workers per run: the usable cores shared among the parallel runs; 0 (the
    ClientApps in the run's own process) when that leaves fewer than two per run."""
    from fedpcd_app.runtime.engine import usable_cores

    per_run = usable_cores() // jobs
    return per_run if per_run >= 2 else 0


def check_finished(sweep: Sweep, out: Path) -> None:
    """A finished run is reused only if it was made with the same overrides (an edited
    sweep file must not silently mix old results into a new table)."""
    for run in sweep.runs:
        folder = run.folder(out)
        if is_done(folder) and (folder / RUN_FILE).is_file():
            old = json.loads((folder / RUN_FILE).read_text()).get("overrides")
            if old != json.loads(json.dumps(run.overrides)):
                raise SweepError(f"{folder} holds a finished run made with other settings ({old}); "
                                 "delete that folder or use another --out")


def run_sweep(sweep: Sweep, out: Path, jobs: int = 1, progress: bool = True,
              engine: Mapping[str, Any] | None = None) -> list[tuple[RunSpec, str]]:
    """Run every pending run; returns the failures ``(run, reason)`` (finished runs are kept).
    ``engine``: :func:`~fedpcd_app.runtime.simulate.simulate`'s engine arguments (``engine``,
    ``workers``: default :func:`default_workers`, ``num_cpus``, ``num_gpus``)."""
    from tqdm import tqdm

    check_finished(sweep, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MANIFEST, {"name": sweep.name, "seeds": sweep.seeds, "source": sweep.source,
                                       "runs": [{**r.labels(), "folder": str(r.folder(out).relative_to(out))}
                                                for r in sweep.runs]})
    pending = [r for r in sweep.runs if not is_done(r.folder(out))]
    for run in pending:
        run.folder(out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(run.folder(out) / RUN_FILE, run.labels())
    failures: list[tuple[RunSpec, str]] = []
    bar = tqdm(total=len(sweep.runs), initial=len(sweep.runs) - len(pending), unit="run",
               desc=sweep.name, disable=not progress, dynamic_ncols=True)
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter per run: engine and torch state do not leak
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, max_tasks_per_child=1) as pool:
        engine = {**(engine or {})}
        if engine.get("workers") is None:
            engine["workers"] = default_workers(jobs)
        futures = {pool.submit(_run_one, r.overrides, str(r.folder(out)), engine): r for r in pending}
        for fut in cf.as_completed(futures):
            run = futures[fut]
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001 - one failed run must not stop the sweep
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
                failures.append((run, reason))
                bar.write(f"FAILED {run.folder(out)}: {reason} (log: {run.folder(out) / LOG_FILE})")
            bar.set_postfix_str(f"{run.method} {run.variant} seed{run.seed}", refresh=False)
            bar.update(1)
    bar.close()
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="sweep file (TOML), e.g. run_configs/sweeps/fedpcd_ablation_digits.toml")
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (one process each; default 1)")
    parser.add_argument("--out", default="", help="output folder (default: outputs/sweeps/<name>)")
    parser.add_argument("--dry-run", action="store_true", help="validate and list the runs; run nothing")
    add_engine_arguments(parser, workers_help="local engine: worker processes per run (default: the usable "
                                              "cores / --jobs, or 0 = in the run's process below 2)")
    parser.add_argument("--ray", default="", metavar="ADDRESS|auto|local",
                        help="run each run as a Ray task on this Ray cluster (head host:port; auto: the one "
                             "`ray start` made here; local: a private Ray), --num-cpus/--num-gpus per run "
                             "(fedpcd_app/analysis/ray_sweep.py)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        print("error: --jobs must be >= 1", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 0:
        print(f"error: --workers {args.workers}: give 0 (in each run's process) or more", file=sys.stderr)
        return 2
    try:
        sweep = load_sweep(args.sweep)
        validate(sweep)
        out = Path(args.out or Path("outputs") / "sweeps" / _safe(sweep.name)).resolve()
        check_finished(sweep, out)
        if args.ray:  # a bad or dead address, or --engine ray: one line before anything starts
            from fedpcd_app.analysis.ray_sweep import check_ray

            args.ray = check_ray(args.ray, args.engine)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = sum(is_done(r.folder(out)) for r in sweep.runs)
    print(f"{sweep.name}: {len(sweep.runs)} runs ({done} already done) -> {out}")
    if args.dry_run:
        for r in sweep.runs:
            state = "done" if is_done(r.folder(out)) else "todo"
            print(f"  [{state}] {r.folder(out).relative_to(out)}  {json.dumps(r.overrides, sort_keys=True)}")
        return 0
    t0 = time.time()
    engine = {"engine": args.engine, "workers": args.workers, "num_cpus": args.num_cpus, "num_gpus": args.num_gpus}

    def run_pass() -> list[tuple[RunSpec, str]]:  # --ray: each run as a Ray task (analysis/ray_sweep.py)
        if args.ray:
            from fedpcd_app.analysis.ray_sweep import run_sweep_ray

            return run_sweep_ray(sweep, out, args.ray, engine=engine)
        return run_sweep(sweep, out, jobs=args.jobs, engine=engine)

    failures = run_pass()
    if not failures:  # [tuning] extend-edges: grid points beyond a selection on an edge, same sweep
        from fedpcd_app.analysis.tuning import extend_edges

        failures = extend_edges(sweep, out, run_pass)
    print(f"{len(sweep.runs) - len(failures)}/{len(sweep.runs)} runs finished in {time.time() - t0:.0f} s -> {out}")
    for run, reason in failures:
        print(f"  failed: {run.folder(out).relative_to(out)}: {reason}", file=sys.stderr)
    if len(failures) < len(sweep.runs):
        _report_and_figures(out)
    return 1 if failures else 0


def _report_and_figures(out: Path) -> None:
    """The sweep's report.md and figures (its runs draw none of their own): ``python -m
    fedpcd_app.report <out>`` and ``python -m fedpcd_app.figures <out>``."""
    for module in ("fedpcd_app.report", "fedpcd_app.figures"):  # the commands a user reruns
        proc = subprocess.run([sys.executable, "-m", module, str(out)], capture_output=True, text=True, check=False,
                              cwd=Path(__file__).resolve().parents[2])
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            print(f"note: {module} failed ({err[-1] if err else proc.returncode}); run python -m {module} {out}",
                  file=sys.stderr)
            return
    print(f"wrote {out / 'report.md'} and the figures in {out / 'figures'}")


if __name__ == "__main__":
    sys.exit(main())
