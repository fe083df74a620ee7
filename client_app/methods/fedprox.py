"""FedProx's client (Li et al., MLSys 2020): local SGD on f_i(w) + (μ/2)‖w − θ_t‖².

The proximal term's gradient μ(w − θ_t) is added to each step's gradient: on the loop through
the ``before_step`` hook (:func:`proximal_pull`), as rows by :class:`Pull`; μ = 0 is FedAvg's
local SGD exactly. Ditto's personal model takes the same pull. μ is ``fedprox-mu``
(``fedcore.keys.FEDPROX_MU``), declared (default 0.01, μ ≥ 0) in :mod:`strategies.fedprox` and sent
by its strategy in every request's config; there is no default here (a missing key is an error).

A foreign ClientApp runs it through ``client_app.client_app.train_reply(...)``, or
keeps its own training loop and adds it with ``client_app.foreign.ClientSide`` (which calls these functions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from client_app.methods import Row, RowForm, TrainJob, TrainOutcome, register_client_method
from client_app.methods.sgd import run_sgd
from fedcore import keys
from fedcore.params import sent_value


def proximal_pull(anchor: list[torch.Tensor], coeff: float) -> Callable[[nn.Module], None]:
    """``before_step`` hook: grad += coeff·(w − anchor), the gradient of (coeff/2)‖w − anchor‖²
    (FedProx's μ with the global model as anchor; Ditto's λ for the personal model)."""

    @torch.no_grad()
    def hook(model: nn.Module) -> None:
        for p, a in zip(model.parameters(), anchor):
            if p.grad is not None:
                p.grad.add_(p - a, alpha=coeff)

    return hook


@dataclasses.dataclass(frozen=True, eq=False)
class Pull:
    """The row form of :func:`proximal_pull`: coeff·(w − anchor) added to the row's gradient."""

    coeff: float
    anchor: list[torch.Tensor]

    @staticmethod
    def stack(terms, rows, flat, params):
        """(see :class:`client_app.methods.GradientTerm`) A row without a pull: coeff 0."""
        coeffs = [0.0 if t is None else t.coeff for t in terms]
        if not any(coeffs):
            return None
        coeff = torch.tensor(coeffs, dtype=params.dtype, device=params.device)[:, None]
        anchor = torch.stack([flat(r.init if t is None else t.anchor) for t, r in zip(terms, rows)])
        return lambda g, p, m: g + coeff[:m] * (p - anchor[:m])


def mu_of(job: TrainJob) -> float:
    """μ, as the server sent it."""
    return float(sent_value(job.config, keys.FEDPROX_MU))


def rows(job: TrainJob, base: Row) -> RowForm:
    """The plain row pulled towards its start θ_t."""
    return RowForm([dataclasses.replace(base, terms=(Pull(mu_of(job), base.init),))])


@register_client_method(keys.FEDPROX, rows=rows)
def fedprox(job: TrainJob) -> TrainOutcome:
    mu = mu_of(job)
    # θ_t = the parameters on entry (the received global model)
    anchor = [p.detach().clone() for p in job.model.parameters()]
    return run_sgd(job, before_step=proximal_pull(anchor, mu))
