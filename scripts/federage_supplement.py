"""Supplement to a FedeRage Table I sweep's report.md, on equal terms: every grid point of every
method with the validation ā it was selected on, the test ā and W₁₀ of the iterate the runs
scored (``scored_iterate``: the averaged iterate θ̄_T with ``eval-averaged-iterate = true``),
the final-ten means, and the same runs' last iterate θ_T (``final_model.pt``, scored
afterwards on the same test splits), so that both iterates compare every method alike.
Seeds that did not finish normally (``complete: false``) are listed, never scored.

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


def main(out: str) -> str:
    runs = report.load_runs(out)
    settings, methods = report.sweep_order(out)
    lines = []
    for setting in report.ordered((r.setting for r in runs), settings):
        in_setting = [r for r in runs if r.setting == setting]
        iterates = sorted({r.iterate for r in in_setting})
        seeds = sorted({r.seed for r in in_setting})
        lines += [f"## {setting}", "",
                  f"Every grid point (mean ± std over the seeds that ran, %; seeds {seeds}). Scored iterate of "
                  f"the runs: {', '.join(iterates)}; the last-iterate columns score the same runs' final model "
                  "θ_T (final_model.pt) on the same test splits.", "",
                  "| method | hyperparameters | seeds | val ā | test ā | test W₁₀ | final-ten ā | final-ten W₁₀ | "
                  "last-iterate ā | last-iterate W₁₀ | selected |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
        notes = []
        for method in report.ordered((r.method for r in in_setting), methods):
            rs = [r for r in in_setting if r.method == method]
            best, by_variant = report.best_variant(rs)
            for variant, group in by_variant.items():
                group = sorted(group, key=lambda r: r.seed)
                bad = [r for r in group if r.incomplete]
                notes += [f"{method} [{variant}] seed {r.seed}: {r.incomplete}" for r in bad]
                ok = [r for r in group if not r.incomplete]
                s = [r.summary for r in ok]
                last = [last_iterate(r) for r in ok]
                cells = [pct(x.get("val_mean_acc") for x in s), pct(x["mean_acc"] for x in s),
                         pct(x["worst10_acc"] for x in s), pct(x.get("final10_mean_acc") for x in s),
                         pct(x.get("final10_worst10_acc") for x in s), pct(m["mean_acc"] for m in last),
                         pct(m["worst10_acc"] for m in last)]
                if bad:
                    cells = [f"diverged ({len(bad)}/{len(group)} seeds)"] + ["—"] * (len(cells) - 1)
                mark = "✓" if variant == best and not bad else ""
                lines.append(f"| {method} | {variant.replace(',', ', ')} | {len(group)} | " + " | ".join(cells)
                             + f" | {mark} |")
        if notes:
            lines += ["", "Seeds that gave no score (complete: false):", ""] + [f"- {n}" for n in notes]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"# {report.title_of(sys.argv[1])}: supplement\n")
    print(f"Made by `python scripts/federage_supplement.py {sys.argv[1]}` from the same runs as report.md.\n")
    print(main(sys.argv[1]))
