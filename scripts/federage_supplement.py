"""Supplement to a FedeRage Table I sweep's report.md, on equal terms: every grid point of every
method with the validation ā it was selected on, the test ā and W₁₀ of the averaged iterate θ̄_T
(Algorithm 2's output, the runs' ``scored_iterate`` with ``eval-averaged-iterate = true``), the
final-ten means, and the same runs' last iterate θ_T (``iterate_scores.last`` of their summaries,
issue 52; runs made before it: ``final_model.pt`` scored afterwards on the same test splits), with the
selection under each iterate marked, so that both iterates compare every method alike.

The sweep's declared rules hold here as in report.md (issue 52): a grid point is unstable (no numbers,
``diverged (k/n seeds)``) only when a majority of its seeds failed (``[tuning] unstable``); a failed
seed of another point counts at its last evaluation and is listed under the table.

    python scripts/federage_supplement.py outputs/sweeps/federage-table1-digits > supplement.md
"""
import sys

import numpy as np
import torch

from client_app.data import load_federated_data
from client_app.models import build_model
from fedcore.config import parse_run_config
from fedpcd_app.analysis import report
from fedpcd_app.server.evaluation import score_clients
from fedpcd_app.server.metrics import fairness_metrics


def pct(values) -> str:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return "—"
    return f"{100 * v.mean():.2f}" if v.size == 1 else f"{100 * v.mean():.2f} ± {100 * v.std(ddof=1):.2f}"


def last_iterate(run) -> dict:
    """The run's final global model θ_T scored on every client's test split."""
    cfg = parse_run_config(run.summary["config"])
    data = load_federated_data(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    model.load_state_dict(torch.load(run.folder / "final_model.pt", weights_only=True))
    acc, loss = score_clients(model, data, cfg.eval_batch_size)
    return fairness_metrics(acc, loss)


def last_scores(run) -> dict:
    """The run's last iterate θ_T on every client's test split: ``iterate_scores.last`` of its summary,
    else its ``final_model.pt`` scored here (runs made before issue 52)."""
    recorded = (run.summary.get("iterate_scores") or {}).get("last")
    return recorded if recorded else last_iterate(run)


def main(out: str) -> str:
    rules = report.rules_of(out)
    runs = report.load_runs(out)
    settings, methods = report.sweep_order(out)
    lines = []
    for setting in report.ordered((r.setting for r in runs), settings):
        in_setting = [r for r in runs if r.setting == setting]
        iterates = sorted({r.iterate for r in in_setting})
        seeds = sorted({r.seed for r in in_setting})
        lines += [f"## {setting}", "",
                  f"Every grid point (mean ± std over its seeds, %; seeds {seeds}). Scored iterate of the runs: "
                  f"{', '.join(iterates)}; the last-iterate columns are the same runs' final model θ_T on the same "
                  "test splits. ✓ marks the selection on the validation mean of the averaged iterate (the page's), "
                  "✓ₗ the selection on the last iterate's; a point is unstable (no numbers) only when a majority of "
                  f"its seeds failed ([tuning] unstable = {rules.unstable}), a failed seed of another point counts "
                  "at its last evaluation.", "",
                  "| method | hyperparameters | seeds | val ā | test ā | test W₁₀ | final-ten ā | final-ten W₁₀ | "
                  "last-iterate val ā | last-iterate ā | last-iterate W₁₀ | selected |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
        notes = []
        for method in report.ordered((r.method for r in in_setting), methods):
            rs = [r for r in in_setting if r.method == method]
            best, by_variant = report.best_variant(rs, rules)
            last_runs = report.load_runs(out, "last")
            best_last, _ = report.best_variant([r for r in last_runs if r.setting == setting and r.method == method],
                                               rules)
            for variant, group in by_variant.items():
                group = sorted(group, key=lambda r: r.seed)
                bad = [r for r in group if r.incomplete]
                unstable = rules.is_unstable(len(bad), len(group))
                notes += [f"{method} [{variant}] seed {r.seed}" + ("" if unstable else " (counted at its last "
                                                                   "evaluation)") + f": {r.incomplete}" for r in bad]
                s = [r.summary for r in group]
                last = [last_scores(r) for r in group]
                cells = [pct(x.get("val_mean_acc") for x in s), pct(x["mean_acc"] for x in s),
                         pct(x["worst10_acc"] for x in s), pct(x.get("final10_mean_acc") for x in s),
                         pct(x.get("final10_worst10_acc") for x in s), pct(m.get("val_mean_acc") for m in last),
                         pct(m["mean_acc"] for m in last), pct(m["worst10_acc"] for m in last)]
                if unstable:
                    cells = [f"diverged ({len(bad)}/{len(group)} seeds)"] + ["—"] * (len(cells) - 1)
                mark = " ".join(m for m, ok in (("✓", variant == best), ("✓ₗ", variant == best_last))
                                if ok and not unstable)
                lines.append(f"| {method} | {variant.replace(',', ', ')} | {len(group)} | " + " | ".join(cells)
                             + f" | {mark} |")
        if notes:
            lines += ["", "Seeds that did not finish normally (complete: false):", ""] + [f"- {n}" for n in notes]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"# {report.title_of(sys.argv[1])}: supplement\n")
    print(f"Made by `python scripts/federage_supplement.py {sys.argv[1]}` from the same runs as report.md.\n")
    print(main(sys.argv[1]))
