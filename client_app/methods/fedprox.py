"""FedProx's client (Li et al., MLSys 2020): local SGD on f_i(w) + (μ/2)‖w − θ_t‖².

The proximal term's gradient μ(w − θ_t) is added to each step's gradient (:class:`Pull`: on the
loop by its ``add_to``, as rows by its ``stack``); μ = 0 is FedAvg's local SGD exactly. Ditto's
personal model takes the same pull. μ is ``fedprox-mu`` (``fedcore.keys.FEDPROX_MU``), declared
(default 0.01, μ ≥ 0) in :mod:`strategies.fedprox` and sent by its strategy in every request's
config; there is no default here (a missing key is an error).

A foreign ClientApp runs it through ``client_app.client_app.train_reply(...)``, or
keeps its own training loop and adds it with ``client_app.foreign.ClientSide``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from client_app.methods import Parts, TrainJob, params_of, register_client_method
from fedcore import keys
from fedcore.params import sent_value


@dataclasses.dataclass(frozen=True, eq=False)
class Pull:
    """coeff·(w − anchor) added to the gradient: the gradient of (coeff/2)‖w − anchor‖² (FedProx's μ
    with the global model as anchor; Ditto's λ for the personal model)."""

    coeff: float
    anchor: list[torch.Tensor]

    @torch.no_grad()
    def add_to(self, model: nn.Module) -> None:
        """(see :class:`client_app.methods.GradientTerm`) grad += coeff·(w − anchor), per parameter."""
        for p, a in zip(model.parameters(), self.anchor):
            if p.grad is not None:
                p.grad.add_(p - a, alpha=self.coeff)

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


@register_client_method(keys.FEDPROX)
def fedprox(job: TrainJob) -> Parts:
    """The pull towards the received global model θ_t."""
    return Parts(terms=(Pull(mu_of(job), params_of(job.model)),))
