"""scripts/make_page.py: one command regenerates a results page from its sweep output (every selection
and iterate, the paired CSVs, the declared families, the figures per setting), then checks its words."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.helpers import make_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import make_page  # noqa: E402

PAGE = """# A page

<!-- generated: result -->
<!-- /generated: result -->

<!-- generated: result-averaged -->
<!-- /generated: result-averaged -->

{claim}

<!-- generated: paired -->
<!-- /generated: paired -->
"""


def test_block_replaces_a_generated_block_and_refuses_a_missing_one():
    text = "a\n<!-- generated: x -->\nold\n<!-- /generated: x -->\nb\n"
    assert make_page.block(text, "x", "new") == "a\n<!-- generated: x -->\nnew\n<!-- /generated: x -->\nb\n"
    with pytest.raises(ValueError, match="no block <!-- generated: y -->"):
        make_page.block(text, "y", "new")


@pytest.fixture
def sweep_out(tmp_path):
    """FedAvg and FedPCD (two lr each), six paired seeds, runs scored on the averaged iterate that
    also hold their last one; the sweep declares iterate = "last" and FedPCD − FedAvg primary."""
    out = tmp_path / "out"
    runs = []
    for seed in range(6):
        for method, lrs in (("fedavg", (0.03, 0.1)), ("fedpcd", (0.03, 0.1))):
            for lr in lrs:
                good = lr == 0.1
                bonus = 0.05 + 0.004 * (seed % 3 - 1) if method == "fedpcd" else 0.0  # +5.00 pp, with spread
                base = 0.6 + bonus + 0.01 * seed + (0.02 if good else 0.0)
                last = [base + 0.03, base + 0.01, base - 0.02]  # the last iterate: higher than the average
                avg = [base, base - 0.01, base - 0.05]
                folder = make_run(out, "default", method, seed, avg, grid={"lr": lr}, registered=method,
                                  summary={"scored_iterate": "averaged", "val_mean_acc": sum(avg) / 3,
                                           "val_worst10_acc": min(avg),
                                           "iterate_scores": {"last": {"mean_acc": sum(last) / 3,
                                                                       "val_mean_acc": sum(last) / 3,
                                                                       "val_worst10_acc": min(last),
                                                                       "worst10_acc": min(last),
                                                                       "std_acc": 0.02, "client_acc": last}}})
                runs.append({"setting": "default", "method": method, "folder": str(folder.relative_to(out))})
    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "t"\n[tuning]\nbudget = 2\niterate = "last"\nequivalence-margin = 0.01\n'
                     '[[tuning.primary]]\ncompare = ["fedpcd", "fedavg"]\nmetrics = ["mean_acc"]\n'
                     '[[methods]]\nname = "fedavg"\nmethod = "fedavg"\n[[methods]]\nname = "fedpcd"\n'
                     'method = "fedpcd"\n')
    (out / "sweep.json").write_text(json.dumps({"name": "t", "source": {"tuning": {"budget": 2, "iterate": "last"}},
                                                "runs": runs}))
    return out, sweep


def test_one_command_regenerates_the_page_and_checks_its_words(sweep_out, tmp_path):
    out, sweep = sweep_out
    recipe = make_page.Recipe(str(sweep), str(out), ("fedavg",), ("mean",), ("last", "averaged"))
    page = tmp_path / "page"
    page.mkdir()
    (page / "report.md").write_text(PAGE.format(claim="FedPCD − FedAvg: +5.00 pp ā, significant."))
    problems = make_page.make("t", out, True, page, recipe)
    assert problems == []  # the claim holds on the last iterate's rows
    names = sorted(p.name for p in page.iterdir())
    assert {"report.csv", "report_averaged.csv", "report_paired_vs_fedavg.csv", "report_paired_averaged_vs_fedavg.csv",
            "forest.png", "forest_averaged.png", "pareto.png"} <= set(names)
    text = (page / "report.md").read_text()
    assert "Scored: the last global model θ_T" in text and "Scored: the averaged iterate θ̄_T" in text
    rows = list(csv.DictReader(open(page / "report_paired_vs_fedavg.csv")))
    mean = next(r for r in rows if r["metric"] == "mean_acc")
    assert mean["iterate"] == "last" and mean["comparison_family"] == "primary"
    averaged = next(r for r in csv.DictReader(open(page / "report_paired_averaged_vs_fedavg.csv"))
                    if r["metric"] == "mean_acc")
    assert averaged["comparison_family"] == "exploratory"  # the other iterate: not the declared selection
    # a sentence the new rows no longer support is reported by the same command
    (page / "report.md").write_text(PAGE.format(claim="FedPCD − FedAvg: +4.00 pp ā, significant."))
    problems = make_page.make("t", out, True, page, recipe)
    assert len(problems) == 1 and "+4.00 pp" in problems[0]
