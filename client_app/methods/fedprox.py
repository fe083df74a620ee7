"""FedProx's client (Li et al., MLSys 2020): local SGD on f_i(w) + (μ/2)‖w − θ_t‖².

The proximal term's gradient μ(w − θ_t) is added to each step's gradient through the
``before_step`` hook. ``fedprox-mu`` μ ≥ 0 (default 0.01); μ = 0 is FedAvg's local SGD
exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from client_app.methods import TrainJob, TrainOutcome, register_client_method
from client_app.methods.sgd import run_sgd


def proximal_pull(model: nn.Module, mu: float):
    """A ``before_step`` hook adding μ(w − θ_t) to each parameter's gradient (θ_t = the
    parameters on entry, i.e. the global model)."""
    anchors = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def hook(m: nn.Module) -> None:
        for p, p0 in zip(m.parameters(), anchors):
            if p.grad is not None:
                p.grad.add_(p - p0, alpha=mu)

    return hook


@register_client_method("fedprox")
def fedprox(job: TrainJob) -> TrainOutcome:
    mu = job.cfg.get_float("fedprox-mu", 0.01, low=0.0)
    return run_sgd(job, before_step=proximal_pull(job.model, mu))
