"""Defences around any method: a defence is a :class:`strategies.base.Transform` (a method around
a method), as Flower's ``DifferentialPrivacyServerSideFixedClipping`` wraps a strategy. It
transforms the gate's round before the inner method aggregates it and returns its report in
``Step.defence`` (then the round's ``RoundOutcome.defence``).

Transforms compose; the outermost transforms first. The app builds
``UpdateClip(CentralDP(method, dp), c)`` from ``update-clip`` and ``dp*`` (each only when on):
the median clip, then central DP's clipping and noise (:mod:`strategies.privacy`), then the method.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedcore import flat
from fedcore.config import ConfigError
from strategies.base import Method, Round, Step, Transform


def check_update_clip(c: float) -> float:
    """``update-clip`` c: 0 (off) or ≥ 1 (a bound below the median would shrink most honest updates)."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not (c == 0 or c >= 1):
        raise ConfigError(f"run-config key 'update-clip' = {c!r} must be 0 (off) or a number >= 1 "
                          "(each update is scaled to at most c x the round's median update norm)")
    return float(c)


def median_clip_scales(norms: torch.Tensor, c: float) -> tuple[torch.Tensor, float]:
    """(s_i, bound): s_i = min(1, bound/‖Δ_i‖) with bound = c · median_j ‖Δ_j‖ (the median of an
    even count is the mean of the middle two), so every s_i·Δ_i has norm ≤ bound."""
    bound = c * float(np.median(norms.double().numpy()))
    return torch.clamp(bound / norms.double().clamp_min(1e-300), max=1.0), bound


class UpdateClip(Transform):
    """``update-clip`` c: each local model θ_i becomes θ_t − s_i·Δ_i (Δ_i = θ_t − θ_i, s_i from
    :func:`median_clip_scales`), so no update the inner method sees is longer than c · the round's
    median ‖Δ_j‖. Reported as ``update_clip`` {bound, num_clipped, clipped}."""

    def __init__(self, inner: Method, c: float) -> None:
        super().__init__(inner)
        self.c = check_update_clip(c)

    def aggregate(self, round_: Round, state: Any) -> Step:
        clipped_round, report = self.clip(round_)
        step = self.inner.aggregate(clipped_round, state)
        step.defence = {"update_clip": report, **step.defence}
        return step

    def clip(self, round_: Round) -> tuple[Round, dict[str, Any]]:
        theta = round_.theta
        # Two passes over the replies' bytes instead of an (m, d) matrix of updates.
        norms = torch.tensor([float((theta - flat.record_to_flat(r)).norm()) for r in round_.models])
        scales, bound = median_clip_scales(norms, self.c)
        models, clipped = list(round_.models), []
        for i, (record, s) in enumerate(zip(round_.models, scales.tolist())):
            if s < 1.0:
                delta = theta - flat.record_to_flat(record)
                models[i] = round_.to_record(theta - s * delta)
                clipped.append(round_.clients[i])
        return round_.with_models(models), {"bound": bound, "num_clipped": len(clipped), "clipped": clipped}
