"""Paired-seed sweeps: settings × method variants × hyperparameter grid × seeds.

    python -m fedpcd_app.sweep run_configs/sweeps/<x>.toml [--jobs N] [--out DIR] [--dry-run]
        [--set KEY=VALUE ...] [--seeds 0,1] [--only NAME|KEY=VALUE ...] [--gpus-per-run G]

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
    # tuned-from = "docs/results/..."  # optional: where an untuned entry's fixed values were selected;
    #                                   # the report marks entries without it "untuned" beside tuned ones

Tuning (optional; :mod:`fedpcd_app.analysis.tuning`)::

    [tuning]
    budget = 8                  # configurations per method entry and seed, equal for all
    extend-edges = true         # extend a grid whose selected value is on its edge
    max-extensions = 4          # extension passes at most
    extend-objectives = ["mean", "worst10"]  # selections extended (default: [objective] alone)
    fedavg-both-weightings = true  # add FedAvg under a missing weighting (default true)
    [tuning.grids.fedpcd]       # optional: an entry's own grid over its declared space
    fedpcd-tau = [0.01, 0.02]

With ``[tuning]`` every method entry is tuned over its method's declared space
(the ``grid`` of its ``Params`` fields, the papers' grids) plus ``lr`` (keys the entry sets to a scalar are fixed;
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
Runs execute through :func:`fedpcd_app.runtime.simulate.simulate` in ``--jobs`` run processes
(:mod:`fedpcd_app.analysis.runner`), each reused from run to run (the imports and data once per
process, its state put back between runs; ``--fresh-processes``: one per run), each on its own
GPUs (``CUDA_VISIBLE_DEVICES``, ``--gpus-per-run``: :mod:`fedpcd_app.runtime.placement`), on the
local engine (default; ``--workers`` worker processes per run, default the usable cores shared
among the jobs) or with ``--engine ray`` on Flower's Ray engine (``flwr run`` against a private
local SuperLink per run). ``--set key=value``, ``--seeds`` and ``--only`` cut a file down on the
command line (:func:`cut_down`). The format, flags and placement: docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import queue
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcore.config import APP, ConfigError, Scalar, resolve
from fedpcd_app.analysis.layout import MANIFEST, NO_GRID, RUN_FILE, safe
from fedpcd_app.analysis.ray_sweep import RaySweepError
from fedpcd_app.analysis.runner import LOG_FILE, was_interrupted
from fedpcd_app.runtime.simulate import add_engine_arguments
from fedpcd_app.server.config import check
from fedpcd_app.server.results import SUMMARY, write_json_atomic

DEFAULT_SETTING = "default"


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
    tuned_from: str = ""  # the entry's `tuned-from`: where its fixed values were selected (else untuned)

    @property
    def variant(self) -> str:
        """The grid point as a label, ``key=value,key=value`` (``base`` without a grid)."""
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.grid) or NO_GRID

    def folder(self, out: Path) -> Path:
        return out / safe(self.setting) / safe(self.method) / safe(self.variant) / f"seed{self.seed}"

    def labels(self) -> dict[str, Any]:
        return {"setting": self.setting, "method": self.method, "variant": self.variant,
                "grid": dict(self.grid), "seed": self.seed, "overrides": self.overrides,
                **({"tuned_from": self.tuned_from} if self.tuned_from else {})}


def _fmt(value: Scalar) -> str:
    return repr(value) if isinstance(value, float) else str(value)


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
    known = {"name", "seeds", "base", "settings", "methods", "tuning", "primary"}
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
    if "primary" in source:  # [[primary]]: a sweep without [tuning] declares its primary comparisons here
        from fedpcd_app.analysis import tuning as tuning_mod

        if tuning is not None and tuning.primary:
            raise SweepError("primary comparisons are declared twice: [[primary]] and [[tuning.primary]]; keep one")
        try:
            tuning_mod.parse_primary(source["primary"], [n for n, _ in methods])
        except tuning_mod.TuningError as exc:
            raise SweepError(str(exc).replace("[[tuning.primary]]", "[[primary]]")) from None
    for key in ("seed", "output-dir"):
        if key in base or any(key in e for _, e in settings + methods):
            raise SweepError(f"key '{key}' is set by the sweep itself; use 'seeds' at the top instead" if key == "seed"
                             else f"key '{key}' is set by the sweep itself; use --out")
    runs = []
    notes: dict[str, str] = {}  # method entry -> its tuned-from
    for setting, skeys in settings:
        skeys = _scalars(skeys, f"[[settings]] '{setting}'", allow_lists=False)
        resolved = []  # (label, registered method, keys with the tuned ones as lists)
        for label, mkeys in methods:
            mkeys = dict(mkeys)
            per_setting = mkeys.pop("by-setting", {})
            if not isinstance(per_setting, dict) or set(per_setting) - {n for n, _ in settings}:
                raise SweepError(f"[[methods]] '{label}': 'by-setting' must be a table keyed by setting names "
                                 f"({', '.join(n for n, _ in settings)})")
            mkeys.update(per_setting.get(setting, {}))
            tuned_from = mkeys.pop("tuned-from", "")
            if not isinstance(tuned_from, str):
                raise SweepError(f"[[methods]] '{label}': 'tuned-from' must be a string naming where its values were "
                                 "selected, e.g. tuned-from = \"docs/results/fedpcd_ablation_digits (lr 0.3)\"")
            notes[label] = tuned_from
            mkeys = _scalars(mkeys, f"[[methods]] '{label}'", allow_lists=True)
            method = str(mkeys.get("method", skeys.get("method", base.get("method", APP["method"].default))))
            if tuning is not None:  # the declared search space, filled to the budget
                try:
                    mkeys = tuning_mod.entry_grid(label, method, mkeys, tuning)
                except tuning_mod.TuningError as exc:
                    raise SweepError(str(exc)) from None
            resolved.append((label, method, mkeys))
        # [tuning]: reductions at every baseline lr, and the baselines' lr values (tuning.coverage_points)
        extra = tuning_mod.coverage_points(resolved) if tuning is not None else {}
        for label, _, mkeys in resolved:
            grid_keys = [k for k, v in mkeys.items() if isinstance(v, list)]
            fixed = {k: v for k, v in mkeys.items() if not isinstance(v, list)}
            points = [tuple(zip(grid_keys, point)) for point in itertools.product(*(mkeys[k] for k in grid_keys))]
            points += [tuple(point.items()) for point in extra.get(label, [])]
            for grid in points:
                for seed in seeds:
                    overrides = {**base, **skeys, **fixed, **dict(grid), "seed": seed}
                    runs.append(RunSpec(setting, label, grid, seed, overrides, notes.get(label, "")))
    return Sweep(name, list(seeds), runs, dict(source), tuning)


def load_sweep(path: str | Path, **cut: Any) -> Sweep:
    """A sweep file's runs; ``cut``: :func:`cut_down`'s command-line cuts (``sets``, ``seeds``, ``only``)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            source = tomllib.load(fh)
    except FileNotFoundError:
        raise SweepError(f"no sweep file {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{path} is not valid TOML: {exc}") from None
    return parse_sweep(cut_down(source, **cut) if cut else source)


# -- cutting a sweep down on the command line --------------------------------------------------
def parse_set(text: str) -> tuple[str, Scalar]:
    """``--set key=value``: the value read as TOML (``3``, ``0.1``, ``true``, ``"x"``), else as
    a plain string (``--set dataset=digits``)."""
    key, eq, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not eq or not key or not value:
        raise SweepError(f"--set {text!r}: give key=value, e.g. --set num-server-rounds=3")
    if key == "seed":
        raise SweepError("--set seed: the sweep sets each run's seed; use --seeds 0,1")
    if key == "output-dir":
        raise SweepError("--set output-dir: the sweep sets each run's folder; use --out")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    if isinstance(parsed, (list, dict)):
        raise SweepError(f"--set {text!r}: a --set value is one scalar; grids go in the file's [[methods]] entries")
    return key, parsed


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2``."""
    try:
        seeds = [int(p) for p in text.split(",")]
    except ValueError:
        raise SweepError(f"--seeds {text!r}: give integers separated by commas, e.g. --seeds 0,1") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds {text!r}: give distinct integers >= 0")
    return seeds


def _set_everywhere(entry: dict[str, Any], key: str, value: Scalar) -> None:
    if key in entry:
        entry[key] = value
    for table in (entry.get("by-setting") or {}).values():
        if isinstance(table, dict) and key in table:
            table[key] = value


def _matches(entry: Mapping[str, Any], base: Mapping[str, Any], key: str, value: str) -> bool:
    have = entry.get(key, base.get(key, resolve().get(key)))
    return str(have).lower() == value.lower() if isinstance(have, bool) else str(have) == value


def cut_down(source: Mapping[str, Any], *, sets: list[str] = (), seeds: str | None = None,
             only: list[str] = ()) -> dict[str, Any]:
    """A sweep file's content with the command line's cuts: ``--set key=value`` over ``[base]``
    (and over the same key in any setting or method entry, so the value holds for every run),
    ``--seeds`` for ``seeds``, ``--only`` keeping some entries: ``NAME`` (a [[methods]] entry's
    name), ``setting=NAME`` (a [[settings]] entry) or ``key=value`` (the [[methods]] entries
    whose key, or the base's, has that value: ``method=fedavg``). Several ``--only`` of one kind
    keep what any of them matches; of different kinds, what all kinds match."""
    source = copy.deepcopy(dict(source))
    if sets:
        base = source.setdefault("base", {})
        if not isinstance(base, dict):
            raise SweepError("[base] must be a table")
        for text in sets:
            key, value = parse_set(text)
            base[key] = value
            for what in ("settings", "methods"):
                for entry in source.get(what) or []:
                    if isinstance(entry, dict):
                        _set_everywhere(entry, key, value)
    if seeds is not None:
        source["seeds"] = parse_seeds(seeds)
    names, settings, keyed = [], [], []
    for text in only:
        key, eq, value = text.partition("=")
        if not eq:
            names.append(text.strip())
        elif key.strip() == "setting":
            settings.append(value.strip())
        else:
            keyed.append((key.strip(), value.strip()))
    methods = [m for m in source.get("methods") or [] if isinstance(m, dict)]
    base = source.get("base") or {}
    if names or keyed:
        kept = [m for m in methods if (not names or m.get("name") in names)
                and (not keyed or any(_matches(m, base, k, v) for k, v in keyed))]
        if not kept:
            labels = ", ".join(str(m.get("name")) for m in methods)
            raise SweepError(f"--only {' '.join(only)}: no [[methods]] entry matches (entries: {labels})")
        source["methods"] = kept
        tuning = source.get("tuning")
        if isinstance(tuning, dict) and isinstance(tuning.get("primary"), list):  # primaries of the kept entries
            names_kept = {m.get("name") for m in kept} | {"fedavg-data-size", "fedavg-uniform"}
            tuning["primary"] = [p for p in tuning["primary"] if not isinstance(p, dict)
                                 or not isinstance(p.get("compare"), list) or set(p["compare"]) <= names_kept]
    if settings:
        known = [e.get("name") for e in source.get("settings") or [{"name": DEFAULT_SETTING}]]
        missing = [n for n in settings if n not in known]
        if missing:
            raise SweepError(f"--only setting={missing[0]}: no such [[settings]] entry (entries: "
                             f"{', '.join(map(str, known))})")
        if "settings" in source:
            source["settings"] = [e for e in source["settings"] if e.get("name") in settings]
        for m in source.get("methods") or []:  # by-setting tables name only the settings kept
            if isinstance(m, dict) and isinstance(m.get("by-setting"), dict):
                m["by-setting"] = {k: v for k, v in m["by-setting"].items() if k in settings}
    return source


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


def _run_one(overrides: dict[str, Scalar], folder: str, engine: Mapping[str, Any] | None = None) -> str:
    """One run in this process (e.g. a task of its own), its output (and its engine's) to
    ``run.log``; ``engine`` holds :func:`~fedpcd_app.runtime.simulate.simulate`'s engine arguments.
    A sweep's own run processes call :func:`fedpcd_app.analysis.runner.run_one` the same way."""
    from fedpcd_app.analysis.runner import run_one

    return run_one(overrides, folder, engine)


def default_workers(jobs: int) -> int:
    """Local-engine workers per run: the usable cores shared among the parallel runs; 0 (the
    ClientApps in the run's own process) when that leaves fewer than two per run."""
    from fedpcd_app.runtime.pool import usable_cores

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


def prepare(sweep: Sweep, out: Path) -> list[RunSpec]:
    """The sweep's pending runs, after writing its manifest and each pending run's folder and
    ``run.json`` (refused, :class:`SweepError`, when ``out`` holds another sweep's finished runs)."""
    check_finished(sweep, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MANIFEST, {"name": sweep.name, "seeds": sweep.seeds, "source": sweep.source,
                                       "runs": [{**r.labels(), "folder": str(r.folder(out).relative_to(out))}
                                                for r in sweep.runs]})
    pending = [r for r in sweep.runs if not is_done(r.folder(out))]
    for run in pending:
        run.folder(out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(run.folder(out) / RUN_FILE, run.labels())
    return pending


def run_sweep(sweep: Sweep, out: Path, jobs: int | None = 1, progress: bool = True,
              engine: Mapping[str, Any] | None = None, *, gpus_per_run: float | None = None,
              reuse: bool = True) -> list[tuple[RunSpec, str]]:
    """Run every pending run; returns the failures ``(run, reason)`` (finished runs are kept).
    ``engine``: :func:`~fedpcd_app.runtime.simulate.simulate`'s engine arguments (``engine``,
    ``workers``: default :func:`default_workers`, ``num_cpus``, ``num_gpus``).

    ``jobs`` run processes (:class:`~fedpcd_app.analysis.runner.RunProcess`; None: 1, or as many
    as the GPUs hold at ``gpus_per_run``) take the pending runs one after another, each on the
    GPUs of its slot (:func:`~fedpcd_app.runtime.placement.slots`); ``reuse=False``: a fresh
    process per run."""
    from tqdm import tqdm

    from fedpcd_app.analysis.runner import RunProcess
    from fedpcd_app.runtime import placement

    table = placement.slots(placement.visible_gpus(), jobs, gpus_per_run)
    pending = prepare(sweep, out)
    bar = tqdm(total=len(sweep.runs), initial=len(sweep.runs) - len(pending), unit="run",
               desc=sweep.name, disable=not progress, dynamic_ncols=True)
    engine = {**(engine or {})}
    if engine.get("workers") is None:
        engine["workers"] = default_workers(len(table))
    procs = [RunProcess(placement.child_env(slot), slot, reuse=reuse) for slot in table[:max(1, len(pending))]]
    dispatch = _Dispatch(_in_data_order(sweep, pending), out, engine)
    threads = [threading.Thread(target=dispatch.serve, args=(p,), name=f"sweep-slot-{i}", daemon=True)
               for i, p in enumerate(procs)]
    try:
        for t in threads:
            t.start()
        return _collect(dispatch, len(pending), bar, out)
    except BaseException:  # Ctrl-C: no new runs; the run processes are stopped by their PIDs
        dispatch.stop.set()
        for p in procs:
            p.kill()
        raise
    finally:
        for t in threads:
            t.join(60.0)
        bar.close()


def _in_data_order(sweep: Sweep, pending: list[RunSpec]) -> list[RunSpec]:
    """Runs of one setting and seed side by side: they share their data (the run processes cache
    one data setting), so handed out together most runs find it already loaded. The order
    changes no result."""
    order = {name: i for i, name in enumerate(dict.fromkeys(r.setting for r in sweep.runs))}
    return sorted(pending, key=lambda r: (order[r.setting], r.seed))


class _Dispatch:
    """The pending runs handed to the run processes, one thread per process (:meth:`serve`);
    each run's outcome (``None`` or the reason it failed) goes to :attr:`results`."""

    def __init__(self, todo: list[RunSpec], out: Path, engine: Mapping[str, Any]) -> None:
        self.todo, self.out, self.engine = todo, out, engine
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.results: queue.Queue[tuple[RunSpec, str | None]] = queue.Queue()

    def _next(self) -> RunSpec | None:
        with self.lock:
            return self.todo.pop(0) if self.todo else None

    def serve(self, proc) -> None:
        """Hand ``proc`` the next run until none is left or the sweep stops; then close it."""
        try:
            while not self.stop.is_set():
                run = self._next()
                if run is None:
                    return
                self.results.put((run, self._run(proc, run)))
        finally:
            proc.close()

    def _run(self, proc, run: RunSpec) -> str | None:
        """One run in ``proc``: None, or why it failed (one line)."""
        from fedpcd_app.analysis.runner import RunFailed

        folder = run.folder(self.out)
        write_json_atomic(folder / RUN_FILE, {**run.labels(), "gpus": list(proc.gpus)})
        try:
            proc.run(run.overrides, folder, self.engine)
        except RunFailed as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - one failed run must not stop the sweep
            return f"{type(exc).__name__}: {exc}".splitlines()[0]
        return None

    def next_result(self) -> tuple[RunSpec, str | None]:
        """The next finished run (waiting in short steps, so that Ctrl-C is seen at once)."""
        while True:
            try:
                return self.results.get(timeout=0.5)
            except queue.Empty:
                continue


def _collect(dispatch: _Dispatch, count: int, bar, out: Path) -> list[tuple[RunSpec, str]]:
    """Wait for ``count`` runs, ticking the progress bar; the failures ``(run, reason)``."""
    failures: list[tuple[RunSpec, str]] = []
    for _ in range(count):
        run, failed = dispatch.next_result()
        if failed is not None:
            failures.append((run, failed))
            bar.write(f"FAILED {run.folder(out)}: {failed} (log: {run.folder(out) / LOG_FILE})")
        bar.set_postfix_str(f"{run.method} {run.variant} seed{run.seed}", refresh=False)
        bar.update(1)
    return failures


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fedpcd_app.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="sweep file (TOML), e.g. run_configs/sweeps/fedpcd_ablation_digits.toml")
    parser.add_argument("--jobs", type=int, default=None,
                        help="parallel runs (one process each, reused from run to run; default 1, or as many as "
                             "the GPUs hold at --gpus-per-run)")
    parser.add_argument("--out", default="", help="output folder (default: outputs/sweeps/<name>)")
    parser.add_argument("--dry-run", action="store_true", help="validate and list the runs; run nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="run-config key over the file's [base] and its entries (repeatable), e.g. "
                             "--set num-server-rounds=3")
    parser.add_argument("--seeds", default=None, help="the seeds instead of the file's, e.g. --seeds 0,1")
    parser.add_argument("--only", action="append", default=[], metavar="NAME|KEY=VALUE",
                        help="keep only some entries (repeatable): a [[methods]] name, setting=NAME, or "
                             "key=value of the method entries (e.g. --only method=fedavg)")
    parser.add_argument("--gpus-per-run", default=None, metavar="G",
                        help="GPUs each run process gets: 1, 2, ... or a share 0.5 (two runs per GPU), 0.25, ... "
                             "(default: the jobs spread evenly over the visible GPUs; see docs/sweeps.md)")
    parser.add_argument("--fresh-processes", action="store_true",
                        help="a new process for every run instead of reusing each job's process")
    add_engine_arguments(parser, workers_help="local engine: worker processes per run (default: the usable "
                                              "cores / --jobs, or 0 = in the run's process below 2)")
    parser.add_argument("--ray", default="", metavar="ADDRESS|auto|local",
                        help="run each run as a Ray task on this Ray cluster (head host:port; auto: the one "
                             "`ray start` made here; local: a private Ray), --num-cpus/--num-gpus per run "
                             "(fedpcd_app/analysis/ray_sweep.py)")
    return parser


def _argument_error(args: argparse.Namespace) -> str | None:
    if args.jobs is not None and args.jobs < 1:
        return "--jobs must be >= 1"
    if args.workers is not None and args.workers < 0:
        return f"--workers {args.workers}: give 0 (in each run's process) or more"
    return None


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the command runs, every check passed: the sweep, its folder and its run processes' GPUs."""

    sweep: Sweep
    out: Path
    table: list[tuple[str, ...]]  # each run process's GPUs
    gpus_per_run: float | None


def _plan(args: argparse.Namespace) -> _Plan:
    """The sweep loaded, cut down and validated, its folder checked, a ``--ray`` address checked:
    every refusal (:class:`SweepError`, :class:`RaySweepError`, ``PlacementError``) before anything runs."""
    from fedpcd_app.runtime import placement

    gpus_per_run = placement.parse_gpus_per_run(args.gpus_per_run)
    table = placement.slots(placement.visible_gpus(), args.jobs, gpus_per_run)
    sweep = load_sweep(args.sweep, sets=args.sets, seeds=args.seeds, only=args.only)
    validate(sweep)
    out = Path(args.out or Path("outputs") / "sweeps" / safe(sweep.name)).resolve()
    check_finished(sweep, out)
    if args.ray:  # a bad or dead address, or --engine ray: one line before anything starts
        from fedpcd_app.analysis.ray_sweep import check_ray

        args.ray = check_ray(args.ray, args.engine)
    return _Plan(sweep, out, table, gpus_per_run)


def _print_runs(sweep: Sweep, out: Path) -> None:
    """--dry-run: each run's folder, done or to do, and its overrides."""
    for r in sweep.runs:
        state = "done" if is_done(r.folder(out)) else "todo"
        print(f"  [{state}] {r.folder(out).relative_to(out)}  {json.dumps(r.overrides, sort_keys=True)}")


def _run_passes(args: argparse.Namespace, plan: _Plan) -> list[tuple[RunSpec, str]]:
    """The sweep's runs (locally or as Ray tasks), then ``[tuning]``'s edge extensions if
    every run finished; the failures."""
    sweep, out = plan.sweep, plan.out
    engine = {"engine": args.engine, "workers": args.workers, "num_cpus": args.num_cpus, "num_gpus": args.num_gpus}

    def run_pass() -> list[tuple[RunSpec, str]]:  # --ray: each run as a Ray task (analysis/ray_sweep.py)
        if args.ray:
            from fedpcd_app.analysis.ray_sweep import run_sweep_ray

            return run_sweep_ray(sweep.name, len(sweep.runs), prepare(sweep, out), out, args.ray, engine=engine)
        return run_sweep(sweep, out, jobs=len(plan.table), gpus_per_run=plan.gpus_per_run,
                         reuse=not args.fresh_processes, engine=engine)

    failures = run_pass()
    if not failures:  # [tuning] extend-edges: grid points beyond a selection on an edge, same sweep
        from fedpcd_app.analysis.tuning import extend_edges

        failures = extend_edges(sweep, out, run_pass)
    return failures


def main(argv: list[str] | None = None) -> int:
    from fedpcd_app.runtime.placement import PlacementError

    args = _parser().parse_args(argv)
    if (error := _argument_error(args)) is not None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        plan = _plan(args)
    except (SweepError, RaySweepError, PlacementError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sweep, out = plan.sweep, plan.out
    done = sum(is_done(r.folder(out)) for r in sweep.runs)
    print(f"{sweep.name}: {len(sweep.runs)} runs ({done} already done) -> {out}")
    if args.dry_run:
        _print_runs(sweep, out)
        return 0
    if any(plan.table):
        print(f"{len(plan.table)} run process(es) on GPUs " + " ".join(",".join(slot) for slot in plan.table))
    t0 = time.time()
    try:
        failures = _run_passes(args, plan)
    except KeyboardInterrupt:  # the run processes are stopped; finished runs are kept
        print(f"interrupted: rerun the command to finish the remaining runs -> {out}", file=sys.stderr, flush=True)
        return 130
    print(f"{len(sweep.runs) - len(failures)}/{len(sweep.runs)} runs finished in {time.time() - t0:.0f} s -> {out}")
    for run, reason in failures:
        print(f"  failed: {run.folder(out).relative_to(out)}: {reason}", file=sys.stderr)
    if len(failures) < len(sweep.runs):
        report_and_figures(out)
    return 1 if failures else 0


def report_and_figures(out: Path) -> None:
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
