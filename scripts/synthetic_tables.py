"""The tables of the Synthetic results pages (docs/results/{qffl,federage,fairness}_synthetic/)
from finished sweep runs, in the q-FFL paper's statistics.

    python scripts/synthetic_tables.py <sweep-out> [--paper qffl] [--frontier FIG.png] [--csv OUT.csv]
                                       [--objective mean|worst10]

Runs are found and labelled as by ``fedpcd_app.analysis.report`` (``load_runs``). Per run it reads
``summary.json`` (and ``rounds.jsonl`` for the divergence check) and computes the q-FFL
paper's Table 1 statistics of the final per-client test accuracies (``client_acc``), as the
authors' ``plot_fairness.py`` does: average (unweighted mean over clients), worst 10 % and
best 10 % (mean of the ⌊0.1 N⌋ lowest / highest), variance ``np.var(acc) · 10⁴`` (population
variance, in %²). Over seeds: mean ± sample std.

Selection: the report's, by the sweep's declared rules (issue 42). Per setting and method entry,
the grid point is chosen by ``fedpcd_app.analysis.report.best_variant`` under the ``[tuning]``
rules the sweep declared (``report.rules_of``: :class:`fedpcd_app.analysis.tuning.Rules`, scored
by ``tuning.point_scores`` and ``tuning.choose``), so the ``selected`` column of the CSV equals
``report.csv``'s on the same sweep: a seed *failed* when the run says it did not finish normally
(``complete: false``, its ``incomplete_reason``: the server's completeness checks, which read the
validation split, ``fedpcd_app.server.divergence.selection_acc``); a grid point is *unstable*
(never selected, its row ``diverged (k/n)`` or ``incomplete (k/n)`` without numbers) only when the
declared rule says so (``unstable = "majority"``: more than half of its seeds failed); a failed
seed of any other point counts at its last validation evaluation (``failed-seed-score``) and is
listed under the table; the objective is the declared one (``objective``; ``--objective`` replaces
it, as ``report --objective``), on the validation split (the test split only when the runs have
none); an exact tie goes to the point on fewer grid edges (toward the interior). The test split is
read for the reported numbers only.

Flags on the reported numbers. :func:`divergence` also checks what the run reports on the test
split: a training or evaluation loss that is not finite; an evaluated mean client loss at or above
its first evaluation's for the last ``K`` = 5 evaluations while the mean client accuracy is no
higher than at the first (training made the model no better than where it started: a model whose
accuracy rose while its mean loss grew is over-confident on the clients it gets wrong, not
diverged; FedAvg's 1,000-round Synthetic runs do that); a final mean client accuracy at or below
chance (1/C, C = 10 classes). These flags are listed under the table (and counted in the CSV's
``flagged``); they never feed selection, which must not read the test split.

Every configuration. ``build`` returns every grid point of every method entry (``shown``
marks the chosen one; when every point is unstable, the first, as the report): the CSV (``--csv``) always
holds them all with a ``selected`` column; the markdown shows the chosen rows unless ``--all``.
Each row has its method's ``weighting`` (``strategies.registry.weighting_of``) and
``on_edge`` (its grid point is the smallest or largest value tried in a numeric key, as in
``fedpcd_app.analysis.report``: the optimum may lie beyond the grid; marked ⚠ edge).

Weighting. A table whose chosen rows weight their clients differently must hold FedAvg
under both weightings (``fedavg-weighting`` ``data-size`` and ``uniform``), as the report
requires; the script refuses it in one line otherwise (``--mixed-weightings`` overrides).

Equal scoring. Every run of one table is read as one iterate: the sweep's declared ``[tuning]
iterate`` (issue 52: the paper's; ``--iterate`` replaces it), a run scored on the averaged iterate
giving its last one from ``iterate_scores`` (``fedpcd_app.analysis.tuning.view``), selection included;
a method whose only output is another iterate (AFL's average) or a personal model (Ditto) keeps it and
the table names it (``iterate`` column); any other mix is refused in one line.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpcd_app.analysis.report import (  # noqa: E402
    ReportError,
    Run,
    best_variant,
    check_iterates,
    declared_iterate,
    grid_edges,
    load_runs,
    ordered,
    rules_of,
    selection_split,
    sweep_order,
)

NUM_CLASSES = 10
STALL_EVALS = 5
STATS = ("average", "worst10", "best10", "variance")
TITLES = {"average": "Average (%)", "worst10": "Worst 10 % (%)", "best10": "Best 10 % (%)", "variance": "Variance"}
# q-FFL paper (Li et al., ICLR 2020, arXiv 1905.10497), Table 1, Synthetic: not retrieved from the
# paper; the row as secondary sources quote it is scripts/qffl_protocols.py's PAPER_QUOTED.
PAPER_QFFL: dict[str, dict[str, float]] = {}


def paper_stats(acc) -> dict[str, float]:
    """The q-FFL authors' statistics of one run's per-client accuracies (fractions in)."""
    a = np.sort(np.asarray(acc, dtype=np.float64))
    k = max(1, int(0.1 * len(a)))
    return {"average": 100 * float(a.mean()), "worst10": 100 * float(a[:k].mean()),
            "best10": 100 * float(a[-k:].mean()), "variance": float(np.var(a) * 1e4)}


def divergence(run: Run) -> str:
    """Why the run failed or is flagged ("" when neither): its own ``incomplete_reason`` (a failed
    seed, by the server's checks on the validation split), else this script's checks of the test
    split (flags on the reported numbers, never read by selection): see the module doc."""
    s = run.summary
    if run.incomplete:
        return run.incomplete
    for key in ("mean_acc", "mean_loss"):
        v = s.get(key)
        if v is None or not math.isfinite(v):
            return f"final {key} not finite"
    rounds = run.rounds()
    for r in rounds:
        for key in ("train_loss", "loss_before"):
            if key in r and (r[key] is None or not math.isfinite(r[key])):
                return f"{key} not finite at round {r['round']}"
    evals = [r["eval"] for r in rounds if "eval" in r]
    losses = [e.get("mean_loss") for e in evals]
    if any(v is None or not math.isfinite(v) for v in losses):
        return "evaluation loss not finite"
    accs = [float(np.mean(e["client_acc"])) if e.get("client_acc") else None for e in evals]
    no_better = accs[0] is None or accs[-1] is None or accs[-1] <= accs[0]
    if len(losses) > STALL_EVALS and all(v >= losses[0] for v in losses[-STALL_EVALS:]) and no_better:
        return f"mean loss >= its first evaluation ({losses[0]:.3f}) for the last {STALL_EVALS} evaluations"
    if s["mean_acc"] <= 1.0 / NUM_CLASSES:
        return f"final mean accuracy {100 * s['mean_acc']:.2f} % <= chance"
    return ""


def fmt(values: list[float], digits: int = 2) -> str:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return "—"
    if v.size == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def group_runs(runs: list[Run], order) -> dict[str, dict[str, dict[str, list[Run]]]]:
    """setting → method entry → grid point → runs (sorted by seed)."""
    out: dict = {}
    for setting in ordered((r.setting for r in runs), order[0]):
        out[setting] = {}
        in_setting = [r for r in runs if r.setting == setting]
        for method in ordered((r.method for r in in_setting), order[1]):
            by_variant: dict[str, list[Run]] = defaultdict(list)
            for r in sorted((r for r in in_setting if r.method == method), key=lambda r: r.seed):
                by_variant[r.variant].append(r)
            out[setting][method] = dict(by_variant)
    return out


def select(candidates: list[Run], rules) -> tuple[str, str]:
    """(the chosen grid point, the split it was selected on) of one method entry's runs
    (``candidates``, in the order ``load_runs`` gives them): the report's selection
    (``report.best_variant`` under the sweep's ``rules``; see the module doc)."""
    import warnings

    with warnings.catch_warnings():  # the no-validation warning is the report's to give
        warnings.simplefilter("ignore")
        chosen, _ = best_variant(candidates, rules)
    return chosen, selection_split(candidates)


def build(out: Path, all_points: bool = True, objective: str | None = None,
          iterate: str | None = None) -> tuple[list[dict], dict[Path, str], str]:
    """(every grid point's row, run folder → failure or flag reason, the iterate read); a row's
    ``shown`` is true for the chosen grid point (every point with ``all_points``). ``objective``
    replaces the sweep's declared selection objective (``mean`` / ``worst10``), ``iterate`` its
    declared iterate (``last`` / ``averaged``; see the module doc)."""
    iterate = iterate or declared_iterate(out)
    runs = load_runs(out, iterate)
    if not runs:
        raise SystemExit(f"error: no finished run (summary.json) at or below {out}")
    try:
        check_iterates(runs)
    except ReportError as exc:
        raise SystemExit(f"error: {exc}") from None
    iterates = {r.iterate for r in runs}
    rules = rules_of(out, objective)
    diverged = {r.folder: divergence(r) for r in runs}
    rows = []
    for setting, methods in group_runs(runs, sweep_order(out)).items():
        for method, variants in methods.items():
            chosen, split = select([r for r in runs if r.setting == setting and r.method == method], rules)
            grids = [rs[0].grid for rs in variants.values()]
            for variant, rs in variants.items():
                failed = [r for r in rs if r.incomplete]  # the seeds the sweep's rules count as failed
                unstable = rules.is_unstable(len(failed), len(rs))
                scored = [] if unstable else rs  # a failed seed of a stable point: its recorded (last) numbers

                def values(key, scored=scored):
                    return [100 * r.summary[key] for r in scored if _finite(r.summary.get(key))]

                stats = [paper_stats(r.summary["client_acc"]) for r in scored if r.summary.get("client_acc")]
                rows.append({
                    "setting": setting, "method": method, "variant": variant, "chosen": variant == chosen,
                    "selected_on": split if len(variants) > 1 else "", "seeds": [r.seed for r in rs],
                    "shown": all_points or variant == chosen, "weighting": "/".join(sorted({r.weighting for r in rs})),
                    "edge": (grid_edges(rs[0].grid, grids, str(rs[0].summary.get("method", "")))
                             if len(grids) > 1 else []),
                    "diverged": len(failed), "diverged_reasons": sorted({r.incomplete for r in failed}),
                    "unstable": unstable, "objective": rules.objective,
                    "flagged": len([r for r in rs if diverged[r.folder] and not r.incomplete]),
                    "flagged_reasons": sorted({diverged[r.folder] for r in rs if diverged[r.folder]
                                               and not r.incomplete}),
                    "stats": {k: [s[k] for s in stats] for k in STATS},
                    "val_average": values("val_mean_acc"), "val_worst10": values("val_worst10_acc"),
                    "final10_average": values("final10_mean_acc"), "final10_worst10": values("final10_worst10_acc"),
                    "runs": rs, "iterate": "/".join(sorted({r.iterate for r in rs})),
                })
    main = iterate or (iterates.pop() if len(iterates) == 1 else "/".join(sorted(iterates)))
    return rows, diverged, main


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_weightings(rows: list[dict]) -> None:
    """One line (SystemExit) when a table mixes weightings without FedAvg under both."""
    for setting in dict.fromkeys(r["setting"] for r in rows):
        group = [r for r in rows if r["setting"] == setting and (r["chosen"] or not r["selected_on"])]
        kinds = {r["weighting"] for r in group} - {"unknown"}
        have = {r["weighting"] for r in group if all(x.summary.get("method") == "fedavg" for x in r["runs"])}
        missing = [w for w in ("data-size", "uniform") if w not in have]
        if len(kinds) > 1 and missing:
            raise SystemExit(f"error: setting '{setting}' compares rules of different weightings "
                             f"({', '.join(sorted(kinds))}) without FedAvg under fedavg-weighting = '{missing[0]}': "
                             f"add a [[methods]] entry method = \"fedavg\", fedavg-weighting = \"{missing[0]}\" to "
                             "the sweep, or pass --mixed-weightings")


def markdown(rows: list[dict], iterate: str, paper: dict[str, dict[str, float]] | None = None) -> str:
    others = sorted({r["iterate"] for r in rows} - {iterate})
    lines = [f"Scored iterate: **{iterate}**" + (f" (its own output kept by: {', '.join(others)}; the iterate column)"
                                                 if others else " (every run of this table)")
             + "; split: the clients' test splits. "
             "Mean ± sample std over seeds of the q-FFL paper's statistics of the final per-client accuracies "
             "(variance = np.var · 10⁴, in %²); `final-10` = mean accuracy averaged over the last ten evaluations.", ""]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        lines += [f"### {setting}", "",
                  "| method | weighting | hyperparameters | seeds | " + " | ".join(TITLES[k] for k in STATS)
                  + " | final-10 average | final-10 worst 10 % | validation average |"
                  + (" paper (avg / worst / best / var) |" if paper is not None else ""),
                  "|---|---|---|---:|" + "---:|" * (len(STATS) + 3) + ("---|" if paper is not None else "")]
        for r in (x for x in rows if x["setting"] == setting):
            hyper = (r["variant"].replace(",", ", ") + (" ★" if r["chosen"] and r["selected_on"] else "")
                     + (" ⚠ edge" if r["chosen"] and r["edge"] else ""))
            n = len(r["seeds"])
            if r["unstable"]:
                word = "diverged" if any("diverg" in x for x in r["diverged_reasons"]) else "incomplete"
                cells = [f"{word} ({r['diverged']}/{n})"] + ["—"] * (len(STATS) + 2)
            else:
                cells = [fmt(r["stats"][k], 0 if k == "variance" else 2) for k in STATS]
                cells += [fmt(r["final10_average"]), fmt(r["final10_worst10"]), fmt(r["val_average"])]
            p = ""
            if paper is not None:
                ref = paper.get(r["method"])
                p = " " + (" / ".join(f"{ref[k]:g}" for k in STATS) if ref else "not retrieved") + " |"
            lines.append(f"| {r['method']} | {r['weighting']} | {hyper} | {n} | " + " | ".join(cells) + " |" + p)
        group = [r for r in rows if r["setting"] == setting]
        unstable = [(r["method"], r["variant"], x) for r in group if r["unstable"] for x in r["diverged_reasons"]]
        if unstable:
            lines += ["", "Unstable (a majority of the seeds failed, by the sweep's rule; never scored): "
                      + "; ".join(f"{m} [{v}]: {x}" for m, v, x in unstable)]
        counted = [(r["method"], r["variant"], r["diverged"], len(r["seeds"]), x) for r in group
                   if r["diverged"] and not r["unstable"] for x in r["diverged_reasons"]]
        if counted:
            lines += ["", "Failed seeds counted at their last evaluation (a minority of their grid point's seeds): "
                      + "; ".join(f"{m} [{v}] ({k}/{n}): {x}" for m, v, k, n, x in counted)]
        flagged = [(r["method"], r["variant"], x) for r in group for x in r["flagged_reasons"]]
        if flagged:
            lines += ["", "Flagged on the test split (the reported numbers; selection does not read them): "
                      + "; ".join(f"{m} [{v}]: {x}" for m, v, x in flagged)]
        edges = [r for r in rows if r["setting"] == setting and r["chosen"] and r["edge"]]
        if edges:
            where = "; ".join(f"{r['method']}: {', '.join(r['edge'])}" for r in edges)
            lines += ["", "⚠ edge — selections on the edge of the grid tried (the optimum may lie beyond it; no best "
                          f"is claimed from them): {where}"]
        sel = {r["selected_on"] for r in rows if r["setting"] == setting} - {""}
        if sel:
            objective = {r["objective"] for r in rows if r["setting"] == setting}.pop()
            what = "mean accuracy" if objective == "mean" else "worst-10 % accuracy"
            lines += ["", f"★ = grid point selected on the {' / '.join(sorted(sel))} split: best mean over seeds of "
                          f"the {what} among the grid points that are not unstable (a failed seed counted at its "
                          "last evaluation), an exact tie to the interior: the report's selection."]
        lines.append("")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["setting", "method", "hyperparameters", "chosen", "selected_on", "seeds", "diverged"]
                   + [f"{k}_{s}" for k in STATS for s in ("mean", "std")]
                   + ["final10_average_mean", "val_average_mean", "weighting", "selected", "on_edge", "edge",
                      "unstable", "objective", "flagged", "val_worst10_mean", "iterate"])
        for r in rows:
            vals = []
            for k in STATS:
                v = np.asarray(r["stats"][k], dtype=np.float64)
                vals += [v.mean() if v.size else "", v.std(ddof=1) if v.size > 1 else ""]
            f10 = np.mean(r["final10_average"]) if r["final10_average"] else ""
            va = np.mean(r["val_average"]) if r["val_average"] else ""
            w.writerow([r["setting"], r["method"], r["variant"], int(r["chosen"]), r["selected_on"],
                        " ".join(map(str, r["seeds"])), r["diverged"]] + vals
                       + [f10, va, r["weighting"], int(r["chosen"]), int(bool(r["edge"])), "; ".join(r["edge"]),
                          int(r["unstable"]), r["objective"], r["flagged"],
                          np.mean(r["val_worst10"]) if r["val_worst10"] else "", r["iterate"]])


def frontier(rows: list[dict], path: Path) -> None:
    """Mean client accuracy against worst-10 % of every configuration (``build``'s rows) on the
    validation split (what selection reads; issue 52), the chosen ones bold with ±1 std bars over the
    seeds, the Pareto fronts marked: ``fedpcd_app.analysis.figures.configurations_frontier`` on the rows
    as ``report.csv`` has them."""
    from fedpcd_app.analysis.figures import configurations_frontier

    table = []
    for r in rows:
        cells = {}
        for key, stat in (("val_mean_acc", "val_average"), ("val_worst10_acc", "val_worst10")):
            v = np.asarray(r[stat], dtype=np.float64) / 100
            cells[f"{key}_mean"] = str(v.mean()) if v.size else ""
            cells[f"{key}_std"] = str(v.std(ddof=1)) if v.size > 1 else ""
        table.append({"setting": r["setting"], "method": r["method"], "hyperparameters": r["variant"],
                      "selected": str(int(r["chosen"] or not r["selected_on"])), **cells})
    configurations_frontier(table, path)


def qffl_diagnostics(rows: list[dict], q0: str, q1: str) -> str:
    """What the q-FFL runs say about the pipeline and the step (markdown), per seed:

    * L = 1/lr: with q = 0, Σ_k h_k = m·L exactly (``qffl-sum-h`` of ``rounds.jsonl``);
    * sampling ∝ training size: correlation of ``times_sampled`` (``clients.csv``) with the
      expected count T·π_k (``availability.json`` ``probabilities``);
    * the step: ‖θ_{t+1} − θ_t‖ of q = 1 over that of q = 0, round by round on the same seed
      (the same clients are drawn in the same rounds: the draw depends on (seed, t) only);
    * the accuracy curves (mean and worst 10 % per evaluation).
    """
    by = {(r["method"]): {x.seed: x for x in r["runs"]} for r in rows}
    if q0 not in by or q1 not in by:
        return ""
    out = ["| seed | Σh / (m·L) at q = 0 (min–max over rounds) | corr(times sampled, T·π) "
           "| median ‖step(q=1)‖ / ‖step(q=0)‖ "
           "| rounds where q = 1 stepped further | q = 0 ā at rounds 10/25/50 | q = 1 ā at rounds 10/25/50 |",
           "|---:|---|---:|---:|---:|---|---|"]
    for seed in sorted(set(by[q0]) & set(by[q1])):
        r0, r1 = by[q0][seed], by[q1][seed]
        cfg = r0.summary["config"]
        m_l = round(cfg["fraction-train"] * cfg["num-clients"]) / cfg["lr"]
        rec0, rec1 = r0.rounds(), r1.rounds()
        sh = np.array([x["strategy"]["qffl-sum-h"] for x in rec0 if "strategy" in x]) / m_l
        n0 = {x["round"]: x["strategy"]["update-norm"] for x in rec0 if "strategy" in x}
        n1 = {x["round"]: x["strategy"]["update-norm"] for x in rec1 if "strategy" in x}
        common = sorted(set(n0) & set(n1))
        ratio = np.array([n1[t] / n0[t] for t in common if n0[t] > 0])
        same = sum(x.get("sampled") == y.get("sampled") for x, y in zip(rec0, rec1))
        avail = json_load(r0.folder / "availability.json")
        sampled = np.array([int(row["times_sampled"]) for row in csv_rows(r0.folder / "clients.csv")], dtype=float)
        expected = np.asarray(avail["probabilities"]) * cfg["num-server-rounds"]
        corr = float(np.corrcoef(sampled, expected)[0, 1])

        def at(run, ts):
            pts = dict(zip(*run.eval_curve("mean_acc")))
            return " / ".join(f"{100 * pts[t]:.1f}" if t in pts else "—" for t in ts)

        out.append(f"| {seed} | {sh.min():.6f}–{sh.max():.6f} | {corr:.3f} | {np.median(ratio):.3f} | "
                   f"{int((ratio > 1).sum())}/{len(ratio)} (same clients drawn in {same}/{len(rec0)} rounds) | "
                   f"{at(r0, (10, 25, 50))} | {at(r1, (10, 25, 50))} |")
    return "\n".join(out) + "\n"


def json_load(path: Path):
    import json

    return json.loads(Path(path).read_text())


def csv_rows(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def curves_figure(rows: list[dict], path: Path, title: str) -> None:
    """Mean and worst-10 % client accuracy per evaluation, mean over seeds, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        if r["unstable"] or not (r["chosen"] or not r["selected_on"]):
            continue
        for ax, key in zip(axes, ("mean_acc", "worst10_acc")):
            curves = [x.eval_curve(key) for x in r["runs"]]
            t = curves[0][0]
            vals = np.array([c[1][: len(t)] for c in curves if len(c[1]) >= len(t)])
            ax.plot(t, 100 * vals.mean(axis=0), label=f"{r['setting']} {r['method']}")
            ax.fill_between(t, 100 * vals.min(axis=0), 100 * vals.max(axis=0), alpha=0.15)
    for ax, name in zip(axes, ("mean client accuracy (%)", "worst-10 % client accuracy (%)")):
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}: mean over seeds, band = seeds' range")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="a sweep output folder")
    ap.add_argument("--all", dest="all_points", action="store_true", help="every grid point, not only the chosen one")
    ap.add_argument("--paper", choices=("qffl",), default=None, help="add the paper's row beside ours")
    ap.add_argument("--csv", default="", help="also write the table as CSV")
    ap.add_argument("--frontier", default="", help="write the mean vs worst-10 %% frontier, every configuration (PNG)")
    ap.add_argument("--curves", default="", help="write the accuracy curves of the chosen rows (PNG)")
    ap.add_argument("--qffl-diagnostics", default="", metavar="Q0,Q1",
                    help="the q = 0 and q = 1 method entries: add the pipeline/step checks (qffl_diagnostics)")
    ap.add_argument("--objective", choices=("mean", "worst10"), default=None,
                    help="select on the validation mean (default: the sweep's [tuning] objective) or its worst-10 %%")
    ap.add_argument("--iterate", choices=("last", "averaged"), default=None,
                    help="read the runs as this iterate (default: the sweep's [tuning] iterate, else each run's)")
    ap.add_argument("--mixed-weightings", action="store_true",
                    help="allow a table of rules of different weightings without FedAvg under both")
    args = ap.parse_args(argv)
    every, _, iterate = build(Path(args.out), args.all_points, args.objective, args.iterate)
    if not args.mixed_weightings:
        check_weightings(every)
    rows = [r for r in every if r["shown"]]
    print(markdown(rows, iterate, PAPER_QFFL if args.paper == "qffl" else None))
    if args.qffl_diagnostics:
        print(qffl_diagnostics([r for r in every if r["chosen"] or not r["selected_on"]],
                               *args.qffl_diagnostics.split(",")))
    if args.curves:
        curves_figure(rows, Path(args.curves), Path(args.out).name)
    if args.csv:  # every configuration, selected marking the chosen ones
        write_csv(every, Path(args.csv))
    if args.frontier:  # every configuration, the chosen ones bold
        frontier(every, Path(args.frontier))
    return 0


if __name__ == "__main__":
    sys.exit(main())
