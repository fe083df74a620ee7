"""FedFV (Wang, Xu, Liu, Lv, Zhang, "Federated Learning with Fair Averaging", IJCAI 2021;
reference code ``WwZzz/easyFL`` ``method/fedfv.py``).

Inputs: Δ_i = θ_t − θ_i (not divided by η_l) and F_i, the loss of θ_t on client i
(``loss-before``). One round:

1. Internal conflicts. Sort the sampled clients by F ascending. The clients
   order[⌈(m−1)(1−α)⌉:] (≈ the α·m highest losses; none when α = 0) keep their update.
   Every other g̃_i starts at Δ_i and, for j in ascending-loss order (j ≠ i), is projected
   off the *original* Δ_j whenever Δ_j·g̃_i < 0: g̃_i −= (Δ_j·g̃_i / ‖Δ_j‖²) Δ_j.
   g = uniform mean of the g̃_i.
2. External conflicts. For k = τ, …, 1: g_con = Σ of the stored updates of clients last
   seen in round t−k whose stored update h has h·g < 0; if g·g_con < 0, project g off g_con.
3. Rescale ‖g‖ to ‖mean_i Δ_i‖; θ_{t+1} = θ_t − g.

Each client's latest update and the round it was sent are stored, in the :class:`State`
(only those of the last τ rounds are ever used, older ones are dropped).

Degenerate case: α = 0 and τ = 0 with no conflicting pair is the uniform mean of the updates
(FedAvg, equal weights).

``server-lr`` is not used (a non-zero value is refused): the step is g, rescaled to ‖mean_i Δ_i‖.
The method is ``fedfv``;
the strategy is :class:`FedFV`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from fedcore import keys
from fedcore.config import ConfigError, Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

NORM_EPS = 1e-30


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedfv"
    alpha: float = hyper(0.1, low=0.0, high=1.0, grid=Grid((0.0, 0.1, 0.2, 0.33, 0.5), 0.0, 1.0),
                         reduces_to={"fedavg": 1.0}, reduces_with={"fedfv-tau": 0},
                         doc="α, the share of the highest-loss clients whose update is kept unprojected (1 with "
                             "τ = 0: no projection, the uniform mean update rescaled to its own norm: FedAvg)")
    tau: int = hyper(1, low=0, grid=Grid((0, 1, 3, 10), 0, 100),
                     doc="τ, the rounds of stored updates checked for external conflicts")

    def check_run(self, rounds: int, clients_per_round: int) -> None:
        if self.tau > rounds:
            raise ConfigError(f"run-config key 'fedfv-tau' = {self.tau} exceeds num-server-rounds = {rounds}: no "
                              f"stored update is older than the run; use at most {rounds}")


@dataclasses.dataclass
class State:
    """Each client's latest update and the round it arrived (client id → ...)."""

    last_round: dict[int, int] = dataclasses.field(default_factory=dict)
    update: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def by_age(self, server_round: int, tau: int, d: int, dtype) -> list[torch.Tensor]:
        """The stored updates by age 1 … min(τ, server_round − 1): no update is older than the
        run, so a τ beyond the rounds played sizes nothing (the external step skips empty ages)."""
        out = []
        for k in range(1, min(tau, server_round - 1) + 1):
            rows = [self.update[p] for p, r in self.last_round.items() if r == server_round - k]
            out.append(torch.stack(rows) if rows else torch.empty(0, d, dtype=dtype))
        return out

    def store(self, server_round: int, tau: int, partition_ids: list[int], deltas: torch.Tensor) -> State:
        """The state with these updates stored and the ones too old to be read dropped (this one unchanged)."""
        last_round, update = dict(self.last_round), dict(self.update)
        for pid, row in zip(partition_ids, deltas):
            last_round[pid] = server_round
            update[pid] = row.clone()
        for pid in [p for p, r in last_round.items() if r <= server_round - tau]:
            # Seen τ or more rounds ago: round t+1 looks back to t+1−τ at most.
            del last_round[pid], update[pid]
        return State(last_round, update)


def project_off(g: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """g − (g·ref / ‖ref‖²) ref (the component of g orthogonal to ref)."""
    return g - (torch.dot(g, ref) / max(float(torch.dot(ref, ref)), NORM_EPS)) * ref


def fedfv_internal(deltas: torch.Tensor, losses: torch.Tensor, alpha: float) -> tuple[torch.Tensor, int]:
    """Step 1: the uniform mean of the conflict-projected updates, and how many
    projections were made.

    Every g̃_i stays in the span of the original Δ_j, so it is carried as coefficients
    c_i (g̃_i = c_i·Δ) and each test Δ_j·g̃_i is G_j·c_i with the Gram matrix G = ΔΔᵀ:
    one (m, d) × (d, m) product instead of m² sequential passes over d-long vectors
    (the same projections as the textbook loop, to float rounding; tested against it).
    """
    m = deltas.shape[0]
    order = [int(i) for i in torch.argsort(losses, stable=True)]
    keep = set(order[math.ceil((m - 1) * (1.0 - alpha)) :]) if alpha > 0 else set()
    gram = (deltas @ deltas.T).to(torch.float64)
    coef = torch.eye(m, dtype=torch.float64)
    count = 0
    for i in range(m):
        if i in keep:
            continue
        c = coef[i]
        for j in order:
            if j == i:
                continue
            dot = float(gram[j] @ c)
            if dot < 0.0:
                c[j] -= dot / max(float(gram[j, j]), NORM_EPS)  # g̃_i −= (Δ_j·g̃_i / ‖Δ_j‖²) Δ_j
                count += 1
    return coef.mean(dim=0).to(deltas.dtype) @ deltas, count


def fedfv_external(g: torch.Tensor, history_by_age: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Step 2. ``history_by_age[k-1]``: (n_k, d) stored updates of clients last seen k
    rounds ago; ages are visited from the oldest (τ) to the newest (1)."""
    count = 0
    for stored in reversed(history_by_age):
        if stored.shape[0] == 0:
            continue
        conflicting = stored[stored @ g < 0.0]
        if conflicting.shape[0] == 0:
            continue
        g_con = conflicting.sum(dim=0)
        if float(torch.dot(g, g_con)) < 0.0:
            g = project_off(g, g_con)
            count += 1
    return g, count


def rescale(g: torch.Tensor, norm: float) -> torch.Tensor:
    g_norm = float(g.norm())
    return g * (norm / g_norm) if g_norm > NORM_EPS else g


class FedFVMethod(Method):
    """FedFV's server step (client: plain local SGD); its pairwise conflict tests need each
    client's update (no secure aggregation)."""

    Params = Params
    weighting = "uniform"  # the uniform mean of the projected updates
    own_step = "its step is the conflict-free direction rescaled to the mean update's norm"

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(keys.LOSS_BEFORE,))  # F_i(θ_t): the clients compute it for this method

    def init(self) -> State:
        return State()

    def aggregate(self, round_: Round, state: State) -> Step:
        theta, deltas = round_.theta, round_.deltas
        alpha, tau = self.params.alpha, self.params.tau
        target_norm = float(deltas.mean(dim=0).norm())
        g, n_internal = fedfv_internal(deltas, round_.value(keys.LOSS_BEFORE), alpha)
        past = state.by_age(round_.number, tau, deltas.shape[1], deltas.dtype)
        g, n_external = fedfv_external(g, past)
        g = rescale(g, target_norm)
        metrics = {
            "fedfv-internal-projections": n_internal,
            "fedfv-external-projections": n_external,
            "update-norm": float(g.norm()),
        }
        return Step(theta - g, state.store(round_.number, tau, round_.clients, deltas), metrics)


@register("fedfv")
class FedFV(FairStrategy):
    """FedFV (see the module docstring): ``FedFV(alpha=0.1, tau=1, fraction_train=0.25, lr=0.1, seed=0)``."""

    method_class = FedFVMethod
    Params = Params

    def __init__(self, *, alpha: float = Params.alpha, tau: int = Params.tau, params: Params | None = None,
                 **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedFV", alpha=alpha, tau=tau), **common)
