"""Seeded metrics of every registered method on the digits preset (3 rounds), recorded
before the "one contract per method" redesign; ``tests/test_golden.py`` checks that the
code still gives them.

    python -m tests.golden.record            # rewrites tests/golden/methods.json

What is kept per run: each round's sampled partitions, train loss and the strategy's
diagnostics (timings left out), the final per-client accuracies and the central accuracy,
and the final global model (its sha256, for bit-identity, and 16 fixed random projections
of it in float64, for a 1e-6 comparison).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).with_name("methods.json")
PRESET = {
    "dataset": "digits", "model": "mlp", "partitioner": "dirichlet", "dirichlet-alpha": 0.1,
    "num-clients": 20, "fraction-train": 0.25, "num-server-rounds": 3, "local-epochs": 1,
    "batch-size": 16, "lr": 0.1, "eval-every": 0, "seed": 0, "checkpoint-every": 0,
}
# Variants beyond each method's defaults: settings that reach code paths the defaults do not.
VARIANTS = {
    "fedpcd-tau0.5": {"method": "fedpcd", "fedpcd-tau": 0.5},
    "fedpcd-ema": {"method": "fedpcd", "fedpcd-normalize": "ema", "fedpcd-history": 2},
    "ditto-craft": {"method": "ditto", "ditto-aggregator": "craft"},
    "craft-flat": {"method": "craft", "craft-layerwise": False},
    "fedavg-skewed": {"method": "fedavg", "participation": "skewed"},
    # hostile clients and defences: an attack mod, the update clip, central DP, Krum's f
    "fedavg-scale-attack-clip": {"method": "fedavg", "attack": "scale", "attack-fraction": 0.2, "update-clip": 2.0},
    "federage-loss-lie-dp": {"method": "federage", "attack": "loss-lie", "attack-clients": "3,7", "dp": "adaptive",
                             "dp-noise-multiplier": 0.2, "dp-clipping-norm": 0.5},
    "krum-label-flip": {"method": "krum", "krum-num-malicious": 1, "attack": "label-flip", "attack-fraction": 0.2},
}
_SKIP = ("seconds",)


def runs() -> dict[str, dict]:
    from strategies import registry

    out = {name: {"method": name} for name in registry.names()}
    out.update(VARIANTS)
    return out


def projections(flat: np.ndarray) -> list[float]:
    rng = np.random.default_rng(12345)
    return (rng.standard_normal((16, flat.size)) @ flat.astype(np.float64)).tolist()


def flat_model(arrays) -> np.ndarray:
    return np.concatenate([a.numpy().ravel() for a in arrays.values()]).astype(np.float32)


def run_one(overrides: dict, out_dir: str) -> dict:
    """One seeded run through the app's round loop on an in-process grid; what it recorded."""
    from tests.golden.harness import run_in_process

    arrays, rounds, summary = run_in_process({**PRESET, **overrides, "output-dir": out_dir})
    flat = flat_model(arrays)
    return {
        "rounds": [
            {
                "sampled": r["sampled"],
                "train_loss": r.get("train_loss"),
                "strategy": {k: v for k, v in r.get("strategy", {}).items() if not any(s in k for s in _SKIP)},
            }
            for r in rounds
        ],
        "client_acc": summary["client_acc"],
        "mean_acc": summary["mean_acc"],
        "central_acc": summary["central_acc"],
        "model_sha256": hashlib.sha256(flat.tobytes()).hexdigest(),
        "model_projections": projections(flat),
    }


def main(argv: list[str]) -> int:
    only = set(argv)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in runs().items():
            if only and name not in only:
                continue
            golden[name] = run_one(overrides, f"{tmp}/{name}")
            print(name, golden[name]["mean_acc"], flush=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
