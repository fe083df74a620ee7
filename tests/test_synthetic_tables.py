"""scripts/synthetic_tables.py: the q-FFL paper's statistics, divergence flags, the report's
selection under the sweep's declared rules (validation only, the majority rule, ties to the
interior), and one iterate per table."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("synthetic_tables", ROOT / "scripts" / "synthetic_tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)


def _value(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def make_run(root: Path, method: str, variant: str, seed: int, acc, val: float | None = None,
             losses=(2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.7), train_loss: float = 0.5, iterate: str = "averaged",
             eval_accs=None, **summary_keys) -> Path:
    folder = root / "default" / method / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    grid = {k: _value(v) for k, v in (kv.split("=") for kv in variant.split(","))} if variant != "base" else {}
    (folder / "run.json").write_text(json.dumps({"setting": "default", "method": method, "variant": variant,
                                                 "grid": grid, "seed": seed, "overrides": {}}))
    a = np.asarray(acc, dtype=float)
    summary = {"method": method, "seed": seed, "mean_acc": float(a.mean()), "std_acc": float(a.std()),
               "worst10_acc": 0.0, "best10_acc": 1.0, "mean_loss": losses[-1], "client_acc": a.tolist(),
               "scored_iterate": iterate}
    if val is not None:
        summary["val_mean_acc"] = val
    summary.update(summary_keys)
    (folder / "summary.json").write_text(json.dumps(summary))
    with open(folder / "rounds.jsonl", "w") as fh:
        for i, lo in enumerate(losses):
            ev = {"mean_loss": lo, **({"client_acc": [eval_accs[i]] * 3} if eval_accs else {})}
            fh.write(json.dumps({"round": i + 1, "train_loss": train_loss, "eval": ev}) + "\n")
    return folder


def test_paper_statistics_match_the_authors_definitions():
    acc = np.linspace(0.0, 1.0, 25)  # 25 clients: floor(2.5) = 2 in each tail
    s = tables.paper_stats(acc)
    assert s["average"] == pytest.approx(100 * acc.mean())
    assert s["worst10"] == pytest.approx(100 * acc[:2].mean())
    assert s["best10"] == pytest.approx(100 * acc[-2:].mean())
    assert s["variance"] == pytest.approx(np.var(acc) * 1e4)


def test_divergence_reasons(tmp_path):
    ok = make_run(tmp_path, "a", "base", 0, [0.5, 0.7, 0.9])
    nan = make_run(tmp_path, "b", "base", 0, [0.5, 0.7, 0.9], train_loss=math.nan)
    stall = make_run(tmp_path, "c", "base", 0, [0.5, 0.7, 0.9], losses=(2.0, 1.0, 2.1, 2.2, 2.3, 2.4, 2.5))
    chance = make_run(tmp_path, "d", "base", 0, [0.05, 0.1, 0.1])
    runs = {r.folder: r for r in tables.load_runs(tmp_path)}
    assert tables.divergence(runs[ok]) == ""
    assert "train_loss not finite" in tables.divergence(runs[nan])
    assert "first evaluation" in tables.divergence(runs[stall])
    assert "chance" in tables.divergence(runs[chance])


def test_a_run_marked_incomplete_is_diverged_as_report_reads_it(tmp_path):
    # the server stopped the run (complete: false): never scored, whatever its losses say
    folder = make_run(tmp_path, "a", "base", 0, [0.5, 0.7, 0.9])
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(complete=False, incomplete_reason="diverged at round 6: the train loss was at chance level")
    (folder / "summary.json").write_text(json.dumps(summary))
    run = tables.load_runs(tmp_path)[0]
    assert tables.divergence(run).startswith("diverged at round 6")


def test_a_rising_loss_with_rising_accuracy_is_not_divergence(tmp_path):
    # FedAvg's long Synthetic runs: the mean test loss ends above its first evaluation (over-confident
    # on the clients it gets wrong) while the mean accuracy climbed from 20 % to 50 %
    losses = (2.0, 1.9, 2.1, 2.2, 2.3, 2.4, 2.5)
    rising = make_run(tmp_path, "a", "base", 0, [0.4, 0.5, 0.6], losses=losses,
                      eval_accs=(0.2, 0.3, 0.4, 0.45, 0.5, 0.5, 0.5))
    flat = make_run(tmp_path, "b", "base", 0, [0.4, 0.5, 0.6], losses=losses,
                    eval_accs=(0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3))
    runs = {r.folder: r for r in tables.load_runs(tmp_path)}
    assert tables.divergence(runs[rising]) == ""
    assert "first evaluation" in tables.divergence(runs[flat])


FAILED = {"complete": False, "incomplete_reason": "diverged at round 150: the train loss was at chance level"}


def test_a_minority_failed_point_stays_selectable_and_a_majority_makes_it_unstable(tmp_path):
    # lr=0.1: 1 of 3 seeds failed (counted at its last validation evaluation, 0.5): (0.95 + 0.95 + 0.5) / 3 = 0.8
    # beats lr=0.03's 0.75; lr=0.3: 2 of 3 failed, unstable whatever it scores
    for seed in (0, 1, 2):
        make_run(tmp_path, "fedavg", "lr=0.01", seed, [0.6, 0.7, 0.8], val=0.7)
        make_run(tmp_path, "fedavg", "lr=0.03", seed, [0.6, 0.7, 0.8], val=0.75)
        make_run(tmp_path, "fedavg", "lr=0.1", seed, [0.9, 0.9, 0.9], val=0.5 if seed == 2 else 0.95,
                 **(FAILED if seed == 2 else {}))
        make_run(tmp_path, "fedavg", "lr=0.3", seed, [0.9, 0.9, 1.0], val=0.99, **(FAILED if seed else {}))
    rows, _, iterate = tables.build(tmp_path, all_points=True)
    by = {r["variant"]: r for r in rows}
    assert [r["variant"] for r in rows if r["chosen"]] == ["lr=0.1"]
    assert by["lr=0.1"]["selected_on"] == "validation"
    assert by["lr=0.1"]["diverged"] == 1 and not by["lr=0.1"]["unstable"]
    assert len(by["lr=0.1"]["stats"]["average"]) == 3  # its failed seed's recorded numbers, as the report
    assert by["lr=0.3"]["diverged"] == 2 and by["lr=0.3"]["unstable"] and by["lr=0.3"]["stats"]["average"] == []
    text = tables.markdown(rows, iterate)
    assert "diverged (2/3)" in text and "Failed seeds counted at their last evaluation" in text
    assert "fedavg [lr=0.1] (1/3): diverged at round 150" in text
    assert iterate == "averaged"


def test_an_exact_tie_goes_to_the_interior_point(tmp_path):
    # lr=0.01 (the edge, first in order) and lr=0.03 (interior) score exactly alike on validation
    for seed in (0, 1):
        for lr, val in ((0.01, 0.8), (0.03, 0.8), (0.1, 0.7)):
            make_run(tmp_path, "fedavg", f"lr={lr}", seed, [0.6, 0.7, 0.8], val=val)
    rows, _, _ = tables.build(tmp_path)
    assert [r["variant"] for r in rows if r["chosen"]] == ["lr=0.03"]


def test_the_test_split_never_feeds_selection(tmp_path):
    # lr=0.1 is at chance on the test split but not on validation, and the run finished normally: selected, flagged
    for seed in (0, 1):
        make_run(tmp_path, "fedavg", "lr=0.01", seed, [0.6, 0.7, 0.8], val=0.7)
        make_run(tmp_path, "fedavg", "lr=0.03", seed, [0.6, 0.7, 0.8], val=0.75)
        make_run(tmp_path, "fedavg", "lr=0.1", seed, [0.05, 0.1, 0.1], val=0.9)
    rows, diverged, iterate = tables.build(tmp_path)
    by = {r["variant"]: r for r in rows}
    assert by["lr=0.1"]["chosen"] and by["lr=0.1"]["flagged"] == 2 and by["lr=0.1"]["diverged"] == 0
    assert "Flagged on the test split" in tables.markdown(rows, iterate)


def write_manifest(root: Path, tuning_table: dict) -> None:
    """A sweep.json as the sweep writes it: its runs and its source (the declared [tuning] rules)."""
    runs = [json.loads(p.read_text()) | {"folder": str(p.parent.relative_to(root))} for p in root.rglob("run.json")]
    (root / "sweep.json").write_text(json.dumps({"name": "t", "runs": runs, "source": {"tuning": tuning_table}}))


@pytest.mark.parametrize("objective", ["mean", "worst10"])
def test_selection_equals_the_reports_on_a_sweep(tmp_path, objective):
    """The CSV's ``selected`` equals report.csv's on the same sweep folder, under its declared rules: a minority
    failure kept, a majority failure unstable, an exact tie to the interior, both objectives."""
    from fedpcd_app.analysis import report

    def run(method, variant, seed, val, worst, **keys):
        make_run(tmp_path, method, variant, seed, [0.5, 0.7, 0.9], val=val, val_worst10_acc=worst,
                 weighting="data-size", **keys)

    for seed in range(3):
        # fedavg: mean best at lr 0.1 despite a failed seed; worst-10 % best at lr 0.3 (edge), lr 0.03 unstable
        for lr, val, worst in ((0.01, 0.70, 0.30), (0.03, 0.90, 0.50), (0.1, 0.80, 0.40), (0.3, 0.60, 0.45)):
            keys = FAILED if (lr == 0.1 and seed == 0) or (lr == 0.03 and seed < 2) else {}
            run("fedavg", f"lr={lr}", seed, val - 0.05 * (lr == 0.1 and seed == 0), worst, **keys)
        # fedpcd: two keys, an exact tie between tau 0.01 (edge) and 0.02 (interior) under both objectives
        for tau, lr, val, worst in ((0.01, 0.1, 0.85, 0.45), (0.02, 0.1, 0.85, 0.45), (0.05, 0.1, 0.80, 0.40),
                                    (0.02, 0.03, 0.70, 0.50), (0.02, 0.3, 0.60, 0.20)):
            run("fedpcd", f"fedpcd-tau={tau},lr={lr}", seed, val, worst)
    write_manifest(tmp_path, {"budget": 4, "unstable": "majority", "failed-seed-score": "last",
                              "objective": objective})
    _, csv_path = report.report(tmp_path)
    import csv

    theirs = {(r["method"], r["hyperparameters"]): r["selected"] for r in csv.DictReader(open(csv_path))}
    ours_path = tmp_path / "stats.csv"
    assert tables.main([str(tmp_path), "--csv", str(ours_path)]) == 0
    ours = {(r["method"], r["hyperparameters"]): r["selected"] for r in csv.DictReader(open(ours_path))}
    assert ours == theirs
    chosen = sorted(k for k, v in ours.items() if v == "1")
    want = {"mean": [("fedavg", "lr=0.1"), ("fedpcd", "fedpcd-tau=0.02,lr=0.1")],
            "worst10": [("fedavg", "lr=0.3"), ("fedpcd", "fedpcd-tau=0.02,lr=0.03")]}[objective]
    assert chosen == want
    assert {r["objective"] for r in csv.DictReader(open(ours_path))} == {objective}
    # --objective replaces the declared one, as report --objective does
    other = "worst10" if objective == "mean" else "mean"
    _, csv_other = report.report(tmp_path, objective=other)
    assert tables.main([str(tmp_path), "--csv", str(ours_path), "--objective", other]) == 0
    assert ({(r["method"], r["hyperparameters"]): r["selected"] for r in csv.DictReader(open(ours_path))}
            == {(r["method"], r["hyperparameters"]): r["selected"] for r in csv.DictReader(open(csv_other))})


def test_refuses_to_mix_iterates(tmp_path):
    make_run(tmp_path, "fedavg", "base", 0, [0.5, 0.6, 0.7], iterate="last")
    make_run(tmp_path, "federage", "base", 0, [0.5, 0.6, 0.7], iterate="averaged")
    with pytest.raises(SystemExit, match="different iterates"):
        tables.build(tmp_path, all_points=False)


def test_project_qffl_step_is_the_authors_aggregate2():
    """strategies.qffl.qffl_step (this project's q-FFL) against the authors' aggregate2 as
    scripts/qffl_reference.py re-implements it: the same step for q = 0, 1, 2 (L = 1/lr)."""
    import torch

    from strategies.qffl import qffl_step

    spec = importlib.util.spec_from_file_location("qffl_reference", ROOT / "scripts" / "qffl_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    rng = np.random.default_rng(0)
    diffs = rng.normal(size=(10, 610)) * 0.3
    losses = rng.uniform(0.1, 3.0, size=10)
    for q in (0.0, 1.0, 2.0):
        ours, _ = qffl_step(torch.tensor(diffs), torch.tensor(losses), q, 1.0 / 0.1)
        np.testing.assert_allclose(ours.numpy(), ref.authors_step(diffs, losses, q, 0.1), rtol=1e-9)
    # q = 0: the uniform mean of the local models
    np.testing.assert_allclose(ref.authors_step(diffs, losses, 0.0, 0.1), diffs.mean(axis=0), rtol=1e-12)


def test_csv_holds_every_configuration_with_selected_weighting_and_edge(tmp_path):
    # three lr values: 0.03 is best on validation (interior); the markdown shows it alone
    for seed in (0, 1):
        for lr, val in ((0.01, 0.6), (0.03, 0.8), (0.1, 0.7)):
            folder = make_run(tmp_path, "fedavg", f"lr={lr}", seed, [0.5, 0.6, 0.7], val=val)
            labels = json.loads((folder / "run.json").read_text())
            (folder / "run.json").write_text(json.dumps({**labels, "grid": {"lr": lr}}))  # numeric, as the sweep
    out_csv = tmp_path / "t.csv"
    assert tables.main([str(tmp_path), "--csv", str(out_csv)]) == 0
    import csv

    rows = list(csv.DictReader(open(out_csv)))
    assert [(r["hyperparameters"], r["selected"], r["on_edge"]) for r in rows] == [
        ("lr=0.01", "0", "1"), ("lr=0.03", "1", "0"), ("lr=0.1", "0", "1")]
    assert {r["weighting"] for r in rows} == {"data-size"}
    every, _, iterate = tables.build(tmp_path, all_points=False)
    shown = [r for r in every if r["shown"]]
    text = tables.markdown(shown, iterate)
    assert "| fedavg | data-size | lr=0.03 ★ |" in text and "lr=0.01" not in text and "⚠ edge" not in text
    # the best on the edge: marked
    for folder in tmp_path.rglob("summary.json"):
        if "lr=0.1" in str(folder):
            s = json.loads(folder.read_text())
            folder.write_text(json.dumps({**s, "val_mean_acc": 0.9}))
    every, _, iterate = tables.build(tmp_path)
    text = tables.markdown([r for r in every if r["chosen"]], iterate)
    assert "lr=0.1 ★ ⚠ edge" in text and "selections on the edge of the grid tried" in text


def test_mixed_weightings_without_both_fedavgs_are_refused(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path, "fedavg", "base", seed, [0.5, 0.6, 0.7])
        make_run(tmp_path, "federage", "base", seed, [0.6, 0.6, 0.7])  # registered: uniform averaging
    with pytest.raises(SystemExit, match="different weightings .data-size, uniform. without FedAvg under "
                                         "fedavg-weighting = 'uniform'"):
        tables.main([str(tmp_path)])
    assert tables.main([str(tmp_path), "--mixed-weightings"]) == 0


def test_frontier_draws_every_configuration_with_the_chosen_one_selected(tmp_path, monkeypatch):
    # the page's frontier.png: every grid point (not only the chosen one), chosen = selected, an unstable point unscored
    from fedpcd_app.analysis import figures

    for seed in (0, 1):
        make_run(tmp_path, "fedavg", "lr=0.01", seed, [0.5, 0.6, 0.7], val=0.6)
        make_run(tmp_path, "fedavg", "lr=0.03", seed, [0.6, 0.7, 0.8 + 0.1 * seed], val=0.8)
        make_run(tmp_path, "fedavg", "lr=0.1", seed, [0.9, 0.9, 0.9], val=0.95, **FAILED)  # unstable: both failed
    seen = {}
    monkeypatch.setattr(figures, "configurations_frontier", lambda rows, path: seen.update(rows=rows, path=path))
    assert tables.main([str(tmp_path), "--frontier", str(tmp_path / "f.png")]) == 0
    rows = {r["hyperparameters"]: r for r in seen["rows"]}
    assert set(rows) == {"lr=0.01", "lr=0.03", "lr=0.1"} and seen["path"] == tmp_path / "f.png"
    assert [rows[k]["selected"] for k in ("lr=0.01", "lr=0.03", "lr=0.1")] == ["0", "1", "0"]
    # the validation split (issue 52: the numbers selection reads, never a front chosen on the test split)
    assert float(rows["lr=0.03"]["val_mean_acc_mean"]) == pytest.approx(0.8)
    assert "mean_acc_mean" not in rows["lr=0.03"]
    assert rows["lr=0.1"]["val_mean_acc_mean"] == ""  # unstable (every seed failed): not scored, not drawn
