"""FedHEAL (Chen et al., 2024, "Fair Federated Learning under Domain Skew with Local
Consistency and Domain Diversity", CVPR): sign-consistency masks + distance-based weights.

Following the authors' code (``yuhangchen0/FedHEAL``, ``models/fedavgheal.py`` and
``models/utils/federated_model.py``), with Δ_i = θ_t − θ_i:

* Mask (local consistency). Each client keeps r_i, the running frequency with which each
  coordinate of its update was ≥ 0. On the client's first participation m_i = 1 and
  r_i = [Δ_i ≥ 0]; afterwards c_j = r_i,j where Δ_i,j ≥ 0 else 1 − r_i,j (how often the
  current sign occurred before), m_i = [c > τ_s], then r_i ← (n r_i + [Δ_i ≥ 0])/(n + 1)
  with n the client's number of earlier participations.
* Weights (domain diversity). D_i = Σ_arrays ‖m_i ⊙ Δ_i‖ (the sum of per-array norms, as
  the code sums per-parameter norms); δ_i ← (1 − β) δ_i + β D_i / Σ_{j∈S_t} D_j;
  w_i ← w_i + δ_i (w_i starts at 1/m, δ_i at 0; the stored w_i stay unnormalised, as in
  the code); the round's weights are w_i / Σ_{j∈S_t} w_j.
* Aggregation, per coordinate: θ ← θ − s Σ_i [w_i m_i / Σ_j w_j m_j] m_i Δ_i (where no
  client keeps a coordinate the masked updates are all zero and θ stays put there),
  with s = ``server-lr``/``lr`` (1 when ``server-lr`` is 0, the default).

Partial participation: r_i, n_i, δ_i and w_i persist across rounds keyed by client id
(:class:`State`: one :class:`ClientMemory` per client seen).
The code counts n by the global round index (it runs all clients every round); here n is
the client's own number of participations, and Σ D sums over this round's clients only
(the code's dict also held stale distances of absent clients).

"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedcore.params import MethodParams, hyper
from strategies.base import Method, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """FedHEAL's hyperparameters (see the module docstring)."""

    prefix = "fedheal"
    threshold: float = hyper(0.3, high=1.0, doc="τ_s, the mask's sign-consistency threshold (the code's default); 0 "
                                                "keeps every coordinate whose sign occurred before, < 0 keeps all")
    beta: float = hyper(0.4, low=0.0, high=1.0, reduces_to={"fedavg": 0.0},
                        reduces_with={"fedheal-threshold": -1.0},
                        doc="β, the step of the distance-based weights; 0 keeps them uniform "
                                                    "1/m (with threshold < 0: FedAvg with uniform weights)")


def consistency_mask(
    deltas: torch.Tensor, up_freq: torch.Tensor, threshold: float
) -> torch.Tensor:
    """m = [frequency of the current sign in the client's past > threshold] (float)."""
    positive = deltas >= 0
    consistency = torch.where(positive, up_freq, 1.0 - up_freq)
    return (consistency > threshold).to(deltas.dtype)


def masked_distances(masked: torch.Tensor, groups: list[tuple[int, int]]) -> torch.Tensor:
    """D_i = Σ_q ‖(m_i ⊙ Δ_i)_q‖ over the column groups q (the model's arrays)."""
    return sum(torch.linalg.vector_norm(masked[:, a:b].to(torch.float64), dim=1) for a, b in groups)


def masked_weighted_update(masked: torch.Tensor, masks: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_i [w_i m_i / Σ_j w_j m_j] (m_i ⊙ Δ_i) per coordinate (w_i where Σ_j w_j m_j = 0).

    With 0/1 masks m_i ⊙ m_i = m_i, so this is (w·(m ⊙ Δ)) / (w·m) per coordinate: two
    matrix-vector products and no (m, d) temporaries. Where no client keeps a coordinate
    every masked entry is 0 and so is the result, as with the weights w_i there.
    """
    w = weights.to(masked.dtype)
    total = w @ masks
    return (w @ masked) / torch.where(total == 0, 1.0, total)


@dataclasses.dataclass
class ClientMemory:
    up_freq: torch.Tensor  # (d,) running frequency of Δ ≥ 0
    count: int  # participations so far
    delta: float  # weight momentum δ_i
    weight: float  # unnormalised weight w_i


@dataclasses.dataclass
class State:
    clients: dict[int, ClientMemory] = dataclasses.field(default_factory=dict)  # client id → memory


class FedHEALMethod(Method):
    """FedHEAL (see the module docstring)."""

    Params = Params
    weighting = "distance"  # distance-based weights; β = 0 keeps them at 1/m

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return "uniform" if cls.Params.from_run_config(config).beta == 0.0 else "distance"

    def init(self) -> State:
        return State()

    def aggregate(self, round_: Round, state: State) -> Step:
        theta, deltas = round_.theta, round_.deltas
        m = deltas.shape[0]
        beta = self.params.beta
        clients = dict(state.clients)  # client id → its memory after this round (new objects: the old state stays)
        # Row by row, no (m, d) sign matrix: 100 ResNet-18 replies are 4.5 GB per such matrix.
        masks = torch.empty_like(deltas)
        for row, pid in enumerate(round_.clients):
            positive = (deltas[row] >= 0).to(deltas.dtype)
            mem = clients.get(pid)
            if mem is None:  # first participation: keep everything, start the frequency
                masks[row] = 1.0
                clients[pid] = ClientMemory(positive, 1, 0.0, 1.0 / m)
            else:
                masks[row] = consistency_mask(deltas[row], mem.up_freq, self.params.threshold)
                clients[pid] = ClientMemory((mem.up_freq * mem.count + positive) / (mem.count + 1), mem.count + 1,
                                            mem.delta, mem.weight)
        masked = deltas.mul_(masks)  # m_i ⊙ Δ_i in place (Δ is not needed afterwards)

        dist = masked_distances(masked, round_.spec.offsets())
        share = dist / dist.sum() if dist.sum() > 0 else torch.full_like(dist, 1.0 / m)
        for pid, s in zip(round_.clients, share.tolist()):
            mem = clients[pid]
            delta = (1.0 - beta) * mem.delta + beta * s
            clients[pid] = ClientMemory(mem.up_freq, mem.count, delta, mem.weight + delta)
        raw = torch.tensor([clients[pid].weight for pid in round_.clients], dtype=torch.float64)
        weights = raw / raw.sum()

        update = masked_weighted_update(masked, masks, weights)
        new = theta - round_.step_scale * update
        metrics = {
            "fedheal-weights": [float(x) for x in weights],
            "fedheal-momentum": [clients[pid].delta for pid in round_.clients],
            "fedheal-mask-density": [float(x) for x in masks.mean(1)],
            "fedheal-uncovered": float((masks.sum(0) == 0).to(torch.float64).mean()),
            "update-norm": float(round_.step_scale * update.norm()),
        }
        return Step(new, State(clients), metrics)


@register("fedheal")
class FedHEAL(FairStrategy):
    """FedHEAL (see the module docstring): ``FedHEAL(fraction_train=0.1, threshold=0.3, beta=0.4)``."""

    method_class = FedHEALMethod
    Params = Params

    def __init__(self, *, threshold: float = Params.threshold, beta: float = Params.beta,
                 params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedHEAL", threshold=threshold, beta=beta), **common)
