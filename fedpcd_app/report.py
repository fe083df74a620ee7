"""The papers' table from a finished sweep: ``report.md`` and ``report.csv``.

    python -m fedpcd_app.report <sweep-out-dir> [--target 0.8]

Per setting and per method (a ``[[methods]]`` label of the sweep), the grid point with the
highest mean over seeds of the final mean client accuracy ā is chosen (FedPCD paper,
Sec. 5: "report the best performing hyperparameters per dataset after averaging the five
seeds"), on the clients' validation splits when the runs have them (``val-fraction`` > 0,
as the FedeRage paper tunes), else on the test splits with a warning (:func:`selection_split`;
the table says which); for it the table gives mean ± std over seeds of ā, the client spread σ_c,
worst-10 % W₁₀, best-10 %, Jain's index and the central test accuracy, and the rounds
needed to reach a target accuracy: by default FedAvg's final ā in that setting (the mean
over seeds of the best FedAvg entry), read from the evaluation records of ``rounds.jsonl``
(a run reaches the target at its first evaluation round with ā ≥ target).

The std over seeds is the sample std (ddof = 1; 0 for a single seed). The best value of
each column is in bold (highest, except σ_c and rounds: lowest; only when there is a
comparison). Markdown shows
accuracies as percentages with 2 decimals and Jain's index (a ratio in [1/N, 1]) with 4;
the CSV holds raw fractions.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedpcd_app.results import ROUNDS, SUMMARY, read_rounds, read_summary
from fedpcd_app.sweep import MANIFEST, RUN_FILE

# (summary key, column title, higher is better, shown as a percentage)
METRICS: tuple[tuple[str, str, bool, bool], ...] = (
    ("mean_acc", "ā", True, True),
    ("std_acc", "σ_c", False, True),
    ("worst10_acc", "W₁₀", True, True),
    ("best10_acc", "B₁₀", True, True),
    ("jain", "Jain", True, False),
    ("central_acc", "central", True, True),
)


@dataclasses.dataclass
class Run:
    folder: Path
    setting: str
    method: str
    variant: str
    seed: int
    grid: dict[str, Any]
    summary: dict[str, Any]

    def rounds(self) -> list[dict[str, Any]]:
        return read_rounds(self.folder) if (self.folder / ROUNDS).is_file() else []

    def eval_curve(self, key: str = "mean_acc") -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the evaluation records of ``rounds.jsonl``."""
        pts = [(r["round"], r["eval"][key]) for r in self.rounds() if "eval" in r and r["eval"].get(key) is not None]
        return np.array([p[0] for p in pts], dtype=np.int64), np.array([p[1] for p in pts], dtype=np.float64)


def load_runs(out: str | Path) -> list[Run]:
    """Every finished run (``run.json`` and ``summary.json``) of a sweep output folder: the
    runs its ``sweep.json`` lists (the current sweep file), or every run folder below it."""
    out = Path(out)
    if (out / MANIFEST).is_file():
        run_files = [out / r["folder"] / RUN_FILE for r in json.loads((out / MANIFEST).read_text())["runs"]]
    else:
        run_files = sorted(out.rglob(RUN_FILE))
    runs = []
    for run_file in run_files:
        folder = run_file.parent
        if not run_file.is_file():
            continue
        if not (folder / SUMMARY).is_file():
            continue
        labels = json.loads(run_file.read_text())
        runs.append(Run(folder, labels["setting"], labels["method"], labels["variant"], int(labels["seed"]),
                        labels.get("grid", {}), read_summary(folder)))
    return runs


def ordered(values, order: list[str]) -> list[str]:
    """Unique values, in the sweep file's order where known, else first-seen order."""
    seen = list(dict.fromkeys(values))
    rank = {v: i for i, v in enumerate(order)}
    return sorted(seen, key=lambda v: (rank.get(v, len(rank)), seen.index(v)))


def sweep_order(out: str | Path) -> tuple[list[str], list[str]]:
    """(settings, methods) in the order of the sweep file (from ``sweep.json``)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return [], []
    runs = json.loads(path.read_text())["runs"]
    return list(dict.fromkeys(r["setting"] for r in runs)), list(dict.fromkeys(r["method"] for r in runs))


def mean_std(values) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def selection_split(runs: list[Run], warn: bool = False) -> str:
    """``validation`` when every run scored a validation split (``val-fraction`` > 0: its
    summary has ``val_mean_acc``), else ``test`` (with a warning when there is a choice to
    make: selecting on the reported test data inflates the "best" numbers)."""
    if runs and all(r.summary.get("val_mean_acc") is not None for r in runs):
        return "validation"
    if warn and len({r.variant for r in runs}) > 1:
        import warnings

        warnings.warn(f"{runs[0].setting}/{runs[0].method}: no validation split (val-fraction = 0): the grid point "
                      "is selected on the test accuracy it reports; set val-fraction > 0 to select on validation",
                      stacklevel=2)
    return "test"


def best_variant(runs: list[Run]) -> tuple[str, dict[str, list[Run]]]:
    """The grid point with the highest mean over seeds of the mean client accuracy on the
    validation split when the runs have one (else on the test split, :func:`selection_split`);
    first on ties."""
    by_variant: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_variant[r.variant].append(r)
    key = "val_mean_acc" if selection_split(runs, warn=True) == "validation" else "mean_acc"
    best = max(by_variant, key=lambda v: mean_std(r.summary[key] for r in by_variant[v])[0])
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
    selected_on: str = ""  # the split its grid point was selected on (selection_split); "" = no grid


def is_fedavg(runs: list[Run]) -> bool:
    return all(r.summary.get("method") == "fedavg" for r in runs)


def summarize(runs: list[Run], target: float | None = None,
              order: tuple[list[str], list[str]] = ([], [])) -> list[Row]:
    """One row per (setting, method): the best grid point's mean ± std over seeds."""
    rows = []
    for setting in ordered((r.setting for r in runs), order[0]):
        in_setting = [r for r in runs if r.setting == setting]
        chosen: dict[str, list[Run]] = {}
        for method in ordered((r.method for r in in_setting), order[1]):
            best, by_variant = best_variant([r for r in in_setting if r.method == method])
            chosen[method] = sorted(by_variant[best], key=lambda r: r.seed)
        goal = target
        if goal is None:
            fedavg = [m for m, rs in chosen.items() if is_fedavg(rs)]
            if fedavg:  # the best FedAvg entry's final accuracy, as in the papers
                goal = max(mean_std(r.summary["mean_acc"] for r in chosen[m])[0] for m in fedavg)
        for method, rs in chosen.items():
            stats = {key: mean_std(r.summary.get(key) for r in rs) for key, *_ in METRICS}
            reach = None
            if goal is not None:
                hits = [rounds_to_target(r, goal) for r in rs]
                m, s = mean_std(h for h in hits if h is not None)
                reach = (m, s, sum(h is not None for h in hits))
            candidates = [r for r in in_setting if r.method == method]
            split = selection_split(candidates) if len({r.variant for r in candidates}) > 1 else ""
            rows.append(Row(setting, method, rs[0].variant, [r.seed for r in rs], stats, goal, reach, split))
    return rows


def _best_marks(rows: list[Row]) -> dict[tuple[str, str, str], bool]:
    """(setting, method, column) → is the best mean of that column in its setting."""
    marks = {}
    for setting in dict.fromkeys(r.setting for r in rows):
        group = [r for r in rows if r.setting == setting]
        cols = [(key, high) for key, _, high, _ in METRICS]
        for key, high in cols:
            vals = [r.stats[key][0] for r in group]
            finite = [v for v in vals if not math.isnan(v)]
            for r, v in zip(group, vals):
                marks[(setting, r.method, key)] = len(finite) > 1 and v == (max(finite) if high else min(finite))
        reach = [r.rounds[0] for r in group if r.rounds and r.rounds[2] == len(r.seeds)]
        for r in group:
            marks[(setting, r.method, "rounds")] = (len(group) > 1 and bool(reach) and r.rounds is not None
                                                    and r.rounds[2] == len(r.seeds) and r.rounds[0] == min(reach))
    return marks


def _cell(mean: float, std: float, percent: bool) -> str:
    if math.isnan(mean):
        return "—"
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if percent else f"{mean:.4f} ± {std:.4f}"


def to_markdown(rows: list[Row], title: str = "") -> str:
    marks = _best_marks(rows)
    lines = [f"# {title}" if title else "# Results", ""]
    splits = sorted({r.selected_on for r in rows} - {""})
    lines.append("Mean ± std over seeds (sample std) of the final round's metrics (test splits); per method the "
                 f"grid point with the best mean ā over seeds{' on the ' + ' or '.join(splits) + ' split' if splits else ''}. "
                 "Accuracies in %, best per column in bold.")
    if "test" in splits:
        lines.append("")
        lines.append("**Warning:** hyperparameters selected on the test split they are reported on (no "
                     "validation split: val-fraction = 0), which inflates the best numbers.")
    for setting in dict.fromkeys(r.setting for r in rows):
        group = [r for r in rows if r.setting == setting]
        target = group[0].target
        lines += ["", f"## {setting}", ""]
        rounds_title = f"rounds to {100 * target:.2f}%" if target is not None else "rounds to target"
        head = ["method", "hyperparameters", "seeds"] + [t for _, t, _, _ in METRICS] + [rounds_title]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join(["---"] * 3 + ["---:"] * (len(METRICS) + 1)) + "|")
        for r in group:
            cells = [r.method, r.variant.replace(",", ", "), str(len(r.seeds))]
            for key, _, _, percent in METRICS:
                text = _cell(*r.stats[key], percent)
                cells.append(f"**{text}**" if marks[(setting, r.method, key)] and text != "—" else text)
            if r.rounds is None or r.rounds[2] == 0:
                text = "—" if r.rounds is None else f"not reached (0/{len(r.seeds)})"
            else:
                text = f"{r.rounds[0]:.1f} ± {r.rounds[1]:.1f}"
                if r.rounds[2] < len(r.seeds):
                    text += f" ({r.rounds[2]}/{len(r.seeds)} seeds)"
                elif marks[(setting, r.method, "rounds")]:
                    text = f"**{text}**"
            cells.append(text)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[Row], path: Path) -> None:
    fields = ["setting", "method", "hyperparameters", "num_seeds", "seeds"]
    for key, *_ in METRICS:
        fields += [f"{key}_mean", f"{key}_std"]
    fields += ["target_acc", "rounds_to_target_mean", "rounds_to_target_std", "seeds_reaching_target"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            row = {"setting": r.setting, "method": r.method, "hyperparameters": r.variant,
                   "num_seeds": len(r.seeds), "seeds": " ".join(map(str, r.seeds)),
                   "target_acc": "" if r.target is None else r.target}
            for key, *_ in METRICS:
                row[f"{key}_mean"], row[f"{key}_std"] = r.stats[key]
            if r.rounds is not None:
                row["rounds_to_target_mean"], row["rounds_to_target_std"], row["seeds_reaching_target"] = r.rounds
            w.writerow(row)


def report(out: str | Path, target: float | None = None) -> tuple[Path, Path]:
    out = Path(out)
    runs = load_runs(out)
    if not runs:
        raise FileNotFoundError(f"no finished run (run.json + summary.json) under {out}: run the sweep first")
    rows = summarize(runs, target, sweep_order(out))
    name = json.loads((out / MANIFEST).read_text())["name"] if (out / MANIFEST).is_file() else out.name
    md, csv_path = out / "report.md", out / "report.csv"
    md.write_text(to_markdown(rows, name))
    write_csv(rows, csv_path)
    return md, csv_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="a sweep output folder")
    parser.add_argument("--target", type=float, default=None,
                        help="target accuracy (fraction) for the rounds column (default: FedAvg's final mean)")
    args = parser.parse_args(argv)
    try:
        md, csv_path = report(args.out, args.target)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(md.read_text())
    print(f"wrote {md} and {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
