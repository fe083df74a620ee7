"""FedAvg (McMahan et al., 2017): the data-size-weighted mean of the local models.

θ_{t+1} = Σ_i p_i θ_i with p_i = n_i / Σ_j n_j. With ``server-lr`` η_g set (> 0) the step
is θ_t − η_g/η_l · Σ p_i Δ_i, i.e. η_g = η_l (the default) is plain FedAvg.
"""

from __future__ import annotations

import torch

from strategies.base import FairStrategy, unpack_replies
from strategies.registry import register


def fedavg_direction(pseudo_gradients: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """ḡ = Σ_i p_i g_i for (m, d) rows and (m,) weights summing to 1."""
    return weights.to(pseudo_gradients.dtype) @ pseudo_gradients


class FedAvgStrategy(FairStrategy):
    needs_individual_updates = False  # a weighted sum: works under secure aggregation

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        batch = unpack_replies(replies)
        theta = self.current_flat()
        eta_l = self.round_lr(server_round)
        eta_g = self.cfg.server_lr or eta_l
        g_bar = fedavg_direction(batch.local, batch.fedavg_weights)  # Σ p_i θ_i
        g_bar = torch.sub(theta, g_bar)  # Σ p_i Δ_i
        new = theta - (eta_g / eta_l) * g_bar
        return self.to_record(new), MetricRecord({"update-norm": float(g_bar.norm())})


@register("fedavg")
def build(cfg):
    return FedAvgStrategy(cfg)
