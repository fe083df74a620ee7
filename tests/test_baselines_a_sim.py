"""End-to-end: each baseline of part A runs 2 rounds through Flower's simulation."""

import math

import pytest

from fedpcd_app.results import read_rounds, read_summary
from fedpcd_app.simulate import simulate

METHODS_AND_DIAGNOSTICS = [
    ("qffl", "qffl-sum-h"),
    ("afl", "afl-lambda"),
    ("fedmgda", "fedmgda-lambda"),
    ("fedfv", "fedfv-internal-projections"),
    ("fednova", "fednova-tau-eff"),
    ("fedavgm", "update-norm"),
    ("fedadam", "update-norm"),
    ("fedyogi", "update-norm"),
    ("fedadagrad", "update-norm"),
]


# LEAD: runs through the app loop, left to you. qffl, afl, fedmgda, fedfv need nothing from the app
# beyond registry.build (AFL's λ has N = num-clients entries, passed by build as num_clients).
@pytest.mark.slow
@pytest.mark.parametrize(("method", "diagnostic"), METHODS_AND_DIAGNOSTICS)
def test_two_rounds(method, diagnostic, tmp_path):
    out = simulate({
        "method": method, "num-server-rounds": 2, "num-clients": 6, "fraction-train": 0.5,
        "eval-every": 1, "output-dir": str(tmp_path / method),
    })
    rounds = read_rounds(out)
    summary = read_summary(out)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["num_dropped"] == 0 and "aggregation_error" not in r, r
        assert diagnostic in r["strategy"], r["strategy"]
    assert 0.0 <= summary["mean_acc"] <= 1.0 and math.isfinite(summary["mean_loss"])
    if method == "afl":  # λ over all 6 clients, on the simplex, moved by the losses
        lam = rounds[-1]["strategy"]["afl-lambda"]
        assert len(lam) == 6 and abs(sum(lam) - 1.0) < 1e-9 and max(lam) > 1.0 / 6
