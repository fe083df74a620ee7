"""The robustness table (fedpcd_app.analysis.robustness) from fake sweep folders: honest clients' means
and stds per method and attack, the shared honest clients checked, placeholders, incomplete runs."""

import csv
import json
import statistics

import pytest

from fedpcd_app.analysis import robustness
from fedpcd_app.server.metrics import fairness_metrics
from tests.helpers import make_run

ATTACKED = {0: [0, 1], 1: [2, 3]}  # per seed


def honest_run(out, setting, method, seed, acc, *, attacked=None, complete=True):
    attacked = ATTACKED[seed] if attacked is None else attacked
    honest = fairness_metrics([a for i, a in enumerate(acc) if i not in attacked])
    return make_run(out, setting, method, seed, acc, summary={
        "attacked_partitions": attacked, "honest": honest, "complete": complete})


@pytest.fixture
def sweep(tmp_path):
    acc = {("no-attack", "fedavg"): 0.9, ("scale", "fedavg"): 0.3, ("no-attack", "krum"): 0.85,
           ("scale", "krum"): 0.8}
    for (setting, method), a in acc.items():
        for seed in (0, 1):
            honest_run(tmp_path, setting, method, seed, [0.0, 0.0, 0.0, 0.0] + [a + 0.02 * seed] * 4 + [a - 0.1])
    runs = [{"setting": s, "method": m, "folder": f"{s}/{m}/base/seed{k}"}
            for s in ("no-attack", "scale") for m in ("fedavg", "krum") for k in (0, 1)]
    (tmp_path / "sweep.json").write_text(json.dumps({"name": "rob", "runs": runs}))
    return tmp_path


def test_table_gives_the_honest_clients_mean_and_worst_per_attack(sweep, tmp_path):
    assert robustness.main([str(sweep), "--out", str(tmp_path / "doc"), "--placeholder", "fedpcd+outlier"]) == 0
    text = (tmp_path / "doc" / "robustness.md").read_text()
    # FedAvg under "scale", seed 0: honest clients 2..8 hold 0, 0, 0.3 x4, 0.2 → mean 1.4/7
    mean0 = statistics.mean([0.0, 0.0, 0.3, 0.3, 0.3, 0.3, 0.2])
    mean1 = statistics.mean([0.0, 0.0, 0.32, 0.32, 0.32, 0.32, 0.2])  # seed 1: clients 0, 1, 4..8
    row = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    assert f"{100 * statistics.mean([mean0, mean1]):.2f} ± {100 * statistics.stdev([mean0, mean1]):.2f}" in row
    assert "| fedpcd+outlier | — | — |" in text
    assert text.count("| method | no-attack | scale |") == 2  # mean and worst-10 % tables
    rows = list(csv.DictReader(open(tmp_path / "doc" / "robustness.csv")))
    assert {(r["method"], r["setting"], r["metric"]) for r in rows} == {
        (m, s, k) for m in ("fedavg", "krum") for s in ("no-attack", "scale") for k in ("mean_acc", "worst10_acc")}
    assert (tmp_path / "doc" / "robustness.png").stat().st_size > 1000


def edit_summary(sweep, folder: str, **changes) -> None:
    path = sweep / folder / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_incomplete_runs_are_marked(sweep):
    edit_summary(sweep, "scale/krum/base/seed1", complete=False)
    settings, methods, cells = robustness.collect(sweep)
    text = robustness.to_markdown("t", settings, methods, cells, [])
    assert [line.count("†") for line in text.splitlines() if line.startswith("| krum |")] == [1, 1]


def test_runs_of_one_seed_must_share_their_attackers(sweep):
    edit_summary(sweep, "scale/krum/base/seed0", attacked_partitions=[5])
    with pytest.raises(robustness.RobustnessError, match="differ"):
        robustness.collect(sweep)


def test_a_run_without_honest_metrics_is_refused(tmp_path):
    make_run(tmp_path, "scale", "fedavg", 0, [0.5] * 4)
    assert robustness.main([str(tmp_path)]) == 2
