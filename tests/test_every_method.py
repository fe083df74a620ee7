"""Every registered method, through the app's round loop and the real ClientApp (in process):
its State survives a checkpoint file (torch.load with weights_only=True), and a run resumed
from a round-2 checkpoint ends where the uninterrupted run ends."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from client_app.client_app import app as client_app
from fedcore.config import load_config
from fedcore.state import to_tree
from fedpcd_app.server import checkpoint
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from tests.fakegrid import ClientAppGrid, task_identity

# A diagnostic each method reports every round (rounds.jsonl "strategy").
DIAGNOSTIC = {
    "qffl": "qffl-sum-h", "afl": "afl-lambda", "fedmgda": "fedmgda-lambda", "fedfv": "fedfv-internal-projections",
    "fednova": "fednova-tau-eff", "fedlf": "fedlf-halvings", "fedheal": "fedheal-weights", "fedpw": "fedpw-weights",
    "fedpcd": "fedpcd-active", "craft": "craft-active", "term": "term-weights", "fedfa": "fedfa-weights",
    "adafed": "adafed-rates",
}
BASE = {"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4, "eval-every": 2,
        "checkpoint-every": 2, "seed": 3, "batch-size": 32}


def run(tmp_path, name, method, **extra):
    cfg = load_config({**BASE, "method": method, "output-dir": str(tmp_path / name), **extra})
    with task_identity():
        exp = Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg)
        exp.run()
    return exp


def same_tree(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        # bytes, not values: unused rows of a preallocated buffer may hold NaN bit patterns
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b))


@pytest.mark.slow
@pytest.mark.parametrize("method", registry.names())
def test_state_round_trips_and_a_resumed_run_equals_the_uninterrupted_one(method, tmp_path):
    # Prepare: an uninterrupted 4-round run checkpointing every 2 rounds
    full = run(tmp_path, "full", method)
    # Assert: the state written at round 4 reads back (weights_only) to the same tree
    saved = checkpoint.load(checkpoint.path_for(full.writer.dir, 4))
    assert same_tree(to_tree(saved.strategy), to_tree(full.strategy.state))
    # Execute: a copy holding only the round-2 checkpoint (the run "crashed" after round 2), resumed
    crashed = tmp_path / "crashed"
    shutil.copytree(full.writer.dir, crashed)
    checkpoint.path_for(crashed, 4).unlink()
    resumed = run(tmp_path, "resumed", method, **{"resume-from": str(crashed)})
    # Assert: the same global model bit for bit, the same rounds and (unless the method keeps
    # personal models on the clients, which a checkpoint cannot hold) the same metrics
    for (ka, va), (kb, vb) in zip(full.state.arrays.items(), resumed.state.arrays.items()):
        assert ka == kb and np.array_equal(va.numpy(), vb.numpy()), ka
    ra, rb = read_rounds(full.writer.dir), read_rounds(resumed.writer.dir)
    for r in ra:  # every round aggregated every reply, without error
        assert r["num_dropped"] == 0 and "aggregation_error" not in r and "strategy" in r, r
        assert r["strategy"] and (method not in DIAGNOSTIC or DIAGNOSTIC[method] in r["strategy"]), r["strategy"]
    if method == "afl":  # λ over all 6 clients, on the simplex, moved by the losses
        lam = ra[-1]["strategy"]["afl-lambda"]
        assert len(lam) == 6 and abs(sum(lam) - 1.0) < 1e-9 and max(lam) > 1.0 / 6
    assert [r["round"] for r in rb] == [1, 2, 3, 4]
    assert [r["train_loss"] for r in rb] == [r["train_loss"] for r in ra]
    if not full.strategy.method.personalized:
        a, b = read_summary(full.writer.dir), read_summary(resumed.writer.dir)
        for key in ("mean_acc", "worst10_acc", "jain", "central_acc", "client_acc"):
            assert a[key] == b[key], key
