"""The papers' table from finished runs: ``report.md`` and ``report.csv``.

    python -m fedpcd_app.report <folder> [--target 0.8] [--all] [--baseline METHOD] [--mixed-iterates]
                                [--mixed-weightings]
    python -m fedpcd_app.report --check-wording PAGE.md
    python -m fedpcd_app.report --restat PAGE_FOLDER [--margin 0.01]

``<folder>`` is a single run folder (holding ``summary.json``), a sweep output folder, or
any folder holding runs (searched recursively). Runs made by a sweep carry their labels
(setting, method entry, grid point, seed) in ``run.json``, and a folder with a
``sweep.json`` contributes only the runs that manifest lists (the current sweep file).
Other runs (``flwr run``, ``fedpcd_app.runtime.simulate``) are labelled from their resolved config
in ``summary.json``: the method is ``method``; the setting is named by the data and
federation keys (:data:`SETTING_KEYS`) that differ between the runs found ("default" when
none does); the grid point by the other keys that differ between runs of one method and
setting (:data:`IGNORED_KEYS` never count). If several runs share a seed of one grid
point, the newest is used.

Per setting and per method (a ``[[methods]]`` label of the sweep), the grid point with the
highest mean over seeds of the final mean client accuracy ā is chosen (FedPCD paper,
Sec. 5: "report the best performing hyperparameters per dataset after averaging the five
seeds"), on the clients' validation splits when the runs have them (``val-fraction`` > 0,
as the FedeRage paper tunes), else on the test splits with a warning (:func:`selection_split`;
the table says which); ``--all`` lists every grid point in ``report.md`` instead, the chosen
one marked ★. ``report.csv`` always holds every configuration (grid point), its ``selected``
column (= ``chosen``) marking the chosen ones.
The table gives mean ± std over seeds of ā, the client spread σ_c,
worst-10 % W₁₀, best-10 %, Jain's index and the central test accuracy, and the rounds
needed to reach a target accuracy: by default FedAvg's final ā in that setting (the mean
over seeds of the best FedAvg entry), read from the evaluation records of ``rounds.jsonl``
(a run reaches the target at its first evaluation round with ā ≥ target).

The std over seeds is the sample std (ddof = 1); with a single seed only the value is
shown (no ±). The best value of each column is in bold (highest, except σ_c and rounds:
lowest; only when there is a comparison). Markdown shows accuracies as percentages with 2
decimals and Jain's index (a ratio in [1/N, 1]) with 4; the CSV holds raw fractions.

Equal terms. Every table says which iterate and which split were scored: each run's
``summary.json`` records ``scored_iterate`` (``last`` θ_T or ``averaged`` θ̄_T, the
run-config key ``eval-averaged-iterate``; AFL is always ``averaged``) and ``scored_split``
(``test``); runs written before these fields are read as ``last`` (``averaged`` for AFL and
for FedeRage with the retired ``federage-averaged-iterate``). A table (one setting) holding
runs scored on different iterates is refused with one line (exit 2) unless
``--mixed-iterates`` is given; the table then has an ``iterate`` column.

Runs that did not finish normally (``complete: false`` in ``summary.json``, e.g.
``incomplete_reason: "diverged at round N"``) are counted by the sweep's declared rules
(``[tuning] unstable``, ``failed-seed-score``; :class:`fedpcd_app.analysis.tuning.Rules`): a grid
point is *unstable* when a majority of its seeds failed (default; ``any``: one) and is then shown
as ``diverged (k/n seeds)`` (``incomplete`` for other reasons), is not a candidate for selection
(unless every grid point of the method is), sets no best value and enters no paired comparison;
a failed seed of any other point counts at its last evaluation (listed under the table). An exact
tie between grid points goes to the one on fewer grid edges (toward the interior). The selection
objective is the validation mean accuracy (``[tuning] objective`` or ``--objective worst10``: its
worst-10 %; written beside the mean selection as ``report_worst10.md`` / ``.csv`` /
``report_paired_worst10.csv``, so that a fairness page reports both). ``report.csv`` adds
``objective``, ``neighbourhood`` (``bracketed``, or the tuned keys without a neighbour run at the
selection: ⚠ not bracketed), ``untuned`` (an entry run at its defaults beside tuned ones, also
named on the budget line) and the validation means ``val_*``.

Weighting. Every table has a ``weighting`` column: how the row's method weights its clients
(``strategies.registry.weighting_of`` of its method and resolved config: ``data-size``,
``uniform``, ``loss``, ...). A table whose chosen rows weight their clients differently must
hold FedAvg under both weightings (``fedavg-weighting`` ``data-size`` and ``uniform``) as
baselines; otherwise it is refused with one line naming the missing one and the
``[[methods]]`` entry that adds it (exit 2), unless ``--mixed-weightings`` is given.

Budget and edges. Under each table a budget line gives the configurations per method entry
and seed (the sweep's ``[tuning] budget`` and the edge extensions beyond it, or the counts,
flagged **unequal** when they differ). A grid point is ``on_edge`` when it is the smallest or
largest value tried in a numeric key, along that key through it (:func:`grid_edges`); a
selection on the edge is marked ⚠ edge, listed under the table, and never marked best.

Ditto is scored on each client's personal model: its ``scored_iterate`` is ``personal``, which
sits beside any iterate of the other rows.

``--baseline METHOD`` adds a paired comparison per setting: every other row against the
baseline's chosen grid point, over the seeds both ran (a seed fixes the partition, the
initial model and the sampled clients, so the runs are paired): the mean over seeds of
the per-seed difference (method − baseline), the two-sided paired t-test and Wilcoxon
signed-rank p-values (``scipy.stats``) and the number of seeds on which the method did
better, with the mean difference's 95 % t-based confidence interval, the effect size d_z,
the exact sign-test p of the seed count (5/5 seeds is p = 0.0625: not a finding), the t-test p
Holm-adjusted over the report's whole family (every row × metric × setting; ``[tuning]
holm-family = "setting"`` declares the narrower per-setting family), the TOST p at the declared
``[tuning] equivalence-margin`` and a verdict: *significant* only when the adjusted p is below
0.05 over at least 5 paired seeds (fewer: *exploratory, n seeds*), *equivalent* only by the TOST,
else *inconclusive* (:mod:`fedpcd_app.analysis.stats`). Written to ``report.md`` and ``report_paired.csv``;
``report.csv``'s ``p_holm`` is each compared row's adjusted p of the first metric (ā by default).

``--check-wording PAGE.md`` lists the claim sentences of a results page that the rows of the CSVs
beside it do not support (:mod:`fedpcd_app.analysis.claims`: each sentence stating a direction, a
magnitude, a significance, an equivalence or a p-value is parsed into claims — methods, metric,
setting, direction, number — and checked against that pair's row; an unparseable one fails unless
it carries a counted ``<!-- claim-exempt: why -->``); exit 1 when there is one, 0 when none.
``--restat FOLDER [--margin m]`` re-derives a page's page-wide Holm, TOST and verdicts from its
stored ``report_paired*.csv`` and renders them to ``FOLDER/paired.md`` (:func:`restat`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.config import APP
from fedpcd_app.analysis import stats
from fedpcd_app.analysis.layout import MANIFEST, METRIC_INFO, METRICS, NO_GRID, RUN_FILE
from fedpcd_app.server.results import ROUNDS, SUMMARY, read_rounds, read_summary

PAIRED_METRICS = ("mean_acc", "worst10_acc", "std_acc")
VAL_METRICS = ("val_mean_acc", "val_worst10_acc")  # the validation numbers selection reads (report.csv, Pareto figure)

# Runs without run.json: keys that define the federation (a setting) ...
SETTING_KEYS = (
    "dataset", "dataset-path", "model", "partitioner", "dirichlet-alpha", "classes-per-client",
    "num-clients", "min-partition-size", "local-test-fraction", "central-test-fraction",
    "fraction-train", "num-server-rounds", "participation", "availability-rare-clients",
    "availability-rare-prob", "availability-rare-choice",
)
# ... and keys that do not change what a run computes (bookkeeping, evaluation schedule).
IGNORED_KEYS = frozenset({
    "seed", "output-dir", "resume-from", "checkpoint-every", "checkpoint-keep", "tensorboard",
    "log-every", "eval-every", "eval-batch-size", "eval-mode", "round-timeout", "client-loss-before",
})
DEFAULT_SETTING = "default"
UNKNOWN_WEIGHTING = "unknown"
BOTH_FEDAVG = APP["fedavg-weighting"].choices  # the FedAvg baselines of a table mixing weightings
PERSONAL = "personal"  # the scored object of a personalised method (Ditto): each client's personal model
PRIMARY, EXPLORATORY, PAGE = "primary", "exploratory", "page"  # the comparison families of a page (issue 52)


@dataclasses.dataclass
class Run:
    folder: Path
    setting: str
    method: str
    variant: str
    seed: int
    grid: dict[str, Any]
    summary: dict[str, Any]
    tuned_from: str = ""  # the sweep entry's tuned-from (run.json): where its fixed values were selected
    view_iterate: str = ""  # the iterate its numbers are read as (load_runs' iterate; "" = its scored one)

    @property
    def iterate(self) -> str:
        """The iterate its metrics were scored on (``last`` / ``averaged``; see the module doc)."""
        if self.summary.get("method") == "ditto":  # scored on each client's personal model (its paper's output)
            return PERSONAL
        if self.summary.get("scored_iterate"):
            return str(self.summary["scored_iterate"])
        cfg = self.summary.get("config", {})
        if self.summary.get("method") == "afl" or cfg.get("federage-averaged-iterate") is True:
            return "averaged"
        return "last"

    @property
    def split(self) -> str:
        return str(self.summary.get("scored_split", "test"))

    @property
    def weighting(self) -> str:
        """How its method weights the clients: ``weighting`` of its ``summary.json`` (recorded
        by the run), else ``strategies.registry.weighting_of`` of its method and resolved
        config (runs written before the field); ``unknown`` for a method not registered here."""
        if self.summary.get("weighting"):
            return str(self.summary["weighting"])
        from fedcore.config import ConfigError
        from strategies.registry import weighting_of  # imports torch: only for runs without the field

        try:
            return weighting_of(str(self.summary.get("method", "?")), self.summary.get("config", {}))
        except (ConfigError, ValueError, TypeError):
            return UNKNOWN_WEIGHTING

    @property
    def incomplete(self) -> str | None:
        """Why the run gives no score (``complete: false``), else None."""
        if self.summary.get("complete", True) is False:
            return str(self.summary.get("incomplete_reason") or "incomplete (no reason given)")
        return None

    def rounds(self) -> list[dict[str, Any]]:
        return read_rounds(self.folder) if (self.folder / ROUNDS).is_file() else []

    def evaluations(self) -> list[tuple[int, dict[str, Any]]]:
        """(round, evaluation record) of ``rounds.jsonl``, as the run's viewed iterate scores them
        (``iterate_scores[view_iterate]`` laid over the record when it holds that iterate)."""
        from fedpcd_app.analysis.tuning import view

        out = []
        for r in self.rounds():
            if "eval" in r:
                e = r["eval"]
                out.append((r["round"], dict(view({"scored_iterate": self.own_iterate, **e}, self.view_iterate))))
        return out

    @property
    def own_iterate(self) -> str:
        """The iterate the run's headline fields scored (before any view)."""
        return str(self.summary.get("_scored_iterate", self.summary.get("scored_iterate", "last")))

    def eval_curve(self, key: str = "mean_acc") -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the evaluation records of ``rounds.jsonl`` (the viewed iterate's)."""
        pts = [(t, e[key]) for t, e in self.evaluations() if e.get(key) is not None]
        return np.array([p[0] for p in pts], dtype=np.int64), np.array([p[1] for p in pts], dtype=np.float64)

    @property
    def label(self) -> str:
        """The method entry with its grid point, as legends and tables name it."""
        return self.method if self.variant == NO_GRID else f"{self.method} [{self.variant}]"


# -- finding runs ------------------------------------------------------------------------
def _manifests(out: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, sweep.json content) of every sweep at or below ``out`` (or holding it)."""
    found = sorted({p.parent for p in out.rglob(MANIFEST)} | ({out} if (out / MANIFEST).is_file() else set()))
    out_list = []
    for folder in found:
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            [r["folder"] for r in manifest["runs"]]  # noqa: B018 - the fields the report reads
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"warning: {folder / MANIFEST} is not a sweep manifest ({type(exc).__name__}: {exc}); "
                  "its runs are read as plain runs", file=sys.stderr)
            continue
        out_list.append((folder, manifest))
    return out_list


def _run_folders(out: Path, manifests: list[tuple[Path, dict[str, Any]]]) -> list[Path]:
    if (out / SUMMARY).is_file():
        return [out]
    folders = sorted({p.parent for p in out.rglob(SUMMARY)})
    for root, manifest in manifests:  # a sweep contributes the runs its current file lists
        listed = {(root / r["folder"]).resolve() for r in manifest["runs"]}
        folders = [f for f in folders if not _is_below(f, root) or f.resolve() in listed]
    return folders


def _is_below(folder: Path, root: Path) -> bool:
    try:
        folder.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _varying(configs: list[dict[str, Any]], keys) -> list[str]:
    return [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]


def _label_loose(loose: list[tuple[Path, dict[str, Any]]]) -> list[Run]:
    """Labels for runs without run.json, from the config keys that differ between them."""
    configs = [s.get("config", {}) for _, s in loose]
    setting_keys = _varying(configs, SETTING_KEYS)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (_, summary) in enumerate(loose):
        cfg = configs[i]
        setting = ",".join(f"{k}={_fmt(cfg.get(k))}" for k in setting_keys) or DEFAULT_SETTING
        groups[(setting, str(summary.get("method", cfg.get("method", "?"))))].append(i)
    runs = []
    for (setting, method), idx in groups.items():
        own = sorted({k for i in idx for k in configs[i]} - set(SETTING_KEYS) - IGNORED_KEYS - {"method"})
        grid_keys = _varying([configs[i] for i in idx], own)
        for i in idx:
            folder, summary = loose[i]
            grid = {k: configs[i].get(k) for k in grid_keys}
            variant = ",".join(f"{k}={_fmt(v)}" for k, v in grid.items()) or NO_GRID
            seed = int(summary.get("seed", configs[i].get("seed", APP["seed"].default)))
            runs.append(Run(folder, setting, method, variant, seed, grid, summary))
    return runs


def load_runs(out: str | Path, iterate: str | None = None) -> list[Run]:
    """Every finished run (a folder with ``summary.json``) at or below ``out``: a run
    folder, a sweep folder or any folder holding runs (see the module doc for labels).
    ``iterate`` (``last`` / ``averaged``): each run's numbers as that iterate scores them
    (:func:`fedpcd_app.analysis.tuning.view`: a run scored on the averaged iterate also holds its
    last one, ``iterate_scores``); a run without it keeps its own (AFL, Ditto)."""
    runs = _load_runs(out)
    if iterate:
        from fedpcd_app.analysis.tuning import view

        for run in runs:
            own = run.summary.get("scored_iterate", "last")
            run.summary = {**view(run.summary, iterate), "_scored_iterate": own}
            run.view_iterate = iterate
    return runs


def _load_runs(out: str | Path) -> list[Run]:
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a folder")
    manifests = _manifests(out)
    sweep_of = {root.resolve(): m["name"] for root, m in manifests}
    prefix = len(manifests) > 1  # several sweeps: their settings are told apart by name
    labelled, loose = [], []
    for folder in _run_folders(out, manifests):
        summary = read_summary(folder)
        if not (folder / RUN_FILE).is_file():
            loose.append((folder, summary))
            continue
        labels = json.loads((folder / RUN_FILE).read_text())
        setting = labels["setting"]
        if prefix:
            owner = next((name for root, name in sweep_of.items() if _is_below(folder, root)), None)
            setting = f"{owner}/{setting}" if owner else setting
        labelled.append(Run(folder, setting, labels["method"], labels["variant"], int(labels["seed"]),
                            labels.get("grid", {}), summary, str(labels.get("tuned_from", ""))))
    return _newest_per_seed(labelled + _label_loose(loose))


def _newest_per_seed(runs: list[Run]) -> list[Run]:
    keep: dict[tuple, Run] = {}
    for run in runs:
        key = (run.setting, run.method, run.variant, run.seed)
        if key not in keep or _mtime(run) > _mtime(keep[key]):
            keep[key] = run
    if len(keep) < len(runs):
        print(f"note: {len(runs) - len(keep)} run(s) repeat a seed of the same setting, method and grid "
              "point; the newest of each is used", file=sys.stderr)
    return [r for r in runs if keep[(r.setting, r.method, r.variant, r.seed)] is r]


def _mtime(run: Run) -> float:
    return (run.folder / SUMMARY).stat().st_mtime


def ordered(values, order: list[str]) -> list[str]:
    """Unique values, in the sweep file's order where known, else first-seen order."""
    seen = list(dict.fromkeys(values))
    rank = {v: i for i, v in enumerate(order)}
    return sorted(seen, key=lambda v: (rank.get(v, len(rank)), seen.index(v)))


def sweep_order(out: str | Path) -> tuple[list[str], list[str]]:
    """(settings, methods) in the order of the sweep files (the ``sweep.json`` found)."""
    manifests = _manifests(Path(out))
    settings, methods = [], []
    for _, m in manifests:
        prefix = f"{m['name']}/" if len(manifests) > 1 else ""
        settings += [prefix + r["setting"] for r in m["runs"]]
        methods += [r["method"] for r in m["runs"]]
    return list(dict.fromkeys(settings)), list(dict.fromkeys(methods))


def title_of(out: str | Path) -> str:
    manifests = _manifests(Path(out))
    return manifests[0][1]["name"] if len(manifests) == 1 else Path(out).resolve().name


# -- statistics --------------------------------------------------------------------------
def mean_std(values) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def selection_split(runs: list[Run], warn: bool = False) -> str:
    """``validation`` when every run scored a validation split (``val-fraction`` > 0: its
    summary has ``val_mean_acc``), else ``test`` (with a warning when there is a choice to
    make: selecting on the reported test data inflates the "best" numbers)."""
    finished = [r for r in runs if not r.incomplete]  # a run stopped before its first evaluation has none
    if finished and all(r.summary.get("val_mean_acc") is not None for r in finished):
        return "validation"
    if warn and len({r.variant for r in runs}) > 1:
        import warnings

        warnings.warn(f"{runs[0].setting}/{runs[0].method}: no validation split (val-fraction = 0): the grid point "
                      "is selected on the test accuracy it reports; set val-fraction > 0 to select on validation",
                      stacklevel=2)
    return "test"


def best_variant(runs: list[Run], rules=None) -> tuple[str, dict[str, list[Run]]]:
    """The grid point with the highest mean over seeds of the selection objective (the mean
    client accuracy by default) on the validation split when the runs have one (else on the test
    split, :func:`selection_split`), among the points that are not unstable, a failed seed counted
    by the sweep's rules (:class:`fedpcd_app.analysis.tuning.Rules`: a majority failing makes a
    point unstable; a failed seed counts at its last evaluation); an exact tie goes toward the
    interior of the grid (:func:`fedpcd_app.analysis.tuning.choose`), then to the first."""
    from fedpcd_app.analysis.tuning import Rules, choose, point_scores

    by_variant: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_variant[r.variant].append(r)
    selection_split(runs, warn=True)
    scores, _ = point_scores({v: [r.summary for r in rs] for v, rs in by_variant.items()}, rules or Rules())
    if not scores:  # every grid point is unstable: shown as such, never as a score
        return next(iter(by_variant)), by_variant
    best = choose(scores, {v: rs[0].grid for v, rs in by_variant.items()})
    return best, by_variant


def rounds_to_target(run: Run, target: float) -> int | None:
    """First evaluation round whose mean client accuracy reaches ``target`` (None: never)."""
    rounds, acc = run.eval_curve("mean_acc")
    hit = np.nonzero(acc >= target - 1e-12)[0]
    return int(rounds[hit[0]]) if hit.size else None


@dataclasses.dataclass
class Row:
    setting: str
    method: str
    variant: str
    seeds: list[int]
    stats: dict[str, tuple[float, float]]
    target: float | None
    rounds: tuple[float, float, int] | None  # (mean, std over seeds that reached, count reached)
    chosen: bool = True  # the method's best grid point (every row unless --all)
    runs: list[Run] = dataclasses.field(default_factory=list, repr=False)
    selected_on: str = ""  # the split its grid point was selected on (selection_split); "" = no grid
    iterate: str = "last"  # the iterate its runs were scored on (Run.iterate)
    split: str = "test"  # the split its metrics are on (Run.split)
    incomplete: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (seed, reason): no score
    weighting: str = UNKNOWN_WEIGHTING  # how its method weights the clients (Run.weighting)
    edge: list[str] = dataclasses.field(default_factory=list)  # "key=value (largest tried)": on its grid's edge
    p_holm: float | None = None  # Holm-adjusted p of its paired comparison (first metric), when made
    unstable: bool = False  # too many failed seeds (the sweep's Rules): no score
    unbracketed: list[str] = dataclasses.field(default_factory=list)  # tuned keys without both neighbours run
    untuned: bool = False  # run at its defaults (one configuration) beside tuned entries
    objective: str = "mean"  # the selection objective (Rules.objective)

    @property
    def on_edge(self) -> bool:
        """Its grid point lies on the edge of the grid tried in some numeric key."""
        return bool(self.edge)

    @property
    def status(self) -> str:
        """``""`` (scored; a minority of failed seeds counted at their last evaluation), or
        ``diverged`` / ``incomplete`` when the point is unstable (the sweep's rule over its seeds)."""
        if not self.unstable:
            return ""
        return "diverged" if any("diverg" in why for _, why in self.incomplete) else "incomplete"

    @property
    def neighbourhood(self) -> str:
        """``bracketed`` when every tuned numeric key has a lower and a higher value run at the
        selection's other values; else which key is not (the selection is interior along lines only)."""
        if not self.unbracketed:
            return "bracketed"
        return "not bracketed: " + ", ".join(self.unbracketed)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def grid_edges(grid: dict[str, Any], grids: list[dict[str, Any]], method: str = "") -> list[str]:
    """The numeric keys in which ``grid`` is the smallest or largest value tried along that key
    (among ``grids`` with the other keys equal), as ``key=value (largest tried)``; ``, at its
    declared bound`` when the value is the bound of ``method``'s declared space
    (:func:`fedpcd_app.analysis.tuning.space_of`: the sweep cannot extend it further)."""
    from fedpcd_app.analysis.tuning import space_of, values_along

    out = []
    for key, value in grid.items():
        if not _numeric(value):
            continue
        line = values_along(grid, grids, key)
        if len(line) >= 2 and value in (min(line), max(line)):
            space = space_of(method, key)
            top = value == max(line)
            bound = space is not None and value == (space.high if top else space.low)
            out.append(f"{key}={_fmt(value)} ({'largest' if top else 'smallest'} tried"
                       + (", at its declared bound)" if bound else ")"))
    return out


def unbracketed(grid: dict[str, Any], grids: list[dict[str, Any]]) -> list[str]:
    """The numeric keys of ``grid`` tried at other values somewhere in ``grids`` but lacking a
    lower or a higher value on the line through ``grid`` (the other keys equal): the selection
    is not bracketed along that key (``key (lower)``, ``key (higher)``, or ``key (single value)``)."""
    out = []
    for key, value in grid.items():
        if not _numeric(value):
            continue
        tried = {g[key] for g in grids if key in g and _numeric(g[key])}
        line = {g[key] for g in grids if key in g and _numeric(g[key])
                and all(g.get(k) == v for k, v in grid.items() if k != key)}
        if len(tried) < 2:
            continue
        lower, higher = any(v < value for v in line), any(v > value for v in line)
        if not lower and not higher:
            out.append(f"{key} (single value at the selection)")
        elif not lower and any(v < value for v in tried):
            out.append(f"{key} (no lower value at the selection)")
        elif not higher and any(v > value for v in tried):
            out.append(f"{key} (no higher value at the selection)")
    return out


def declared_iterate(out: str | Path) -> str:
    """The ``[tuning] iterate`` of the sweep at or below ``out`` ("" when it declares none)."""
    return tuning_value(out, "iterate") or ""


def rules_of(out: str | Path, objective: str | None = None):
    """The selection rules the sweep at or below ``out`` declares in ``[tuning]``
    (:class:`fedpcd_app.analysis.tuning.Rules`; the defaults without), ``objective`` overriding.
    The iterate is left to :func:`load_runs` (the runs are read as the iterate asked for)."""
    from fedpcd_app.analysis.tuning import OBJECTIVES, Rules

    rules = Rules(tuning_value(out, "unstable") or "majority", tuning_value(out, "failed-seed-score") or "last",
                  objective or tuning_value(out, "objective") or "mean")
    if rules.objective not in OBJECTIVES:
        raise ReportError(f"--objective {rules.objective!r}: choose from {', '.join(OBJECTIVES)}")
    return rules


def is_fedavg(runs: list[Run]) -> bool:
    return all(r.summary.get("method") == "fedavg" for r in runs)


def summarize(runs: list[Run], target: float | None = None,
              order: tuple[list[str], list[str]] = ([], []), all_points: bool = False, rules=None) -> list[Row]:
    """One row per (setting, method): the best grid point's mean ± std over seeds; with
    ``all_points`` one row per grid point (``chosen`` marks the best). ``rules``: the sweep's
    selection rules (:class:`fedpcd_app.analysis.tuning.Rules`): an unstable point has no score;
    a failed seed of another point is counted at its last evaluation (the numbers its summary
    recorded) and listed under the table."""
    from fedpcd_app.analysis.tuning import Rules

    rules = rules or Rules()
    rows = []
    for setting in ordered((r.setting for r in runs), order[0]):
        in_setting = [r for r in runs if r.setting == setting]
        chosen: dict[str, str] = {}
        variants: dict[str, dict[str, list[Run]]] = {}
        for method in ordered((r.method for r in in_setting), order[1]):
            chosen[method], variants[method] = best_variant([r for r in in_setting if r.method == method], rules)
        goal = target
        if goal is None:
            fedavg = [m for m in chosen if is_fedavg(variants[m][chosen[m]])]
            fedavg = [m for m in fedavg
                      if not rules.is_unstable(sum(bool(r.incomplete) for r in variants[m][chosen[m]]),
                                               len(variants[m][chosen[m]]))]
            if fedavg:  # the best FedAvg entry's final accuracy, as in the papers
                goal = max(mean_std(r.summary["mean_acc"] for r in variants[m][chosen[m]])[0] for m in fedavg)
        for method in chosen:
            candidates = [r for r in in_setting if r.method == method]
            split = selection_split(candidates) if len({r.variant for r in candidates}) > 1 else ""
            for variant in (variants[method] if all_points else [chosen[method]]):
                rs = sorted(variants[method][variant], key=lambda r: r.seed)
                bad = [(r.seed, r.incomplete) for r in rs if r.incomplete]
                unstable = rules.is_unstable(len(bad), len(rs))
                stats = {key: (math.nan, math.nan) if unstable else mean_std(r.summary.get(key) for r in rs)
                         for key in [k for k, *_ in METRICS] + list(VAL_METRICS)}
                reach = None
                if goal is not None and not unstable:
                    hits = [rounds_to_target(r, goal) for r in rs]
                    m, s = mean_std(h for h in hits if h is not None)
                    reach = (m, s, sum(h is not None for h in hits))
                iterates = sorted({r.iterate for r in rs})
                grids = [v[0].grid for v in variants[method].values()]
                tuned_elsewhere = any(len({r.variant for r in in_setting if r.method == m}) > 1 for m in chosen) \
                    or any(r.tuned_from for r in in_setting)
                rows.append(Row(setting, method, variant, [r.seed for r in rs], stats, goal, reach,
                                chosen=variant == chosen[method], runs=rs, selected_on=split,
                                iterate="/".join(iterates), split="/".join(sorted({r.split for r in rs})),
                                incomplete=bad, weighting="/".join(sorted({r.weighting for r in rs})),
                                edge=grid_edges(rs[0].grid, grids, str(rs[0].summary.get("method", "")))
                                if len(grids) > 1 else [], unstable=unstable,
                                unbracketed=unbracketed(rs[0].grid, grids) if len(grids) > 1 else [],
                                untuned=len(grids) == 1 and tuned_elsewhere and not rs[0].tuned_from,
                                objective=rules.objective))
    return rows


def _best_marks(rows: list[Row]) -> dict[tuple[int, str], bool]:
    """(row index, column) → is the best mean of that column in its setting."""
    marks = {}
    for setting in dict.fromkeys(r.setting for r in rows):  # personal models are ranked apart (issue 52)
        for personal in (False, True):
            _mark_group([(i, r) for i, r in enumerate(rows) if r.setting == setting
                         and (r.iterate == PERSONAL) == personal], marks, rank=not personal)
    return marks


def _mark_group(group: list[tuple[int, Row]], marks: dict, rank: bool = True) -> None:
    """The best marks of one table's rows (``rank`` false: none; personal models stand apart)."""
    if True:
        for key, _, high, _ in METRICS:  # a selection on its grid's edge is never called best
            vals = [math.nan if r.on_edge else r.stats[key][0] for _, r in group]
            finite = [v for v in vals if not math.isnan(v)]
            for (i, _), v in zip(group, vals):
                marks[(i, key)] = rank and len(finite) > 1 and v == (max(finite) if high else min(finite))
        reach = [r.rounds[0] for _, r in group if r.rounds and r.rounds[2] == len(r.seeds) and not r.on_edge]
        for i, r in group:
            marks[(i, "rounds")] = (rank and len(group) > 1 and bool(reach) and r.rounds is not None
                                    and not r.on_edge and r.rounds[2] == len(r.seeds) and r.rounds[0] == min(reach))


def format_cell(mean: float, std: float, percent: bool, n: int = 2) -> str:
    """``mean ± std`` (no ± for a single seed: there is no spread to show)."""
    if math.isnan(mean):
        return "—"
    if percent:
        return f"{100 * mean:.2f}" if n == 1 else f"{100 * mean:.2f} ± {100 * std:.2f}"
    return f"{mean:.4f}" if n == 1 else f"{mean:.4f} ± {std:.4f}"


# -- paired comparison -------------------------------------------------------------------
@dataclasses.dataclass
class Paired:
    setting: str
    method: str
    variant: str
    baseline: str
    baseline_variant: str
    metric: str
    seeds: list[int]
    diffs: list[float]  # method − baseline, per paired seed
    mean_diff: float
    ttest_p: float
    wilcoxon_p: float
    wins: int  # seeds on which the method did better (higher, or lower for σ_c)
    ties: int
    ci_low: float = math.nan  # 95 % t-based confidence interval of the mean difference
    ci_high: float = math.nan
    effect: float = math.nan  # Cohen's d_z = mean / sample std of the differences
    sign_p: float = math.nan  # exact two-sided sign test of wins among the untied seeds
    p_holm: float = math.nan  # t-test p, Holm-adjusted over the family (the page's, unless declared)
    family: int = 0  # the number of comparisons in that family (defined t-tests)
    on_edge: bool = False  # the method's selection lies on its grid's edge
    baseline_on_edge: bool = False  # the baseline's selection does
    tost_p: float = math.nan  # TOST p of equivalence within the declared margin (NaN: no margin declared)
    family_name: str = "page"  # the Holm family: "page" (every comparison of the report) or "setting"
    tost_p_holm: float = math.nan  # the TOST p Holm-adjusted over the same family as p_holm (issue 52)
    objective: str = ""  # the selection objective of both rows (mean / worst10)
    iterate: str = ""  # the iterate both rows were read as ("" = their scored one)

    @property
    def significant(self) -> bool:
        """Only after the correction, over at least :data:`stats.MIN_SEEDS` paired seeds:
        Holm-adjusted p below :data:`stats.ALPHA`."""
        return len(self.seeds) >= stats.MIN_SEEDS and not math.isnan(self.p_holm) and self.p_holm < stats.ALPHA

    @property
    def verdict(self) -> str:
        """:func:`stats.verdict`: exploratory (n seeds) / significant / equivalent / inconclusive, on
        the p-values corrected alike: the t-test's and the TOST's Holm over the same family."""
        return stats.verdict(len(self.seeds), self.p_holm, self.tost_p_holm)


def paired_tests(diffs) -> tuple[float, float]:
    """Two-sided p-values (paired t-test = one-sample t-test of the differences against 0,
    Wilcoxon signed-rank, zero differences dropped) of per-seed differences; NaN where
    undefined (fewer than 2 seeds; t-test: no spread; Wilcoxon: all differences zero)."""
    from scipy import stats

    from fedpcd_app.analysis import stats as ours

    d = np.asarray(diffs, dtype=np.float64)
    w_p = math.nan
    t_p = ours.ttest_p(d)  # NaN without spread beyond round-off
    if d.size >= 2 and np.any(d != 0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                w_p = float(stats.wilcoxon(d).pvalue)
            except ValueError:
                w_p = math.nan
    return t_p, w_p


def find_baseline(rows: list[Row], setting: str, name: str) -> Row | None:
    """The setting's chosen row of method entry ``name`` (or of the registered method
    ``name`` when exactly one entry runs it)."""
    group = [r for r in rows if r.setting == setting and r.chosen]
    exact = [r for r in group if r.method == name]
    if exact:
        return exact[0]
    by_method = [r for r in group if r.runs and all(x.summary.get("method") == name for x in r.runs)]
    return by_method[0] if len(by_method) == 1 else None


def compare(rows: list[Row], baseline: str, metrics=PAIRED_METRICS, margin: float | None = None,
            family: str = "page") -> list[Paired]:
    """Every row against the baseline's chosen grid point of its setting, over paired seeds:
    mean difference with its 95 % t-interval, d_z, t-test / Wilcoxon / sign-test p-values, the
    t-test p Holm-adjusted over the family (``page``: every row × metric × setting compared;
    ``setting``: each setting's, when the sweep file declares ``[tuning] holm-family =
    "setting"``) and, with an equivalence ``margin`` (``[tuning] equivalence-margin``, a
    fraction), the TOST p; the row's ``p_holm`` gets its first metric's adjusted p."""
    out = []
    for setting in dict.fromkeys(r.setting for r in rows):
        base = find_baseline(rows, setting, baseline)
        if base is None or base.unstable:
            continue
        base_by_seed = {r.seed: r.summary for r in base.runs}
        for row in rows:
            if row.setting != setting or row is base or row.unstable:
                continue
            if (row.iterate == PERSONAL) != (base.iterate == PERSONAL):
                continue  # personal models are never ranked beside a global model (issue 52)
            seeds = [r.seed for r in row.runs if r.seed in base_by_seed]
            mine = {r.seed: r.summary for r in row.runs}
            for key in metrics:
                high = METRIC_INFO[key][1] if key in METRIC_INFO else True
                pairs = [(mine[s].get(key), base_by_seed[s].get(key)) for s in seeds]
                ok = [(s, a - b) for s, (a, b) in zip(seeds, pairs) if a is not None and b is not None]
                d = np.array([x for _, x in ok], dtype=np.float64)
                t_p, w_p = paired_tests(d)
                better = d > 0 if high else d < 0
                _, lo, hi = stats.paired_ci(d)
                ties = int((d == 0).sum())
                out.append(Paired(setting, row.method, row.variant, base.method, base.variant, key,
                                  [s for s, _ in ok], d.tolist(), float(d.mean()) if d.size else math.nan,
                                  t_p, w_p, int(better.sum()), ties, lo, hi, stats.effect_size(d),
                                  stats.sign_test_p(int(better.sum()), d.size - ties), on_edge=row.on_edge,
                                  baseline_on_edge=base.on_edge,
                                  tost_p=stats.tost_p(d, margin) if margin else math.nan, family_name=family))
    if family not in ("page", "setting"):
        raise ReportError(f"holm-family {family!r}: choose 'page' (the default) or 'setting'")
    groups = [out] if family == "page" else [[p for p in out if p.setting == s]
                                             for s in dict.fromkeys(p.setting for p in out)]
    for group in groups:  # Holm over each family, the TOST's as the t-test's (issue 52: one correction)
        for p, adj, tost in zip(group, stats.holm([p.ttest_p for p in group]), stats.holm([p.tost_p for p in group])):
            p.p_holm, p.family, p.tost_p_holm = adj, sum(not math.isnan(x.ttest_p) for x in group), tost
    first = {(p.setting, p.method, p.variant): p.p_holm for p in out if p.metric == metrics[0]} if metrics else {}
    for row in rows:
        if (row.setting, row.method, row.variant) in first:
            row.p_holm = first[(row.setting, row.method, row.variant)]
    return out


def _p(value: float) -> str:
    if math.isnan(value):
        return "—"
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def _diff(value: float, key: str) -> str:
    if math.isnan(value):
        return "—"
    percent = METRIC_INFO.get(key, ("", True, False))[2]
    return f"{100 * value:+.2f} pp" if percent else f"{value:+.4f}"


FAMILY_WORDS = {
    "setting": "this table",
    "page": "the whole report (every setting; declared narrower only by [tuning] holm-family)",
    PRIMARY: "the page's declared primary comparisons ([[tuning.primary]]: each method against the baseline its "
             "paper names, on the paper's metrics, declared before the runs)",
    EXPLORATORY: "the page's exploratory comparisons (every comparison not declared primary, its own family)",
}


def paired_markdown(results: list[Paired], baseline: str, settings: list[str], by_baseline: bool = True) -> list[str]:
    lines = []
    for setting in settings:
        group = [p for p in results if p.setting == setting]
        title = f"paired comparison against {baseline}" if by_baseline else f"primary comparisons against {baseline}"
        lines += ["", f"## {setting}: {title}", ""]
        if not group:
            lines.append(f"No method entry '{baseline}' in this setting (or nothing to compare with it).")
            continue
        first = group[0]
        base = first.baseline + ("" if first.baseline_variant == NO_GRID else f" [{first.baseline_variant}]")
        if not by_baseline:
            base = "its baseline (the baseline column)"
        lines.append(f"Per seed difference method − {base} on the same seed (same partition, initial model "
                     "and sampled clients): mean over the paired seeds with its 95 % confidence interval "
                     "(t-based), the effect size d_z (mean / std of the differences), the two-sided paired "
                     "t-test p, that p Holm-adjusted over the family stated below (p_holm), the TOST p of "
                     "equivalence and the verdict, the Wilcoxon "
                     "signed-rank p (scipy.stats; — where undefined: one seed, or no spread), and the seeds on "
                     "which the method did better (higher; for σ_c lower) with their exact sign-test p.")
        head = "| method | hyperparameters | " + ("" if by_baseline else "baseline | ")
        lines += ["", head + "metric | paired seeds | mean difference [95 % CI] | d_z | "
                      "t-test p | p_holm | TOST p | TOST p_holm | verdict | Wilcoxon p | seeds better (sign-test p) |",
                  "|---|---|" + ("" if by_baseline else "---|")
                  + "---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for p in group:
            title = METRIC_INFO.get(p.metric, (p.metric,))[0]
            better = f"{p.wins}/{len(p.seeds)}" + (f" ({p.ties} tied)" if p.ties else "") + f" (p = {_p(p.sign_p)})"
            ci = "" if math.isnan(p.ci_low) else f" [{_diff(p.ci_low, p.metric)}, {_diff(p.ci_high, p.metric)}]"
            effect = "—" if math.isnan(p.effect) else f"{p.effect:+.2f}"
            hyper = p.variant.replace(",", ", ") + (" ⚠ edge" if p.on_edge else "")
            against = "" if by_baseline else (p.baseline + ("" if p.baseline_variant == NO_GRID
                                                            else f" [{p.baseline_variant.replace(',', ', ')}]") + " | ")
            lines.append(f"| {p.method} | {hyper} | {against}{title} | {len(p.seeds)} | "
                         f"{_diff(p.mean_diff, p.metric)}{ci} | "
                         f"{effect} | {_p(p.ttest_p)} | {_p(p.p_holm)} | {_p(p.tost_p)} | {_p(p.tost_p_holm)} | "
                         f"{p.verdict} | "
                         f"{_p(p.wilcoxon_p)} | {better} |")
        metrics = ", ".join(dict.fromkeys(METRIC_INFO.get(p.metric, (p.metric,))[0] for p in group))
        n_rows = len(dict.fromkeys((p.method, p.variant) for p in group))
        scope = FAMILY_WORDS.get(first.family_name, first.family_name)
        lines += ["", f"Family: the {group[0].family} comparisons of {scope} with a defined t-test "
                      f"({n_rows} method row(s) here × metrics {metrics}), "
                      f"Holm-corrected, the t-tests and the TOSTs alike. Verdict: *significant* means p_holm < "
                      f"{stats.ALPHA} over at least "
                      f"{stats.MIN_SEEDS} paired seeds (fewer: *exploratory, n seeds*, no significance); "
                      "*equivalent* means the TOST p within the sweep's declared [tuning] equivalence-margin, "
                      f"Holm-adjusted over the same family (TOST p_holm), is below {stats.ALPHA}; else "
                      "*inconclusive* (read the interval). \"k/n seeds better\" is a "
                      "sign test, not a finding on its own: with 5 seeds, 5/5 is p = 0.0625; with n seeds the "
                      "Wilcoxon p cannot fall below 2/2ⁿ."]
        if first.baseline_on_edge:
            lines.append(f"⚠ edge: the baseline {base}'s selected grid point lies on its grid's edge: the "
                         "differences are not against its optimum.")
        if any(p.on_edge for p in group):
            lines.append("⚠ edge: the method's selected grid point lies on its grid's edge (see the table above); "
                         "its difference is not against an optimum.")
    return lines


def write_paired_csv(results: list[Paired], path: Path) -> None:
    fields = ["setting", "method", "hyperparameters", "baseline", "baseline_hyperparameters", "metric",
              "num_seeds", "seeds", "differences", "mean_difference", "ttest_p", "wilcoxon_p", "seeds_better",
              "seeds_tied", "ci95_low", "ci95_high", "effect_dz", "sign_test_p", "p_holm", "family_size",
              "significant", "on_edge", "holm_family", "tost_p", "verdict", "tost_p_holm", "objective", "iterate"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for p in results:
            w.writerow({"setting": p.setting, "method": p.method, "hyperparameters": p.variant,
                        "baseline": p.baseline, "baseline_hyperparameters": p.baseline_variant,
                        "metric": p.metric, "num_seeds": len(p.seeds), "seeds": " ".join(map(str, p.seeds)),
                        "differences": " ".join(repr(d) for d in p.diffs), "mean_difference": p.mean_diff,
                        "ttest_p": p.ttest_p, "wilcoxon_p": p.wilcoxon_p, "seeds_better": p.wins,
                        "seeds_tied": p.ties, "ci95_low": p.ci_low, "ci95_high": p.ci_high, "effect_dz": p.effect,
                        "sign_test_p": p.sign_p, "p_holm": p.p_holm, "family_size": p.family,
                        "significant": int(p.significant), "on_edge": int(p.on_edge),
                        "holm_family": p.family_name, "tost_p": p.tost_p, "verdict": p.verdict,
                        "tost_p_holm": p.tost_p_holm, "objective": p.objective, "iterate": p.iterate})


# -- output ------------------------------------------------------------------------------
def budget_line(rows: list[Row], budget: int | None = None) -> str:
    """The configurations per method entry and seed of one table (``rows``: every grid point):
    the declared ``[tuning] budget`` with the points beyond it (edge and neighbour extensions,
    reductions, the shared lr axis), or the counts; then, per entry, the values tried on each
    key, and the entries run untuned (at their defaults) beside tuned ones."""
    counts = {m: len({r.variant for r in rows if r.method == m}) for m in dict.fromkeys(r.method for r in rows)}
    if budget is not None:
        extra = {m: n - budget for m, n in counts.items() if n != budget}
        more = ("; points beyond it (edge and neighbour extensions, reductions, the shared lr axis, equal-budget "
                "top-ups): " + ", ".join(f"{m} {d:+d}" for m, d in extra.items())) if extra else ""
        line = f"Budget: {budget} configurations per method entry and seed ([tuning] budget = {budget}){more}."
        if len(set(counts.values())) == 1:  # issue 52: counted after extensions and reductions
            line += f" Counted after them, every entry ran {next(iter(counts.values()))} configurations: equal."
        else:
            line += (" Counted after them the budgets are **unequal**: " + ", ".join(f"{m} {n}" for m, n in
                                                                                   counts.items()) + ".")
    elif len(set(counts.values())) == 1:
        n = next(iter(counts.values()))
        line = f"Budget: {n} configuration{'s' if n > 1 else ''} per method entry and seed, the same for every entry."
    else:
        line = ("Budget: **unequal** — configurations per method entry and seed: "
                + ", ".join(f"{m} {n}" for m, n in counts.items())
                + " (a sweep's [tuning] table gives every entry the same budget).")
    tried = []
    for m in counts:
        values: dict[str, list] = {}
        for r in rows:
            if r.method == m:
                for k, v in (r.runs[0].grid if r.runs else {}).items():
                    values.setdefault(k, []).append(v)
        if values:
            tried.append(f"{m}: " + "; ".join(f"{k} {{{', '.join(_fmt(v) for v in sorted(set(vs), key=str))}}}"
                                              if not all(_numeric(v) for v in vs) else
                                              f"{k} {{{', '.join(_fmt(v) for v in sorted(set(vs)))}}}"
                                              for k, vs in values.items()))
    if tried:
        line += " Values tried — " + " | ".join(tried) + "."
    elsewhere = {r.method: r.runs[0].tuned_from for r in rows if r.runs and r.runs[0].tuned_from}
    if elsewhere:
        line += " Values selected elsewhere: " + "; ".join(f"{m} ({w})" for m, w in elsewhere.items()) + "."
    untuned = [m for m in counts if any(r.untuned for r in rows if r.method == m)]
    if untuned:
        line += (" **Untuned** (run at their defaults beside tuned entries: not on equal terms): "
                 + ", ".join(untuned) + ".")
    return line


def to_markdown(rows: list[Row], title: str = "", all_points: bool = False, budget: int | None = None,
                every_row: list[Row] | None = None) -> str:
    """The tables; ``every_row`` (every grid point, default ``rows``) sizes the budget line."""
    marks = _best_marks(rows)
    every_row = rows if every_row is None else every_row
    lines = _preamble(rows, title, all_points)
    for setting in dict.fromkeys(r.setting for r in rows):
        group = [(i, r) for i, r in enumerate(rows) if r.setting == setting]
        lines += ["", f"## {setting}", ""]
        lines += [scored_line([r for _, r in group]), "",
                  budget_line([r for r in every_row if r.setting == setting], budget), ""]
        shared = [(i, r) for i, r in group if r.iterate != PERSONAL]
        personal = [(i, r) for i, r in group if r.iterate == PERSONAL]
        lines += _setting_table(shared or personal, marks, all_points)
        if shared and personal:  # issue 52: personal-model scores are never ranked beside global-model scores
            lines += ["", "Personal models — scored on each client's own model, not on the global model: a "
                          "different object, so not ranked (no bold) beside the table above and not compared with "
                          "it in the paired tests:", ""]
            lines += _setting_table(personal, marks, all_points)
    return "\n".join(lines) + "\n"


def _preamble(rows: list[Row], title: str, all_points: bool) -> list[str]:
    """The title, what a cell holds and how a grid point is chosen; a warning when chosen on the test split."""
    lines = [f"# {title}" if title else "# Results", ""]
    splits = sorted({r.selected_on for r in rows} - {""})
    on = f" on the {' or '.join(splits)} split" if splits else ""
    objective = {r.objective for r in rows}
    what = "worst-10 % accuracy" if objective == {"worst10"} else "mean ā"
    if all_points:
        lines.append("Mean ± std over seeds (sample std) of the final round's metrics (test splits), every grid "
                     f"point; ★ marks each method's chosen grid point (best {what} over seeds{on}). Accuracies in %, "
                     "best per column in bold.")
    else:
        lines.append("Mean ± std over seeds (sample std) of the final round's metrics (test splits); per method the "
                     f"grid point with the best {what} over seeds{on}. Accuracies in %, best per column in bold.")
    if "test" in splits:
        lines.append("")
        lines.append("**Warning:** hyperparameters selected on the test split they are reported on (no "
                     "validation split: val-fraction = 0), which inflates the best numbers.")
    return lines


def _setting_table(group: list[tuple[int, Row]], marks: dict, all_points: bool) -> list[str]:
    """One setting's table (``group``: its rows with their indices in ``marks``), then its notes."""
    target = group[0][1].target
    mixed = len({r.iterate for _, r in group} - {PERSONAL}) > 1
    rounds_title = f"rounds to {100 * target:.2f}%" if target is not None else "rounds to target"
    head = (["method", "weighting", "hyperparameters", "seeds"] + (["iterate"] if mixed else [])
            + [t for _, t, _, _ in METRICS] + [rounds_title])
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * (5 if mixed else 4) + ["---:"] * (len(METRICS) + 1)) + "|"]
    notes = []
    for i, r in group:
        hyper = (("untuned: its defaults" if r.untuned else r.variant.replace(",", ", "))
                 + (" ★" if all_points and r.chosen else "")
                 + (" ⚠ edge" if r.on_edge and (r.chosen or not all_points) else "")
                 + (" ⚠ not bracketed" if r.unbracketed and r.chosen and not r.on_edge else ""))
        cells = [r.method, r.weighting, hyper, str(len(r.seeds))] + ([r.iterate] if mixed else [])
        if r.unstable:  # never a score: what happened, and why under the table
            cells += [f"{r.status} ({len(r.incomplete)}/{len(r.seeds)} seeds)"] + ["—"] * len(METRICS)
            notes += [f"{r.method} [{r.variant}] seed {seed}: {why}" for seed, why in r.incomplete]
        else:
            cells += _score_cells(i, r, marks)
            notes += [f"{r.method} [{r.variant}] seed {seed} (counted at its last evaluation): {why}"
                      for seed, why in r.incomplete]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + _table_notes([r for _, r in group], notes)


def _score_cells(i: int, r: Row, marks: dict) -> list[str]:
    """A scored row's metric cells and its rounds-to-target cell, the best of each column in bold."""
    n = len(r.seeds)
    cells = []
    for key, _, _, percent in METRICS:
        text = format_cell(*r.stats[key], percent, n)
        cells.append(f"**{text}**" if marks[(i, key)] and text != "—" else text)
    if r.rounds is None or r.rounds[2] == 0:
        text = "—" if r.rounds is None else f"not reached (0/{n})"
    else:
        text = f"{r.rounds[0]:.1f}" if r.rounds[2] == 1 else f"{r.rounds[0]:.1f} ± {r.rounds[1]:.1f}"
        if r.rounds[2] < n:
            text += f" ({r.rounds[2]}/{n} seeds)"
        elif marks[(i, "rounds")]:
            text = f"**{text}**"
    return cells + [text]


def _table_notes(rows: list[Row], notes: list[str]) -> list[str]:
    """Under a table: runs that gave no score, selections on a grid's edge, mixed weightings."""
    lines = []
    if notes:
        lines += ["", "Runs that stopped early (summary.json `complete: false`; a grid point is unstable, no "
                      "score, only when a majority of its seeds did, else they count at their last evaluation):", ""]
        lines += [f"- {note}" for note in notes]
    loose = [r for r in rows if r.chosen and r.unbracketed and not r.on_edge]
    if loose:
        lines += ["", "⚠ not bracketed — selections interior along lines only (a tuned key lacks a neighbour run "
                      "at the selection's other values): "
                  + "; ".join(f"{r.method}: {', '.join(r.unbracketed)}" for r in loose) + "."]
    edges = [r for r in rows if r.chosen and r.on_edge]
    if edges:
        lines += ["", "⚠ edge — selections on the edge of the grid tried (the optimum may lie beyond it; no "
                      "best value is marked for them and none is claimed): "
                  + "; ".join(f"{r.method}: {', '.join(r.edge)}" for r in edges) + "."]
    weightings = sorted({r.weighting for r in rows})
    if len(weightings) > 1:
        lines += ["", "Weighting: the rows weight their clients differently (" + ", ".join(weightings)
                  + "); compare a rule with the FedAvg of its own weighting."]
    return lines


def scored_line(rows: list[Row]) -> str:
    """What a table scored: the iterate(s) and the split; a method keeping its own single output under a
    view of another iterate (AFL's average, :func:`own_output`) is named, not counted as a mix."""
    own = {r.method: r.iterate for r in rows if r.runs and all(own_output(x) for x in r.runs)}
    iterates = sorted({r.iterate for r in rows if r.method not in own})
    splits = sorted({r.split for r in rows})
    names = {"last": "the last global model θ_T", "averaged": "the averaged iterate θ̄_T (mean of θ_1..θ_T)",
             "last/averaged": "mixed", PERSONAL: "each client's personal model (Ditto)"}
    what = " and ".join(names.get(i, i) for i in iterates)
    if own:
        what += "; " + ", ".join(f"{m}: its own output, {names.get(i, i)} (its paper's; the iterate column)"
                                 for m, i in own.items())
    mixed = (" — **mixed iterates** (--mixed-iterates): rows are not on equal terms"
             if len(set(iterates) - {PERSONAL}) > 1 else "")
    return f"Scored: {what}, on the {' and '.join(splits)} split(s){mixed}."


def own_output(run: Run) -> bool:
    """The run's method has one scored output, whatever the iterate asked for (AFL: its averaged
    iterate, its paper's output): it keeps it under a view of another iterate (issue 52)."""
    return bool(run.view_iterate) and run.iterate != run.view_iterate and not run.summary.get("iterate_scores")


def check_iterates(runs: list[Run]) -> None:
    """One line (ReportError) when a table (a setting) mixes runs scored on different iterates (a
    method's own single output under a view of another iterate, AFL's average, is named in the
    table's iterate column, not refused: each method on the iterate its paper scores)."""
    for setting in dict.fromkeys(r.setting for r in runs):
        by_iterate: dict[str, list[str]] = defaultdict(list)
        for run in runs:  # a personalised method is scored on its personal models beside any iterate
            if run.setting == setting and run.iterate != PERSONAL and not own_output(run) \
                    and run.method not in by_iterate[run.iterate]:
                by_iterate[run.iterate].append(run.method)
        if len(by_iterate) > 1:
            parts = "; ".join(f"{it}: {', '.join(ms)}" for it, ms in sorted(by_iterate.items()))
            raise ReportError(f"setting '{setting}' mixes runs scored on different iterates ({parts}): rerun them "
                              "with the same eval-averaged-iterate, or pass --mixed-iterates to tabulate them anyway")


def check_weightings(rows: list[Row]) -> None:
    """One line (ReportError) when a table compares rules of different weightings without
    FedAvg under both weightings (data-size and uniform) among its rows."""
    for setting in dict.fromkeys(r.setting for r in rows):
        group = [r for r in rows if r.setting == setting and r.chosen]
        kinds = {r.weighting for r in group} - {UNKNOWN_WEIGHTING}
        if len(kinds) < 2:
            continue
        have = {r.weighting for r in group if is_fedavg(r.runs)}
        missing = [w for w in BOTH_FEDAVG if w not in have]
        if missing:
            by = "; ".join(f"{w}: {', '.join(r.method for r in group if r.weighting == w)}" for w in sorted(kinds))
            raise ReportError(f"setting '{setting}' compares rules of different weightings ({by}) without FedAvg "
                              f"under fedavg-weighting = '{missing[0]}': add a [[methods]] entry name = "
                              f"\"fedavg-{missing[0]}\", method = \"fedavg\", fedavg-weighting = \"{missing[0]}\" "
                              "to the sweep, or pass --mixed-weightings")


def write_csv(rows: list[Row], path: Path) -> None:
    """Every configuration (grid point) of every method, ``selected`` marking the chosen one."""
    fields = ["setting", "method", "hyperparameters", "chosen", "num_seeds", "seeds", "scored_iterate",
              "scored_split", "status", "incomplete", "weighting", "selected", "on_edge", "edge", "p_holm"]
    for key, *_ in METRICS:
        fields += [f"{key}_mean", f"{key}_std"]
    fields += ["target_acc", "rounds_to_target_mean", "rounds_to_target_std", "seeds_reaching_target"]
    fields += ["objective", "neighbourhood", "untuned"] + [f"{key}_mean" for key in VAL_METRICS]  # issue 42
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            row = {"setting": r.setting, "method": r.method, "hyperparameters": r.variant, "chosen": int(r.chosen),
                   "num_seeds": len(r.seeds), "seeds": " ".join(map(str, r.seeds)),
                   "target_acc": "" if r.target is None else r.target, "scored_iterate": r.iterate,
                   "scored_split": r.split, "status": r.status or "scored",
                   "incomplete": "; ".join(f"seed {seed}: {why}" for seed, why in r.incomplete),
                   "weighting": r.weighting, "selected": int(r.chosen), "on_edge": int(r.on_edge),
                   "edge": "; ".join(r.edge), "p_holm": "" if r.p_holm is None else r.p_holm,
                   "objective": r.objective, "neighbourhood": r.neighbourhood, "untuned": int(r.untuned)}
            for key, *_ in METRICS:
                row[f"{key}_mean"], row[f"{key}_std"] = ("", "") if r.unstable else r.stats[key]
            for key in VAL_METRICS:
                value = r.stats.get(key, (math.nan, math.nan))[0]
                row[f"{key}_mean"] = "" if r.unstable or math.isnan(value) else value
            if r.rounds is not None:
                row["rounds_to_target_mean"], row["rounds_to_target_std"], row["seeds_reaching_target"] = r.rounds
            w.writerow(row)


class ReportError(ValueError):
    """A report option does not fit the runs found (one line)."""


def tuning_budget(out: str | Path) -> int | None:
    """The ``[tuning] budget`` of the sweep found at or below ``out`` (None: no such table)."""
    return tuning_value(out, "budget")


def tuning_value(out: str | Path, key: str) -> Any:
    """A ``[tuning]`` key of the sweep found at or below ``out`` (None: absent, or sweeps disagree)."""
    values = {json.dumps(m.get("source", {}).get("tuning", {}).get(key)) for _, m in _manifests(Path(out))}
    values.discard("null")
    return json.loads(values.pop()) if len(values) == 1 else None


def report(out: str | Path, target: float | None = None, all_points: bool = False,
           baseline: str | None = None, metrics=PAIRED_METRICS, mixed_iterates: bool = False,
           mixed_weightings: bool = False, objective: str | None = None,
           iterate: str | None = None) -> tuple[Path, Path]:
    """``report.md`` (each method's selected grid point; every grid point with ``all_points``)
    and ``report.csv`` (every grid point, ``selected`` marking the chosen ones). ``iterate``
    (``last`` / ``averaged``): the runs read, selected and tabulated as that iterate scores them
    (default: the sweep's ``[tuning] iterate``, else each run's scored one); one other than the
    declared one writes ``report_<iterate>.*`` beside the declared one's."""
    out = Path(out)
    declared = declared_iterate(out)
    iterate = iterate or declared
    runs = load_runs(out, iterate)
    if not runs:
        raise FileNotFoundError(f"no finished run (a folder with {SUMMARY}) at or below {out}")
    rules = rules_of(out, objective)
    suffix = "" if rules.objective == "mean" else f"_{rules.objective}"  # both selections side by side
    suffix += f"_{iterate}" if iterate and iterate != declared else ""
    every = summarize(runs, target, sweep_order(out), all_points=True, rules=rules)
    rows = every if all_points else [r for r in every if r.chosen]
    if not mixed_iterates:
        check_iterates(runs)
    if not mixed_weightings:
        check_weightings(every)
    if baseline:
        unknown = [m for m in metrics if m not in METRIC_INFO]
        if unknown:
            raise ReportError(f"--metrics: unknown metric {unknown[0]!r} (choose from {', '.join(METRIC_INFO)})")
        settings = list(dict.fromkeys(r.setting for r in rows))
        if not any(find_baseline(rows, s, baseline) for s in settings):
            names = ", ".join(dict.fromkeys(r.method for r in rows))
            raise ReportError(f"--baseline {baseline!r} is not a method of the runs found (methods: {names})")
        results = compare(rows, baseline, metrics, tuning_value(out, "equivalence-margin"),
                          tuning_value(out, "holm-family") or "page")
        for p in results:
            p.objective, p.iterate = rules.objective, iterate or ""
    text = to_markdown(rows, title_of(out), all_points, tuning_budget(out), every)
    if baseline:
        text += "\n".join(paired_markdown(results, baseline, settings)) + "\n"
        write_paired_csv(results, out / f"report_paired{suffix}.csv")
    md, csv_path = out / f"report{suffix}.md", out / f"report{suffix}.csv"
    md.write_text(text)
    write_csv(every, csv_path)
    return md, csv_path


def page_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of the paired CSVs beside a results page (every ``*.csv`` of its folder with a
    ``mean_difference`` column): what :func:`check_page` checks the page's words against."""
    rows = []
    for csv_path in sorted(Path(path).parent.glob("*.csv")):
        with open(csv_path, newline="") as fh:
            reader = csv.DictReader(fh)
            if "mean_difference" in (reader.fieldnames or []):
                rows += list(reader)
    return rows


def _paired_objective(path: Path, row: dict[str, str]) -> str:
    """The selection objective of a stored paired row: its ``objective`` column, else the file's name."""
    return row.get("objective") or ("worst10" if path.name.startswith("report_paired_worst10") else "mean")


def _paired_iterate(path: Path, row: dict[str, str]) -> str:
    """The iterate of a stored paired row: its ``iterate`` column, else a ``_last`` / ``_averaged`` in the
    file's name, else "" (the runs' scored iterate: pages made before issue 52)."""
    if row.get("iterate"):
        return row["iterate"]
    return next((it for it in ("last", "averaged") if f"_{it}" in path.stem), "")


def declared_families(sweep_file: str | Path | None):
    """(primary comparisons, objective, iterate, margin) a sweep file declares in ``[tuning]``
    (``[[tuning.primary]]``, :class:`fedpcd_app.analysis.tuning.Primary`); ((), "mean", "", None) without."""
    if not sweep_file:
        return (), "mean", "", None
    import tomllib

    from fedpcd_app.analysis import tuning as tuning_mod

    source = tomllib.loads(Path(sweep_file).read_text())
    table = source.get("tuning") or {}
    names = [str(m.get("name")) for m in source.get("methods") or [] if isinstance(m, dict)]
    try:
        primary = tuning_mod.parse_primary(table.get("primary", source.get("primary", [])), names)
    except tuning_mod.TuningError as exc:
        raise ReportError(f"{sweep_file}: {exc}") from None
    return primary, table.get("objective", "mean"), table.get("iterate", ""), table.get("equivalence-margin")


def is_primary(row: dict[str, str], objective: str, iterate: str, declared, obj: str, it: str) -> bool:
    """The stored paired ``row`` (of selection ``objective``, ``iterate``) is a declared primary
    comparison: its two entries, metric and setting declared (either order: A − B is B − A), under the
    declared objective ``obj`` and iterate ``it``."""
    if objective != obj or iterate != it:
        return False
    pair = {row.get("method", ""), row.get("baseline", "")}
    return any(pair == {d.method, d.baseline} and row.get("metric") in d.metrics
               and (not d.settings or row.get("setting") in d.settings) for d in declared)


def restat(folder: str | Path, margin: float | None = None, sweep: str | Path | None = None) -> list[Path]:
    """Re-derive a results page's statistics from its stored paired CSVs (``report_paired*.csv``:
    their per-seed ``differences``), without its runs. One correction rule for every test the page
    states (issue 52): the comparisons a ``sweep`` file declares primary (``[[tuning.primary]]``: each
    method against the baseline its paper names, on the paper's metrics, under the declared objective
    and iterate) form one Holm family, every other comparison of the page the exploratory family; the
    t-test p and the TOST p of each comparison are Holm-adjusted over its family alike
    (``p_holm_family``, ``tost_p_holm_family``; ``comparison_family``, ``comparison_family_size``), and
    ``verdict`` (:func:`stats.verdict`) reads both. Without declared primaries the family is the page's
    (``page``). A − B and B − A are one comparison; so is one pair of selected configurations under
    either objective. ``p_holm_page``, ``page_family_size`` (Holm of the t-tests over the whole page,
    as before issue 52) and ``tost_p`` (raw, at the equivalence ``margin``: the sweep's declared one
    when not given; NaN without one, and then nothing may be called a tie) are kept. The CSVs are
    rewritten with these columns added (the earlier ones kept); the paths rewritten."""
    folder = Path(folder)
    declared, obj, it, declared_margin = declared_families(sweep)
    margin = margin if margin is not None else declared_margin
    files = sorted(folder.glob("report_paired*.csv"))
    tables = []
    for path in files:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            tables.append((path, list(reader.fieldnames or []), list(reader)))

    def ident(path: Path, r: dict[str, str]) -> tuple:  # one comparison, whichever side is the baseline
        sides = frozenset({(r.get("method", ""), r.get("hyperparameters", "")),
                           (r.get("baseline", ""), r.get("baseline_hyperparameters", ""))})
        return r.get("setting", ""), sides, r.get("metric", ""), _paired_iterate(path, r)

    unique: dict[tuple, tuple[float, float]] = {}
    family: dict[tuple, str] = {}
    for path, _, rows in tables:
        for r in rows:
            key = ident(path, r)
            diffs = [float(x) for x in (r.get("differences") or "").split()]
            if key not in unique:
                tost = stats.tost_p(diffs, margin) if margin else math.nan  # symmetric: A − B's is B − A's
                unique[key] = (float(r.get("ttest_p") or "nan"), tost)
            primary = declared and is_primary(r, _paired_objective(path, r), _paired_iterate(path, r), declared,
                                              obj, it)
            family[key] = PRIMARY if primary or family.get(key) == PRIMARY else (EXPLORATORY if declared else PAGE)
    keys = list(unique)
    page_adjusted = dict(zip(keys, stats.holm([unique[k][0] for k in keys])))
    page_size = sum(not math.isnan(unique[k][0]) for k in keys)
    adjusted: dict[tuple, tuple[float, float]] = {}
    sizes: dict[str, int] = {}
    for name in dict.fromkeys(family.values()):
        members = [k for k in keys if family[k] == name]
        sizes[name] = sum(not math.isnan(unique[k][0]) for k in members)
        t_adj = stats.holm([unique[k][0] for k in members])
        tost_adj = stats.holm([unique[k][1] for k in members])
        adjusted.update({k: (a, b) for k, a, b in zip(members, t_adj, tost_adj)})
    added = ("p_holm_page", "page_family_size", "tost_p", "verdict", "comparison_family", "comparison_family_size",
             "p_holm_family", "tost_p_holm_family")
    for path, fields, rows in tables:
        for r in rows:
            key = ident(path, r)
            n = len((r.get("differences") or "").split())
            p_fam, tost_fam = adjusted[key]
            r.update({"p_holm_page": page_adjusted[key], "page_family_size": page_size, "tost_p": unique[key][1],
                      "comparison_family": family[key], "comparison_family_size": sizes[family[key]],
                      "p_holm_family": p_fam, "tost_p_holm_family": tost_fam,
                      "verdict": stats.verdict(n, p_fam, tost_fam),
                      "significant": int(n >= stats.MIN_SEEDS and p_fam < stats.ALPHA)})
        out = fields + [f for f in added if f not in fields]
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=out)
            w.writeheader()
            w.writerows(rows)
    return files


def paired_from_csv(rows: list[dict[str, str]]) -> list[Paired]:
    """:class:`Paired` results read back from a page's paired CSV rows (after :func:`restat`: the
    declared family's ``p_holm_family`` and ``tost_p_holm_family`` are the adjusted p-values; before
    issue 52's restat, the page-wide ``p_holm_page``)."""
    def num(r: dict[str, str], key: str) -> float:
        try:
            return float(r.get(key) or "nan")
        except ValueError:
            return math.nan

    out = []
    for r in rows:
        fam = "p_holm_family" in r
        page = "p_holm_page" in r
        p_key = "p_holm_family" if fam else "p_holm_page" if page else "p_holm"
        size_key = "comparison_family_size" if fam else "page_family_size" if page else "family_size"
        out.append(Paired(
            r["setting"], r["method"], r["hyperparameters"], r["baseline"], r["baseline_hyperparameters"], r["metric"],
            [int(x) for x in (r.get("seeds") or "").split()], [float(x) for x in (r.get("differences") or "").split()],
            num(r, "mean_difference"), num(r, "ttest_p"), num(r, "wilcoxon_p"), int(num(r, "seeds_better")),
            int(num(r, "seeds_tied")), num(r, "ci95_low"), num(r, "ci95_high"), num(r, "effect_dz"),
            num(r, "sign_test_p"), num(r, p_key), int(num(r, size_key)), r.get("on_edge") == "1",
            tost_p=num(r, "tost_p"), family_name=r["comparison_family"] if fam else "page" if page else "setting",
            tost_p_holm=num(r, "tost_p_holm_family" if fam else "tost_p_holm"),
            objective=r.get("objective", ""), iterate=r.get("iterate", "")))
    return out


def render_paired(folder: str | Path, pattern: str = "report_paired*.csv") -> str:
    """The paired-comparison tables of a results page, re-rendered from its stored paired CSVs
    (``pattern``; run :func:`restat` first: the declared families, verdicts): per selection (objective
    and iterate), the declared primary comparisons in one table, then the exploratory ones, one table
    per baseline and setting; each distinct comparison once."""
    rows, seen = [], set()
    for path in sorted(Path(folder).glob(pattern)):
        with open(path, newline="") as fh:
            for r in csv.DictReader(fh):
                r = {**r, "objective": _paired_objective(path, r), "iterate": _paired_iterate(path, r)}
                key = tuple(r.get(k) for k in ("setting", "method", "hyperparameters", "baseline", "metric",
                                               "objective", "iterate"))
                if key not in seen:
                    seen.add(key)
                    rows.append(r)
    results = paired_from_csv(rows)
    lines: list[str] = []
    for objective, iterate in dict.fromkeys((p.objective, p.iterate) for p in results):
        here = [p for p in results if (p.objective, p.iterate) == (objective, iterate)]
        what = "validation mean" if objective == "mean" else "validation worst-10 %"
        lines += ["", f"## Selection on the {what}" + (f", {iterate} iterate" if iterate else "")]
        primary = [p for p in here if p.family_name == PRIMARY]
        if primary:
            lines += paired_markdown(primary, "the baselines their papers name (declared primary)",
                                     list(dict.fromkeys(p.setting for p in primary)), by_baseline=False)
        rest = [p for p in here if p.family_name != PRIMARY]
        for baseline in dict.fromkeys(p.baseline for p in rest):
            group = [p for p in rest if p.baseline == baseline]
            lines += paired_markdown(group, baseline, list(dict.fromkeys(p.setting for p in group)))
    return "\n".join(lines).replace("\n## ", "\n### ") + "\n"


def check_page(path: str | Path) -> list[str]:
    """``PAGE:LINE: unsupported (why): SENTENCE`` for each claim sentence of a results page that its
    rows do not support (:func:`fedpcd_app.analysis.claims.check_page`: every sentence stating a
    direction, a magnitude, a significance, an equivalence or a p-value, parsed into claims and
    checked against its pair's row)."""
    from fedpcd_app.analysis import claims

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--check-wording: no page {path}")
    problems, _ = claims.check_page(path)
    return [f"{path}:{p.line}: unsupported ({p.why}): {p.sentence}" for p in problems]


def exemptions(path: str | Path) -> list[str]:
    """``PAGE:LINE: exempt (why): SENTENCE`` for each sentence carrying ``<!-- claim-exempt: why -->``."""
    from fedpcd_app.analysis import claims

    _, found = claims.check_page(Path(path))
    return [f"{path}:{p.line}: exempt ({p.why}): {p.sentence}" for p in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedpcd_app.report", description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="a run folder, a sweep output folder or any folder holding runs")
    parser.add_argument("--target", type=float, default=None,
                        help="target accuracy (fraction) for the rounds column (default: FedAvg's final mean)")
    parser.add_argument("--all", dest="all_points", action="store_true",
                        help="list every grid point, not only each method's best")
    parser.add_argument("--baseline", default=None, metavar="METHOD",
                        help="add a paired comparison over seeds against this method entry")
    parser.add_argument("--mixed-iterates", action="store_true",
                        help="allow runs scored on different iterates (last / averaged) in one table")
    parser.add_argument("--metrics", default=",".join(PAIRED_METRICS),
                        help=f"metrics of the paired comparison (default {','.join(PAIRED_METRICS)})")
    parser.add_argument("--mixed-weightings", action="store_true",
                        help="allow a table of rules of different weightings without FedAvg under both")
    parser.add_argument("--objective", default=None, choices=("mean", "worst10"),
                        help="select each grid point on the validation mean accuracy (default, or the sweep's "
                             "[tuning] objective) or on its worst-10 %%")
    parser.add_argument("--iterate", default=None, choices=("last", "averaged"),
                        help="read, select and tabulate the runs as this iterate scores them (default: the sweep's "
                             "[tuning] iterate, else each run's scored one; runs scored on the averaged iterate "
                             "also hold their last one)")
    parser.add_argument("--check-wording", default=None, metavar="PAGE.md",
                        help="list the page's claims of significance / 'every seed' without a corrected test "
                             "(exit 1 when there is one); no report is made")
    parser.add_argument("--restat", default=None, metavar="FOLDER",
                        help="re-derive a page's statistics from its stored report_paired*.csv (page-wide Holm, "
                             "TOST at --margin, verdict) without its runs, and render them to FOLDER/paired.md")
    parser.add_argument("--margin", type=float, default=None,
                        help="--restat: the equivalence margin (a fraction, 0.01 = 1 pp) declared before the runs "
                             "(default: the --sweep file's [tuning] equivalence-margin)")
    parser.add_argument("--sweep", default=None, metavar="SWEEP.toml",
                        help="--restat: the page's sweep file, whose [[tuning.primary]] declares the primary "
                             "comparisons (Holm over them; the rest exploratory, its own family)")
    args = parser.parse_args(argv)
    if args.restat:
        try:
            files = restat(args.restat, args.margin, args.sweep)
        except (ReportError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not files:
            print(f"error: no report_paired*.csv in {args.restat}", file=sys.stderr)
            return 2
        (Path(args.restat) / "paired.md").write_text("# Paired comparisons (from the stored CSVs, Holm over each "
                                                   "declared family)\n" + render_paired(args.restat))
        print("rewrote " + ", ".join(map(str, files)) + f" and {Path(args.restat) / 'paired.md'}")
        return 0
    if args.check_wording:
        try:
            flagged = check_page(args.check_wording)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        exempt = exemptions(args.check_wording)
        print("\n".join(flagged) if flagged else f"{args.check_wording}: no unsupported claim")
        if exempt:
            print(f"{len(exempt)} exemption(s), counted (<!-- claim-exempt: ... -->):\n" + "\n".join(exempt))
        return 1 if flagged else 0
    if not args.out:
        print("error: give a run or sweep folder (or --check-wording PAGE.md)", file=sys.stderr)
        return 2
    try:
        md, csv_path = report(args.out, args.target, args.all_points, args.baseline,
                              [m.strip() for m in args.metrics.split(",") if m.strip()], args.mixed_iterates,
                              args.mixed_weightings, args.objective, args.iterate)
    except (FileNotFoundError, ReportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(md.read_text())
    paired = md.parent / md.name.replace("report", "report_paired").replace(".md", ".csv")
    print(f"wrote {md} and {csv_path}" + (f" and {paired}" if args.baseline else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
