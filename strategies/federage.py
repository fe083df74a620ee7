"""FedeRage (paper 003, Algorithm 2): agnostic averaging of (θ, β) under unknown availability.

Paper: S. A. (Herlock) Rahimi and D. Kalogerias, *FedeRage: Provably Convergent Agnostic Federated
Learning under General Client Drift*, arXiv:2609.21057, 2026.

The risk aversion lives in the client (``client_app.methods.federage``: CVaR-weighted local
steps and a per-client quantile estimate β). The server only averages what arrives,
uniformly — (θ̂, β̂) = (1/|S_t|) Σ_{i∈S_t} (θ_i, β_i), not by data size — and broadcasts β̂
in the next round's config (``federage-beta-hat``). It never sees the participation
probabilities. Under secure aggregation the secure sum is uniform too
(``secagg_weighting = "uniform"``), so the one aggregate reply holds the same means.

With ``server-lr`` η_g > 0 the model step is θ_t − (η_g/η_l)·mean Δ_i (as in FedAvg);
η_g = η_l (the default, 0) is the plain average.

Algorithm 2 returns the average of the global iterates, (1/T) Σ_{τ=1..T} θ̂_τ. Scoring that
average is the app's ``eval-averaged-iterate = true`` (every method, so that all are scored
on the same iterate: ``fedpcd_app.server.evaluation``); the retired ``federage-averaged-iterate``
is refused with a line naming it. The training rounds broadcast θ̂_t. Algorithm 2's local
work (every client the same H steps, each on a fresh i.i.d. mini-batch) is the app's
``local-steps`` key (any method).

The method sends its keys to the clients with every request (:meth:`FedeRageMethod.request`); a
reply's β outside the box [β_min, β_max] is dropped by the gate (its declared range).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedcore import keys
from fedcore.config import ConfigError, Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Request, Round, Step
from strategies.fedavg import fedavg_direction
from strategies.flower import FairStrategy, method_params
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "federage"
    alpha: float = hyper(0.1, low=0.0, high=1.0, low_open=True, grid=Grid((0.01, 0.05, 0.1), 1e-3, 1.0),
                         reduces_to={"fedavg": 1.0}, reduces_with={"federage-beta-min": 0.0},
                         doc="α, the CVaR level; 1 (with β_min = 0: β stays 0, every weight 1) is FedAvg")
    gamma: float = hyper(0.3, low=0.0, high=1.0, grid=Grid((0.1, 0.3, 0.5), 0.0, 1.0),
                         reduces_to={"fedavg": 0.0},
                         doc="γ, the risk weight; 0 is FedAvg's local SGD with uniform server weights")
    beta_lr: float = hyper(0.1, low=0.0, doc="η_β, the step of a client's quantile estimate β (0: β stays at β̂)")
    beta_min: float = hyper(0.0, doc="the low end of the box B = [β_min, β_max] that β is projected onto "
                                     "(Algorithm 2 starts from β⁰ = Π_B(0))")
    beta_max: float = hyper(10.0, doc="the high end of B (>= federage-beta-min)")
    level: str = hyper("batch", choices=("batch", "sample"),
                       doc="one risk weight per mini-batch, or one per sample (the paper's b = 1)")

    def check(self) -> None:
        if self.beta_max < self.beta_min:
            raise ConfigError(f"run-config key 'federage-beta-max' = {self.beta_max} must be >= "
                              f"federage-beta-min = {self.beta_min}")


@dataclasses.dataclass
class State:
    beta_hat: float  # β̂ broadcast in the next round's requests


def uniform_average(values: torch.Tensor) -> torch.Tensor:
    """(1/m) Σ_i values_i over the first axis: the agnostic aggregate."""
    m = values.shape[0]
    return fedavg_direction(values, torch.full((m,), 1.0 / m, dtype=torch.float64))


class FedeRageMethod(Method):
    """FedeRage's server (see the module docstring); clients run ``client_app.methods.federage``."""

    Params = Params
    weighting = "uniform"  # the agnostic average
    client_method = keys.FEDERAGE
    needs_individual_updates = False  # uniform means of θ_i and β_i: sums suffice
    secagg_weighting = "uniform"  # the agnostic average, also under secure aggregation

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        # honest clients project β onto the box: anything else is a lie (or a bug), dropped by the gate
        self.reads = Reads(values={keys.FEDERAGE_BETA: (self.params.beta_min, self.params.beta_max,
                                                        "the box [federage-beta-min, federage-beta-max]")})

    def init(self) -> State:
        p = self.params
        return State(beta_hat=min(max(0.0, p.beta_min), p.beta_max))  # Algorithm 2: β_i⁰ = Π_B(0)

    def request(self, server_round: int, state: State, current) -> Request:
        """The risk parameters the client routine reads, and β̂."""
        return Request({**self.params.to_run_config(), keys.FEDERAGE_BETA_HAT: state.beta_hat})

    def aggregate(self, round_: Round, state: State) -> Step:
        theta = round_.theta
        mean_delta = theta - uniform_average(round_.model_matrix)
        new = theta - round_.step_scale * mean_delta
        betas = round_.value(keys.FEDERAGE_BETA)
        beta_hat = float(uniform_average(betas.unsqueeze(1))[0])
        return Step(new, State(beta_hat), {
            "federage-beta-hat": beta_hat,
            "federage-betas": betas.tolist(),
            "update-norm": float(mean_delta.norm()),
        })


@register("federage")
class FedeRage(FairStrategy):
    """FedeRage's server (see the module docstring): ``FedeRage(alpha=0.1, gamma=0.3, fraction_train=0.25)``;
    its clients run ``client_app.methods.federage`` (a foreign ClientApp: ``client_app.foreign.ClientSide``)."""

    method_class = FedeRageMethod
    Params = Params

    def __init__(self, *, alpha: float = Params.alpha, gamma: float = Params.gamma, beta_lr: float = Params.beta_lr,
                 beta_min: float = Params.beta_min, beta_max: float = Params.beta_max, level: str = Params.level,
                 params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedeRage", alpha=alpha, gamma=gamma, beta_lr=beta_lr,
                                       beta_min=beta_min, beta_max=beta_max, level=level), **common)
