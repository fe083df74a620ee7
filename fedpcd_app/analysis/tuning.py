"""The tuning protocol of a sweep: declared search spaces, one budget for every method, and
grids whose edges are extended until the validation-selected value is interior.

A sweep file opts in with a ``[tuning]`` table (see :mod:`fedpcd_app.analysis.sweep`)::

    [tuning]
    budget = 8              # configurations per method entry and seed, the same for every entry
    extend-edges = true     # extend a grid whose selected value lies on its edge (default true)
    max-extensions = 4      # extension passes at most (default 4)
    fedavg-both-weightings = true  # add FedAvg under the missing weighting (default true)
    [tuning.grids.fedpcd]   # optional: a method entry's own grid, over its declared space
    fedpcd-tau = [0.01, 0.02]

Search space of a method entry (:func:`entry_grid`): the declared space of its registered
method (the ``grid`` of its ``Params`` fields, the papers' grids: shared/spec/ALGORITHMS.md,
the FedPCD paper's Table 2 grid for τ) plus ``lr`` (the app key's ``grid``, always tuned); a
key the entry sets to a scalar is fixed (not tuned), a key it sets to a list, or that
``[tuning.grids.<entry>]`` lists, is tuned over those values. The product must not exceed the
budget (one-line error naming the entry and its sizes); below it, the lr grid is extended
geometrically (alternately above its largest and below its smallest value, within lr's declared
bounds; then geometric midpoints) until the product equals the budget, so every entry runs
exactly ``budget`` configurations per seed. A budget that is not a multiple of the entry's
other keys' product is refused.

FedAvg under both weightings (:func:`fedavg_baselines`). When the entries' methods weight
their clients differently (``strategies.registry.weighting_of`` of each entry's keys over
``[base]``) and no FedAvg entry has ``fedavg-weighting`` ``data-size`` (or ``uniform``), the
sweep adds the entry ``fedavg-data-size`` (``fedavg-uniform``): the baselines the report
requires for such a table.

Edges (:func:`extensions`). After a pass, per setting and method entry, the grid point with
the best mean over seeds of the validation mean client accuracy (``val_mean_acc``; the test
mean only when the runs have no validation split, as the report) is selected among the grid
points whose seeds all finished normally. For each tuned numeric key whose selected value is
the smallest or largest value tried along that key (the other keys at their selected values),
one grid point is added one geometric step beyond it (the ratio to its neighbour; clamped to
the key's declared bound); a key at its bound is not extended. The sweep runs the new points
(every seed) and repeats until no selection lies on an extendable edge or ``max-extensions``
passes are done. The added points follow from the finished runs only, so rerunning the sweep
recomputes the same points and skips the finished ones (resumable). Extension runs are beyond
the budget; the report states them beside the budget line and marks a selection still on an
edge (``on_edge``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedcore.config import APP, ConfigError, Grid

LR = APP["lr"].grid  # lr's declared space: tuned for every method


def spaces(method: str) -> dict[str, Grid]:
    """``lr``'s space, then the declared spaces of registered ``method``'s keys (none for a
    name that is not registered: the sweep's validation names it)."""
    from strategies.registry import strategy_class

    try:
        grids = strategy_class(method).Params.grids()
    except ConfigError:
        grids = {}
    return {"lr": LR, **grids}


def space_of(method: str, key: str) -> Grid | None:
    """The declared space of ``key`` for registered ``method``."""
    return spaces(method).get(key)


@dataclasses.dataclass(frozen=True)
class Tuning:
    budget: int
    extend_edges: bool = True
    max_extensions: int = 4
    grids: Mapping[str, Mapping[str, list]] = dataclasses.field(default_factory=dict)
    fedavg_both: bool = True


class TuningError(ValueError):
    """A ``[tuning]`` table or a budget cannot be met (one line; the sweep reports it as its
    SweepError)."""


def _error(message: str) -> TuningError:
    return TuningError(message)


def parse_tuning(table: Any, entries: list[str]) -> Tuning:
    """The ``[tuning]`` table of a sweep file (one-line SweepError when malformed)."""
    if not isinstance(table, dict):
        raise _error("'tuning' must be a table ([tuning] budget = N, extend-edges = true)")
    unknown = sorted(set(table) - {"budget", "extend-edges", "max-extensions", "grids", "fedavg-both-weightings"})
    if unknown:
        raise _error(f"[tuning]: unknown key(s) {', '.join(unknown)}: "
                     "it has budget, extend-edges, max-extensions, grids, fedavg-both-weightings")
    budget = table.get("budget")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise _error("[tuning]: 'budget' must be an integer >= 1 (configurations per method entry and seed), "
                     "e.g. budget = 8")
    extend = table.get("extend-edges", True)
    if not isinstance(extend, bool):
        raise _error("[tuning]: 'extend-edges' must be true or false")
    most = table.get("max-extensions", 4)
    if not isinstance(most, int) or isinstance(most, bool) or most < 0:
        raise _error("[tuning]: 'max-extensions' must be an integer >= 0")
    both = table.get("fedavg-both-weightings", True)
    if not isinstance(both, bool):
        raise _error("[tuning]: 'fedavg-both-weightings' must be true or false")
    grids = table.get("grids", {})
    if not isinstance(grids, dict) or set(grids) - set(entries):
        raise _error(f"[tuning.grids]: keys must be method entry names ({', '.join(entries)})")
    for name, grid in grids.items():
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise _error(f"[tuning.grids.{name}]: every key must be a non-empty list of values")
    return Tuning(budget, extend, most, grids, both)


def fedavg_baselines(entries: list[tuple[str, dict[str, Any]]], base: Mapping[str, Any],
                     tuning: Tuning) -> list[tuple[str, dict[str, Any]]]:
    """The FedAvg entries to add so that a sweep comparing rules of different weightings has
    FedAvg under both ``data-size`` and ``uniform`` (see the module doc)."""
    from fedcore.config import ConfigError
    from strategies.registry import weighting_of

    if not tuning.fedavg_both:
        return []
    kinds, fedavg = set(), set()
    for _, keys in entries:
        config = {**base, **{k: v for k, v in keys.items() if not isinstance(v, (list, dict))}}
        method = str(config.get("method", APP["method"].default))
        try:
            word = weighting_of(method, config)
        except (ConfigError, ValueError, TypeError):
            continue  # an unknown method: the sweep's validation names it
        kinds.add(word)
        if method == "fedavg":
            fedavg.add(word)
    if len(kinds) < 2:
        return []
    names = {n for n, _ in entries}
    return [(f"fedavg-{w}", {"method": "fedavg", "fedavg-weighting": w}) for w in ("data-size", "uniform")
            if w not in fedavg and f"fedavg-{w}" not in names]


def _round(value: float, integer: bool) -> float | int:
    return int(round(value)) if integer else float(f"{value:.3g}")


def _grow_lr(values: list[float], count: int) -> list[float]:
    """``values`` extended to ``count`` lr values: alternately one geometric step above the
    largest and below the smallest (within :data:`LR`'s bounds), then geometric midpoints."""
    vals = sorted(set(values))
    ratio = (vals[-1] / vals[0]) ** (1 / (len(vals) - 1)) if len(vals) > 1 and vals[0] > 0 else math.sqrt(10)
    up = True
    while len(vals) < count:
        grown = False
        for side in ((up, not up)):
            new = _round(vals[-1] * ratio if side else vals[0] / ratio, False)
            new = min(LR.high, new) if side else max(LR.low, new)
            if new not in vals:
                vals = sorted(vals + [new])
                grown = True
                break
        up = not up
        if not grown:  # both bounds reached: fill the widest gap with its geometric midpoint
            i = max(range(len(vals) - 1), key=lambda j: vals[j + 1] / vals[j])
            mid = _round(math.sqrt(vals[i] * vals[i + 1]), False)
            if mid in vals:
                raise _error(f"lr: cannot place {count} distinct values within [{LR.low}, {LR.high}]")
            vals = sorted(vals + [mid])
    return vals


def entry_grid(label: str, method: str, keys: Mapping[str, Any], tuning: Tuning) -> dict[str, Any]:
    """A method entry's keys with its tuned grid filled in (lists), exactly ``budget``
    configurations (see the module doc); one-line SweepError when that is impossible."""
    out = dict(keys)
    for key, space in spaces(method).items():
        if key not in out:
            out[key] = list(space.values)
    out.update({k: list(v) for k, v in tuning.grids.get(label, {}).items()})
    lists = {k: v for k, v in out.items() if isinstance(v, list)}
    sizes = " × ".join(f"{k} {len(v)}" for k, v in lists.items())
    total = math.prod(len(v) for v in lists.values())
    if total > tuning.budget:
        raise _error(f"method entry '{label}' has {total} configurations ({sizes}), more than [tuning] budget = "
                     f"{tuning.budget}: fix some keys to a scalar in its [[methods]] entry, narrow "
                     f"[tuning.grids.{label}], or raise the budget")
    if total < tuning.budget:
        if not isinstance(out.get("lr"), list):
            raise _error(f"method entry '{label}' has {total} configurations ({sizes or 'no grid'}) < [tuning] budget "
                         f"= {tuning.budget} and a fixed lr: let lr be tuned (remove it) or set budget = {total}")
        rest = total // len(out["lr"])
        if tuning.budget % rest:
            raise _error(f"method entry '{label}': [tuning] budget = {tuning.budget} is not a multiple of its "
                         f"non-lr configurations ({rest}); the lr grid cannot fill it: choose a multiple of {rest}")
        out["lr"] = _grow_lr(out["lr"], tuning.budget // rest)
    return out


# -- edges ---------------------------------------------------------------------------------
def _score(folder: Path) -> tuple[float | None, float] | None:
    """(validation mean accuracy or None, test mean accuracy) of a finished run; None when
    unfinished or incomplete (never a candidate)."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("complete", True) is False:
        return None
    val = summary.get("val_mean_acc")
    return (None if val is None else float(val)), float(summary["mean_acc"])


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def selected_points(sweep, out: Path) -> dict[tuple[str, str], tuple[tuple, dict[tuple, list]]]:
    """(setting, method entry) → (selected grid point, grid point → its RunSpecs), over the
    grid points whose seeds all finished normally (see the module doc)."""
    groups: dict[tuple[str, str], dict[tuple, list]] = {}
    for run in sweep.runs:
        groups.setdefault((run.setting, run.method), {}).setdefault(run.grid, []).append(run)
    chosen = {}
    for key, points in groups.items():
        scored = {}
        for grid, runs in points.items():
            scores = [_score(r.folder(out)) for r in runs]
            if scores and all(s is not None for s in scores):
                scored[grid] = scores
        if not scored:
            continue
        which = 0 if all(s[0] is not None for ss in scored.values() for s in ss) else 1  # validation, else test
        pick = {g: [s[which] for s in ss] for g, ss in scored.items()}
        best = max(pick, key=lambda g: sum(pick[g]) / len(pick[g]))  # first on ties (sweep order)
        chosen[key] = (best, points)
    return chosen


def edge_steps(method: str, best: tuple, points: Mapping[tuple, Any]) -> list[tuple[str, float | int]]:
    """(key, new value) of each edge extension of the selected grid point ``best``."""
    best_d = dict(best)
    steps = []
    for key, value in best:
        space = space_of(method, key)
        if space is None or not _numeric(value):
            continue
        line = sorted({dict(g)[key] for g in points
                       if all(dict(g).get(k) == v for k, v in best_d.items() if k != key)})
        if len(line) < 2 or line[0] < value < line[-1]:
            continue
        up = value == line[-1]
        neighbour = line[-2] if up else line[1]
        if value > 0 and neighbour > 0:
            ratio = max(value, neighbour) / min(value, neighbour)
            new = value * ratio if up else value / ratio
        else:  # a grid through 0: a linear step
            new = value + (value - neighbour)
        new = _round(min(space.high, new) if up else max(space.low, new), space.integer)
        if new != value and new not in line:
            steps.append((key, new))
    return steps


def extensions(sweep, out: Path) -> list:
    """The RunSpecs (every seed) that extend a selection lying on an extendable grid edge,
    and are not in the sweep yet."""
    have = {(r.setting, r.method, r.grid, r.seed) for r in sweep.runs}
    new = []
    for (setting, label), (best, points) in selected_points(sweep, out).items():
        template = points[best]
        method = str(template[0].overrides.get("method", APP["method"].default))
        for key, value in edge_steps(method, best, points):
            grid = tuple((k, value if k == key else v) for k, v in best)
            for run in template:
                if (setting, label, grid, run.seed) not in have:
                    new.append(dataclasses.replace(run, grid=grid, overrides={**run.overrides, key: value}))
                    have.add((setting, label, grid, run.seed))
    return new


def extend_edges(sweep, out: Path, run_pass: Callable[[], list], log: Callable[[str], None] = print) -> list:
    """Extension passes after the sweep's first pass: add :func:`extensions`, run them with
    ``run_pass`` (returns the failures), until none is left or ``max-extensions`` passes;
    returns the last pass's failures."""
    tuning = getattr(sweep, "tuning", None)
    failures: list = []
    if tuning is None or not tuning.extend_edges:
        return failures
    for i in range(tuning.max_extensions):
        new = extensions(sweep, out)
        if not new:
            break
        points = sorted({f"{r.setting}/{r.method} [{r.variant}]" for r in new})
        todo = sum(not (r.folder(out) / "summary.json").is_file() for r in new)
        log(f"edge extension {i + 1}/{tuning.max_extensions}: {len(new)} runs ({todo} to run): " + "; ".join(points))
        sweep.runs.extend(new)
        failures = run_pass()
        if failures:
            break
    return failures
