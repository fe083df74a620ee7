"""The papers' figures from finished runs (PNG, matplotlib Agg).

    python -m fedpcd_app.figures <folder> [--out DIR] [--baseline METHOD] [--methods A,B,...]

``<folder>`` is a single run folder, a sweep output folder or any folder holding runs
(found and labelled as in :mod:`fedpcd_app.analysis.report`). Per setting, each method at its best
grid point (chosen as in the report); legends name the method entry and its grid point,
``method [key=value]``, and say when a method's data is identical to another's (drawn
dashed or offset so that neither hides the other). ``--methods`` keeps (and orders) the
given method entries; ``--baseline`` names the reference of the paired views (default: the
FedAvg entry, else the first method).

* ``<setting>_convergence.png`` — mean client accuracy and worst-10 % against the round,
  mean over seeds with a ±1 std band (FedPCD Fig. 7); integer round ticks.
* ``<setting>_client_hist.png`` — histograms of the final per-client accuracies pooled
  over seeds, one panel per method (FedPCD Fig. 4, CRAFT Fig. 3).
* ``<setting>_frontier.png`` — ā against σ_c: the seed mean, with bars spanning the
  seeds' range on both axes (FedPCD's accuracy–spread frontier, Figs. 5, 15, 16). One
  marker shape per method; points that coincide are drawn around their common value (a
  note under the axes names them).
* ``<setting>_client_ecdf.png`` — the empirical CDF of the final per-client accuracies
  of every method on one axis (pooled over seeds), and their box plots side by side
  (median, quartiles, 1.5 IQR whiskers, mean as a diamond).
* ``<setting>_paired_scatter.png`` — one panel per method against the baseline: each
  client's final accuracy under the baseline (x) and under the method (y) on the same
  seed (same partition), pooled over seeds; the diagonal is "no change", marker area
  counts clients with the same pair, and the panel says how many clients are above /
  below it. Needs two methods.
* ``<setting>_acc_vs_size.png`` — final client accuracy against the client's number of
  training examples (``num_train`` of ``clients.csv``), one panel per method, coloured by
  seed, with Spearman's ρ.
* ``<setting>_heatmap.png`` — round × client accuracy (the evaluation records of
  ``rounds.jsonl`` hold every client's accuracy), one panel per method, for the lowest
  seed all methods ran; clients ordered by the baseline's final accuracy on that seed.
* ``<setting>_history.png`` — for method entries run at several ``fedpcd-history`` values: ā,
  W₁₀ and the mean number of active constraints (``fedpcd-active`` in the ``strategy``
  entries of ``rounds.jsonl``, averaged over rounds) against H, mean ± std over seeds
  (FedPCD Fig. 17); one line per method entry and values of its other grid keys.
* ``<setting>_labels.png`` — the label distribution of the partition (counts per client
  and class, from ``client_app.data.FederatedData.label_counts``), for the first seed;
  skipped with a note when the dataset cannot be loaded here.
* ``forest.png`` — every paired difference of the report's ``report_paired*.csv`` with its
  95 % interval, significant ones (Holm, ≥ 5 seeds) filled (:func:`forest`); the worst-10 %
  selection's (``report_paired_worst10*.csv``) in ``forest_worst10.png``.
* ``pareto.png`` — per method, every configuration's validation (mean, worst-10 %) from
  ``report.csv``, the Pareto front joined, the selection ringed (:func:`pareto`). Both are
  drawn from the CSVs alone: ``--page`` redraws them for a results page without its runs.
* ``frontier.png`` (``--page --frontier``) — every configuration of ``report.csv`` on one axis,
  mean against worst-10 % on the test split: a colour and marker per method entry, the
  configurations faint, the selections bold, the Pareto fronts joined, the legend outside
  (:func:`configurations_frontier`).
* ``<setting>_availability.png`` — when a run folder holds ``availability.json``
  (``{"probabilities": [...]}``, each client's per-round inclusion probability): that
  probability and, from ``clients.csv``, the fraction of rounds the client was actually
  sampled, on one axis (both are per-round rates).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedpcd_app.analysis.layout import safe as _safe  # noqa: E402
from fedpcd_app.analysis.report import Run, best_variant, load_runs, ordered, sweep_order  # noqa: E402

HISTORY_KEY = "fedpcd-history"
ACTIVE_KEY = "fedpcd-active"
AVAILABILITY = "availability.json"
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p")
LINESTYLES = ("-", "--", "-.", ":")
BAND_LIMIT = 4
SHARED = "0.45"  # colour of a paired-scatter point that several seeds share


def ROUND_TICKS():  # noqa: N802 - a locator factory: integer ticks at 1, 2, 5 or 10 × 10^k
    return MaxNLocator(integer=True, steps=[1, 2, 5, 10])


class FigureError(ValueError):
    """An option does not fit the runs found (one line)."""


def _chosen(runs: list[Run], methods_order: list[str], rules=None) -> dict[str, list[Run]]:
    """Each method entry at its selected grid point, by the sweep's declared rules (``rules``:
    :func:`fedpcd_app.analysis.report.rules_of`), as the report selects it."""
    out = {}
    for method in ordered((r.method for r in runs), methods_order):
        best, by_variant = best_variant([r for r in runs if r.method == method], rules)
        out[method] = sorted(by_variant[best], key=lambda r: r.seed)
    return out


def _name(rs: list[Run]) -> str:
    return rs[0].label


def _legend_name(rs: list[Run], same: dict[str, str], method: str) -> str:
    text = f"{_name(rs)} ({len(rs)} seed{'s' if len(rs) > 1 else ''})"
    return text + (f" = {same[method]}" if method in same else "")


def _same_as(data: dict[str, np.ndarray]) -> dict[str, str]:
    """method → the first earlier method whose data is identical (it would hide under it)."""
    out: dict[str, str] = {}
    keys = list(data)
    for i, key in enumerate(keys):
        for other in keys[:i]:
            a, b = np.asarray(data[key], dtype=float), np.asarray(data[other], dtype=float)
            if a.shape == b.shape and np.allclose(a, b, rtol=0.0, atol=1e-9, equal_nan=True):
                out[key] = out.get(other, other)
                break
    return out


def save_figure(fig, path: Path) -> Path:
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend_below(fig, ax, handles=None, labels=None, ncol: int | None = None) -> None:
    """The legend under the axes (outside them: it covers no data)."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    ncol = ncol or min(3, len(handles))
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8,
               frameon=False)


def _panels(n: int, cols: int = 3, size=(4.0, 3.3), **kw):
    cols = max(1, min(n, cols))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False, **kw)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)[:n]


def _client_acc(run: Run) -> np.ndarray:
    """Final per-client accuracy in % (NaN for a client that was not scored)."""
    return 100 * np.array([np.nan if a is None else a for a in run.summary["client_acc"]], dtype=float)


def _pick_baseline(chosen: dict[str, list[Run]], baseline: str | None) -> str:
    if baseline:
        if baseline in chosen:
            return baseline
        by_method = [m for m, rs in chosen.items() if all(r.summary.get("method") == baseline for r in rs)]
        if len(by_method) == 1:
            return by_method[0]
        raise FigureError(f"--baseline {baseline!r} is not a method of the runs found (methods: {', '.join(chosen)})")
    fedavg = [m for m, rs in chosen.items() if all(r.summary.get("method") == "fedavg" for r in rs)]
    return fedavg[0] if fedavg else next(iter(chosen))


# -- convergence, histograms, frontier ----------------------------------------------------
def convergence(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    curves_by_key = {}
    for key in ("mean_acc", "worst10_acc"):
        out = {}
        for method, rs in chosen.items():
            curves = [r.eval_curve(key) for r in rs]
            rounds = sorted(set.intersection(*(set(c[0].tolist()) for c in curves)))
            if rounds:
                vals = np.array([[dict(zip(c[0].tolist(), c[1]))[t] for t in rounds] for c in curves]) * 100
                out[method] = (np.array(rounds), vals)
        curves_by_key[key] = out
    same = _same_as({m: np.concatenate([v[0], v[1].ravel()]) for m, v in curves_by_key["mean_acc"].items()})
    bands = len(chosen) <= BAND_LIMIT  # more bands than that only hide each other
    for key, ax, title in (("mean_acc", axes[0], "mean client accuracy ā"),
                           ("worst10_acc", axes[1], "worst-10% client accuracy W₁₀")):
        for i, (method, (rounds, vals)) in enumerate(curves_by_key[key].items()):
            rs = chosen[method]
            mean, std = vals.mean(0), vals.std(0, ddof=1) if len(vals) > 1 else np.zeros(len(rounds))
            dup = method in same
            line, = ax.plot(rounds, mean, marker=MARKERS[i % len(MARKERS)], ms=7 if dup else 4, lw=1.4,
                            ls=(0, (4, 3)) if dup else "-", mfc="none" if dup else None,
                            label=_legend_name(rs, same, method), zorder=3 + (1 if dup else 0))
            if bands and len(vals) > 1:
                ax.fill_between(rounds, np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100),
                                color=line.get_color(), alpha=0.12)
        ax.set(xlabel="round", ylabel="%", title=title)
        ax.xaxis.set_major_locator(ROUND_TICKS())
        ax.grid(alpha=0.3)
    _legend_below(fig, axes[0], ncol=3)
    fig.suptitle(f"{setting}: convergence (mean over seeds" + (" ± 1 std)" if bands else
                 f"; ±1 std bands drawn for up to {BAND_LIMIT} methods, --methods picks them)"))
    fig.tight_layout()
    return save_figure(fig, path)


def client_histograms(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    fig, axes = _panels(len(chosen), size=(4.2, 3.0))
    pooled = {}
    for method, rs in chosen.items():
        acc = np.concatenate([_client_acc(r) for r in rs])
        pooled[method] = acc[~np.isnan(acc)]
    lo = min(float(np.floor(a.min() / 5) * 5) for a in pooled.values() if a.size) if any(
        a.size for a in pooled.values()) else 0.0
    bins = np.arange(lo, 100.001, 2.5 if lo >= 50 else 5.0)
    top = 1.12 * max((np.histogram(a, bins=bins)[0].max() for a in pooled.values() if a.size), default=1)
    for ax, (method, rs) in zip(axes, chosen.items()):
        acc = pooled[method]
        ax.hist(acc, bins=bins, color="tab:blue", alpha=0.8, edgecolor="white")
        ax.axvline(acc.mean(), color="k", ls="--", lw=1, label=f"mean {acc.mean():.1f}%")
        ax.set(title=f"{_name(rs)}\n({len(rs)} seeds × {acc.size // len(rs)} clients)", xlabel="client accuracy (%)",
               ylabel="clients")
        ax.title.set_fontsize(9)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(lo, 100.5)
        ax.set_ylim(0, top)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{setting}: final per-client accuracy, pooled over seeds")
    fig.tight_layout()
    return save_figure(fig, path)


def _spread_coincident(points: dict[str, tuple[float, float]], span: tuple[float, float]):
    """Offsets (dx, dy) that put coinciding points on a small circle around their common
    value, and the groups that coincide (each a list of methods)."""
    tol = (0.004 * span[0], 0.004 * span[1])
    groups: list[list[str]] = []
    for method, (x, y) in points.items():
        for g in groups:
            gx, gy = points[g[0]]
            if abs(gx - x) <= tol[0] and abs(gy - y) <= tol[1]:
                g.append(method)
                break
        else:
            groups.append([method])
    offsets = {m: (0.0, 0.0) for m in points}
    radius = (0.025 * span[0], 0.025 * span[1])
    for g in groups:
        if len(g) > 1:
            for k, m in enumerate(g):
                angle = np.pi * (0.75 + 2 * k / len(g))
                offsets[m] = (radius[0] * np.cos(angle), radius[1] * np.sin(angle))
    return offsets, [g for g in groups if len(g) > 1]


def distinct_colours(n: int) -> list:
    """``n`` colours no two of which repeat: matplotlib's ten-colour cycle up to 10, tab20 up to 20
    (a frontier of 14 methods drew two blues, two oranges, ... with the cycle), then hsv."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    if n <= 20:  # tab20's ten dark shades first, then the light ones: the first ten keep the cycle's hues
        cmap = plt.get_cmap("tab20")
        return [cmap(2 * i if i < 10 else 2 * (i - 10) + 1) for i in range(n)]
    cmap = plt.get_cmap("hsv")
    return [cmap(i / n) for i in range(n)]


def frontier(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 5))
    data = {}
    for method, rs in chosen.items():
        x = 100 * np.array([r.summary["std_acc"] for r in rs], dtype=float)
        y = 100 * np.array([r.summary["mean_acc"] for r in rs], dtype=float)
        data[method] = (x, y)
    xs = np.concatenate([np.r_[x.min(), x.max()] for x, _ in data.values()])
    ys = np.concatenate([np.r_[y.min(), y.max()] for _, y in data.values()])
    span = (max(np.ptp(xs), 0.5), max(np.ptp(ys), 0.5))
    offsets, groups = _spread_coincident({m: (x.mean(), y.mean()) for m, (x, y) in data.items()}, span)
    colours = distinct_colours(len(data))
    for i, (method, (x, y)) in enumerate(data.items()):
        dx, dy = offsets[method]
        mx, my = x.mean(), y.mean()
        ax.errorbar(mx + dx, my + dy, xerr=[[mx - x.min()], [x.max() - mx]], yerr=[[my - y.min()], [y.max() - my]],
                    fmt=MARKERS[i % len(MARKERS)], ms=8, capsize=4, elinewidth=1, mec="k", mew=0.6, color=colours[i],
                    label=_name(chosen[method]) + (f" ({len(x)} seeds)" if len(x) > 1 else " (1 seed)"), zorder=3)
        if dx or dy:
            ax.plot([mx, mx + dx], [my, my + dy], color="0.4", lw=0.8, zorder=2)
    if groups:
        note = "; ".join(" = ".join(_name(chosen[m]) for m in g) for g in groups)
        ax.text(0.0, -0.16, f"identical seed means, drawn around their common value (thin lines): {note}",
                transform=ax.transAxes, fontsize=7.5, va="top", wrap=True)
    ax.set(xlabel="client spread σ_c (%)  ← fairer", ylabel="mean client accuracy ā (%)",
           title=f"{setting}: accuracy vs spread\n(seed mean; bars span the seeds' range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)


# -- per-client views ----------------------------------------------------------------------
def client_ecdf(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path:
    pooled = {}
    for method, rs in chosen.items():
        acc = np.concatenate([_client_acc(r) for r in rs])
        pooled[method] = np.sort(acc[~np.isnan(acc)])
    same = _same_as(pooled)
    fig, (ax, box) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    for i, (method, acc) in enumerate(pooled.items()):
        y = np.arange(1, acc.size + 1) / acc.size
        dup = method in same
        ax.step(np.r_[acc[0], acc], np.r_[0.0, y], where="post", lw=1.6,
                ls=(0, (4, 3)) if dup else LINESTYLES[(i // 10) % len(LINESTYLES)],
                label=_legend_name(chosen[method], same, method), zorder=3 + (1 if dup else 0))
    ax.set(xlabel="final client accuracy (%)", ylabel="fraction of clients ≤ x",
           title="empirical CDF (pooled over seeds; further right = better)", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    names = [_name(chosen[m]) for m in pooled]
    parts = box.boxplot(list(pooled.values()), orientation="horizontal", showmeans=True, patch_artist=True,
                        meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "k", "ms": 5},
                        medianprops={"color": "k"}, flierprops={"marker": ".", "ms": 4, "alpha": 0.6})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, patch in enumerate(parts["boxes"]):
        patch.set_facecolor(colors[k % len(colors)])
        patch.set_alpha(0.55)
    box.set_yticks(np.arange(1, len(names) + 1), names, fontsize=8)
    box.invert_yaxis()
    box.set(xlabel="final client accuracy (%)", title="box plots (median, quartiles; ◇ = mean)")
    box.grid(alpha=0.3, axis="x")
    _legend_below(fig, ax, ncol=3)
    fig.suptitle(f"{setting}: per-client accuracy of every method")
    fig.tight_layout()
    return save_figure(fig, path)


def paired_scatter(chosen: dict[str, list[Run]], baseline: str, setting: str, path: Path) -> Path | None:
    others = [m for m in chosen if m != baseline]
    if not others:
        return None
    base = {r.seed: _client_acc(r) for r in chosen[baseline]}
    fig, axes = _panels(len(others), size=(3.9, 3.9))
    lo = 100.0
    seeds_seen = set()
    shared = False
    for ax, method in zip(axes, others):
        pairs = []
        for r in chosen[method]:
            if r.seed in base and len(base[r.seed]) == len(r.summary["client_acc"]):
                a, b = base[r.seed], _client_acc(r)
                ok = ~(np.isnan(a) | np.isnan(b))
                pairs += [(r.seed, x, y) for x, y in zip(a[ok], b[ok])]
                seeds_seen.add(r.seed)
        if not pairs:
            ax.text(0.5, 0.5, "no paired seed", ha="center", transform=ax.transAxes)
            continue
        # one marker per distinct (x, y), area ∝ clients there: the seed's colour when all
        # of them come from one seed, grey when several seeds share the point
        counts = Counter((round(x, 6), round(y, 6)) for _, x, y in pairs)
        owners: dict[tuple, set] = defaultdict(set)
        for s, x, y in pairs:
            owners[(round(x, 6), round(y, 6))].add(s)
        colour = {s: plt.get_cmap("tab10")(k % 10) for k, s in enumerate(sorted(base))}
        pts = sorted(counts.items(), key=lambda kv: -kv[1])  # big markers first, small ones on top
        shared |= any(len(owners[xy]) > 1 for xy, _ in pts)
        ax.scatter([xy[0] for xy, _ in pts], [xy[1] for xy, _ in pts], s=[12 * c for _, c in pts],
                   color=[colour[next(iter(owners[xy]))] if len(owners[xy]) == 1 else SHARED for xy, _ in pts],
                   alpha=0.6, edgecolor="k", linewidth=0.3, zorder=2)
        xs = np.array([p[1] for p in pairs])
        ys = np.array([p[2] for p in pairs])
        lo = min(lo, xs.min(), ys.min())
        above, below = int((ys > xs).sum()), int((ys < xs).sum())
        ax.set_title(f"{_name(chosen[method])}\nclient-seeds better: {above}, worse: {below}, same: "
                     f"{len(xs) - above - below} (of {len(xs)})", fontsize=8.5)
        ax.set(xlabel=f"{_name(chosen[baseline])}: client accuracy (%)", ylabel="client accuracy (%)")
        ax.xaxis.label.set_fontsize(8)
    lo = max(0.0, np.floor(lo / 5) * 5 - 2)
    for ax in axes:
        ax.plot([lo, 104], [lo, 104], color="0.3", lw=0.9, ls="--", zorder=0)
        ax.set(xlim=(lo, 104), ylim=(lo, 104), aspect="equal")  # room for the markers at 100 %
        ax.grid(alpha=0.3)
    # proxies: the scatter artists themselves carry per-point sizes
    shown = [(k, s) for k, s in enumerate(sorted(base)) if s in seeds_seen]
    handles = [Line2D([], [], ls="", marker="o", ms=6, alpha=0.6, mec="k", mew=0.3,
                      color=plt.get_cmap("tab10")(k % 10)) for k, _ in shown]
    labels = [f"seed {s}" for _, s in shown]
    if shared:
        handles.append(Line2D([], [], ls="", marker="o", ms=6, alpha=0.6, mec="k", mew=0.3, color=SHARED))
        labels.append("several seeds")
    _legend_below(fig, axes[0], handles, labels, ncol=max(1, len(handles)))
    fig.suptitle(f"{setting}: each client under {_name(chosen[baseline])} (x) and under each method (y), same seed\n"
                 "above the dashed diagonal = the method is better for that client; marker area ∝ clients")
    fig.tight_layout()
    return save_figure(fig, path)


def _clients_rows(run: Run) -> list[dict[str, str]] | None:
    """The rows of the run's clients.csv (None when it has none)."""
    path = run.folder / "clients.csv"
    if not path.is_file():
        return None
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _client_sizes(run: Run) -> np.ndarray | None:
    rows = _clients_rows(run)
    if rows is None:
        return None
    try:
        sizes = np.array([float(r["num_train"]) for r in rows])
    except (KeyError, ValueError):  # num_train is empty when the server did not load the data
        return None
    return sizes if len(sizes) == len(run.summary["client_acc"]) else None


def acc_vs_size(chosen: dict[str, list[Run]], setting: str, path: Path) -> Path | None:
    from scipy import stats

    data = {}
    for method, rs in chosen.items():
        pts = [(r.seed, n, a) for r in rs if (sizes := _client_sizes(r)) is not None
               for n, a in zip(sizes, _client_acc(r)) if not np.isnan(a)]
        if pts:
            data[method] = pts
    if not data:
        return None
    fig, axes = _panels(len(data), size=(4.0, 3.2), sharex=True, sharey=True)
    seeds = sorted({s for pts in data.values() for s, _, _ in pts})
    for ax, (method, pts) in zip(axes, data.items()):
        for k, s in enumerate(seeds):
            sel = [(n, a) for ss, n, a in pts if ss == s]
            if sel:
                ax.scatter(*zip(*sel), s=14, alpha=0.7, color=plt.get_cmap("tab10")(k % 10), label=f"seed {s}")
        n, a = np.array([p[1] for p in pts]), np.array([p[2] for p in pts])
        rho = stats.spearmanr(n, a).statistic if np.ptp(n) > 0 and np.ptp(a) > 0 else float("nan")
        ax.set_title(f"{_name(chosen[method])}\nSpearman ρ = {rho:.2f}" if rho == rho else _name(chosen[method]),
                     fontsize=8.5)
        ax.set(xlabel="client's training examples", ylabel="final client accuracy (%)")
        ax.tick_params(labelbottom=True, labelleft=True)  # shared axes: every panel keeps its labels
        ax.grid(alpha=0.3)
    _legend_below(fig, axes[0], ncol=max(1, len(seeds)))
    fig.suptitle(f"{setting}: client accuracy vs client data size (clients.csv)")
    fig.tight_layout()
    return save_figure(fig, path)


def _eval_matrix(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """(eval rounds, clients × rounds accuracy in %) from ``rounds.jsonl``."""
    recs = [r for r in run.rounds() if "eval" in r and r["eval"].get("client_acc")]
    if not recs:
        return None
    mat = np.array([[np.nan if a is None else 100 * a for a in r["eval"]["client_acc"]] for r in recs], dtype=float)
    return np.array([r["round"] for r in recs]), mat.T


def heatmap(chosen: dict[str, list[Run]], baseline: str, setting: str, path: Path) -> Path | None:
    common = set.intersection(*({r.seed for r in rs} for rs in chosen.values()))
    if not common:
        return None
    seed = min(common)
    mats = {}
    for method, rs in chosen.items():
        m = _eval_matrix(next(r for r in rs if r.seed == seed))
        if m is not None:
            mats[method] = m
    if not mats:
        return None
    ref = mats.get(baseline, next(iter(mats.values())))[1]
    order = np.argsort(np.nan_to_num(ref[:, -1], nan=-1.0), kind="stable")  # hardest client first (top)
    cols = min(3, len(mats))
    rows = -(-len(mats) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.6 * rows + 0.6), squeeze=False, layout="constrained")
    axes = list(grid.flat)
    for ax in axes[len(mats):]:
        ax.set_visible(False)
    image = None
    for ax, (method, (rounds, mat)) in zip(axes, mats.items()):
        if mat.shape[0] != len(order):
            continue
        image = ax.imshow(mat[order], aspect="auto", cmap="viridis", vmin=0, vmax=100, interpolation="nearest")
        step = max(1, int(np.ceil(len(rounds) / 8)))
        ticks = list(range(len(rounds) - 1, -1, -step))[::-1]  # anchored at the last round
        ax.set_xticks(ticks, [str(int(rounds[t])) for t in ticks], fontsize=7)
        if len(order) <= 40:  # the partition id of every row
            ax.set_yticks(np.arange(len(order)), [str(int(p)) for p in order], fontsize=5.5)
        else:
            ax.set_yticks([])
        ax.set(title=_name(chosen[method]), xlabel="round", ylabel="client (partition id)")
        ax.title.set_fontsize(9)
        ax.yaxis.label.set_fontsize(8)
    if image is not None:
        fig.colorbar(image, ax=axes[:len(mats)], shrink=0.8, label="client accuracy (%)")
    fig.suptitle(f"{setting}: every client's accuracy at each evaluation round (seed {seed})\n"
                 f"rows ordered by {_name(chosen[baseline])}'s final accuracy, lowest at the top", fontsize=10)
    return save_figure(fig, path)


# -- history, labels, availability -----------------------------------------------------------
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
        lines[r.method + (f" [{others}]" if others else "")][int(r.summary["config"][HISTORY_KEY])].append(r)
    lines = {name: by_h for name, by_h in lines.items() if len(by_h) > 1}  # a sweep over H, not one fixed H
    if not lines:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = ((lambda r: 100 * r.summary["mean_acc"], "ā (%)"), (lambda r: 100 * r.summary["worst10_acc"], "W₁₀ (%)"),
              (mean_active, "active constraints (mean over rounds)"))
    for ax, (value, label) in zip(axes, panels):
        for i, (name, by_h) in enumerate(lines.items()):
            hs = sorted(by_h)
            vals = [[value(r) for r in by_h[h]] for h in hs]
            mean = np.array([np.mean(v) for v in vals])
            std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in vals])
            ax.errorbar(hs, mean, yerr=std, marker=MARKERS[i % len(MARKERS)], capsize=3, label=name)
        ax.set(xlabel="history window H (rounds)", ylabel=label)
        ax.xaxis.set_major_locator(ROUND_TICKS())
        ax.grid(alpha=0.3)
    _legend_below(fig, axes[0])
    fig.suptitle(f"{setting}: history-window sweep (mean ± std over seeds)")
    fig.tight_layout()
    return save_figure(fig, path)


def label_distribution(run: Run, setting: str, path: Path) -> Path | None:
    from client_app.data import load_federated_data
    from fedcore.config import APP, parse_run_config

    if APP["client-data"].read(run.summary["config"]) == "node":  # the labels stayed on the devices
        print(f"note: no label distribution for {setting}: the nodes brought their own data (client-data='node')")
        return None
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
    fig.tight_layout()
    return save_figure(fig, path)


def _sampled_fraction(run: Run) -> np.ndarray | None:
    rows = _clients_rows(run)
    if rows is None:
        return None
    return np.array([float(r["times_sampled"]) for r in rows]) / run.summary["rounds"]


def availability(run: Run, setting: str, path: Path) -> Path:
    probs = np.asarray(json.loads((run.folder / AVAILABILITY).read_text())["probabilities"], dtype=float)
    x = np.arange(len(probs))
    fig, ax = plt.subplots(figsize=(max(6, 0.38 * len(probs)), 4))
    ax.bar(x, probs, color="tab:orange", alpha=0.75, label="availability: per-round inclusion probability")
    top = probs.max(initial=0.0)
    sampled = _sampled_fraction(run)
    if sampled is not None and len(sampled) == len(probs):
        # one axis: both are per-round rates, the second the realised one
        ax.plot(x, sampled, "k.", ms=9, label=f"fraction of the {run.summary['rounds']} rounds sampled (clients.csv)")
        top = max(top, sampled.max(initial=0.0))
    ax.set(xlabel="client (partition id)", ylabel="per-round rate", xticks=x, ylim=(0, max(top * 1.12, 1e-3)),
           title=f"{setting}: availability profile and realised sampling, seed {run.seed}\n"
                 f"(the draws depend on the seed only: the same for every method; from {run.label})")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    _legend_below(fig, ax, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)


# -- all of them ---------------------------------------------------------------------------------
# -- from a page's CSVs (redrawn without the runs) ---------------------------------------------------
def _float(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def forest(rows: list[dict[str, str]], path: Path, metrics=("mean_acc", "worst10_acc")) -> Path | None:
    """The page's paired differences (rows of its ``report_paired*.csv``) with their 95 %
    intervals, one panel per metric, one line per comparison ``method − baseline [setting]``:
    a filled marker when the comparison is significant after Holm (over ≥ 5 paired seeds; the
    page-wide ``p_holm_page`` when the CSV has it), hollow otherwise, p_holm written beside it;
    None when there is nothing to draw."""
    from fedpcd_app.analysis import stats

    panels = [m for m in metrics if any(r.get("metric") == m for r in rows)]
    if not panels:
        return None
    height = max(len([r for r in rows if r.get("metric") == m]) for m in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 1.2 + 0.32 * height), squeeze=False)
    for ax, metric in zip(axes[0], panels):
        group = [r for r in rows if r.get("metric") == metric]
        for y, r in enumerate(reversed(group)):
            mean, lo, hi = (100 * _float(r.get(k)) for k in ("mean_difference", "ci95_low", "ci95_high"))
            p = _float(r.get("p_holm_family", r.get("p_holm_page", r.get("p_holm"))))
            n = int(_float(r.get("num_seeds")) or 0)
            sig = n >= stats.MIN_SEEDS and p < stats.ALPHA
            if not np.isnan(lo):
                ax.plot([lo, hi], [y, y], color="0.35", lw=1.2)
            ax.plot([mean], [y], "o", color="C3" if sig else "0.35", mfc="C3" if sig else "white", ms=6)
            note = "—" if np.isnan(p) else f"p_holm {p:.3g}" + (" *" if sig else "")
            ax.annotate(note if n >= stats.MIN_SEEDS else f"exploratory, {n} seeds", (1.0, y),
                        xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7)
        labels = [("▶ " if r.get("comparison_family") == "primary" else "")
                  + f"{r.get('method')} − {r.get('baseline')}" + (f" [{r['setting']}]" if r.get("setting") else "")
                  for r in reversed(group)]
        ax.set_yticks(range(len(group)), labels, fontsize=7)
        ax.axvline(0.0, color="0.6", lw=0.8, ls="--")
        title = {"mean_acc": "ā", "worst10_acc": "W₁₀", "std_acc": "σ_c"}.get(metric, metric)
        ax.set_xlabel(f"paired difference in {title} (pp), 95 % CI")
        ax.set_title(f"{title}: filled = significant after Holm over its declared family (≥ {stats.MIN_SEEDS} "
                     "seeds); ▶ = a declared primary comparison", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (higher or equal in both, higher in one)."""
    out = []
    for i, (a, b) in enumerate(points):
        if not any((c >= a and d >= b) and (c > a or d > b) for j, (c, d) in enumerate(points) if j != i):
            out.append(i)
    return out


def pareto(rows: list[dict[str, str]], path: Path, setting: str | None = None) -> Path | None:
    """Per method entry, every configuration of ``report.csv`` (``rows``) of one ``setting`` (issue
    52: never several settings pooled into one front) as (mean, worst-10 %) on the validation split
    (``val_*`` columns: the numbers selection reads; None for a CSV without them, never the test
    split), the Pareto front marked and joined, the selection ringed; one panel per method, so that
    no colour is shared and no legend covers the data."""
    settings = list(dict.fromkeys(r.get("setting", "") for r in rows))
    if setting is None and len(settings) > 1:
        raise ValueError(f"pareto: {len(settings)} settings in the rows ({', '.join(settings)}): draw one at a time")
    rows = [r for r in rows if setting is None or r.get("setting") == setting]
    val = any(r.get("val_mean_acc_mean") for r in rows)
    if not val:
        return None
    kx, ky = "val_mean_acc_mean", "val_worst10_acc_mean"
    methods = list(dict.fromkeys(r["method"] for r in rows if r.get(kx) and r.get(ky)))
    if not methods:
        return None
    fig, axes = _panels(len(methods), cols=4, size=(3.6, 3.4))
    for ax, method in zip(axes, methods):
        pts = [(100 * _float(r[kx]), 100 * _float(r[ky]), r.get("selected") == "1")
               for r in rows if r["method"] == method and r.get(kx) and r.get(ky)]
        xy = [(x, y) for x, y, _ in pts]
        front = sorted((xy[i] for i in pareto_front(xy)), key=lambda p: p[0])
        ax.scatter([x for x, _ in xy], [y for _, y in xy], s=14, color="0.55", label="configuration")
        ax.plot([x for x, _ in front], [y for _, y in front], "-o", color="C0", ms=4, lw=1, label="Pareto front")
        sel = [(x, y) for x, y, chosen in pts if chosen]
        ax.scatter([x for x, _ in sel], [y for _, y in sel], s=90, facecolors="none", edgecolors="C3", lw=1.5,
                   label="selected")
        ax.set_title(method, fontsize=9)
        ax.set_xlabel("mean ā (%)", fontsize=8)
        ax.set_ylabel("worst-10 % (%)", fontsize=8)
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    fig.suptitle((f"{setting or settings[0]}: " if (setting or settings[0]) else "")
                 + "every configuration on the validation split (what selection reads): mean over seeds",
                 fontsize=10)
    fig.tight_layout()
    handles, labels = axes[0].get_legend_handles_labels()
    _legend_below(fig, axes[0], handles, labels, ncol=3)
    return save_figure(fig, path)


FRONT_ALL = dict(ls=":", color="0.3", lw=1.3, marker="o", ms=12, mfc="none", mec="0.3")
FRONT_SELECTED = dict(ls="-", color="k", lw=1.5, marker="o", ms=16, mfc="none", mec="k")


def configurations_frontier(rows: list[dict[str, str]], path: Path, split: str = "validation") -> Path | None:
    """``frontier.png`` of a page: mean client accuracy against worst-10 % for every
    configuration of ``report.csv`` (``rows``), each method entry in its own colour and marker
    (:func:`distinct_colours`, :data:`MARKERS`), its configurations drawn faint and its selected
    one (``selected`` = 1) bold with ±1 std bars over the seeds (the ``*_std`` columns); the
    Pareto front of every configuration (dotted) and of the selected ones (solid) joined; the
    legend outside the axes. Per setting two panels: every configuration, and the same zoomed
    on the selections; a personal model (``scored_iterate = personal``, Ditto) is drawn but in no front
    (issue 52: never ranked beside global models). ``split``: ``validation`` (default, the ``val_*``
    columns: issue 52, the numbers selection reads, so that no front is chosen on the test split beside
    validation selections) or ``test`` (the reported ``mean_acc_mean`` / ``worst10_acc_mean``). Rows without
    both numbers (an unscored configuration) are counted in the title. None when no row has them."""
    kx, ky = ("val_mean_acc", "val_worst10_acc") if split == "validation" else ("mean_acc", "worst10_acc")

    def xy(r):
        x, y = 100 * _float(r.get(f"{kx}_mean")), 100 * _float(r.get(f"{ky}_mean"))
        return None if np.isnan(x) or np.isnan(y) else (x, y)

    settings = list(dict.fromkeys(r.get("setting", "") for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows if xy(r) is not None))
    if not methods:
        return None
    colours = distinct_colours(len(methods))
    style = {m: (colours[i], MARKERS[i % len(MARKERS)]) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(len(settings), 2, figsize=(13, 5.2 * len(settings)), squeeze=False)
    handles: dict[str, Line2D] = {}
    for (ax_all, ax_zoom), setting in zip(axes, settings):
        here = [r for r in rows if r.get("setting", "") == setting]
        points = [(r, xy(r)) for r in here if xy(r) is not None]
        selected = [(r, p) for r, p in points if r.get("selected") == "1"]
        for ax in (ax_all, ax_zoom):
            for method in methods:
                colour, marker = style[method]
                mine = [p for r, p in points if r["method"] == method]
                if mine:
                    ax.scatter([x for x, _ in mine], [y for _, y in mine], s=24, marker=marker, color=colour,
                               alpha=0.35, lw=0, zorder=2)
            for r, (x, y) in selected:
                colour, marker = style[r["method"]]
                sx, sy = (100 * _float(r.get(f"{k}_std")) for k in (kx, ky))
                ax.errorbar(x, y, xerr=None if np.isnan(sx) else sx, yerr=None if np.isnan(sy) else sy, fmt=marker,
                            ms=9, color=colour, mec="k", mew=0.8, elinewidth=0.9, ecolor=colour, alpha=0.95,
                            capsize=2.5, zorder=4)
            shared = [(r, p) for r, p in points if r.get("scored_iterate") != "personal"]  # issue 52: a personal
            chosen = [(r, p) for r, p in selected if r.get("scored_iterate") != "personal"]  # model is no front's
            for pts, spec in (([p for _, p in shared], FRONT_ALL), ([p for _, p in chosen], FRONT_SELECTED)):
                if pts:
                    front = sorted((pts[i] for i in pareto_front(pts)), key=lambda p: p[0])
                    ax.plot([x for x, _ in front], [y for _, y in front], zorder=5, **spec)
            ax.grid(alpha=0.3)
            ax.set_xlabel(f"mean client accuracy ā (%), {split} split")
            ax.set_ylabel(f"worst-10 % client accuracy (%), {split} split")
        missing = len(here) - len(points)
        ax_all.set_title((f"{setting}: " if setting else "") + f"every configuration ({len(points)}"
                         + (f"; {missing} unscored, not drawn" if missing else "") + ")", fontsize=10)
        if selected:
            sx = [p[0] for _, p in selected]
            sy = [p[1] for _, p in selected]
            pad_x, pad_y = max(0.5, 0.25 * np.ptp(sx)), max(1.0, 0.25 * np.ptp(sy))
            ax_zoom.set_xlim(min(sx) - pad_x, max(sx) + pad_x)
            ax_zoom.set_ylim(min(sy) - pad_y, max(sy) + pad_y)
        ax_zoom.set_title(f"zoomed on the {len(selected)} selections (bars: ±1 std over the seeds)", fontsize=10)
    for r in rows:
        if r["method"] in style and r.get("selected") == "1" and xy(r) is not None:
            colour, marker = style[r["method"]]
            hyper = r.get("hyperparameters", "")
            handles.setdefault(r["method"], Line2D([], [], ls="", marker=marker, ms=8, color=colour, mec="k", mew=0.8,
                                                   label=r["method"] + (f" [{hyper}]" if hyper and hyper != "base"
                                                                        else "")))
    for method in methods:
        colour, marker = style[method]
        handles.setdefault(method, Line2D([], [], ls="", marker=marker, ms=8, color=colour, alpha=0.4,
                                          label=f"{method} (no selection)"))
    personal = sorted({r["method"] for r in rows if r.get("scored_iterate") == "personal"})
    note = f" (global models; {', '.join(personal)}: personal models, in no front)" if personal else ""
    handles["front all"] = Line2D([], [], label="Pareto front, every configuration (ringed)" + note, **FRONT_ALL)
    handles["front sel"] = Line2D([], [], label="Pareto front, the selections (ringed)", **FRONT_SELECTED)
    axes[0][1].legend(handles=list(handles.values()), fontsize=7.5, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      frameon=False)
    fig.suptitle("mean over seeds per configuration: faint = every configuration tried, bold = the selected one of "
                 "each method entry; up and right is better", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def _paired_selection(path: Path, row: dict[str, str]) -> tuple[str, str]:
    from fedpcd_app.analysis.report import _paired_iterate, _paired_objective

    return _paired_objective(path, row), _paired_iterate(path, row)


def page_figures(folder: str | Path, dest: str | Path | None = None, frontier: bool = False) -> list[Path]:
    """A results page's figures from its CSVs alone (into ``dest``, default the folder), per setting
    (issue 52: a page of several settings gets one file per setting, ``<name>_<setting>.png``):

    * ``forest.png`` — the paired differences of every ``report_paired*.csv`` of the declared selection
      (validation mean, the page's iterate), the declared primary comparisons marked; the worst-10 %
      selection's in ``forest_worst10.png`` and another iterate's in ``forest_<iterate>.png``, so that one
      comparison label never stands for two selections;
    * ``pareto.png`` — every configuration of ``report.csv`` on the validation split, per method;
    * with ``frontier``, ``frontier.png`` (:func:`configurations_frontier`, validation split)."""
    folder = Path(folder)
    dest = Path(dest) if dest else folder
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    plain: set[str] = set()  # the iterates of the files named without one: the declared iterate's
    for p in sorted(folder.glob("report_paired*.csv")):
        named = any(f"_{it}" in p.stem.split("_vs_")[0] for it in ("last", "averaged"))
        with open(p, newline="") as fh:
            for r in csv.DictReader(fh):
                key = _paired_selection(p, r)
                groups.setdefault(key, []).append(r)
                if not named and key[1]:
                    plain.add(key[1])
    iterates = [it for _, it in groups]
    main_iterate = (next(iter(plain)) if len(plain) == 1 else
                    "last" if "last" in iterates else (iterates[0] if iterates else ""))
    written = []

    def per_setting(rows, stem, draw):
        settings = list(dict.fromkeys(r.get("setting", "") for r in rows))
        for setting in settings:
            name = f"{stem}.png" if len(settings) == 1 else f"{stem}_{_safe(setting)}.png"
            if (f := draw([r for r in rows if r.get("setting", "") == setting], dest / name)) is not None:
                written.append(f)

    for (objective, iterate), rows in groups.items():
        stem = "forest" + ("_worst10" if objective == "worst10" else "") + (
            f"_{iterate}" if iterate and iterate != main_iterate else "")
        per_setting(rows, stem, forest)
    if (folder / "report.csv").is_file():
        with open(folder / "report.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        per_setting(rows, "pareto", pareto)
        if frontier:
            per_setting(rows, "frontier", configurations_frontier)
    return written


def make_figures(out: str | Path, fig_dir: str | Path | None = None, baseline: str | None = None,
                 methods: list[str] | None = None) -> list[Path]:
    from fedpcd_app.analysis.report import declared_iterate, rules_of

    out = Path(out)
    runs = load_runs(out, declared_iterate(out))  # the page's iterate (issue 52), selected by the sweep's rules
    rules = rules_of(out)
    if not runs:
        raise FileNotFoundError(f"no finished run (a folder with summary.json) at or below {out}")
    if methods:
        unknown = [m for m in methods if m not in {r.method for r in runs}]
        if unknown:
            raise FigureError(f"--methods: {unknown[0]!r} is not a method of the runs found "
                              f"(methods: {', '.join(dict.fromkeys(r.method for r in runs))})")
        runs = [r for r in runs if r.method in methods]
    fig_dir = Path(fig_dir) if fig_dir else out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    settings_order, methods_order = sweep_order(out)
    methods_order = list(methods) if methods else methods_order
    written: list[Path] = []
    for setting in ordered((r.setting for r in runs), settings_order):
        rs = [r for r in runs if r.setting == setting]
        chosen = _chosen(rs, methods_order, rules)
        try:
            base = _pick_baseline(chosen, baseline)
        except FigureError:
            if len({r.setting for r in runs}) == 1:
                raise
            print(f"note: no --baseline {baseline!r} in setting {setting}: its paired views use the first method")
            base = _pick_baseline(chosen, None)
        stem = fig_dir / _safe(setting)
        written.append(convergence(chosen, setting, Path(f"{stem}_convergence.png")))
        written.append(client_histograms(chosen, setting, Path(f"{stem}_client_hist.png")))
        written.append(frontier(chosen, setting, Path(f"{stem}_frontier.png")))
        written.append(client_ecdf(chosen, setting, Path(f"{stem}_client_ecdf.png")))
        for extra in (paired_scatter(chosen, base, setting, Path(f"{stem}_paired_scatter.png")),
                      acc_vs_size(chosen, setting, Path(f"{stem}_acc_vs_size.png")),
                      heatmap(chosen, base, setting, Path(f"{stem}_heatmap.png")),
                      history_sweep(rs, setting, Path(f"{stem}_history.png")),
                      label_distribution(min(rs, key=lambda r: r.seed), setting, Path(f"{stem}_labels.png"))):
            if extra is not None:
                written.append(extra)
        rank = {m: i for i, m in enumerate(chosen)}
        avail = [r for r in rs if (r.folder / AVAILABILITY).is_file()]
        if avail:  # the lowest seed, of the first method in the table's order
            first = min(avail, key=lambda r: (r.seed, rank.get(r.method, len(rank)), r.variant))
            written.append(availability(first, setting, Path(f"{stem}_availability.png")))
    return written + page_figures(out, fig_dir)  # forest and Pareto figures from the report's CSVs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedpcd_app.figures", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="a run folder, a sweep output folder or any folder holding runs")
    parser.add_argument("--out", dest="fig_dir", default="", help="figure folder (default: <folder>/figures)")
    parser.add_argument("--baseline", default=None, metavar="METHOD",
                        help="reference of the paired scatter and the heatmap's client order (default: FedAvg)")
    parser.add_argument("--methods", default="", help="comma-separated method entries to draw, in this order")
    parser.add_argument("--page", action="store_true",
                        help="draw forest.png and pareto.png from the folder's report CSVs alone (a results page)")
    parser.add_argument("--frontier", action="store_true",
                        help="with --page: also frontier.png, every configuration of report.csv, mean vs worst-10 %%")
    args = parser.parse_args(argv)
    if args.frontier and not args.page:
        print("error: --frontier draws from a page's report.csv: add --page", file=sys.stderr)
        return 2
    if args.page:
        paths = page_figures(args.out, args.fig_dir or None, frontier=args.frontier)
        if not paths:
            print(f"error: no report.csv or report_paired*.csv in {args.out}", file=sys.stderr)
            return 2
        print("\n".join(map(str, paths)))
        return 0
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] or None
    try:
        paths = make_figures(args.out, args.fig_dir or None, args.baseline, methods)
    except (FileNotFoundError, FigureError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
