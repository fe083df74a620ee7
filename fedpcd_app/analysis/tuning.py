"""The tuning protocol of a sweep: declared search spaces, one budget for every method, and
grids whose edges are extended until the validation-selected value is interior.

A sweep file opts in with a ``[tuning]`` table (see :mod:`fedpcd_app.analysis.sweep`)::

    [tuning]
    budget = 8              # configurations per method entry and seed, the same for every entry
    extend-edges = true     # extend a grid whose selected value lies on its edge (default true)
    max-extensions = 4      # extension passes at most (default 4)
    fedavg-both-weightings = true  # add FedAvg under the missing weighting (default true)
    unstable = "majority"   # a grid point is unstable when more than half its seeds failed ("any": one)
    failed-seed-score = "last"  # a failed seed counts at its last evaluation ("zero": at 0)
    objective = "mean"      # selection on the validation mean accuracy ("worst10": its worst-10 %)
    extend-objectives = ["mean", "worst10"]  # the selections extended (default: [objective] alone)
    equivalence-margin = 0.01  # the TOST margin of "equivalent" (report), a fraction
    holm-family = "page"    # the Holm family of the report ("setting": per table)
    [tuning.grids.fedpcd]   # optional: a method entry's own grid, over its declared space
    fedpcd-tau = [0.01, 0.02]

Search space of a method entry (:func:`entry_grid`): the declared space of its registered
method (the ``grid`` of its ``Params`` fields: the grids of each method's paper, named in its
module docstring; the FedPCD paper's Table 2 grid for τ) plus ``lr`` (the app key's ``grid``, always tuned); a
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

Coverage (:func:`coverage_points`, issue 42). lr is a shared axis: an entry tuning lr also tries
every lr value of the sweep's FedAvg entries (its other keys at their defaults), and a method
declaring a reduction to FedAvg (``hyper(reduces_to=...)``: FedeRage γ = 0, q-FFL q = 0, FedProx
μ = 0, FedAvgM momentum 0, FedFV α = 1 with τ = 0, FedHEAL β = 0 with threshold < 0) is tried at
that reduction at every lr the FedAvg entries try. These points are beyond the budget.

Selection (:func:`selected_points`, :class:`Rules`). Per setting and method entry, the grid point
with the best mean over seeds of the objective on the validation split (``val_mean_acc``, or
``val_worst10_acc`` with ``objective = "worst10"``; the test split only when the runs have no
validation split) among the grid points whose seeds all finished and that are not unstable (a
majority of failed seeds by default); a failed seed counts at its last evaluation. An exact tie
goes to the point on fewer grid edges (:func:`choose`).

Neighbourhood and edges (:func:`edge_steps`, :func:`extensions`). For each tuned numeric key of a
selection (the selection under each objective of ``extend-objectives``: by default the declared
``objective`` alone; a fairness page that also reports the worst-10 % selection lists
``["mean", "worst10"]`` so that both selections are interior and bracketed), both neighbours
of its value (the nearest values tried anywhere for that key) are added at the selection's
other values when missing; at the edge of the values tried, one point
one geometric step beyond (the ratio to its neighbour; clamped to the key's declared bound; a
key at its bound is not extended). The sweep runs the new points (every seed) and repeats until
nothing is added or ``max-extensions`` passes are done. The added points follow from the finished
runs only, so rerunning the sweep recomputes the same points and skips the finished ones
(resumable). Extension runs are beyond the budget; the report states them beside the budget line
and marks a selection still on an edge (``on_edge``) or not bracketed (``neighbourhood``).
"""

from __future__ import annotations

import dataclasses
import itertools
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


UNSTABLE = ("majority", "any")  # a grid point is unstable when more than half of its seeds failed / when one did
FAILED_SCORE = ("last", "zero")  # a failed seed counts at its last evaluation / at 0
OBJECTIVES = ("mean", "worst10")  # selection on the validation mean client accuracy / its worst-10 %
HOLM_FAMILIES = ("page", "setting")


@dataclasses.dataclass(frozen=True)
class Rules:
    """How a grid point is scored for selection (declared in ``[tuning]``; the defaults hold
    for a sweep without them): ``unstable`` — ``majority``: a point is not a candidate when more
    than half of its seeds failed (``complete: false``), ``any``: when one did (the rule before
    issue 42); ``failed_score`` — a failed seed of a candidate counts at its last evaluation
    (``last``: the numbers its summary recorded, never silently left out) or at ``zero``;
    ``objective`` — ``mean`` (validation mean client accuracy) or ``worst10`` (its worst-10 %)."""

    unstable: str = "majority"
    failed_score: str = "last"
    objective: str = "mean"

    def is_unstable(self, failed: int, seeds: int) -> bool:
        return failed > 0 if self.unstable == "any" else 2 * failed > seeds

    def key(self, validation: bool) -> str:
        base = "mean_acc" if self.objective == "mean" else "worst10_acc"
        return f"val_{base}" if validation else base

    def seed_value(self, summary: Mapping[str, Any], key: str) -> float:
        """A seed's number under ``key``: a failed seed's at its last evaluation (``last``; 0 when
        it recorded none) or 0 (``zero``)."""
        failed = summary.get("complete", True) is False
        value = summary.get(key)
        if failed and (self.failed_score == "zero" or value is None or not math.isfinite(float(value))):
            return 0.0
        return float(value)


@dataclasses.dataclass(frozen=True)
class Tuning:
    budget: int
    extend_edges: bool = True
    max_extensions: int = 4
    grids: Mapping[str, Mapping[str, list]] = dataclasses.field(default_factory=dict)
    fedavg_both: bool = True
    rules: Rules = Rules()
    equivalence_margin: float | None = None  # TOST margin of "equivalent" (a fraction: 0.01 = 1 pp)
    holm_family: str = "page"
    extend_objectives: tuple[str, ...] = ()  # the selections whose edges/neighbours are extended; () = objective

    @property
    def objectives(self) -> tuple[str, ...]:
        """The objectives whose selections are extended (``extend-objectives``; the declared
        ``objective`` alone by default)."""
        return self.extend_objectives or (self.rules.objective,)


class TuningError(ValueError):
    """A ``[tuning]`` table or a budget cannot be met (one line; the sweep reports it as its
    SweepError)."""


def _error(message: str) -> TuningError:
    return TuningError(message)


def parse_tuning(table: Any, entries: list[str]) -> Tuning:
    """The ``[tuning]`` table of a sweep file (one-line SweepError when malformed)."""
    if not isinstance(table, dict):
        raise _error("'tuning' must be a table ([tuning] budget = N, extend-edges = true)")
    known = ("budget", "extend-edges", "max-extensions", "grids", "fedavg-both-weightings", "unstable",
             "failed-seed-score", "objective", "equivalence-margin", "holm-family", "extend-objectives")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise _error(f"[tuning]: unknown key(s) {', '.join(unknown)}: it has {', '.join(known)}")
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
    words = {}
    for key, choices, default in (("unstable", UNSTABLE, "majority"), ("failed-seed-score", FAILED_SCORE, "last"),
                                  ("objective", OBJECTIVES, "mean"), ("holm-family", HOLM_FAMILIES, "page")):
        words[key] = table.get(key, default)
        if words[key] not in choices:
            raise _error(f"[tuning]: '{key}' = {words[key]!r} must be one of {', '.join(choices)}")
    margin = table.get("equivalence-margin")
    if margin is not None and (not isinstance(margin, (int, float)) or isinstance(margin, bool) or not margin > 0):
        raise _error("[tuning]: 'equivalence-margin' must be a number > 0 (a fraction: 0.01 = 1 pp), "
                     "e.g. equivalence-margin = 0.01")
    rules = Rules(words["unstable"], words["failed-seed-score"], words["objective"])
    targets = table.get("extend-objectives", [rules.objective])
    if (not isinstance(targets, list) or not targets or any(t not in OBJECTIVES for t in targets)
            or len(set(targets)) != len(targets)):
        raise _error(f"[tuning]: 'extend-objectives' = {targets!r} must be a non-empty list of distinct objectives "
                     f"among {', '.join(OBJECTIVES)}, e.g. extend-objectives = [\"mean\", \"worst10\"]")
    return Tuning(budget, extend, most, grids, both, rules, None if margin is None else float(margin),
                  words["holm-family"], tuple(targets))


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


# -- coverage: reductions and the shared lr axis ----------------------------------------------
def reduction_of(method: str) -> tuple[str, Any, str, dict[str, Any]] | None:
    """The reduction the tuner adds for ``method`` (``hyper(reduces_to=...)`` of its Params): the
    one needing the fewest other keys (FedeRage: γ = 0 before α = 1 with β_min = 0); None without."""
    from strategies.registry import strategy_class

    try:
        found = strategy_class(method).Params.reductions()
    except ConfigError:
        return None
    return min(found, key=lambda r: len(r[3])) if found else None


def _anchor(method: str, key: str, values: list) -> Any:
    """The value of a tuned key at an added point: its declared default when tried, else the first."""
    from strategies.registry import strategy_class

    try:
        default = strategy_class(method).Params.run_config_keys().get(key)
    except ConfigError:
        default = None
    if key == "lr":
        default = APP["lr"].default
    return default if default in values else values[0]


def coverage_points(entries: list[tuple[str, str, Mapping[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Per method entry of one setting (``entries``: label, registered method, keys with the
    tuned ones as lists), the grid points added beyond its budget so that the lr axis is shared:

    * a method declaring a reduction to a baseline method of the sweep (``reduces_to``: FedeRage
      γ = 0, q-FFL q = 0, FedProx μ = 0, FedAvgM β = 0, FedFV α = 1 with τ = 0, FedHEAL β = 0 with
      threshold < 0 → FedAvg) is tried at that reduction at every lr its baseline entries try (its
      other tuned keys at their default, or first value: they do not act there);
    * any other entry tuning lr is tried at every lr of the baseline entries it lacks, its other
      tuned keys at their default (or first value).

    Points already in the entry's grid are not repeated."""
    out: dict[str, list[dict[str, Any]]] = {}
    for label, method, keys in entries:
        red = reduction_of(method)
        target = red[2] if red else "fedavg"
        base_lrs: set = set()
        for other, other_method, other_keys in entries:
            if other != label and other_method == target:
                lr = other_keys.get("lr", APP["lr"].default)
                base_lrs |= set(lr if isinstance(lr, list) else [lr])
        tuned = {k: v for k, v in keys.items() if isinstance(v, list)}
        if method == target or not base_lrs or "lr" not in tuned:
            continue
        anchor = {k: _anchor(method, k, v) for k, v in tuned.items() if k != "lr"}
        if red is not None:
            anchor.update({red[0]: red[1], **red[3]})
        have = {tuple(sorted((k, v) for k, v in zip(tuned, point)))
                for point in itertools.product(*tuned.values())}
        points = []
        for lr in sorted(base_lrs):
            if red is None and lr in tuned["lr"]:
                continue
            point = {**anchor, "lr": lr}
            if tuple(sorted(point.items())) not in have:
                points.append(point)
        if points:
            out[label] = points
    return out


# -- selection -----------------------------------------------------------------------------
def _score(folder: Path) -> dict[str, Any] | None:
    """A finished run's summary (``complete`` false included: the rules decide); None when unfinished."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def values_along(grid: Mapping[str, Any], grids: list[Mapping[str, Any]], key: str) -> set:
    """The numeric values of ``key`` tried on ``grid``'s line: the grids whose other keys equal its."""
    return {g[key] for g in grids if key in g and _numeric(g[key])
            and all(g.get(k) == v for k, v in grid.items() if k != key)}


def edge_keys(grid: Mapping[str, Any], grids: list[Mapping[str, Any]]) -> list[str]:
    """The numeric keys along which ``grid`` is the smallest or largest value tried (the other
    keys equal, at least two values on that line)."""
    out = []
    for key, value in grid.items():
        if not _numeric(value):
            continue
        line = values_along(grid, grids, key)
        if len(line) >= 2 and value in (min(line), max(line)):
            out.append(key)
    return out


def choose(scores: Mapping[Any, float], grids: Mapping[Any, Mapping[str, Any]]) -> Any:
    """The best-scoring candidate; an exact tie (within 1e-12) goes to the point on fewer grid
    edges (toward the interior), then to the first (sweep order)."""
    top = max(scores.values())
    tied = [c for c, v in scores.items() if v >= top - 1e-12]
    everything = list(grids.values())
    return min(tied, key=lambda c: (len(edge_keys(grids[c], everything)), tied.index(c)))


def point_scores(summaries: Mapping[Any, list[dict[str, Any]]], rules: Rules) -> tuple[dict[Any, float], str]:
    """(candidate → its selection score, the split) over grid points whose seeds all finished:
    a point is a candidate unless :meth:`Rules.is_unstable`; its score is the mean over seeds of
    the objective on the validation split (the test split only when a run has none), a failed
    seed counted by :meth:`Rules.seed_value`."""
    validation = all(s.get(rules.key(True)) is not None or s.get("complete", True) is False
                     for ss in summaries.values() for s in ss)
    key = rules.key(validation)
    out = {}
    for point, ss in summaries.items():
        failed = sum(s.get("complete", True) is False for s in ss)
        if ss and not rules.is_unstable(failed, len(ss)):
            out[point] = sum(rules.seed_value(s, key) for s in ss) / len(ss)
    return out, "validation" if validation else "test"


def selected_points(sweep, out: Path,
                    objective: str | None = None) -> dict[tuple[str, str], tuple[tuple, dict[tuple, list]]]:
    """(setting, method entry) → (selected grid point, grid point → its RunSpecs), among the
    grid points whose seeds all finished, by the sweep's :class:`Rules` (see the module doc);
    ``objective`` replaces the declared one (``mean`` / ``worst10``)."""
    rules = getattr(getattr(sweep, "tuning", None), "rules", None) or Rules()
    if objective is not None:
        rules = dataclasses.replace(rules, objective=objective)
    groups: dict[tuple[str, str], dict[tuple, list]] = {}
    for run in sweep.runs:
        groups.setdefault((run.setting, run.method), {}).setdefault(run.grid, []).append(run)
    chosen = {}
    for key, points in groups.items():
        finished = {}
        for grid, runs in points.items():
            summaries = [_score(r.folder(out)) for r in runs]
            if summaries and all(x is not None for x in summaries):
                finished[grid] = summaries
        scores, _ = point_scores(finished, rules)
        if scores:
            chosen[key] = (choose(scores, {g: dict(g) for g in points}), points)
    return chosen


def edge_steps(method: str, best: tuple, points: Mapping[tuple, Any]) -> list[tuple[str, float | int]]:
    """(key, new value) of each point to add around the selected grid point ``best``: for every
    tuned numeric key, both neighbours of its value (the nearest values tried anywhere for that
    key) at the selection's other values, when not run yet; at the edge of the values tried, one
    geometric step beyond (clamped to the declared bound; a linear step through 0). At a selected
    reduction (FedeRage γ = 0, ...) only the reducing key and lr act, so only they are bracketed."""
    best_d = dict(best)
    red = reduction_of(method)
    at_reduction = red is not None and best_d.get(red[0]) == red[1]
    steps = []
    for key, value in best:
        space = space_of(method, key)
        if space is None or not _numeric(value) or (at_reduction and key not in (red[0], "lr")):
            continue
        line = {dict(g)[key] for g in points
                if key in dict(g) and all(dict(g).get(k) == v for k, v in best_d.items() if k != key)}
        tried = sorted({dict(g)[key] for g in points if key in dict(g) and _numeric(dict(g)[key])})
        below, above = [v for v in tried if v < value], [v for v in tried if v > value]
        for up, side, other in ((False, below, above), (True, above, below)):
            if side:  # a neighbour tried elsewhere: run it at the selection
                near = side[0] if up else side[-1]
                if near not in line:
                    steps.append((key, near))
                continue
            if not other:
                continue
            neighbour = other[-1] if up else other[0]
            if value > 0 and neighbour > 0:
                ratio = max(value, neighbour) / min(value, neighbour)
                new = value * ratio if up else value / ratio
            else:  # a grid through 0: a linear step
                new = value + (value - neighbour)
            new = _round(min(space.high, new) if up else max(space.low, new), space.integer)
            if new != value and new not in tried:
                steps.append((key, new))
    return steps


def extensions(sweep, out: Path) -> list:
    """The RunSpecs (every seed) that extend a selection lying on an extendable grid edge or
    lacking a neighbour, and are not in the sweep yet: the selections under each objective of
    ``[tuning] extend-objectives`` (the declared ``objective`` alone by default)."""
    have = {(r.setting, r.method, r.grid, r.seed) for r in sweep.runs}
    tuning = getattr(sweep, "tuning", None)
    objectives = tuning.objectives if tuning is not None else (Rules().objective,)
    selections = [item for objective in objectives for item in selected_points(sweep, out, objective).items()]
    new = []
    for (setting, label), (best, points) in selections:
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
