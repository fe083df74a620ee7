"""FedeRage (paper 003, Algorithm 2): agnostic averaging of (θ, β) under unknown availability.

The risk aversion lives in the client (``client_app.methods.federage``: CVaR-weighted local
steps and a per-client quantile estimate β). The server only averages what arrives,
uniformly — (θ̂, β̂) = (1/|S_t|) Σ_{i∈S_t} (θ_i, β_i), not by data size — and broadcasts β̂
in the next round's config. It never sees the participation probabilities.

With ``server-lr`` η_g > 0 the model step is θ_t − (η_g/η_l)·mean Δ_i (as in FedAvg);
η_g = η_l (the default, 0) is the plain average. γ = 0 (``federage-gamma``) gives FedAvg
with uniform weights. Hyperparameters: see :mod:`client_app.methods.federage`.
"""

from __future__ import annotations

import torch

from client_app.methods.federage import BETA, BETA_HAT, RiskParams
from strategies.base import FairStrategy, RoundPlan, unpack_replies
from strategies.fedavg import fedavg_direction
from strategies.registry import register


def uniform_average(values: torch.Tensor) -> torch.Tensor:
    """(1/m) Σ_i values_i over the first axis: the agnostic aggregate."""
    m = values.shape[0]
    return fedavg_direction(values, torch.full((m,), 1.0 / m, dtype=torch.float64))


class FedeRageStrategy(FairStrategy):
    client_method = "federage"
    needs_individual_updates = False  # uniform means of θ_i and β_i: sums suffice
    required_metrics = (BETA,)

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.params = RiskParams.from_config(cfg)  # validates the keys before any training
        self.beta_hat = self.params.project(0.0)  # Algorithm 2: β_i⁰ = 0 (projected onto B)

    def begin_round(self, server_round, arrays):
        super().begin_round(server_round, arrays)
        return RoundPlan(config={BETA_HAT: self.beta_hat})

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        batch = unpack_replies(replies)
        theta = self.current_flat()
        eta_l = self.round_lr(server_round)
        eta_g = self.cfg.server_lr or eta_l
        mean_delta = theta - uniform_average(batch.local)
        new = theta - (eta_g / eta_l) * mean_delta
        betas = torch.tensor([float(m[BETA]) for m in batch.metrics], dtype=torch.float64)
        self.beta_hat = float(uniform_average(betas.unsqueeze(1))[0])
        return self.to_record(new), MetricRecord({
            "federage-beta-hat": self.beta_hat,
            "federage-betas": betas.tolist(),
            "update-norm": float(mean_delta.norm()),
        })

    def state_dict(self):
        return {"beta_hat": self.beta_hat}

    def load_state_dict(self, state):
        self.beta_hat = float(state["beta_hat"])


@register("federage")
def build(cfg):
    return FedeRageStrategy(cfg)
