"""The papers' figures from a finished sweep (PNG, matplotlib Agg).

    python -m fedpcd_app.figures <sweep-out-dir> [--out DIR]

Per setting (each method at its best grid point, chosen as in :mod:`fedpcd_app.report`):

* ``<setting>_convergence.png`` — mean client accuracy and worst-10 % against the round,
  mean over seeds with a ±1 std band (FedPCD Fig. 7).
* ``<setting>_client_hist.png`` — histograms of the final per-client accuracies pooled
  over seeds, one panel per method (FedPCD Fig. 4, CRAFT Fig. 3).
* ``<setting>_frontier.png`` — ā against σ_c: the seed mean, with bars spanning the
  seeds' range on both axes (FedPCD's accuracy–spread frontier, Figs. 5, 15, 16).
* ``<setting>_history.png`` — for method entries run at several ``fedpcd-history`` values: ā,
  W₁₀ and the mean number of active constraints (``fedpcd-active`` in the ``strategy``
  entries of ``rounds.jsonl``, averaged over rounds) against H, mean ± std over seeds
  (FedPCD Fig. 17); one line per method entry and values of its other grid keys.
* ``<setting>_labels.png`` — the label distribution of the partition (counts per client
  and class, from ``client_app.data.FederatedData.label_counts``), for the first seed;
  skipped with a note when the dataset cannot be loaded here.
* ``<setting>_availability.png`` — when a run folder holds ``availability.json``
  (``{"probabilities": [...]}``): each client's availability probability and, from
  ``clients.csv``, the fraction of rounds it was actually sampled.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedpcd_app.report import Run, best_variant, load_runs, ordered, sweep_order  # noqa: E402
from fedpcd_app.sweep import _safe  # noqa: E402

HISTORY_KEY = "fedpcd-history"
ACTIVE_KEY = "fedpcd-active"
AVAILABILITY = "availability.json"


def _chosen(runs: list[Run], methods_order: list[str]) -> dict[str, list[Run]]:
    out = {}
    for method in ordered((r.method for r in runs), methods_order):
        best, by_variant = best_variant([r for r in runs if r.method == method])
        out[method] = sorted(by_variant[best], key=lambda r: r.seed)
    return out


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def convergence(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, ax, title in (("mean_acc", axes[0], "mean client accuracy ā"),
                           ("worst10_acc", axes[1], "worst-10% client accuracy W₁₀")):
        for method, rs in chosen.items():
            curves = [r.eval_curve(key) for r in rs]
            rounds = sorted(set.intersection(*(set(c[0].tolist()) for c in curves)))
            if not rounds:
                continue
            vals = np.array([[dict(zip(c[0].tolist(), c[1]))[t] for t in rounds] for c in curves]) * 100
            mean, std = vals.mean(0), vals.std(0, ddof=1) if len(vals) > 1 else np.zeros(len(rounds))
            line, = ax.plot(rounds, mean, marker="o", ms=3, label=f"{method} ({len(rs)} seeds)")
            ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="round", ylabel="%", title=title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{setting}: convergence (mean over seeds ± 1 std)")
    return _save(fig, path)


def client_histograms(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    n = len(chosen)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, sharex=True)
    bins = np.linspace(0, 100, 21)
    for ax, (method, rs) in zip(axes.flat, chosen.items()):
        acc = 100 * np.array([a for r in rs for a in r.summary["client_acc"] if a is not None])
        ax.hist(acc, bins=bins, color="tab:blue", alpha=0.8, edgecolor="white")
        ax.axvline(acc.mean(), color="k", ls="--", lw=1, label=f"mean {acc.mean():.1f}%")
        ax.set(title=f"{method} ({len(rs)} seeds × {acc.size // len(rs)} clients)", xlabel="client accuracy (%)",
               ylabel="clients")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(f"{setting}: final per-client accuracy, pooled over seeds")
    return _save(fig, path)


def frontier(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for method, rs in chosen.items():
        x = 100 * np.array([r.summary["std_acc"] for r in rs])
        y = 100 * np.array([r.summary["mean_acc"] for r in rs])
        ax.errorbar(x.mean(), y.mean(), xerr=[[x.mean() - x.min()], [x.max() - x.mean()]],
                    yerr=[[y.mean() - y.min()], [y.max() - y.mean()]], fmt="o", capsize=4, label=method)
    ax.set(xlabel="client spread σ_c (%)  ← fairer", ylabel="mean client accuracy ā (%)",
           title=f"{setting}: accuracy vs spread (seed mean, bars = seed range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def mean_active(run: Run) -> float:
    """Mean over rounds of the number of active constraints (a count, or a list's length)."""
    vals = []
    for rec in run.rounds():
        v = rec.get("strategy", {}).get(ACTIVE_KEY)
        if v is not None:
            vals.append(len(v) if isinstance(v, list) else float(v))
    return float(np.mean(vals)) if vals else float("nan")


def history_sweep(runs: list[Run], setting: str, path: Path) -> Path | None:
    runs = [r for r in runs if HISTORY_KEY in r.summary.get("config", {})]
    if not runs:
        return None
    lines: dict[str, dict[int, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        others = ",".join(f"{k}={v}" for k, v in r.grid.items() if k != HISTORY_KEY)
        lines[r.method + (f" ({others})" if others else "")][int(r.summary["config"][HISTORY_KEY])].append(r)
    lines = {name: by_h for name, by_h in lines.items() if len(by_h) > 1}  # a sweep over H, not one fixed H
    if not lines:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = ((lambda r: 100 * r.summary["mean_acc"], "ā (%)"), (lambda r: 100 * r.summary["worst10_acc"], "W₁₀ (%)"),
              (mean_active, "active constraints (mean over rounds)"))
    for ax, (value, label) in zip(axes, panels):
        for name, by_h in lines.items():
            hs = sorted(by_h)
            vals = [[value(r) for r in by_h[h]] for h in hs]
            mean = np.array([np.mean(v) for v in vals])
            std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in vals])
            ax.errorbar(hs, mean, yerr=std, marker="o", capsize=3, label=name)
        ax.set(xlabel="history window H (rounds)", ylabel=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{setting}: history-window sweep (mean ± std over seeds)")
    return _save(fig, path)


def label_distribution(run: Run, setting: str, path: Path) -> Path | None:
    from client_app.data import load_federated_data
    from fedcore.config import parse_run_config

    try:
        data = load_federated_data(parse_run_config(run.summary["config"]))
    except Exception as exc:  # noqa: BLE001 - a dataset not available here skips this one figure
        print(f"note: no label distribution for {setting}: {type(exc).__name__}: {exc}".splitlines()[0])
        return None
    counts = data.label_counts()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(counts)), 4))
    bottom = np.zeros(len(counts))
    cmap = plt.get_cmap("tab10" if counts.shape[1] <= 10 else "tab20")
    for c in range(counts.shape[1]):
        ax.bar(np.arange(len(counts)), counts[:, c], bottom=bottom, color=cmap(c % cmap.N), label=str(c))
        bottom += counts[:, c]
    ax.set(xlabel="client (partition id)", ylabel="examples", xticks=np.arange(len(counts)),
           title=f"{setting}: label distribution (seed {run.seed})")
    ax.tick_params(axis="x", labelsize=7)
    if counts.shape[1] <= 20:
        ax.legend(title="class", fontsize=7, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


def _sampled_fraction(run: Run) -> np.ndarray | None:
    path = run.folder / "clients.csv"
    if not path.is_file():
        return None
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    return np.array([float(r["times_sampled"]) for r in rows]) / run.summary["rounds"]


def availability(run: Run, setting: str, path: Path) -> Path:
    probs = np.asarray(json.loads((run.folder / AVAILABILITY).read_text())["probabilities"], dtype=float)
    x = np.arange(len(probs))
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(probs)), 4))
    ax.bar(x, probs, color="tab:orange", alpha=0.8, label="availability probability")
    ax.set(xlabel="client (partition id)", ylabel="availability probability", xticks=x,
           title=f"{setting}: availability profile ({run.method}, seed {run.seed})")
    ax.tick_params(axis="x", labelsize=7)
    handles = [ax.containers[0]]
    sampled = _sampled_fraction(run)
    if sampled is not None and len(sampled) == len(probs):
        # own axis: the profile may be per-draw probabilities (summing to 1), not per-round rates
        twin = ax.twinx()
        handles += twin.plot(x, sampled, "k.", ms=8)
        twin.set(ylabel="fraction of rounds sampled", ylim=(0, None))
    ax.legend(handles, ["availability probability", "fraction of rounds sampled (clients.csv)"][:len(handles)],
              fontsize=8)
    return _save(fig, path)


def make_figures(out: str | Path, fig_dir: str | Path | None = None) -> list[Path]:
    out = Path(out)
    runs = load_runs(out)
    if not runs:
        raise FileNotFoundError(f"no finished run (run.json + summary.json) under {out}: run the sweep first")
    fig_dir = Path(fig_dir) if fig_dir else out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    settings_order, methods_order = sweep_order(out)
    written: list[Path] = []
    for setting in ordered((r.setting for r in runs), settings_order):
        rs = [r for r in runs if r.setting == setting]
        chosen = _chosen(rs, methods_order)
        stem = fig_dir / _safe(setting)
        written.append(convergence(chosen, setting, Path(f"{stem}_convergence.png")))
        written.append(client_histograms(chosen, setting, Path(f"{stem}_client_hist.png")))
        written.append(frontier(chosen, setting, Path(f"{stem}_frontier.png")))
        for extra in (history_sweep(rs, setting, Path(f"{stem}_history.png")),
                      label_distribution(min(rs, key=lambda r: r.seed), setting, Path(f"{stem}_labels.png"))):
            if extra is not None:
                written.append(extra)
        avail = [r for r in rs if (r.folder / AVAILABILITY).is_file()]
        if avail:
            written.append(availability(min(avail, key=lambda r: r.seed), setting, Path(f"{stem}_availability.png")))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="a sweep output folder")
    parser.add_argument("--out", dest="fig_dir", default="", help="figure folder (default: <out>/figures)")
    args = parser.parse_args(argv)
    try:
        paths = make_figures(args.out, args.fig_dir or None)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
