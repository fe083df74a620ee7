"""Agnostic Federated Learning (Mohri, Sivek, Suresh, "Agnostic Federated Learning",
ICML 2019; the federated version of fair_flearn / FLGo ``afl.py``).

A minimax game: the model descends on the λ-weighted loss, the mixture λ (on the simplex
over ALL N clients, initially uniform) ascends on it:

    θ_{t+1} = θ_t − (η_g/η_l) Σ_{k∈S_t} w_k Δ_k,   w_k = λ_k / Σ_{j∈S_t} λ_j,
    λ ← Proj(λ + γ_λ F),

with Δ_k = θ_t − θ_k and F_k the loss of θ_t on client k before training
(``loss-before``). The model that is evaluated and reported is the running average of
the iterates θ_0, θ_1, …, θ_t (:meth:`AFL.evaluation_arrays`); θ_0 is the first model
the strategy is handed. The app's ``eval-averaged-iterate`` (the mean of θ_1..θ_t for every
other method) changes nothing for AFL: it is always scored on this average, and its
summary says ``scored_iterate = "averaged"``. λ, the averaged iterate and its count are the :class:`State`.

Partial participation. AFL assumes every client every round. When only S_t is sampled,
only the sampled entries λ_S are updated: λ_S ← Proj_{c·Δ}(λ_S + γ_λ F_S), the Euclidean
projection onto {x ≥ 0, Σx = c} with c = Σ_{k∈S_t} λ_k, so the unsampled entries stay as
they are and λ stays on the simplex (mass moves among the sampled clients only). Under
full participation c = 1 and this is exactly the paper's update. If the sampled clients
hold no mass (c ≈ 0) the model step falls back to the FedAvg weights n_k/Σn.

``server-lr`` is η_g, as for FedAvg. N is ``num_clients`` (the app passes the run's
``num-clients``; a foreign app may leave it None, and then N is the number of nodes connected
at the first ``configure_train``). λ_k belongs to client id k when the ids are 0 … N−1 (this
app's partition ids); other ids (a foreign app's node ids) get the free slots in the order
they are first seen (:func:`afl_slots`). The method is ``afl``; the strategy is :class:`AFL`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from flwr.app import MetricRecord

from fedcore import keys
from fedcore.config import Grid
from fedcore.flat import spec_of
from fedcore.params import MethodParams, hyper
from strategies.base import FairStrategy
from strategies.linalg import project_simplex
from strategies.registry import register
from strategies.rounds import Aggregated

MASS_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "afl"
    lambda_lr: float = hyper(0.01, low=0.0, grid=Grid((0.01, 0.1, 0.5), 1e-4, 10.0),
                             doc="γ_λ, the step of the mixture weights λ; 0 keeps λ uniform (uniform-weight "
                                 "FedAvg scored on the averaged iterate)")


@dataclasses.dataclass
class State:
    """What AFL carries across rounds."""

    lam: np.ndarray | None = None  # (N,) mixture weights on the simplex; None until N is known
    avg_model: torch.Tensor | None = None  # float64 mean of θ_0 … θ_t
    num_averaged: int = 0
    slots: dict[int, int] = dataclasses.field(default_factory=dict)  # client id → index of λ


def afl_lambda_update(lam: np.ndarray, sampled: list[int], losses: np.ndarray, lr: float) -> np.ndarray:
    """λ with only the ``sampled`` entries moved: the sampled block ascends γ·F and is
    projected onto the scaled simplex holding its previous mass (see the module doc)."""
    lam = np.asarray(lam, dtype=np.float64).copy()
    idx = np.asarray(sampled, dtype=np.int64)
    mass = float(lam[idx].sum())
    if mass <= MASS_EPS:  # nothing to redistribute among these clients
        return lam
    # Proj onto {x ≥ 0, Σx = c} is c · Proj_simplex(v / c) (the set is the simplex scaled by c).
    lam[idx] = mass * project_simplex((lam[idx] + lr * np.asarray(losses, dtype=np.float64)) / mass)
    return lam


def afl_model_weights(lam: np.ndarray, sampled: list[int], fallback: np.ndarray) -> np.ndarray:
    """w_k = λ_k / Σ_{j∈S} λ_j over the sampled clients (``fallback`` if they hold no mass)."""
    w = np.asarray(lam, dtype=np.float64)[np.asarray(sampled, dtype=np.int64)]
    total = float(w.sum())
    return w / total if total > MASS_EPS else np.asarray(fallback, dtype=np.float64)


def afl_slots(slots: dict[int, int], clients: list[int], n: int) -> list[int]:
    """The λ index of each client, recording new ones in ``slots``: a client id in 0 … n−1
    keeps its own index while it is free, any other id takes the lowest free index."""
    taken = set(slots.values())
    out = []
    for c in clients:
        if c not in slots:
            if 0 <= c < n and c not in taken:
                slots[c] = c
            else:
                free = next((i for i in range(n) if i not in taken), None)
                if free is None:
                    raise ValueError(f"AFL: client {c} is client number {n + 1}, but λ has N = {n} entries "
                                     "(set num_clients to the federation's size)")
                slots[c] = free
            taken.add(slots[c])
        out.append(slots[c])
    return out


@register("afl")
class AFL(FairStrategy):
    """AFL server (client: plain local SGD); see the module docstring::

        AFL(lambda_lr=0.01, num_clients=20, fraction_train=0.25, lr=0.1, seed=0)

    The mixture weights change per client each round from individual losses and the
    weighted sum uses server-side weights, so each update must be seen (no secure aggregation).
    """

    weighting = "loss"  # λ ascends on the losses; γ_λ = 0 keeps it uniform

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return "uniform" if cls.Params.from_run_config(config).lambda_lr == 0.0 else "loss"

    Params = Params
    required_metrics = (keys.LOSS_BEFORE,)  # F_i(θ_t): the clients compute it for this method
    loss_metrics = (keys.LOSS_BEFORE,)  # weighted by: finite, >= 0, bounded (FairStrategy.check_numbers)
    evaluated_iterate = "averaged"  # evaluation_arrays: the mean of θ_0..θ_t (its paper's output)

    def init_state(self) -> State:
        n = self.num_clients
        return State(lam=None if n is None else np.full(n, 1.0 / n))

    def set_model(self, arrays):
        super().set_model(arrays)
        if self.state.avg_model is None:  # the average starts with the initial model θ_0
            self.state.avg_model = self.current_flat(torch.float64)
            self.state.num_averaged = 1

    def configure_train(self, server_round, arrays, config, grid, context=None):
        if self.state.lam is None:  # N unknown: the federation connected now
            n = len(list(grid.get_node_ids()))
            self.state.lam = np.full(n, 1.0 / n)
        return super().configure_train(server_round, arrays, config, grid, context)

    def aggregate_valid(self, server_round, replies):
        st = self.state
        if st.lam is None:
            raise RuntimeError("AFL needs num_clients (or configure_train()) before aggregate_train()")
        if self.num_clients is not None and st.lam.size != self.num_clients:
            raise ValueError(f"AFL state has λ for {st.lam.size} clients, this run has {self.num_clients}")
        batch = self.read_updates(replies)
        theta, deltas = batch.theta, batch.deltas
        idx = afl_slots(st.slots, batch.partition_ids, st.lam.size)
        w = afl_model_weights(st.lam, idx, batch.fedavg_weights.numpy())
        step = torch.from_numpy(w).to(deltas.dtype) @ deltas
        new = theta - self.step_scale(server_round) * step
        st.lam = afl_lambda_update(st.lam, idx, batch.loss_before.numpy(), self.params.lambda_lr)
        st.num_averaged += 1
        st.avg_model += (new.to(torch.float64) - st.avg_model) / st.num_averaged
        metrics = {
            "afl-lambda": [float(x) for x in st.lam],
            "afl-weights": [float(x) for x in w],
            "update-norm": float(step.norm()),
        }
        return Aggregated(self.to_record(new), MetricRecord(metrics))

    def evaluation_arrays(self, arrays):
        if self.state.avg_model is None:
            return arrays
        if self.spec is None:  # resumed from a checkpoint, evaluated before any round
            self.spec = spec_of(arrays)
        return self.to_record(self.state.avg_model)
