"""ConFIG as a federated baseline (Liu et al., 2024, "ConFIG: towards conflict-free training
of physics informed neural networks"; the CRAFT paper 002_* compares against it).

Per round, with the raw updates Δ_i = θ_t − θ_i of the m replies and U their unit rows:

    g_v = U⁺ 1,   g_u = g_v / ‖g_v‖,   g = (1/m) Σ_i ⟨Δ_i, g_u⟩ g_u,
    θ_{t+1} = θ_t − (η_g / η_l) g.

The direction is CRAFT's with a zero reference and equal weights (U⁺ 1 ∝ U⁺ ρ for ρ = 1/m),
so CRAFT's kernel (:class:`strategies.craft.UpdateMatrix`) computes it. ConFIG's magnitude is the *sum*
of the projections of the raw updates on g_u; it is divided here by m so that the step
has FedAvg's scale (with no conflict and equal updates g is exactly FedAvg's mean update),
which lets ``server-lr`` keep FedAvg's meaning: 0 (default) → η_g = η_l, a step of 1×g.

Global, as ConFIG: one group holding the whole model (CRAFT's layer-wise variant is
``method=craft``). Clients with a zero update are inactive (they still count in m, as in
FedAvg's mean). Stateless: nothing to checkpoint. One active client: its raw update / m.

Its one key is CRAFT's ``craft-tol`` (:func:`strategies.craft.tol_field`); ``server-lr`` keeps its
one meaning, η_g/η_l (0 → 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedcore.params import MethodParams
from strategies.base import Round, Step
from strategies.craft import Aggregate, GroupedMethod, step_from, tol_field
from strategies.flower import FairStrategy, method_params
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """ConFIG's one hyperparameter, read with CRAFT's key ``craft-tol``."""

    prefix = "config-fl"
    tol: float = tol_field()


def config_step(agg: Aggregate, m: int) -> torch.Tensor:
    """ConFIG's update g (d,) from CRAFT's aggregate of the m updates with a zero reference and
    equal weights (the direction g_v, rescaled in place)."""
    norm = agg.norm
    if norm <= 0.0:
        return agg.direction.zero_()
    # Σ_i ⟨Δ_i, g_u⟩ = Σ_i ⟨Δ_i, g_v⟩ / ‖g_v‖, already in agg.dots: no extra pass over Δ
    return agg.direction.mul_(float(agg.dots.sum()) / (norm * norm * m))


class ConFIGMethod(GroupedMethod):
    """ConFIG (see the module docstring)."""

    Params = Params
    weighting = "uniform"  # equal targets ρ = 1/m

    def aggregate(self, round_: Round, state: Any) -> Step:
        theta, updates = self.read_rows(round_)
        m = updates.shape[0]
        agg = self.matrix.solve(updates, torch.ones(m, dtype=torch.float64), self.groups(round_.spec),
                                tol=self.params.tol)
        step = config_step(agg, m)
        norm = float(torch.linalg.vector_norm(step))
        return Step(step_from(theta, step, round_.step_scale), state, {**agg.diagnostics(), "update-norm": norm})


@register("config-fl")
class ConFIG(FairStrategy):
    """ConFIG (see the module docstring): ``ConFIG(fraction_train=0.1, tol=0.0)``."""

    method_class = ConFIGMethod
    Params = Params

    def __init__(self, *, tol: float = Params.tol, params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "ConFIG", tol=tol), **common)
