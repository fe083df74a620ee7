"""Agnostic Federated Learning (Mohri, Sivek, Suresh, "Agnostic Federated Learning",
ICML 2019; the federated version of fair_flearn / FLGo ``afl.py``).

A minimax game: the model descends on the λ-weighted loss, the mixture λ (on the simplex
over ALL N clients, initially uniform) ascends on it:

    θ_{t+1} = θ_t − (η_g/η_l) Σ_{k∈S_t} w_k Δ_k,   w_k = λ_k / Σ_{j∈S_t} λ_j,
    λ ← Proj(λ + γ_λ F),

with Δ_k = θ_t − θ_k and F_k the loss of θ_t on client k before training
(``loss-before``). The model that is evaluated and reported is the running average of
the iterates θ_0, θ_1, …, θ_t (:meth:`AFLStrategy.evaluation_arrays`).

Partial participation. AFL assumes every client every round. When only S_t is sampled,
only the sampled entries λ_S are updated: λ_S ← Proj_{c·Δ}(λ_S + γ_λ F_S), the Euclidean
projection onto {x ≥ 0, Σx = c} with c = Σ_{k∈S_t} λ_k, so the unsampled entries stay as
they are and λ stays on the simplex (mass moves among the sampled clients only). Under
full participation c = 1 and this is exactly the paper's update. If the sampled clients
hold no mass (c ≈ 0) the model step falls back to the FedAvg weights n_k/Σn.

Hyperparameters
---------------
afl-lambda-lr : float, default 0.01
    γ_λ ≥ 0, the step of the mixture weights (paper grid 0.01, 0.1, 0.5). Degenerate case:
    γ_λ = 0 keeps λ uniform, i.e. uniform-weight FedAvg evaluated on the averaged iterate.
server-lr : float, default 0 (= η_l)
    η_g, as for FedAvg.
"""

from __future__ import annotations

import numpy as np
import torch

from fedcore import keys
from strategies.base import FairStrategy, unpack_replies
from fedcore.flat import model_deltas, spec_of
from strategies.linalg import project_simplex
from strategies.registry import register

MASS_EPS = 1e-12


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


class AFLStrategy(FairStrategy):
    """AFL server (client: plain local SGD). State: λ, the averaged iterate and its count."""

    # The mixture weights change per client each round from individual losses, and the
    # weighted sum uses server-side weights: each update must be seen.
    needs_individual_updates = True
    required_metrics = (keys.LOSS_BEFORE,)  # F_i(θ_t): the clients compute it for this method

    def __init__(self, cfg, lambda_lr: float) -> None:
        super().__init__(cfg)
        self.lambda_lr = lambda_lr
        self.lam = np.full(cfg.num_clients, 1.0 / cfg.num_clients)
        self.avg_model: torch.Tensor | None = None  # mean of θ_0 … θ_t
        self.num_averaged = 0

    def begin_round(self, server_round, arrays):
        plan = super().begin_round(server_round, arrays)
        if self.avg_model is None:  # the average starts with the initial model θ_0
            self.avg_model = self.current_flat(torch.float64)
            self.num_averaged = 1
        return plan

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        batch = unpack_replies(replies)
        theta = self.current_flat()
        eta_l = self.round_lr(server_round)
        eta_g = self.cfg.server_lr or eta_l
        w = afl_model_weights(self.lam, batch.partition_ids, batch.fedavg_weights.numpy())
        deltas = model_deltas(theta, batch.local)
        step = torch.from_numpy(w).to(deltas.dtype) @ deltas
        new = theta - (eta_g / eta_l) * step
        self.lam = afl_lambda_update(self.lam, batch.partition_ids, batch.loss_before.numpy(), self.lambda_lr)
        self.num_averaged += 1
        self.avg_model += (new.to(torch.float64) - self.avg_model) / self.num_averaged
        metrics = {
            "afl-lambda": [float(x) for x in self.lam],
            "afl-weights": [float(x) for x in w],
            "update-norm": float(step.norm()),
        }
        return self.to_record(new), MetricRecord(metrics)

    def evaluation_arrays(self, arrays):
        if self.avg_model is None:
            return arrays
        if self.spec is None:  # resumed from a checkpoint, evaluated before any round
            self.spec = spec_of(arrays)
        return self.to_record(self.avg_model)

    def state_dict(self):
        return {
            "lambda": self.lam.copy(),
            "avg_model": None if self.avg_model is None else self.avg_model.clone(),
            "num_averaged": self.num_averaged,
        }

    def load_state_dict(self, state):
        lam = np.asarray(state["lambda"], dtype=np.float64)
        if lam.shape != self.lam.shape:
            raise ValueError(f"AFL checkpoint has λ for {lam.size} clients, this run has {self.lam.size}")
        self.lam = lam.copy()
        avg = state["avg_model"]
        self.avg_model = None if avg is None else torch.as_tensor(avg, dtype=torch.float64).clone()
        self.num_averaged = int(state["num_averaged"])


@register("afl")
def build(cfg):
    return AFLStrategy(cfg, lambda_lr=cfg.get_float("afl-lambda-lr", low=0.0))
