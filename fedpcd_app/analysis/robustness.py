"""The robustness table: every method's honest clients under every attack.

    python -m fedpcd_app.robustness <sweep folder> [--out FOLDER] [--placeholder LABEL ...]

Reads the runs of a sweep whose ``[[settings]]`` are attacks (e.g.
``run_configs/sweeps/robustness_digits.toml``) and writes ``robustness.md`` and
``robustness.csv`` (one row per method entry; per setting the mean ± std over seeds of the
honest clients' mean accuracy and worst-10 % accuracy, from ``summary.json``'s ``honest``)
and ``robustness.png`` (the same two metrics as heatmaps, method × setting) into ``--out``
(default: the sweep folder). ``--placeholder LABEL`` adds an empty row (a method still to
be run). A cell over an incomplete run (``complete`` false) is marked †.

The honest clients are the partitions outside ``attacked_partitions``; a no-attack setting
(``attack = "none"`` with the same ``attack-fraction``) marks the same partitions, so every
column is over the same clients of each seed (checked: the attacked partitions of a seed
must agree across settings and methods).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedpcd_app.analysis.report import format_cell, load_runs, mean_std, ordered, sweep_order, title_of

METRICS = (("mean_acc", "honest mean accuracy"), ("worst10_acc", "honest worst-10 % accuracy"))


class RobustnessError(ValueError):
    """The runs found cannot make the table (one line)."""


def collect(folder: Path) -> tuple[list[str], list[str], dict[tuple[str, str], list]]:
    """(settings, method entries, (method, setting) → runs) of a sweep folder."""
    runs = load_runs(folder)
    if not runs:
        raise RobustnessError(f"no finished run (summary.json) at or below {folder}")
    attackers: dict[int, list[int]] = {}
    for run in runs:
        if "honest" not in run.summary:
            raise RobustnessError(f"{run.folder}: summary.json has no 'honest' metrics: give the run "
                                  "attack-fraction or attack-clients (with attack = 'none' for a no-attack baseline)")
        marked = run.summary["attacked_partitions"]
        if attackers.setdefault(run.seed, marked) != marked:
            raise RobustnessError(f"{run.folder}: attacked partitions {marked} differ from {attackers[run.seed]} "
                                  f"of another run with seed {run.seed}: the columns would not share their clients")
    settings, methods = sweep_order(folder)
    cells: dict[tuple[str, str], list] = defaultdict(list)
    for run in runs:
        cells[(run.method, run.setting)].append(run)
    return ordered((r.setting for r in runs), settings), ordered((r.method for r in runs), methods), cells


def cell(runs: list, key: str) -> tuple[float, float, int, bool]:
    """(mean, std over seeds, seeds, any incomplete run) of the honest clients' ``key``."""
    mean, std = mean_std(r.summary["honest"][key] for r in runs)
    return mean, std, len(runs), any(r.summary.get("complete") is False for r in runs)


def to_markdown(title: str, settings: list[str], methods: list[str], cells, placeholders: list[str]) -> str:
    lines = [f"# {title}", "",
             "Honest clients only (the partitions outside `attacked_partitions`, the same per seed in every "
             "column): mean ± std over seeds of the final round's metric, in %. † marks a cell with an "
             "incomplete run.", ""]
    for key, what in METRICS:
        lines += [f"## {what}", "", "| method | " + " | ".join(settings) + " |",
                  "|---|" + "---:|" * len(settings)]
        for method in methods + placeholders:
            row = []
            for setting in settings:
                runs = cells.get((method, setting), [])
                if not runs:
                    row.append("—")
                    continue
                mean, std, n, incomplete = cell(runs, key)
                row.append(format_cell(mean, std, True, n) + (" †" if incomplete else ""))
            lines.append(f"| {method} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def write_csv(path: Path, settings: list[str], methods: list[str], cells) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["method", "setting", "metric", "mean", "std", "seeds", "complete"])
        for method in methods:
            for setting in settings:
                runs = cells.get((method, setting), [])
                for key, _ in METRICS:
                    if runs:
                        mean, std, n, incomplete = cell(runs, key)
                        out.writerow([method, setting, key, mean, std, n, not incomplete])


def figure(path: Path, settings: list[str], methods: list[str], cells) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(1.1 * len(settings) * len(METRICS) + 3,
                                                       0.42 * len(methods) + 2), constrained_layout=True)
    for ax, (key, what) in zip(np.atleast_1d(axes), METRICS):
        grid = np.full((len(methods), len(settings)), np.nan)
        for i, method in enumerate(methods):
            for j, setting in enumerate(settings):
                if cells.get((method, setting)):
                    grid[i, j] = 100 * cell(cells[(method, setting)], key)[0]
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(settings)), settings, rotation=30, ha="right")
        ax.set_yticks(range(len(methods)), methods)
        ax.set_title(f"{what} (%), mean over seeds")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedpcd_app.robustness", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a sweep output folder whose settings are attacks")
    parser.add_argument("--out", default="", help="where robustness.md/.csv/.png go (default: the folder)")
    parser.add_argument("--placeholder", action="append", default=[], metavar="LABEL",
                        help="an empty row for a method still to be run (repeatable)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:
        settings, methods, cells = collect(folder)
    except (RobustnessError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or folder)
    out.mkdir(parents=True, exist_ok=True)
    text = to_markdown(title_of(folder), settings, methods, cells, args.placeholder)
    (out / "robustness.md").write_text(text)
    write_csv(out / "robustness.csv", settings, methods, cells)
    figure(out / "robustness.png", settings, methods, cells)
    print(text)
    print(f"wrote {out / 'robustness.md'}, {out / 'robustness.csv'} and {out / 'robustness.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
