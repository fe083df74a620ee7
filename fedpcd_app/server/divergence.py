"""A run that went wrong says so: the round loop's last line of defence against divergence.

Replies are validated before any method sees them (non-finite arrays, counts, sizes); this
watches what comes out. The run stops, with one line and a summary saying
``complete: false``, ``incomplete_reason: "diverged at round N: <why>"``, when

1. **the global model becomes non-finite** (NaN or ±Inf in any array after an aggregation):
   at once; the model is rolled back to the last finite one (the round's aggregate is not
   kept), and that is the model scored, saved as ``final_model.pt`` and left in memory;
2. **every reply is refused** for ``diverge-patience`` consecutive rounds: rounds in which
   replies came back and all of them were dropped (a round whose drops are all timeouts or
   lost replies is a federation problem, not a divergence, and neither counts nor resets);
3. **the train loss is non-finite, or at chance level or worse without progress**, for
   ``diverge-patience`` consecutive rounds: the *median* of the round's valid replies' train
   losses (a minority of lying clients cannot move it) is ``>= ln(C)`` (the loss of the
   uniform guess over the model's C classes) and no lower than the best median seen so
   far. A run learning slowly near chance makes a new best most rounds and is not stopped;
   a run that learnt and fell back to chance, or whose loss grows from the start, is.

``diverge-patience = 0`` turns criteria 2 and 3 off; criterion 1 always holds (a non-finite
model can only give non-finite scores). The default, 5 rounds, never fires on the golden or
robustness runs (measured: tests/test_golden.py, docs/results/robustness_digits.md's settings).
No checkpoint is written for the diverged round: the latest one on disk is from before it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from fedcore import keys
from fedcore.config import RunConfig

PATIENCE_KEY = "diverge-patience"
DEFAULT_PATIENCE = 5
PREFIX = "diverged at round"  # contract: summary.json incomplete_reason starts with it
NO_REPLY = "no reply"  # fedcore's reason for a timed-out or lost reply


def num_classes(model: torch.nn.Module) -> int:
    """C: the output width of the model's last linear layer (0 when it has none)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return int(linears[-1].out_features) if linears else 0


def is_finite(arrays) -> bool:
    """Every array of an ArrayRecord (or a mapping of numpy arrays) finite."""
    for value in arrays.values():
        a = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        if a.dtype.kind in "fc" and a.size and not np.isfinite(a).all():
            return False
    return True


class Watch:
    """Counts the rounds of criteria 2 and 3 (see the module docstring)."""

    def __init__(self, cfg: RunConfig, classes: int) -> None:
        self.patience = cfg.get_int(PATIENCE_KEY, DEFAULT_PATIENCE, low=0)
        self.chance = math.log(classes) if classes >= 2 else None
        self.refused_rounds = 0
        self.bad_loss_rounds = 0
        self.best_loss = math.inf

    def observe(self, record: dict[str, Any], valid: Iterable) -> str | None:
        """After a round's aggregation: why the run diverged, or None."""
        if record.get("diverged"):
            return record["diverged"]
        if not self.patience:
            return None
        arrived = [d for d in record.get("dropped", ()) if not str(d.get("reason", "")).startswith(NO_REPLY)]
        if record.get("num_replies", 0) == 0 and arrived:
            self.refused_rounds += 1
        elif record.get("num_replies", 0) > 0:
            self.refused_rounds = 0
        if self.refused_rounds >= self.patience:
            return f"every reply was dropped in {self.refused_rounds} consecutive rounds"
        losses = [float(r.content[keys.METRICS][keys.TRAIN_LOSS]) for r in valid
                  if keys.TRAIN_LOSS in r.content[keys.METRICS]]
        if losses:
            median = float(np.median(losses))
            bad = not math.isfinite(median) or (
                self.chance is not None and median >= self.chance and median >= self.best_loss)
            if math.isfinite(median):
                self.best_loss = min(self.best_loss, median)
            self.bad_loss_rounds = self.bad_loss_rounds + 1 if bad else 0
            if self.bad_loss_rounds >= self.patience:
                what = "non-finite" if not math.isfinite(median) else (
                    f"at chance level or worse (median {median:.4g} >= ln({round(math.exp(self.chance))}) = "
                    f"{self.chance:.4g}) without progress")
                return f"the train loss was {what} for {self.bad_loss_rounds} consecutive rounds"
        return None
