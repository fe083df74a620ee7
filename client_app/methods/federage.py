"""FedeRage's client (paper 003, Algorithm 2): CVaR risk-averse local SGD with a scalar β.

Each local step on a mini-batch ξ with loss f at the current (θ, β):

    w = (1 − γ) + (γ/α)·1{f ≥ β}
    θ ← θ − η_θ · w · ∇f
    β ← Π_B(β − η_β · (1 − w)),   B = [β_min, β_max]

(1 − w = γ(1 − 1{f ≥ β}/α) is the subgradient of the mean–CVaR objective in β.) The client
starts each round from the broadcast (θ̂, β̂) and returns its β in the MetricRecord.

``federage-level = "sample"`` is the per-sample variant (the paper's b = 1 case): weights
w_j per sample, loss mean_j w_j ℓ_j and β-gradient mean_j (1 − w_j) = γ(1 − frac(ℓ_j ≥ β)/α).

The weights (:func:`risk_weights`) and the β step (:func:`beta_step`) serve both forms of the
one loss, :class:`RiskRows`: the rows' loss (one β per row) and, by its ``loop``, the loop's
``loss_fn`` hook (:class:`RiskAverseLoss`, one β).

The hyperparameters (``federage-alpha``, ``-gamma``, ``-beta-lr``, ``-beta-min``, ``-beta-max``,
``-level``) are declared, with their defaults and ranges, once in :mod:`strategies.federage`;
its strategy sends them in every request's config, and β̂ under ``federage-beta-hat``.
The routine reads both from the request (:class:`client_app.methods.Sent`: no defaults here,
a missing key is an error at its first read).

A foreign ClientApp runs this routine through ``client_app.client_app.train_reply(...)``, or
keeps its own training loop and adds it with ``client_app.foreign.ClientSide``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional as F

from client_app.methods import Parts, Sent, TrainJob, TrainOutcome, register_client_method
from fedcore import keys
from fedcore.params import sent_value


def project(beta, params: Sent):
    """Π_B: clip to [β_min, β_max] (a float, or a tensor of the rows' β)."""
    if isinstance(beta, torch.Tensor):
        return beta.clamp(params.beta_min, params.beta_max)
    return float(min(max(float(beta), params.beta_min), params.beta_max))


def risk_weights(losses: torch.Tensor, beta, alpha: float, gamma: float) -> torch.Tensor:
    """w = (1 − γ) + (γ/α)·1{loss ≥ β}, elementwise (no gradient flows through w); β a float or
    a tensor that broadcasts against the losses."""
    exceed = (losses.detach() >= beta).to(losses.dtype)
    return (1.0 - gamma) + (gamma / alpha) * exceed


def beta_step(beta, grad, params: Sent):
    """β ← Π_B(β − η_β · g) with g = mean(1 − w), the β-subgradient (one weight at batch level,
    the mean over the samples else); floats, or the rows' β and g as float64 tensors."""
    return project(beta - params.beta_lr * grad, params)


class RiskAverseLoss:
    """The ``loss_fn`` hook of :func:`client_app.training.local_sgd`: the weighted loss at
    the current β, and the β step (both use the β and θ of before the step)."""

    def __init__(self, params: Sent, beta: float) -> None:
        self.params = params
        self.beta = project(beta, params)

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
        self.beta = beta_step(self.beta, float((1.0 - w).mean()), p)
        return loss

    @property
    def carried(self) -> float:
        """β now (:class:`client_app.methods.LoopLoss`)."""
        return self.beta


@dataclasses.dataclass(frozen=True)
class RiskRows:
    """The risk-averse loss (a :class:`client_app.methods.RowLoss` carrying each row's β): as rows,
    the weights at every row's β over its real examples (padding has ``real`` 0); on the loop,
    :class:`RiskAverseLoss` (:meth:`loop`)."""

    params: Sent

    def loop(self, beta: float) -> RiskAverseLoss:
        return RiskAverseLoss(self.params, beta)

    def coefficient(self, losses, mean_losses, real, count, beta):
        p = self.params
        if p.level == "batch":
            w = risk_weights(mean_losses, beta.float(), p.alpha, p.gamma)
            return w[:, None] * real / count, (1.0 - w).double()
        w = risk_weights(losses, beta.float()[:, None], p.alpha, p.gamma)
        return w * real / count, (((1.0 - w) * real).sum(1) / count[:, 0]).double()

    def step(self, beta, grad):
        return beta_step(beta, grad, self.params)


def start(job: TrainJob) -> tuple[Sent, float]:
    """(the risk parameters, the starting β = Π_B(β̂)) of a request."""
    params = Sent(job.config, keys.FEDERAGE)
    return params, project(float(sent_value(job.config, keys.FEDERAGE_BETA_HAT)), params)


def finish(outcome: TrainOutcome, beta: float) -> None:
    """The reply's β."""
    outcome.metrics[keys.FEDERAGE_BETA] = beta


@register_client_method(keys.FEDERAGE)
def federage(job: TrainJob) -> Parts:
    """The risk-averse loss carrying β from Π_B(β̂); the reply's β after the last step."""
    params, beta = start(job)
    return Parts(loss=RiskRows(params), carried=beta,
                 finish=lambda _job, outcome, trained: finish(outcome, trained.carried))
