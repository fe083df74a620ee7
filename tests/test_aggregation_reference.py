"""The server maths gives the models it gave before it was reworked for speed and memory.

``tests/data/aggregation_reference.npz`` holds, for FedPCD (four settings), CRAFT (three)
and ConFIG, every round's aggregated model on seeded replies, recorded with the code as it
was before the rework (commit 188bf16: FedPCD's (k+1)-row work buffer and geometric cache
growth, CRAFT's three passes per group). The replies are regenerated here from the same
seeds (each round from the recorded model of the round before, so every round is compared
on the same input); their checksum is recorded too, so a changed generator fails loudly
instead of comparing different inputs. Models are compared to 1e-6; the integer diagnostics (active
constraints, cache size, active clients) exactly.

    python -m tests.test_aggregation_reference   # re-record (only when the maths changes on purpose)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedcore.config import load_config
from strategies import registry
from tests.helpers import aggregate_round, make_replies

DATA = Path(__file__).with_name("data") / "aggregation_reference.npz"
SHAPES = {"fc1.weight": (40, 30), "fc1.bias": (40,), "fc2.weight": (10, 40), "fc2.bias": (10,)}
CASES = {  # name -> run-config overrides
    "fedpcd": {"method": "fedpcd"},
    "fedpcd-tau0.5": {"method": "fedpcd", "fedpcd-tau": 0.5, "fedpcd-history": 3},
    "fedpcd-ema": {"method": "fedpcd", "fedpcd-normalize": "ema", "fedpcd-history": 2, "fedpcd-tau": 0.3},
    "fedpcd-bf16": {"method": "fedpcd", "fedpcd-cache-dtype": "bfloat16", "fedpcd-tau": 0.3},
    "craft": {"method": "craft"},
    "craft-flat-uniform": {"method": "craft", "craft-layerwise": False, "craft-rho": "uniform"},
    "craft-tol": {"method": "craft", "craft-tol": 0.05},
    "config-fl": {"method": "config-fl"},
}
ROUNDS, CLIENTS, PER_ROUND, LR = 6, 12, 5, 0.1


def template() -> ArrayRecord:
    return ArrayRecord({k: Array(np.zeros(s, dtype=np.float32)) for k, s in SHAPES.items()})


def plan(seed: int = 7):
    """Per round: sampled clients, their sizes and update offsets (drift + client part, with
    one client pulling against the others so that constraints and conflicts occur)."""
    rng = np.random.default_rng(seed)
    d = sum(int(np.prod(s)) for s in SHAPES.values())
    theta0 = rng.normal(size=d).astype(np.float32)
    client_dir = rng.normal(size=(CLIENTS, d))
    rounds = []
    for _ in range(ROUNDS):
        pids = sorted(rng.choice(CLIENTS, size=PER_ROUND, replace=False).tolist())
        drift = rng.normal(size=d)
        offsets = []
        for j, pid in enumerate(pids):
            g = drift + 0.8 * client_dir[pid] + 0.3 * rng.normal(size=d)
            if j == 0:
                g = -1.5 * g + drift  # a conflicting client
            if pid % 5 == 4:
                g[:1240] *= 0.01  # small on the first layer group (craft-tol = 0.05 turns it off there)
            offsets.append(LR * 0.05 * g)
        sizes = rng.integers(10, 80, size=PER_ROUND).tolist()
        rounds.append((pids, offsets, sizes))
    return theta0, rounds


def run(overrides: dict, inputs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(models (ROUNDS, d) float32, integer diagnostics (ROUNDS, 3), checksum of the replies'
    offsets). Round t starts from ``inputs[t - 2]`` when given (the recorded model of the round
    before), else from the run's own previous model."""
    theta0, rounds = plan()
    tmpl = template()
    strat = registry.build(load_config({"lr": LR, "num-clients": CLIENTS, **overrides}))
    theta, models, ints, digest = theta0.astype(np.float64), [], [], hashlib.sha256(theta0.tobytes())
    for rnd, (pids, offsets, sizes) in enumerate(rounds, start=1):
        if inputs is not None and rnd > 1:
            theta = inputs[rnd - 2].astype(np.float64)
        digest.update(np.asarray([*pids, *sizes]).tobytes())
        for o in offsets:
            digest.update(o.tobytes())
        locals_ = [theta.astype(np.float32) - o.astype(np.float32) for o in offsets]
        replies = make_replies(tmpl, locals_, pids, n=sizes)
        theta, metrics = aggregate_round(strat, rnd, theta, tmpl, replies)
        models.append(theta.astype(np.float32))
        ints.append([int(metrics.get(k, -1)) for k in ("fedpcd-active", "fedpcd-cache-size", "craft-active")])
    return np.stack(models), np.asarray(ints), digest.hexdigest()


def record() -> None:
    out = {}
    for name, overrides in CASES.items():
        models, ints, digest = run(overrides)
        out[f"{name}/models"], out[f"{name}/ints"], out[f"{name}/replies"] = models, ints, np.asarray(digest)
    DATA.parent.mkdir(exist_ok=True)
    np.savez_compressed(DATA, **out)


RECORDED = np.load(DATA) if DATA.exists() else None


@pytest.mark.parametrize("name", sorted(CASES))
def test_aggregated_models_unchanged(name):
    assert RECORDED is not None, f"{DATA} missing: python -m tests.test_aggregation_reference"
    models, ints, digest = run(CASES[name], RECORDED[f"{name}/models"])  # each round from the recorded input
    assert digest == str(RECORDED[f"{name}/replies"]), "the replies differ from the recorded ones"
    np.testing.assert_array_equal(ints, RECORDED[f"{name}/ints"])
    np.testing.assert_allclose(models, RECORDED[f"{name}/models"], rtol=1e-6, atol=1e-6)


def test_reference_cases_reach_the_interesting_paths():
    """The recorded runs are not all trivial: FedPCD corrects, CRAFT drops clients by tol."""
    assert RECORDED is not None
    assert RECORDED["fedpcd-tau0.5/ints"][:, 0].max() > 0  # active constraints
    assert RECORDED["fedpcd-bf16/ints"][:, 0].max() > 0
    assert RECORDED["fedpcd/ints"][-1, 1] > PER_ROUND  # cached entries from earlier rounds
    tol, plain = RECORDED["craft-tol/models"], RECORDED["craft/models"]
    assert np.abs(tol - plain).max() > 1e-4  # clients inactive in a group changed the result


if __name__ == "__main__":
    record()
    sys.exit(0)
