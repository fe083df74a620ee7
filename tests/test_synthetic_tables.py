"""scripts/synthetic_tables.py: the q-FFL paper's statistics, divergence marking, selection on
validation among non-diverged grid points, and one iterate per table."""

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


def make_run(root: Path, method: str, variant: str, seed: int, acc, val: float | None = None,
             losses=(2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.7), train_loss: float = 0.5, iterate: str = "averaged",
             eval_accs=None) -> Path:
    folder = root / "default" / method / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    grid = dict(kv.split("=") for kv in variant.split(",")) if variant != "base" else {}
    (folder / "run.json").write_text(json.dumps({"setting": "default", "method": method, "variant": variant,
                                                 "grid": grid, "seed": seed, "overrides": {}}))
    a = np.asarray(acc, dtype=float)
    summary = {"method": method, "seed": seed, "mean_acc": float(a.mean()), "std_acc": float(a.std()),
               "worst10_acc": 0.0, "best10_acc": 1.0, "mean_loss": losses[-1], "client_acc": a.tolist(),
               "scored_iterate": iterate}
    if val is not None:
        summary["val_mean_acc"] = val
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


def test_selection_skips_grid_points_with_a_diverged_seed(tmp_path):
    # lr=0.1 has the best validation accuracy but one of its seeds diverged: never scored
    for seed in (0, 1):
        make_run(tmp_path, "fedavg", "lr=0.1", seed, [0.9, 0.9, 0.9], val=0.95,
                 train_loss=math.inf if seed == 1 else 0.5)
        make_run(tmp_path, "fedavg", "lr=0.01", seed, [0.6, 0.7, 0.8], val=0.7)
    rows, diverged, iterate = tables.build(tmp_path, all_points=True)
    chosen = [r for r in rows if r["chosen"]]
    assert [r["variant"] for r in chosen] == ["lr=0.01"]
    assert chosen[0]["selected_on"] == "validation"
    bad = next(r for r in rows if r["variant"] == "lr=0.1")
    assert bad["diverged"] == 1 and bad["stats"]["average"] == []
    assert "diverged (1/2)" in tables.markdown(rows, iterate)
    assert iterate == "averaged"


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
    # the page's frontier.png: every grid point (not only the chosen one), chosen = selected, a diverged point unscored
    from fedpcd_app.analysis import figures

    for seed in (0, 1):
        make_run(tmp_path, "fedavg", "lr=0.01", seed, [0.5, 0.6, 0.7], val=0.6)
        make_run(tmp_path, "fedavg", "lr=0.03", seed, [0.6, 0.7, 0.8 + 0.1 * seed], val=0.8)
        make_run(tmp_path, "fedavg", "lr=0.1", seed, [0.9, 0.9, 0.9], val=0.95, train_loss=math.inf if seed else 0.5)
    seen = {}
    monkeypatch.setattr(figures, "configurations_frontier", lambda rows, path: seen.update(rows=rows, path=path))
    assert tables.main([str(tmp_path), "--frontier", str(tmp_path / "f.png")]) == 0
    rows = {r["hyperparameters"]: r for r in seen["rows"]}
    assert set(rows) == {"lr=0.01", "lr=0.03", "lr=0.1"} and seen["path"] == tmp_path / "f.png"
    assert [rows[k]["selected"] for k in ("lr=0.01", "lr=0.03", "lr=0.1")] == ["0", "1", "0"]
    assert float(rows["lr=0.03"]["mean_acc_mean"]) == pytest.approx(np.mean([0.7, 0.7333333333]))
    assert float(rows["lr=0.03"]["worst10_acc_std"]) == pytest.approx(0.0)  # worst 10 % of 3 clients: 0.6 both seeds
    assert rows["lr=0.1"]["mean_acc_mean"] == ""  # diverged seed: not scored, not drawn
