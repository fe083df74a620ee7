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
when its first aggregated round was sampled). λ_k belongs to client id k when the ids are
0 … N−1 (this app's partition ids); other ids (a foreign app's node ids) get the free slots in the
order they are first seen (:func:`afl_slots`). A client that arrives when every slot is taken (a
node that joins late, also beyond a declared ``num_clients``) is admitted: λ grows by one entry,
the newcomer gets 1/(N+1) and every earlier entry keeps its share of the rest, λ_k·N/(N+1) (as if
it had been there from the start with the uniform weight); a warning says so once per newcomer.
The method is ``afl``; the strategy is :class:`AFL`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.linalg import project_simplex
from strategies.registry import register

log = logging.getLogger("fedpcd")
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


def afl_slots(slots: dict[int, int], clients: list[int],
              lam: np.ndarray) -> tuple[list[int], dict[int, int], np.ndarray]:
    """(the λ index of each client, the slots with the new ones recorded, λ): a client id in 0 … N−1
    keeps its own index while it is free, any other id takes the lowest free index, and a client
    that finds none is admitted by :func:`afl_admit` (λ grows by one entry). ``slots`` and ``lam``
    are not modified."""
    slots, n = dict(slots), lam.size
    taken = set(slots.values())
    out = []
    for c in clients:
        if c not in slots:
            if 0 <= c < n and c not in taken:
                slots[c] = c
            else:
                free = next((i for i in range(n) if i not in taken), None)
                if free is None:
                    lam = afl_admit(lam)
                    free, n = n, n + 1
                    log.warning("AFL: client %s is client number %d, beyond the %d entries of λ (num_clients, or the "
                                "nodes connected at the first round): admitted with λ = 1/%d, the others rescaled",
                                c, n, n - 1, n)
                slots[c] = free
            taken.add(slots[c])
        out.append(slots[c])
    return out, slots, lam


def afl_admit(lam: np.ndarray) -> np.ndarray:
    """λ with one more entry for a newcomer: 1/(N+1) for it, λ_k·N/(N+1) for the others (still on the simplex)."""
    n = lam.size
    return np.concatenate([lam * (n / (n + 1.0)), [1.0 / (n + 1.0)]])


class AFLMethod(Method):
    """AFL server (client: plain local SGD); see the module docstring. The mixture weights change
    per client each round from individual losses and the weighted sum uses server-side weights,
    so each update must be seen (no secure aggregation)."""

    Params = Params
    weighting = "loss"  # λ ascends on the losses; γ_λ = 0 keeps it uniform
    evaluated_iterate = "averaged"  # evaluation_model: the mean of θ_0..θ_t (its paper's output)

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(keys.LOSS_BEFORE,))  # F_i(θ_t): the clients compute it for this method

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return "uniform" if cls.Params.from_run_config(config).lambda_lr == 0.0 else "loss"

    def init(self) -> State:
        n = self.setting.num_clients
        return State(lam=None if n is None else np.full(n, 1.0 / n))

    def aggregate(self, round_: Round, state: State) -> Step:
        lam, avg, count = state.lam, state.avg_model, state.num_averaged
        if lam is None:  # N unknown: the federation connected when the round was sampled
            n = round_.num_nodes or len(round_)
            lam = np.full(n, 1.0 / n)
        if avg is None:  # the average starts with the first model the method is handed, θ_0
            avg, count = round_.theta_as(torch.float64), 1
        theta, deltas = round_.theta, round_.deltas
        idx, slots, lam = afl_slots(state.slots, round_.clients, lam)
        w = afl_model_weights(lam, idx, round_.fedavg_weights.numpy())
        step = torch.from_numpy(w).to(deltas.dtype) @ deltas
        new = theta - round_.step_scale * step
        lam = afl_lambda_update(lam, idx, round_.value(keys.LOSS_BEFORE).numpy(), self.params.lambda_lr)
        count += 1
        avg = avg + (new.to(torch.float64) - avg) / count
        metrics = {
            "afl-lambda": [float(x) for x in lam],
            "afl-weights": [float(x) for x in w],
            "update-norm": float(step.norm()),
        }
        return Step(new, State(lam, avg, count, slots), metrics)

    def evaluation_model(self, state: State, current):
        if state.avg_model is None:
            return current
        from fedcore import flat

        return flat.flat_to_record(state.avg_model, flat.spec_of(current))


@register("afl")
class AFL(FairStrategy):
    """AFL (see the module docstring): ``AFL(lambda_lr=0.01, num_clients=20, fraction_train=0.25, lr=0.1, seed=0)``."""

    method_class = AFLMethod
    Params = Params

    def __init__(self, *, lambda_lr: float = Params.lambda_lr, params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "AFL", lambda_lr=lambda_lr), **common)
