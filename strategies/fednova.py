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
``FedNova(momentum=0.9)``; this app passes it as an app argument. ``server-lr`` is η_g, as
for FedAvg.
Degenerate case: equal τ_i gives a_i = τ_eff for all i, i.e. exactly FedAvg.
"""

from __future__ import annotations

import torch
from flwr.app import MetricRecord

from fedcore import keys
from strategies.base import FairStrategy
from strategies.registry import register
from strategies.rounds import Aggregated


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


@register("fednova")
class FedNova(FairStrategy):
    """FedNova server step (client: plain local SGD, reporting ``num-steps``).

    ``momentum``: the clients' heavy-ball ρ (the run's ``momentum``), for a_i.
    """

    weighting = "data-size"  # p_i = n_i / Σ n_j

    # The server divides each update by its own a_i: it must see every update (a client
    # that sent Δ_i/a_i itself would make a weighted sum enough; the SGD client does not).
    needs_individual_updates = True
    required_metrics = (keys.NUM_STEPS,)
    reads_num_steps = True  # a_i from it: a whole number in [1, the steps asked] (FairStrategy.check_numbers)

    def __init__(self, *, momentum: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.momentum = momentum

    def aggregate_valid(self, server_round, replies):
        batch = self.read_updates(replies)
        theta = batch.theta
        a = nova_step_weights(batch.num_steps, self.momentum)
        step, tau_eff = fednova_step(batch.deltas, batch.fedavg_weights, a)
        metrics = {"fednova-tau-eff": tau_eff, "update-norm": float(step.norm())}
        return Aggregated(self.to_record(theta - self.step_scale(server_round) * step), MetricRecord(metrics))
