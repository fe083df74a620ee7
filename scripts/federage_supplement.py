"""Supplement to a FedeRage Table I sweep's report.md: every grid point's validation ā (what
the report selects on) next to its test ā and W₁₀ and the final-ten means, and FedeRage's
selected point scored on its last iterate (final_model.pt) instead of its averaged iterate.

    python scripts/federage_supplement.py outputs/sweeps/federage-table1-digits > supplement.md
"""
import sys
from collections import defaultdict

import numpy as np
import torch

from client_app.data import load_federated_data
from client_app.models import build_model
from fedcore.config import parse_run_config
from fedpcd_app import report
from fedpcd_app.evaluation import score_clients
from fedpcd_app.metrics import fairness_metrics

out = sys.argv[1]
runs = report.load_runs(out)
pct = lambda v: f"{100 * np.mean(v):.2f} ± {100 * np.std(v, ddof=1):.2f}"


def last_iterate(run):
    cfg = parse_run_config(run.summary["config"])
    data = load_federated_data(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    model.load_state_dict(torch.load(run.folder / "final_model.pt", weights_only=True))
    acc, loss = score_clients(model, data, cfg.eval_batch_size)
    return fairness_metrics(acc, loss)


lines = []
for setting in ("skewed", "uniform"):
    lines += [f"## {setting}", "", "Every grid point (mean ± std over 5 seeds, %): the validation ā it was selected on, the test ā and W₁₀ reported.", "",
              "| method | hyperparameters | val ā | test ā | test W₁₀ | final-ten ā | final-ten W₁₀ | selected |",
              "|---|---|---:|---:|---:|---:|---:|:---:|"]
    for method in ("fedavg", "fedprox", "scaffold", "federage"):
        rs = [r for r in runs if r.setting == setting and r.method == method]
        best, by_variant = report.best_variant(rs)
        for variant, group in sorted(by_variant.items()):
            s = [r.summary for r in group]
            cells = [pct([x["val_mean_acc"] for x in s]), pct([x["mean_acc"] for x in s]),
                     pct([x["worst10_acc"] for x in s]), pct([x["final10_mean_acc"] for x in s]),
                     pct([x["final10_worst10_acc"] for x in s])]
            lines.append(f"| {method} | {variant.replace(',', ', ')} | " + " | ".join(cells) + f" | {'✓' if variant == best else ''} |")
    rs = [r for r in runs if r.setting == setting and r.method == "federage"]
    best, by_variant = report.best_variant(rs)
    last = [last_iterate(r) for r in by_variant[best]]
    lines += ["", f"FedeRage's selected point ({best.replace(',', ', ')}) scored on its last iterate θ̂_300 "
              f"(final_model.pt) instead of the averaged iterate: ā {pct([m['mean_acc'] for m in last])}, "
              f"W₁₀ {pct([m['worst10_acc'] for m in last])}, σ_c {pct([m['std_acc'] for m in last])}.", ""]
print("\n".join(lines))
