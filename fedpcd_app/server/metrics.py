"""Per-client fairness metrics (what the papers report)."""

from __future__ import annotations

import math

import numpy as np


def tail_mean(values: np.ndarray, fraction: float, lowest: bool) -> float:
    """Mean of the lowest (or highest) ⌈fraction·N⌉ values (at least one)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    k = max(1, math.ceil(fraction * len(v) - 1e-9))
    return float(v[:k].mean() if lowest else v[-k:].mean())


def jain_index(values: np.ndarray) -> float:
    """(Σa)² / (N·Σa²) ∈ [1/N, 1]; 1 when all clients are equal (also all zero)."""
    a = np.asarray(values, dtype=np.float64)
    sq = float(np.sum(a * a))
    return 1.0 if sq == 0.0 else float(a.sum() ** 2 / (len(a) * sq))


def fairness_metrics(accuracies, losses=None) -> dict[str, float]:
    """Mean, spread (population std), worst/best 10 %, minimum and Jain's index."""
    a = np.asarray(accuracies, dtype=np.float64)
    out = {
        "mean_acc": float(a.mean()),
        "std_acc": float(a.std()),
        "worst10_acc": tail_mean(a, 0.1, lowest=True),
        "best10_acc": tail_mean(a, 0.1, lowest=False),
        "min_acc": float(a.min()),
        "jain": jain_index(a),
    }
    if losses is not None:
        lo = np.asarray(losses, dtype=np.float64)
        out.update({"mean_loss": float(lo.mean()), "max_loss": float(lo.max())})
    return out
