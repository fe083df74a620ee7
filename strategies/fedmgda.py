"""FedMGDA+ (Hu, Wang, Yu, Wang, "Federated Learning Meets Multi-objective Optimization",
IEEE TNSE 2022, arXiv:2006.11489; FLGo ``fedmgda.py``).

Each update is normalised, ĝ_i = Δ_i / ‖Δ_i‖ (Δ_i = θ_t − θ_i), and the common descent
direction is the minimum-norm point of their convex hull, kept within ε of the FedAvg
weights p_i = n_i / Σ n_j:

    λ* = argmin_λ ‖Σ_i λ_i ĝ_i‖²  s.t. λ ∈ simplex, |λ_i − p_i| ≤ ε,
    θ_{t+1} = θ_t − η Σ_i λ*_i ĝ_i.

The QP over the m×m Gram matrix is :func:`strategies.linalg.min_norm_simplex`.

``server-lr`` is not used: ``fedmgda-lr`` η is the step. The method is ``fedmgda``; the strategy is :class:`FedMGDA`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.linalg import min_norm_simplex, unit_rows
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedmgda"
    eps: float = hyper(0.1, low=0.0, grid=Grid((0.01, 0.05, 0.1, 0.5, 1.0), 0.0, 1.0),
                       doc="ε, how far λ may move from the centre weights; 0 gives λ* = the centre (FedAvg weights on "
                           "normalised updates, no solve), >= 1 is plain MGDA")
    centre: str = hyper("data-size", choices=("data-size", "uniform"),
                        doc="the weights λ is kept within ε of: data-size p_i = n_i/Σn (FLGo's fedmgda.py, this "
                            "project's spec) or uniform 1/m (this project's option, for comparisons at equal "
                            "weighting; not the paper's)")
    eta: float = hyper(1.0, key="fedmgda-lr", low=0.0, low_open=True,
                       doc="η, the global step on the (norm <= 1) direction (keyword eta: lr is the clients' "
                           "learning rate of every strategy)")


def fedmgda_weights(unit_updates: torch.Tensor, p: np.ndarray, eps: float) -> np.ndarray:
    """λ* of FedMGDA+ for (m, d) normalised rows and FedAvg weights ``p``."""
    p = np.asarray(p, dtype=np.float64)
    if eps == 0.0:
        return p.copy()
    rows = unit_updates.to(torch.float64)
    gram = (rows @ rows.T).numpy()
    return min_norm_simplex(gram, lower=np.clip(p - eps, 0.0, None), upper=np.clip(p + eps, None, 1.0))


class FedMGDAMethod(Method):
    """FedMGDA+'s server step (client: plain local SGD). Normalising each update and solving over
    their Gram matrix needs every update."""

    Params = Params
    weighting = "data-size"  # λ within ε of the centre: fedmgda-centre (resolve_weighting)
    own_step = "its step is fedmgda-lr"

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return cls.Params.from_run_config(config).centre

    def aggregate(self, round_: Round, state: Any) -> Step:
        theta, deltas = round_.theta, round_.deltas
        units, norms = unit_rows(deltas)
        centre = round_.fedavg_weights.numpy()
        if self.params.centre == "uniform":
            centre = np.full_like(centre, 1.0 / len(centre))
        lam = fedmgda_weights(units, centre, self.params.eps)
        direction = torch.from_numpy(lam).to(units.dtype) @ units
        metrics = {
            "fedmgda-lambda": [float(x) for x in lam],
            "direction-norm": float(direction.norm()),
            "mean-update-norm": float(norms.mean()),
        }
        return Step(theta - self.params.eta * direction, state, metrics)


@register("fedmgda")
class FedMGDA(FairStrategy):
    """FedMGDA+ (see the module docstring): ``FedMGDA(eps=0.1, eta=1.0, fraction_train=0.25, lr=0.1, seed=0)``."""

    method_class = FedMGDAMethod
    Params = Params

    def __init__(self, *, eps: float = Params.eps, centre: str = Params.centre, eta: float = Params.eta,
                 params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedMGDA", eps=eps, centre=centre, eta=eta), **common)
