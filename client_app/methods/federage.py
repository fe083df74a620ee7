"""FedeRage's client (paper 003, Algorithm 2): CVaR risk-averse local SGD with a scalar β.

Each local step on a mini-batch ξ with loss f at the current (θ, β):

    w = (1 − γ) + (γ/α)·1{f ≥ β}
    θ ← θ − η_θ · w · ∇f
    β ← Π_B(β − η_β · (1 − w)),   B = [β_min, β_max]

(1 − w = γ(1 − 1{f ≥ β}/α) is the subgradient of the mean–CVaR objective in β.) The client
starts each round from the broadcast (θ̂, β̂) and returns its β in the MetricRecord.

``federage-level = "sample"`` is the per-sample variant (the paper's b = 1 case): weights
w_j per sample, loss mean_j w_j ℓ_j and β-gradient mean_j (1 − w_j) = γ(1 − frac(ℓ_j ≥ β)/α).

Hyperparameters (run-config keys): ``federage-alpha`` α ∈ (0, 1] (default 0.1),
``federage-gamma`` γ ∈ [0, 1] (default 0.3; γ = 0 is FedAvg's local SGD exactly),
``federage-beta-lr`` η_β (default 0.1), ``federage-beta-min``/``-max`` B (default [0, 10]),
``federage-level`` ``batch`` | ``sample`` (default ``batch``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional as F

from client_app.methods import TrainJob, TrainOutcome, register_client_method
from client_app.methods.sgd import run_sgd
from fedcore.config import ConfigError, RunConfig

BETA = "federage-beta"  # reply metric: the client's β after its local steps
BETA_HAT = "federage-beta-hat"  # request config: the server's averaged β̂
LEVELS = ("batch", "sample")


@dataclasses.dataclass(frozen=True)
class RiskParams:
    alpha: float = 0.1
    gamma: float = 0.3
    beta_lr: float = 0.1
    beta_min: float = 0.0
    beta_max: float = 10.0
    level: str = "batch"

    @classmethod
    def from_config(cls, cfg: RunConfig) -> RiskParams:
        lo = cfg.get_float("federage-beta-min", 0.0)
        hi = cfg.get_float("federage-beta-max", 10.0)
        if hi < lo:
            raise ConfigError(f"run-config key 'federage-beta-max' = {hi} must be >= federage-beta-min = {lo}")
        return cls(
            alpha=cfg.get_float("federage-alpha", 0.1, low=0.0, high=1.0, low_open=True),
            gamma=cfg.get_float("federage-gamma", 0.3, low=0.0, high=1.0),
            beta_lr=cfg.get_float("federage-beta-lr", 0.1, low=0.0),
            beta_min=lo, beta_max=hi,
            level=cfg.get_choice("federage-level", LEVELS, "batch"),
        )

    def project(self, beta: float) -> float:
        """Π_B: clip to [β_min, β_max]."""
        return min(max(float(beta), self.beta_min), self.beta_max)


def risk_weights(losses: torch.Tensor, beta: float, alpha: float, gamma: float) -> torch.Tensor:
    """w = (1 − γ) + (γ/α)·1{loss ≥ β}, elementwise (no gradient flows through w)."""
    exceed = (losses.detach() >= beta).to(losses.dtype)
    return (1.0 - gamma) + (gamma / alpha) * exceed


def beta_step(beta: float, weights: torch.Tensor, params: RiskParams) -> float:
    """β ← Π_B(β − η_β · mean(1 − w)) (one weight at batch level, one per sample else)."""
    grad = float((1.0 - weights).mean())
    return params.project(beta - params.beta_lr * grad)


class RiskAverseLoss:
    """The ``loss_fn`` hook of :func:`client_app.training.local_sgd`: the weighted loss at
    the current β, and the β step (both use the β and θ of before the step)."""

    def __init__(self, params: RiskParams, beta: float) -> None:
        self.params = params
        self.beta = params.project(beta)

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = self.params
        if p.level == "batch":
            f = F.cross_entropy(logits, y)
            w = risk_weights(f, self.beta, p.alpha, p.gamma)
            loss = w * f
        else:
            per_sample = F.cross_entropy(logits, y, reduction="none")
            w = risk_weights(per_sample, self.beta, p.alpha, p.gamma)
            loss = (w * per_sample).mean()
        self.beta = beta_step(self.beta, w, p)
        return loss


@register_client_method("federage")
def federage(job: TrainJob) -> TrainOutcome:
    params = RiskParams.from_config(job.cfg)
    risk = RiskAverseLoss(params, float(job.config.get(BETA_HAT, params.beta_min)))
    outcome = run_sgd(job, loss_fn=risk)
    outcome.metrics[BETA] = risk.beta
    return outcome
