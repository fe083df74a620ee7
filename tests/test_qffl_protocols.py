"""scripts/qffl_protocols.py: the q-FFL page's paired differences, drift, heavy tail and the
paper's quoted row, each checked against a computation written out here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from client_app.data import synthetic

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("qffl_protocols", ROOT / "scripts" / "qffl_protocols.py")
qp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qp)


def make_run(root: Path, method: str, seed: int, acc, curve, synthetic_seed: int = 7) -> None:
    folder = root / "default" / method / "base" / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"setting": "default", "method": method, "variant": "base",
                                                 "grid": {}, "seed": seed, "overrides": {}}))
    a = np.asarray(acc, dtype=float)
    (folder / "summary.json").write_text(json.dumps({
        "method": "qffl", "seed": seed, "mean_acc": float(a.mean()), "client_acc": a.tolist(), "rounds": 100,
        "scored_iterate": "last", "mean_loss": 1.0, "config": {"synthetic-seed": synthetic_seed}}))
    with open(folder / "rounds.jsonl", "w") as fh:
        for t, (m, w) in zip((25, 50, 75, 100), curve):
            fh.write(json.dumps({"round": t, "eval": {"mean_acc": m, "worst10_acc": w}}) + "\n")


def test_paired_differences_drift_and_heavy_tail(tmp_path):
    rng = np.random.default_rng(0)
    accs = {(m, s): rng.uniform(0, 1, 20) for m in (qp.Q0, qp.Q1) for s in (1, 2, 3)}
    curve0 = [(0.2, 0.0), (0.3, 0.0), (0.4, 0.05), (0.5, 0.1)]
    curve1 = [(0.1, 0.0), (0.2, 0.0), (0.3, 0.1), (0.45, 0.2)]
    for (m, s), a in accs.items():
        make_run(tmp_path, m, s, a, curve0 if m == qp.Q0 else curve1)
    make_run(tmp_path, qp.Q0, 4, rng.uniform(0, 1, 20), curve0)  # unpaired: counted for q = 0 only
    p = qp.summarise("x", qp.load(tmp_path))
    assert p["both"] == [1, 2, 3] and sorted(p["stats"][qp.Q0]) == [1, 2, 3, 4]
    # the worst-10 % difference, by hand: 2 lowest of 20 clients, in points
    d = np.array([100 * (np.sort(accs[qp.Q1, s])[:2].mean() - np.sort(accs[qp.Q0, s])[:2].mean()) for s in (1, 2, 3)])
    got = p["diffs"]["worst10"]
    assert got["mean"] == pytest.approx(d.mean())
    assert got["half"] == pytest.approx(4.302652729911275 * d.std(ddof=1) / np.sqrt(3))  # t_{0.975, 2}
    assert got["positive"] == int((d > 0).sum()) and got["n"] == 3
    var = np.array([1e4 * (np.var(accs[qp.Q1, s]) - np.var(accs[qp.Q0, s])) for s in (1, 2, 3)])
    assert p["diffs"]["variance"]["mean"] == pytest.approx(var.mean())
    # drift over the last fifth of a 100-round horizon: the evaluation nearest round 80 is round 75
    assert p["drift"][qp.Q0]["mean_acc"] == pytest.approx((100 * (0.5 - 0.4), 75, 100))
    assert p["drift"][qp.Q1]["worst10_acc"] == pytest.approx((100 * (0.2 - 0.1), 75, 100))
    # the heavy tail of draw 7 from the generator's own sizes (20 users here)
    sizes = np.sort([len(y) for y in synthetic.generate(20, 1.0, 1.0, False, 7)[1]])[::-1]
    assert p["draws"] == {7: pytest.approx(sizes[:10].sum() / sizes.sum())}
    text = qp.markdown([p])
    assert "Table 1 (as quoted by secondary sources; not checked against the paper here)" in text
    assert "| 0 | Worst 10 % (%) | 18.8 |" in text and "| 1 | Variance | 472 |" in text
    assert "| Worst 10 % (%) | +12.3 |" in text and "| Variance | -252 |" in text  # the quoted 18.8 → 31.1, 724 → 472
    qp.write_csv([p], tmp_path / "runs.csv")
    rows = (tmp_path / "runs.csv").read_text().splitlines()
    assert len(rows) == 1 + 7 and rows[1].startswith(f"x,{qp.Q0},1,7,100,")
    qp.curves([p], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_user_sizes_are_the_generators_draw():
    xs, ys = synthetic.generate(30, 1.0, 1.0, False, 11)
    np.testing.assert_array_equal(synthetic.user_sizes(30, 11), [len(y) for y in ys])


def test_csv_protocol_and_a_bad_label(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("setting,method,hyperparameters,chosen,selected_on,seeds,diverged,average_mean,average_std,"
                    "worst10_mean,worst10_std,best10_mean,best10_std,variance_mean,variance_std\n"
                    "default,fedavg-q0,base,1,,0 1,0,53.06,5.19,0.0,0.0,99.98,0.04,1365.07,130.39\n")
    text = qp.markdown([qp.from_csv("old", path)])
    assert "| 0 | Average (%) | 80.8 | 53.06 ± 5.19 |" in text and "| 0 | Variance | 724 | 1365 ± 130 |" in text
    assert "| 1 | Average (%) | 79.0 | — |" in text
    d0, d1 = synthetic.data_seed(0, -1), synthetic.data_seed(1, -1)
    share = qp.top_share(synthetic.user_sizes(100, d1))
    assert f"{d0}: " in text and f"{d1}: {100 * share:.1f} %" in text
    with pytest.raises(SystemExit, match="LABEL=FOLDER"):
        qp.main(["--protocol", "no-label-here"])
    with pytest.raises(SystemExit, match="no finished"):
        qp.main(["--protocol", f"empty={tmp_path}"])
