"""PropFair's client (Zhang et al., TMLR 2023; huawei-noah ``FairFL/algs/algorithms.py``): local SGD
on the log utility of each batch's mean cross-entropy f against the baseline M,

    φ(f) = −log(1 − f/M)  if M − f ≥ ε,  else f/M (or f/ε with the Huber variant),

so that a batch's gradient is ∇f·φ'(f), φ'(f) = 1/(M − f) on the log branch (:func:`utility_slope`).
The one loss, :class:`UtilityRows`, weights each example's loss by φ'(f)/count as rows and forms
φ(f) on the loop (its ``loop``: :class:`LogUtilityLoss`, the ``loss_fn`` hook), the same slope. M, ε and the variant are
``propfair-base``, ``-epsilon``, ``-huber``, declared once in :mod:`strategies.propfair` and sent by
its strategy in every request (read here by the prefix: :class:`client_app.methods.Sent`).

A foreign ClientApp runs it through ``client_app.foreign.ClientSide`` (``side.loss``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional as F

from client_app.methods import Parts, Sent, TrainJob, register_client_method
from fedcore import keys


def utility_loss(f: torch.Tensor, params: Sent) -> torch.Tensor:
    """φ(f) of one batch's mean loss (a scalar tensor with its graph)."""
    base, eps = float(params.base), float(params.epsilon)
    if base - float(f.detach()) < eps:  # near or above M: the linear branch
        return f / eps if bool(params.huber) else f / base
    return -torch.log(1 - f / base)


def utility_slope(f: torch.Tensor, params: Sent) -> torch.Tensor:
    """φ'(f), elementwise for the rows' mean batch losses f (the same branch as :func:`utility_loss`)."""
    base, eps = float(params.base), float(params.epsilon)
    linear = torch.full_like(f, 1.0 / (eps if bool(params.huber) else base))
    near = (base - f.double()) < eps  # in float64, as the loop's test of the same float32 value
    return torch.where(near, linear, (1.0 / (1 - f / base)) / base)


class LogUtilityLoss:
    """The ``loss_fn`` hook of :func:`client_app.training.local_sgd`: φ of the batch's mean cross-entropy."""

    carried = 0.0  # it carries nothing (:class:`client_app.methods.LoopLoss`)

    def __init__(self, params: Sent) -> None:
        self.params = params

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return utility_loss(F.cross_entropy(logits, y), self.params)


@dataclasses.dataclass(frozen=True)
class UtilityRows:
    """:class:`LogUtilityLoss` as rows (a :class:`client_app.methods.RowLoss`; it carries nothing):
    each real example's loss weighted by φ'(its row's mean batch loss)/count."""

    params: Sent

    def loop(self, carried: float) -> LogUtilityLoss:
        return LogUtilityLoss(self.params)

    def coefficient(self, losses, mean_losses, real, count, carried):
        slope = utility_slope(mean_losses, self.params)
        return slope[:, None] * real / count, torch.zeros_like(carried)

    def step(self, carried, grad):
        return carried


def params_of(job: TrainJob) -> Sent:
    """M, ε and the variant, as the server sent them."""
    return Sent(job.config, keys.PROPFAIR)


@register_client_method(keys.PROPFAIR)
def propfair(job: TrainJob) -> Parts:
    """The log-utility loss against the baseline M."""
    return Parts(loss=UtilityRows(params_of(job)))
