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
    iterate = "last"        # issue 52: the iterate selection reads (and the report's tables), the paper's
    extend-iterates = ["last", "averaged"]  # the iterates whose selections are extended (default: [iterate])
    min-values = 3          # every tuned key tried at >= 3 values along the selection (with its neighbours)
    equal-budgets = true    # after the extensions, every entry topped up to the same count of configurations
    [tuning.grids.fedpcd]   # optional: a method entry's own grid, over its declared space
    fedpcd-tau = [0.01, 0.02]
    [[tuning.primary]]      # issue 52: a primary comparison, declared before the runs (report --restat)
    compare = ["fedpcd", "fedavg-data-size"]   # method entry − baseline entry
    metrics = ["mean_acc", "worst10_acc", "std_acc"]
    source = "FedPCD paper (000), Table 1"

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
that reduction at every lr the FedAvg entries try. These points are beyond the budget. The FedAvg
entries' later lr values (extensions, equal-budget top-ups) are not all mirrored: each would grow the
reducing entry with its baseline, and no two counts could then be equal. What is kept is the
guarantee that matters to a verdict: wherever the baseline's selection lands (each objective ×
iterate the extensions read), the reducing entry is run at its reduction at that lr
(:func:`reduction_followups`, in every extension pass), so its selection can always fall back on
the baseline's own point.

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

Issue 52. *Iterates*: a run scored on the averaged iterate also records its last iterate
(``iterate_scores.last`` of ``summary.json``, :mod:`fedpcd_app.server.evaluation`); ``iterate``
names the one selection reads (:func:`view`: the run's numbers as that iterate gives them; a run
without it, AFL whose own output is the average or Ditto's personal models, keeps its own), and
``extend-iterates`` the iterates whose selections are extended (each objective × each iterate).
*At least three values*: with ``min-values = k`` a tuned numeric key whose line through the selection
would hold fewer than ``k`` values once its neighbours are run gets one more value beyond the
farther neighbour (on the side that can still grow), pass after pass, so that no selection rests on
two values (FedHEAL's β was tried at 0 and 0.4 only). *Equal budgets*: with ``equal-budgets``, once
an extension pass adds nothing, every entry of a setting with fewer configurations than the
setting's largest count (budget, coverage points, reductions and extensions all counted) is topped
up to it (:func:`top_ups`): lr values at its selection's other values, first the geometric midpoints
of the lr values it tried nearest the selected lr, then steps beyond its lr edges; the extension
passes then resume (a new selection gets its neighbours), and the passes stop when nothing is added
or ``max-extensions`` passes are done: the report then counts the configurations of every entry
and says **unequal** where they still differ.
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
    """The declared space of ``key`` for registered ``method``; a numeric hyperparameter declared
    without a grid (FedHEAL's β) has its allowed range as bounds (a sweep tuning it over its own
    list is extended within them: issue 52, its β had been tried at two values)."""
    found = spaces(method).get(key)
    if found is not None:
        return found
    from strategies.registry import strategy_class

    try:
        params = strategy_class(method).Params
    except ConfigError:
        return None
    for f, kind in params._fields():
        meta = f.metadata
        if meta.get("nested") or params.key_of(f.name) != key or kind not in (int, float) \
                or isinstance(f.default, bool):
            continue
        low = meta.get("low") if meta.get("low") is not None else -math.inf
        high = meta.get("high") if meta.get("high") is not None else math.inf
        return Grid((f.default,), low, high)
    return None


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
    iterate: str = ""  # the iterate selection reads (:func:`view`); "" = each run's scored one

    def is_unstable(self, failed: int, seeds: int) -> bool:
        return failed > 0 if self.unstable == "any" else 2 * failed > seeds

    def key(self, validation: bool) -> str:
        base = "mean_acc" if self.objective == "mean" else "worst10_acc"
        return f"val_{base}" if validation else base

    def seed_value(self, summary: Mapping[str, Any], key: str) -> float:
        """A seed's number under ``key``: a failed seed's at its last evaluation (``last``; 0 when
        it recorded none) or 0 (``zero``)."""
        failed = summary.get("complete", True) is False
        value = view(summary, self.iterate).get(key)
        if failed and (self.failed_score == "zero" or value is None or not math.isfinite(float(value))):
            return 0.0
        return float(value)


ITERATES = ("last", "averaged")  # the global model θ_T / the running mean of θ_1..θ_T


def view(summary: Mapping[str, Any], iterate: str = "") -> Mapping[str, Any]:
    """``summary`` (a run's ``summary.json``) as ``iterate`` scores it: the run's own numbers when it
    scored that iterate (or ``iterate`` is ""), else its ``iterate_scores[iterate]`` laid over them
    (``scored_iterate`` then says which); a run that did not score ``iterate`` (AFL, whose output is
    the averaged iterate; Ditto's personal models; runs made before issue 52) keeps its own."""
    if not iterate or summary.get("scored_iterate", "last") == iterate:
        return summary
    other = (summary.get("iterate_scores") or {}).get(iterate)
    if not other:
        return summary
    return {**summary, **other, "scored_iterate": iterate}


@dataclasses.dataclass(frozen=True)
class Primary:
    """A primary comparison the sweep declares (``[[tuning.primary]]``): ``method`` − ``baseline``
    (method entries) on ``metrics``, in ``settings`` (() = every setting), under the declared
    objective and iterate; ``source``: the paper's table or figure that names it."""

    method: str
    baseline: str
    metrics: tuple[str, ...]
    settings: tuple[str, ...] = ()
    source: str = ""


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
    extend_iterates: tuple[str, ...] = ()  # the iterates whose selections are extended; () = rules.iterate
    min_values: int = 0  # a tuned key's values along the selection, at least (0: no rule)
    equal_budgets: bool = False  # top every entry up to the setting's largest count of configurations
    primary: tuple[Primary, ...] = ()  # the declared primary comparisons (report --restat)

    @property
    def objectives(self) -> tuple[str, ...]:
        """The objectives whose selections are extended (``extend-objectives``; the declared
        ``objective`` alone by default)."""
        return self.extend_objectives or (self.rules.objective,)

    @property
    def iterates(self) -> tuple[str, ...]:
        """The iterates whose selections are extended (``extend-iterates``; the declared
        ``iterate`` alone by default: "" = each run's scored one)."""
        return self.extend_iterates or (self.rules.iterate,)


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
             "failed-seed-score", "objective", "equivalence-margin", "holm-family", "extend-objectives",
             "iterate", "extend-iterates", "min-values", "equal-budgets", "primary")
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
    iterate = table.get("iterate", "")
    if iterate not in ("", *ITERATES):
        raise _error(f"[tuning]: 'iterate' = {iterate!r} must be one of {', '.join(ITERATES)}")
    rules = Rules(words["unstable"], words["failed-seed-score"], words["objective"], iterate)
    targets = table.get("extend-objectives", [rules.objective])
    if (not isinstance(targets, list) or not targets or any(t not in OBJECTIVES for t in targets)
            or len(set(targets)) != len(targets)):
        raise _error(f"[tuning]: 'extend-objectives' = {targets!r} must be a non-empty list of distinct objectives "
                     f"among {', '.join(OBJECTIVES)}, e.g. extend-objectives = [\"mean\", \"worst10\"]")
    iterates = table.get("extend-iterates", [iterate])
    if (not isinstance(iterates, list) or not iterates or any(t not in ("", *ITERATES) for t in iterates)
            or len(set(iterates)) != len(iterates)):
        raise _error(f"[tuning]: 'extend-iterates' = {iterates!r} must be a non-empty list of distinct iterates "
                     f"among {', '.join(ITERATES)}, e.g. extend-iterates = [\"last\", \"averaged\"]")
    least = table.get("min-values", 0)
    if not isinstance(least, int) or isinstance(least, bool) or least < 0:
        raise _error("[tuning]: 'min-values' must be an integer >= 0 (values tried along a tuned key), e.g. 3")
    equal = table.get("equal-budgets", False)
    if not isinstance(equal, bool):
        raise _error("[tuning]: 'equal-budgets' must be true or false")
    return Tuning(budget, extend, most, grids, both, rules, None if margin is None else float(margin),
                  words["holm-family"], tuple(targets), tuple(iterates), least, equal,
                  parse_primary(table.get("primary", []), entries))


def parse_primary(items: Any, entries: list[str]) -> tuple[Primary, ...]:
    """``[[tuning.primary]]`` tables: ``compare = [method entry, baseline entry]``, ``metrics``
    (report metric keys), optional ``settings`` and ``source`` (one-line error when malformed)."""
    from fedpcd_app.analysis.layout import METRIC_INFO

    if not isinstance(items, list):
        raise _error("[tuning]: 'primary' must be a list of tables "
                     "([[tuning.primary]] compare = [A, B], metrics = [...])")
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) - {"compare", "metrics", "settings", "source"}:
            raise _error("[[tuning.primary]]: keys are compare, metrics, settings, source")
        pair, metrics = item.get("compare"), item.get("metrics")
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise _error("[[tuning.primary]]: 'compare' must be [method entry, baseline entry]")
        names = set(entries) | {f"fedavg-{w}" for w in ("data-size", "uniform")}
        if unknown := [x for x in pair if x not in names]:
            raise _error(f"[[tuning.primary]]: {unknown[0]!r} is not a method entry ({', '.join(entries)})")
        known = (*METRIC_INFO, "variance")  # variance: the q-FFL statistic (scripts/qffl_protocols.py)
        if not (isinstance(metrics, list) and metrics and all(m in known for m in metrics)):
            raise _error(f"[[tuning.primary]]: 'metrics' must list report metrics ({', '.join(known)})")
        settings = item.get("settings", [])
        if not isinstance(settings, list) or not all(isinstance(x, str) for x in settings):
            raise _error("[[tuning.primary]]: 'settings' must be a list of setting names")
        out.append(Primary(pair[0], pair[1], tuple(metrics), tuple(settings), str(item.get("source", ""))))
    return tuple(out)


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
    validation = all(view(s, rules.iterate).get(rules.key(True)) is not None or s.get("complete", True) is False
                     for ss in summaries.values() for s in ss)
    key = rules.key(validation)
    out = {}
    for point, ss in summaries.items():
        failed = sum(s.get("complete", True) is False for s in ss)
        if ss and not rules.is_unstable(failed, len(ss)):
            out[point] = sum(rules.seed_value(s, key) for s in ss) / len(ss)
    return out, "validation" if validation else "test"


def selected_points(sweep, out: Path, objective: str | None = None,
                    iterate: str | None = None) -> dict[tuple[str, str], tuple[tuple, dict[tuple, list]]]:
    """(setting, method entry) → (selected grid point, grid point → its RunSpecs), among the
    grid points whose seeds all finished, by the sweep's :class:`Rules` (see the module doc);
    ``objective`` replaces the declared one (``mean`` / ``worst10``), ``iterate`` the declared
    iterate (``last`` / ``averaged``; :func:`view`)."""
    rules = getattr(getattr(sweep, "tuning", None), "rules", None) or Rules()
    if objective is not None:
        rules = dataclasses.replace(rules, objective=objective)
    if iterate is not None:
        rules = dataclasses.replace(rules, iterate=iterate)
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


def _beyond(value: float, neighbour: float, up: bool, space) -> float | int:
    """One step from ``value`` away from ``neighbour`` (geometric: their ratio; linear through 0),
    clamped to ``space``'s declared bound and rounded as the key is."""
    if value > 0 and neighbour > 0:
        ratio = max(value, neighbour) / min(value, neighbour)
        new = value * ratio if up else value / ratio
    else:  # a grid through 0: a linear step
        new = value + (value - neighbour)
    return _round(min(space.high, new) if up else max(space.low, new), space.integer)


def edge_steps(method: str, best: tuple, points: Mapping[tuple, Any],
               min_values: int = 0) -> list[tuple[str, float | int]]:
    """(key, new value) of each point to add around the selected grid point ``best``: for every
    tuned numeric key, both neighbours of its value (the nearest values tried anywhere for that
    key) at the selection's other values, when not run yet; at the edge of the values tried, one
    geometric step beyond (clamped to the declared bound; a linear step through 0). At a selected
    reduction (FedeRage γ = 0, ...) only the reducing key and lr act, so only they are bracketed.
    ``min_values`` (``[tuning] min-values``): when the line through the selection would hold fewer
    values than that once these points run, one more beyond the farther value on a side that can
    grow (the upper first)."""
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
            new = _beyond(value, neighbour, up, space)
            if new != value and new not in tried:
                steps.append((key, new))
        planned = sorted(line | {value} | {v for k, v in steps if k == key})
        if len(planned) < min_values and len(planned) >= 2:  # one more value beyond the farther end
            for up in (True, False):
                end, inner = (planned[-1], planned[-2]) if up else (planned[0], planned[1])
                new = _beyond(end, inner, up, space)
                if new != end and new not in planned:
                    steps.append((key, new))
                    break
    return steps


def extensions(sweep, out: Path) -> list:
    """The RunSpecs (every seed) that extend a selection lying on an extendable grid edge or
    lacking a neighbour (or, with ``min-values``, a tuned key's third value), and are not in the
    sweep yet: the selections under each objective of ``[tuning] extend-objectives`` (the declared
    ``objective`` alone by default) and each iterate of ``extend-iterates``."""
    have = {(r.setting, r.method, r.grid, r.seed) for r in sweep.runs}
    tuning = getattr(sweep, "tuning", None)
    objectives = tuning.objectives if tuning is not None else (Rules().objective,)
    iterates = tuning.iterates if tuning is not None else ("",)
    least = tuning.min_values if tuning is not None else 0
    selections = [item for objective in objectives for iterate in iterates
                  for item in selected_points(sweep, out, objective, iterate).items()]
    new = []
    for (setting, label), (best, points) in selections:
        template = points[best]
        method = _method(template)
        for key, value in edge_steps(method, best, points, least):
            grid = tuple((k, value if k == key else v) for k, v in best)
            for run in template:
                if (setting, label, grid, run.seed) not in have:
                    new.append(dataclasses.replace(run, grid=grid, overrides={**run.overrides, key: value}))
                    have.add((setting, label, grid, run.seed))
    for run in reduction_followups(sweep, selections):
        if (run.setting, run.method, run.grid, run.seed) not in have:
            new.append(run)
            have.add((run.setting, run.method, run.grid, run.seed))
    return new


def _method(runs: list) -> str:
    """The registered method of a grid point's runs (an entry's label need not be its name)."""
    return str(runs[0].overrides.get("method", APP["method"].default))


def reduction_followups(sweep, selections: list) -> list:
    """The RunSpecs (every seed) of a reducing entry's reduction at its baseline's selected lr
    where an equal-budget top-up (or anything else) put that selection at an lr the reduction was
    not run at (issue 52: FedAvg's selection at a top-up lr 0.245 that FedeRage's γ = 0 never saw).
    ``selections``: ((setting, entry), (selected grid point, grid point → RunSpecs)) pairs, each
    objective × iterate the extensions read. The point is a copy of the entry's first reduction
    point (its other keys as :func:`coverage_points` anchored them) at the baseline's lr."""
    by_entry: dict[tuple[str, str], dict[tuple, list]] = {}
    for run in sweep.runs:
        by_entry.setdefault((run.setting, run.method), {}).setdefault(run.grid, []).append(run)
    new = []
    for (setting, base_label), (best, base_points) in selections:
        lr = dict(best).get("lr")
        if lr is None:
            continue
        base_method = _method(base_points[best])
        for (other_setting, label), points in by_entry.items():
            if other_setting != setting or label == base_label:
                continue
            red = reduction_of(_method(next(iter(points.values()))))
            if red is None or red[2] != base_method:
                continue
            fixed = {red[0]: red[1], **red[3]}
            at_red = [g for g in points if "lr" in dict(g)
                      and all(dict(g).get(k, points[g][0].overrides.get(k)) == v for k, v in fixed.items())]
            if not at_red or any(dict(g)["lr"] == lr for g in at_red):
                continue
            grid = tuple((k, lr if k == "lr" else v) for k, v in at_red[0])
            new += [dataclasses.replace(run, grid=grid, overrides={**run.overrides, "lr": lr})
                    for run in points[at_red[0]]]
    return new


def configuration_counts(sweep) -> dict[str, dict[str, int]]:
    """setting → method entry → the configurations (grid points) the sweep runs for it now:
    its budget, coverage points, reductions, extensions and top-ups all counted."""
    out: dict[str, dict[str, set]] = {}
    for r in sweep.runs:
        out.setdefault(r.setting, {}).setdefault(r.method, set()).add(r.grid)
    return {s: {m: len(g) for m, g in by.items()} for s, by in out.items()}


def top_ups(sweep, out: Path) -> list:
    """``equal-budgets``: the RunSpecs (every seed) that bring every method entry of a setting to
    the setting's largest count of configurations (:func:`configuration_counts`): lr values at the
    entry's selection's other values (the declared objective and iterate), first the geometric
    midpoints between the lr values it tried, nearest the selected lr first, then one geometric step
    beyond its smallest and largest lr (within lr's declared bounds), alternately; when these are
    fewer than the entry lacks, the midpoints between the values tried and chosen, again, until none
    is left."""
    counts = configuration_counts(sweep)
    selections = selected_points(sweep, out)
    new = []
    for (setting, label), (best, points) in selections.items():
        missing = max(counts[setting].values()) - counts[setting][label]
        best_d = dict(best)
        if missing <= 0 or "lr" not in best_d:
            continue
        tried = sorted({dict(g)["lr"] for g in points if "lr" in dict(g)})
        at = best_d["lr"]
        mids = [_round(math.sqrt(a * b), False) for a, b in zip(tried, tried[1:])]
        mids = sorted((m for m in mids if m not in tried), key=lambda m: (abs(math.log(m / at)), m))
        ratio = (tried[-1] / tried[0]) ** (1 / (len(tried) - 1)) if len(tried) > 1 else math.sqrt(10)
        beyond, lo, hi = [], tried[0], tried[-1]
        for _ in range(missing):
            hi, lo = _round(min(LR.high, hi * ratio), False), _round(max(LR.low, lo / ratio), False)
            beyond += [v for v in (hi, lo) if v not in tried and v not in beyond]
        chosen = (mids + beyond)[:missing]
        # short of candidates (the lr range at its bounds, every midpoint tried): the midpoints of
        # the values tried and chosen so far, nearest the selected lr first, until enough or none left
        while len(chosen) < missing:
            have = sorted({*tried, *chosen})
            more = {_round(math.sqrt(a * b), False) for a, b in zip(have, have[1:])} - set(have)
            if not more:
                break
            chosen += sorted(more, key=lambda m: (abs(math.log(m / at)), m))[:missing - len(chosen)]
        template = points[best]
        for lr in chosen:
            grid = tuple((k, lr if k == "lr" else v) for k, v in best)
            for run in template:
                new.append(dataclasses.replace(run, grid=grid, overrides={**run.overrides, "lr": lr}))
    return new


def extend_edges(sweep, out: Path, run_pass: Callable[[], list], log: Callable[[str], None] = print) -> list:
    """Extension passes after the sweep's first pass: add :func:`extensions` (and, when none is
    left and ``equal-budgets`` is declared, :func:`top_ups`), run them with ``run_pass`` (returns
    the failures), until none is left or ``max-extensions`` passes; returns the last pass's failures.

    With ``equal-budgets``, when the ``max-extensions`` passes ran out with the budgets unequal
    (a selection that keeps moving: each top-up a new best, each best new neighbours and
    reductions), one more pass runs the top-ups alone, so the budgets end equal whatever the cap;
    the log counts the extension points left unrun."""
    tuning = getattr(sweep, "tuning", None)
    failures: list = []
    if tuning is None or not tuning.extend_edges:
        return failures

    def run(new: list, what: str) -> list:
        points = sorted({f"{r.setting}/{r.method} [{r.variant}]" for r in new})
        todo = sum(not (r.folder(out) / "summary.json").is_file() for r in new)
        log(f"{what}: {len(new)} runs ({todo} to run): " + "; ".join(points))
        sweep.runs.extend(new)
        return run_pass()

    for i in range(tuning.max_extensions):
        new, what = extensions(sweep, out), "edge extension"
        if not new and tuning.equal_budgets:
            new, what = top_ups(sweep, out), "equal-budget top-up"
        if not new:
            return failures
        failures = run(new, f"{what} {i + 1}/{tuning.max_extensions}")
        if failures:
            return failures
    if tuning.equal_budgets and (new := top_ups(sweep, out)):
        left = {(r.setting, r.method, r.grid) for r in extensions(sweep, out)}
        failures = run(new, f"max-extensions ({tuning.max_extensions}) reached, {len(left)} extension "
                            "points not run; equal-budget top-up (final)")
    return failures
