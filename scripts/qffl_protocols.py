"""The q-FFL page's protocol comparison (docs/results/qffl_synthetic/): q = 0 (FedAvg as the
q-FFL authors run it) against q = 1 under each protocol, beside the paper's Table 1 row as
secondary sources quote it.

    python scripts/qffl_protocols.py --protocol "authors, one draw, 500 rounds=outputs/sweeps/qffl-authors-h500" \\
        [--protocol LABEL=DIR ...] [--csv-protocol "LABEL=report.csv"] [--curves curves.png] [--csv out.csv]
    python scripts/qffl_protocols.py --paired-from-runs runs.csv report_paired.csv   # from the stored CSV

Each ``--protocol`` is a sweep output with the method entries ``fedavg-q0`` and ``qffl-q1``
(run_configs/sweeps/qffl_*.toml); only finished runs (``summary.json``) are read, so a sweep
still running gives the seeds it has. Per run: the q-FFL paper's statistics of the final
per-client test accuracies (:func:`synthetic_tables.paper_stats`: average, worst 10 %, best
10 %, variance = np.var · 10⁴). Per protocol: mean ± sample std over seeds for each q; the
paired difference q = 1 − q = 0 over the seeds both finished (mean, its 95 % t interval, and in
how many seeds it is positive: a description of these seeds, not a test corrected for the
page's other comparisons); the drift of the mean and worst-10 % accuracy over the last fifth of
the horizon (the seeds' mean of the last evaluation minus that of the evaluation nearest 80 % of
the horizon: near 0 = flat at this horizon, not necessarily converged); and each draw's heavy
tail (the share of all examples held by its ten largest users, from the generator's sizes).

``--csv-protocol`` adds a protocol from an earlier page's ``synthetic_tables.py --csv`` file
(its means and stds only: no pairs, curves or per-seed rows).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("synthetic_tables", ROOT / "scripts" / "synthetic_tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

from client_app.data import synthetic  # noqa: E402

Q0, Q1 = "fedavg-q0", "qffl-q1"
STATS = tables.STATS
# Table 1 of the q-FFL paper, Synthetic row, as quoted by secondary sources (not checked against
# the paper here): q = 0 → q = 1, worst 10 % 18.8 → 31.1 %, variance 724 → 472, average −1.8 pp
# from 80.8 % (so 79.0 % at q = 1); best 10 % not quoted.
PAPER_QUOTED = {Q0: {"average": 80.8, "worst10": 18.8, "variance": 724.0},
                Q1: {"average": 79.0, "worst10": 31.1, "variance": 472.0}}


def t95(n: int) -> float:
    """The two-sided 95 % quantile of Student's t with n − 1 degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def paired(d: list[float]) -> dict[str, float]:
    """Mean, 95 % t interval half-width and the count of positive values of paired differences."""
    v = np.asarray(d, dtype=np.float64)
    half = t95(len(v)) * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return {"mean": float(v.mean()), "half": float(half), "positive": int((v > 0).sum()), "n": len(v)}


def top_share(sizes, k: int = 10) -> float:
    """The share of all examples held by the ``k`` largest users."""
    s = np.sort(np.asarray(sizes, dtype=np.float64))[::-1]
    return float(s[:k].sum() / s.sum())


def draw_of(run) -> int:
    """The RandomState seed of the run's Synthetic draw (``synthetic-seed``, else from ``seed``)."""
    cfg = run.summary.get("config", {})
    return synthetic.data_seed(run.seed, int(cfg.get("synthetic-seed", -1)))


def load(out: Path) -> dict[str, dict[int, object]]:
    """method entry → seed → finished run (the q = 0 and q = 1 entries)."""
    runs = tables.load_runs(out)
    by: dict[str, dict[int, object]] = {Q0: {}, Q1: {}}
    for r in runs:
        if r.method in by:
            by[r.method][r.seed] = r
    if not by[Q0] and not by[Q1]:
        raise SystemExit(f"error: no finished {Q0} or {Q1} run under {out}; run its sweep first")
    return by


def drift(runs, key: str) -> tuple[float, int, int]:
    """(seeds' mean of the last evaluation − that nearest 80 % of the horizon, in points; the two rounds)."""
    curves = [r.eval_curve(key) for r in runs]
    t = curves[0][0]
    last = int(t[-1])
    early = int(t[np.argmin(np.abs(t - 0.8 * last))])
    vals = [(c[1][list(c[0]).index(last)], c[1][list(c[0]).index(early)]) for c in curves
            if last in c[0] and early in c[0]]
    return 100 * float(np.mean([a - b for a, b in vals])), early, last


def summarise(label: str, by: dict[str, dict[int, object]]) -> dict:
    stats = {m: {s: tables.paper_stats(r.summary["client_acc"]) for s, r in runs.items()} for m, runs in by.items()}
    both = sorted(set(by[Q0]) & set(by[Q1]))
    diffs = {k: paired([stats[Q1][s][k] - stats[Q0][s][k] for s in both]) for k in STATS} if both else {}
    rounds = sorted({int(r.summary["rounds"]) for runs in by.values() for r in runs.values()})
    draws = sorted({draw_of(r) for runs in by.values() for r in runs.values()})
    num_users = {len(r.summary["client_acc"]) for runs in by.values() for r in runs.values()}.pop()
    return {"label": label, "by": by, "stats": stats, "both": both, "diffs": diffs, "rounds": rounds,
            "draws": {d: top_share(synthetic.user_sizes(num_users, d)) for d in draws},
            "drift": {m: {k: drift(list(runs.values()), k) for k in ("mean_acc", "worst10_acc")}
                      for m, runs in by.items() if runs}}


def from_csv(label: str, path: Path, num_users: int = 100) -> dict:
    """A protocol from an earlier page's CSV: its rows' means and stds (no per-seed rows), and
    its draws' heavy tail, the draws being those of its seeds with ``synthetic-seed = -1``
    (qffl_synthetic.toml's)."""
    with open(path) as fh:
        rows = {r["method"]: r for r in csv.DictReader(fh)}
    seeds = sorted({int(s) for m in (Q0, Q1) if m in rows for s in rows[m]["seeds"].split()})
    draws = {synthetic.data_seed(s, -1): top_share(synthetic.user_sizes(num_users, synthetic.data_seed(s, -1)))
             for s in seeds}
    return {"label": label, "csv": {m: rows[m] for m in (Q0, Q1) if m in rows}, "draws": draws, "seeds": seeds}


def _ms(values) -> str:
    return tables.fmt(list(values), 2)


PAPER_COLUMN = "paper, Table 1 (as quoted by secondary sources; not checked against the paper here)"


def markdown(protocols: list[dict]) -> str:
    cols = [p["label"] for p in protocols]
    head = f"| q | statistic | {PAPER_COLUMN} | " + " | ".join(cols) + " |"
    lines = ["Mean ± sample std over seeds of the final per-client test accuracies' statistics "
             "(variance in %²).", "", head, "|---|---|---:|" + "---:|" * len(cols)]
    for m, q in ((Q0, "0"), (Q1, "1")):
        for k in STATS:
            ref = PAPER_QUOTED[m].get(k)
            cells = []
            for p in protocols:
                if "csv" in p:
                    row = p["csv"].get(m)
                    mean, std = (row[f"{k}_mean"], row[f"{k}_std"]) if row else ("", "")
                    d = 0 if k == "variance" else 2
                    cells.append(f"{float(mean):.{d}f} ± {float(std):.{d}f}" if mean not in ("", None) else "—")
                else:
                    vals = [s[k] for s in p["stats"][m].values()]
                    cells.append(tables.fmt(vals, 0 if k == "variance" else 2))
            paper = "—" if ref is None else f"{ref:.{0 if k == 'variance' else 1}f}"
            lines.append(f"| {q} | {tables.TITLES[k]} | {paper} | " + " | ".join(cells) + " |")
    lines += ["", "Paired difference q = 1 − q = 0 over the seeds both finished: mean [95 % t interval] "
              "(seeds where it is positive / seeds).", "",
              f"| statistic | {PAPER_COLUMN} | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for k in STATS:
        ref = (PAPER_QUOTED[Q1].get(k), PAPER_QUOTED[Q0].get(k))
        paper = "—" if None in ref else f"{ref[0] - ref[1]:+.{0 if k == 'variance' else 1}f}"
        cells = []
        for p in protocols:
            d = p.get("diffs", {}).get(k)
            if not d:
                cells.append("— (no pairs)")
                continue
            digits = 0 if k == "variance" else 2
            ci = f" [{d['mean'] - d['half']:+.{digits}f}, {d['mean'] + d['half']:+.{digits}f}]" if d["n"] > 1 else ""
            cells.append(f"{d['mean']:+.{digits}f}{ci} ({d['positive']}/{d['n']})")
        lines.append(f"| {tables.TITLES[k]} | {paper} | " + " | ".join(cells) + " |")
    lines += ["", "Per protocol: rounds, draws and their heavy tail (share of all examples held by the ten "
              "largest users), and the drift over the last fifth of the horizon (seeds' mean, points).", "",
              "| protocol | rounds | seeds (q = 0 / q = 1) | draws: top-10 users' share | "
              "drift of mean acc. q = 0 / q = 1 | drift of worst 10 % q = 0 / q = 1 |", "|---|---:|---|---|---|---|"]
    for p in protocols:
        shares = ", ".join(f"{d}: {100 * s:.1f} %" for d, s in p["draws"].items())
        if "csv" in p:
            lines.append(f"| {p['label']} | (its CSV) | {' '.join(map(str, p['seeds']))} | {shares} | — | — |")
            continue
        dm = " / ".join(f"{p['drift'][m]['mean_acc'][0]:+.2f}" if m in p["drift"] else "—" for m in (Q0, Q1))
        dw = " / ".join(f"{p['drift'][m]['worst10_acc'][0]:+.2f}" if m in p["drift"] else "—" for m in (Q0, Q1))
        span = next(iter(p["drift"].values()))["mean_acc"][1:]
        lines.append(f"| {p['label']} | {', '.join(map(str, p['rounds']))} | "
                     f"{' '.join(map(str, sorted(p['by'][Q0])))} / {' '.join(map(str, sorted(p['by'][Q1])))} | "
                     f"{shares} | {dm} (rounds {span[0]}→{span[1]}) | {dw} |")
    for p in protocols:
        if "csv" in p or not p["both"]:
            continue
        lines += ["", f"Per seed, {p['label']}:", "",
                  "| seed | draw | average q = 0 / q = 1 | worst 10 % q = 0 / q = 1 | variance q = 0 / q = 1 | "
                  "clients at 0 % q = 0 / q = 1 |", "|---:|---:|---|---|---|---|"]
        for s in p["both"]:
            a, b = p["stats"][Q0][s], p["stats"][Q1][s]
            z = [sum(x == 0 for x in p["by"][m][s].summary["client_acc"]) for m in (Q0, Q1)]
            lines.append(f"| {s} | {draw_of(p['by'][Q0][s])} | {a['average']:.2f} / {b['average']:.2f} | "
                         f"{a['worst10']:.2f} / {b['worst10']:.2f} | {a['variance']:.0f} / {b['variance']:.0f} | "
                         f"{z[0]} / {z[1]} |")
    return "\n".join(lines) + "\n"


def write_csv(protocols: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["protocol", "method", "seed", "draw", "rounds"] + list(STATS))
        for p in protocols:
            if "csv" in p:
                continue
            for m in (Q0, Q1):
                for s, st in sorted(p["stats"][m].items()):
                    run = p["by"][m][s]
                    w.writerow([p["label"], m, s, draw_of(run), run.summary["rounds"]] + [st[k] for k in STATS])


def curves(protocols: list[dict], path: Path) -> None:
    """Mean and worst-10 % accuracy per evaluation: seeds' mean, band = their range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in protocols:
        for m, q in ((Q0, "q = 0"), (Q1, "q = 1")):
            runs = list(p.get("by", {}).get(m, {}).values())
            if not runs:
                continue
            for ax, key in zip(axes, ("mean_acc", "worst10_acc")):
                cs = [r.eval_curve(key) for r in runs]
                t = min((c[0] for c in cs), key=len)
                v = 100 * np.array([c[1][: len(t)] for c in cs])
                ax.plot(t, v.mean(axis=0), label=f"{p['label']}: {q} ({len(runs)} seeds)")
                ax.fill_between(t, v.min(axis=0), v.max(axis=0), alpha=0.15)
    for ax, key in zip(axes, ("average", "worst10")):  # the paper's row, as quoted
        for (m, q), style in zip(((Q0, "q = 0"), (Q1, "q = 1")), ("--", ":")):
            ax.axhline(PAPER_QUOTED[m][key], color="grey", linestyle=style, linewidth=1,
                       label=f"paper {q} (as quoted)")
    for ax, name in zip(axes, ("mean client accuracy (%)", "worst-10 % client accuracy (%)")):
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("q-FFL Synthetic(1,1): mean over seeds, band = the seeds' range")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _labelled(text: str) -> tuple[str, Path]:
    label, sep, folder = text.rpartition("=")
    if not sep or not label:
        raise SystemExit(f"error: {text!r}: give LABEL=FOLDER (e.g. 'authors=outputs/sweeps/qffl-authors-h500')")
    return label, Path(folder)


def paired_from_runs(runs_csv: Path, out_csv: Path, base: str = "fedavg-q0", method: str = "qffl-q1") -> Path:
    """The page's paired comparisons q = 1 − q = 0 (every statistic, every protocol with pairs)
    from its stored per-seed ``runs.csv`` (``--csv``), in the format of the report's
    ``report_paired.csv`` (accuracies as fractions, variance in %²), Holm over the page: what
    ``python -m fedpcd_app.report --check-wording`` checks the page's words against."""
    from fedpcd_app.analysis import report, stats

    with open(runs_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    results = []
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        by = {(r["method"], int(r["seed"])): r for r in rows if r["protocol"] == protocol}
        seeds = sorted(s for m, s in by if m == method and (base, s) in by)
        if not seeds:
            continue
        for key, metric, high in (("average", "mean_acc", True), ("worst10", "worst10_acc", True),
                                  ("best10", "best10_acc", True), ("variance", "variance", False)):
            scale = 0.01 if key != "variance" else 1.0  # accuracies as fractions, as the report writes them
            d = np.array([scale * (float(by[(method, s)][key]) - float(by[(base, s)][key])) for s in seeds])
            t_p, w_p = report.paired_tests(d)
            better = int((d > 0).sum() if high else (d < 0).sum())
            ties = int((d == 0).sum())
            _, lo, hi = stats.paired_ci(d)
            results.append(report.Paired(protocol, method, "base", base, "base", metric, seeds, d.tolist(),
                                         float(d.mean()), t_p, w_p, better, ties, lo, hi, stats.effect_size(d),
                                         stats.sign_test_p(better, len(seeds) - ties)))
    for p, adj in zip(results, stats.holm([p.ttest_p for p in results])):
        p.p_holm, p.family = adj, sum(not np.isnan(x.ttest_p) for x in results)
    report.write_paired_csv(results, out_csv)
    report.restat(out_csv.parent)  # the page-wide columns (p_holm_page, verdict)
    return out_csv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--protocol", action="append", default=[], metavar="LABEL=DIR", help="a sweep output (repeatable)")
    ap.add_argument("--csv-protocol", action="append", default=[], metavar="LABEL=CSV",
                    help="an earlier page's synthetic_tables.py --csv file (means and stds only)")
    ap.add_argument("--curves", default="", help="write the accuracy curves (PNG)")
    ap.add_argument("--csv", default="", help="write every run's statistics (CSV)")
    ap.add_argument("--paired-from-runs", nargs=2, metavar=("RUNS_CSV", "PAIRED_CSV"),
                    help="write the page's paired comparisons (report_paired.csv format, Holm over the page) "
                         "from a stored --csv file, without the runs")
    args = ap.parse_args(argv)
    if args.paired_from_runs:
        print(paired_from_runs(Path(args.paired_from_runs[0]), Path(args.paired_from_runs[1])))
        return 0
    if not args.protocol and not args.csv_protocol:
        ap.error("give at least one --protocol LABEL=DIR")
    protocols = [summarise(label, load(folder)) for label, folder in map(_labelled, args.protocol)]
    protocols += [from_csv(label, path) for label, path in map(_labelled, args.csv_protocol)]
    print(markdown(protocols))
    if args.csv:
        write_csv(protocols, Path(args.csv))
    if args.curves:
        curves(protocols, Path(args.curves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
