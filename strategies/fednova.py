"""FedNova (Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem
in Heterogeneous Federated Optimization", NeurIPS 2020; Flower ``baselines/niid_bench``).

Clients that take different numbers of local steps τ_i pull FedAvg towards the objective
of the busiest ones. FedNova averages the *normalised* updates d_i = Δ_i / a_i
(Δ_i = θ_t − θ_i) and rescales by the effective number of steps:

    θ_{t+1} = θ_t − (η_g/η_l) · τ_eff · Σ_i p_i d_i,   τ_eff = Σ_i p_i a_i,

with p_i = n_i / Σ n_j and a_i = ‖a‖₁ of the client's local-step weights: a_i = τ_i for
plain SGD, a_i = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)] / (1 − ρ) for heavy-ball momentum ρ
(``momentum``). τ_i comes in each reply's ``num-steps`` metric.

No hyperparameters of its own. It needs the clients' momentum ρ (the run's ``momentum``):
``FedNova(momentum=0.9)``; this app passes it. ``server-lr`` is η_g, as for FedAvg. ``num-steps``
is a whole number in [1, the steps the requests asked] (the app's run config, or a foreign app's
train config naming ``local-steps`` or ``local-epochs``/``batch-size``), else at most 10× the
round's median scaled by the client's size (:func:`fedcore.replies.steps_outliers`).
Degenerate case: equal τ_i gives a_i = τ_eff for all i, i.e. exactly FedAvg.
"""

from __future__ import annotations

from typing import Any

import torch

from fedcore import keys
from fedcore.config import check_value
from fedcore.params import NoParams
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register


def nova_step_weights(num_steps: torch.Tensor, momentum: float) -> torch.Tensor:
    """a_i for τ_i local steps of SGD with heavy-ball momentum ρ (ρ = 0: a_i = τ_i)."""
    tau = num_steps.to(torch.float64)
    if momentum == 0.0:
        return tau
    rho = momentum
    return (tau - rho * (1.0 - rho**tau) / (1.0 - rho)) / (1.0 - rho)


def fednova_step(deltas: torch.Tensor, p: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, float]:
    """τ_eff Σ p_i Δ_i / a_i, and τ_eff. A client with a_i = 0 (no step) has Δ_i = 0 and
    contributes nothing."""
    p = p.to(torch.float64)
    tau_eff = float(p @ a)
    coef = torch.where(a > 0, p / a.clamp_min(1e-300), torch.zeros_like(p))
    return tau_eff * (coef.to(deltas.dtype) @ deltas), tau_eff


class FedNovaMethod(Method):
    """FedNova's server step (client: plain local SGD, reporting ``num-steps``). The server divides
    each update by its own a_i: it must see every update."""

    Params = NoParams
    weighting = "data-size"  # p_i = n_i / Σ n_j

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(num_steps=True)  # a_i from it

    def aggregate(self, round_: Round, state: Any) -> Step:
        theta = round_.theta
        a = nova_step_weights(round_.value(keys.NUM_STEPS), self.setting.momentum)
        step, tau_eff = fednova_step(round_.deltas, round_.fedavg_weights, a)
        return Step(theta - round_.step_scale * step, state, {"fednova-tau-eff": tau_eff,
                                                                "update-norm": float(step.norm())})


@register("fednova")
class FedNova(FairStrategy):
    """FedNova (see the module docstring): ``FedNova(momentum=0.9, fraction_train=0.25)``."""

    method_class = FedNovaMethod
    Params = NoParams
    app_keywords = ("momentum",)

    def __init__(self, *, momentum: float = 0.0, params: NoParams | None = None, **common: Any) -> None:
        self.client_momentum = check_value("momentum", momentum, float, low=0.0, high=1.0, high_open=True,
                                           subject="FedNova() keyword 'momentum' (the clients' SGD momentum)")
        super().__init__(method_params(NoParams, params, "FedNova"), **common)

    @property
    def momentum(self) -> float:
        """The clients' SGD momentum ρ."""
        return self.client_momentum
