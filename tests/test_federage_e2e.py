"""End to end through the in-process entry point (local engine, worker processes): FedeRage
under Bernoulli availability (an empty round included), SCAFFOLD under skewed availability."""

import csv
import json

import pytest

from fedpcd_app.runtime.simulate import simulate
from fedpcd_app.server.results import read_rounds, read_summary

pytestmark = pytest.mark.slow


def test_federage_bernoulli_with_an_empty_round(tmp_path):
    # seed 3: rounds 1 and 2 draw clients, round 3 draws none (checked in test_sampler's model)
    out = simulate({
        "method": "federage", "num-clients": 6, "fraction-train": 1 / 6, "num-server-rounds": 3,
        "participation": "bernoulli", "availability-rare-choice": "last", "availability-rare-clients": 1,
        "availability-rare-prob": 0.05, "seed": 3, "eval-every": 1, "output-dir": str(tmp_path),
    })
    rounds = read_rounds(out)
    assert [r["sampled"] for r in rounds] == [[0, 1], [2], []]
    assert rounds[2]["num_replies"] == 0 and "strategy" not in rounds[2] and "eval" in rounds[2]
    assert rounds[1]["strategy"]["federage-beta-hat"] > 0.0  # β moved off its start at β_min = 0
    assert rounds[2]["eval"]["client_acc"] == rounds[1]["eval"]["client_acc"]  # the model stayed
    profile = json.loads((out / "availability.json").read_text())
    assert profile["participation"] == "bernoulli" and profile["rare_clients"] == [5]
    assert sum(profile["probabilities"]) == pytest.approx(1.0)
    with open(out / "clients.csv") as fh:
        sampled = {int(r["partition_id"]): int(r["times_sampled"]) for r in csv.DictReader(fh)}
    assert sampled == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0, 5: 0}
    assert read_summary(out)["method"] == "federage"


def test_scaffold_skewed_runs(tmp_path):
    out = simulate({
        "method": "scaffold", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2,
        "participation": "skewed", "availability-rare-choice": "last", "output-dir": str(tmp_path),
    })
    rounds = read_rounds(out)
    assert all(r["num_replies"] == 3 and r["num_dropped"] == 0 for r in rounds)
    assert rounds[1]["strategy"]["scaffold-c-norm"] > 0
    assert read_summary(out)["mean_acc"] > 0.0
