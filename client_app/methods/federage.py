"""FedeRage's client (paper 003, Algorithm 2): CVaR risk-averse local SGD with a scalar β.

Each local step on a mini-batch ξ with loss f at the current (θ, β):

    w = (1 − γ) + (γ/α)·1{f ≥ β}
    θ ← θ − η_θ · w · ∇f
    β ← Π_B(β − η_β · (1 − w)),   B = [β_min, β_max]

(1 − w = γ(1 − 1{f ≥ β}/α) is the subgradient of the mean–CVaR objective in β.) The client
starts each round from the broadcast (θ̂, β̂) and returns its β in the MetricRecord.

``federage-level = "sample"`` is the per-sample variant (the paper's b = 1 case): weights
w_j per sample, loss mean_j w_j ℓ_j and β-gradient mean_j (1 − w_j) = γ(1 − frac(ℓ_j ≥ β)/α).

The hyperparameters (``federage-alpha``, ``-gamma``, ``-beta-lr``, ``-beta-min``, ``-beta-max``,
``-level``) are declared, with their defaults and ranges, once in :mod:`strategies.federage`;
its strategy sends them in every request's config, and β̂ under ``federage-beta-hat``.
The routine reads both from the request (no defaults here: a missing key is an error).

A foreign ClientApp runs this routine through ``client_app.client_app.train_reply(...)``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional as F

from client_app.methods import TrainJob, TrainOutcome, register_client_method
from client_app.methods.sgd import run_sgd
from fedcore import keys
from fedcore.params import sent_value


@dataclasses.dataclass(frozen=True)
class RiskParams:
    """The client's risk parameters, as the server sent them (validated there)."""

    alpha: float
    gamma: float
    beta_lr: float
    beta_min: float
    beta_max: float
    level: str  # "batch" | "sample"

    @classmethod
    def from_request(cls, config) -> RiskParams:
        """From a request's config: run-config key ``federage-<field>`` (``_`` → ``-``)."""
        values = {f.name: sent_value(config, "federage-" + f.name.replace("_", "-"))
                  for f in dataclasses.fields(cls)}
        return cls(**{k: str(v) if k == "level" else float(v) for k, v in values.items()})

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


def start(job: TrainJob) -> tuple[RiskParams, float]:
    """(the risk parameters, the starting β = Π_B(β̂)) of a request."""
    params = RiskParams.from_request(job.config)
    return params, params.project(float(sent_value(job.config, keys.FEDERAGE_BETA_HAT)))


def finish(outcome: TrainOutcome, beta: float) -> None:
    """The reply's β."""
    outcome.metrics[keys.FEDERAGE_BETA] = beta


@register_client_method("federage")
def federage(job: TrainJob) -> TrainOutcome:
    params, beta = start(job)
    risk = RiskAverseLoss(params, beta)
    outcome = run_sgd(job, loss_fn=risk)
    finish(outcome, risk.beta)
    return outcome
