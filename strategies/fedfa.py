"""FedFa (Huang, Li, Wang, Du, Zhang, "Fairness and Accuracy in Federated Learning",
arXiv:2012.10069, 2020): aggregation weights from the information in the clients' training
accuracies and participation frequencies, with momentum on the clients and on the server.

Reference: FLGo (``WwZzz/easyFL``, ``flgo/algorithm/fedfa.py``, commit ee6e269 of 2023-04-06, read
2026; FLGo's own note: "a non-official implementation"). With the m replying clients' training
accuracy of the received model a_i (``fedfa-accuracy``, in [0, 1], scored before local training)
and participation counts f_i (this round included), β and γ:

    I^a_i = −log2(a_i/Σa + 1e−6),   I^f_i = −log2(1 − f_i/Σf + 1e−5),
    p_i = (1 − β) I^a_i/ΣI^a + β I^f_i/ΣI^f,        θ̄ = Σ_i p_i θ_i,
    M ← γ M + (1 − γ)(θ̄ − θ_t)      (M = 0 before the first round),
    θ_{t+1} = θ̄ − η_l M

(η_l: the round's client learning rate, FLGo's ``learning_rate``). The clients train with SGD
momentum γ (FLGo sets every client's ``momentum`` to γ: the "double momentum"), which the FedFa
client routine (``client_app.methods.fedfa``) takes instead of the run's ``momentum`` key; it also
sends a_i. A client of lower accuracy carries more information (a larger I^a): fairness; as the
code computes it, a client that has trained more often has the larger frequency term.

Deviations: f_i is counted by the server (the rounds in which the client's reply was aggregated),
not sent by the client as FLGo's clients do: a stranger's count is not trusted. A round whose
accuracies are all 0 takes a_i/Σa = 1/m (the code would divide by 0). ``server-lr`` is not used
(the step is FLGo's).

The other implementation the issue names, zibinpan's gfedplat (``gfedplat/algorithm/FedFa/FedFa.py``
in ``zibinpan/FedLF``), differs from FLGo and is not followed: its accuracy is scored after local
training, its frequency is f_i/t, its weights normalise the raw accuracies and frequencies by the
sums of their information terms (``ACCinf = acc_locals / torch.sum(ACCinf)``) and its server takes a
heavy-ball step (M ← γM + (θ̄ − θ_t), θ_{t+1} = θ_t + M).

Special cases: equal accuracies and equal counts give p_i = 1/m; β = 0 weights by accuracy alone,
β = 1 by frequency alone (uniform in a client's first round: every f_i = 1); γ = 0 steps to
θ̄ − η_l(θ̄ − θ_t) = θ_t + (1 − η_l)(θ̄ − θ_t) with plain local SGD. FedFa has no reduction to FedAvg
(its weights are never the data sizes). The method is ``fedfa``; the strategy is :class:`FedFa`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Request, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

ACC_EPS = 1e-6  # FLGo's constants inside the logarithms
FREQ_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedfa"
    beta: float = hyper(0.5, low=0.0, high=1.0, grid=Grid((0.25, 0.5, 0.75), 0.0, 1.0),
                        doc="β, the weight of the participation-frequency term (1 − β weights the accuracy term; "
                            "FLGo's 0.5); 0: accuracy alone, 1: frequency alone")
    gamma: float = hyper(0.9, low=0.0, high=1.0, high_open=True, grid=Grid((0.5, 0.9), 0.0, 0.99),
                         doc="γ, the momentum of the server's average update and of the clients' local SGD (sent "
                             "to them; FLGo's 0.9); 0: no momentum on either side")


def information_weights(accuracy: torch.Tensor, counts: torch.Tensor, beta: float) -> torch.Tensor:
    """p_i = (1 − β) I^a_i/ΣI^a + β I^f_i/ΣI^f (float64; see the module docstring)."""
    acc = accuracy.to(torch.float64)
    share = acc / acc.sum() if float(acc.sum()) > 0 else torch.full_like(acc, 1.0 / acc.numel())
    info_acc = -torch.log2(share + ACC_EPS)
    freq = counts.to(torch.float64)
    info_freq = -torch.log2(1.0 - freq / freq.sum() + FREQ_EPS)
    return (1.0 - beta) * info_acc / info_acc.sum() + beta * info_freq / info_freq.sum()


def fedfa_step(theta: torch.Tensor, mean_model: torch.Tensor, momentum: torch.Tensor | None, gamma: float,
               eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(θ_{t+1}, M): M ← γM + (1 − γ)(θ̄ − θ_t) (M = 0 first), θ_{t+1} = θ̄ − η M."""
    move = mean_model - theta
    new_momentum = (1.0 - gamma) * move if momentum is None else gamma * momentum + (1.0 - gamma) * move
    return mean_model - eta * new_momentum, new_momentum


@dataclasses.dataclass
class State:
    """Each client's participation count and the server's momentum M (None before the first round)."""

    counts: dict[int, int] = dataclasses.field(default_factory=dict)
    momentum: torch.Tensor | None = None


class FedFaMethod(Method):
    """FedFa (see the module docstring): the clients run ``client_app.methods.fedfa``."""

    Params = Params
    weighting = "loss"  # information weights: they fall with the clients' accuracy
    client_method = keys.FEDFA
    own_step = "its step is the weighted mean of the local models less η_l times its server momentum (FLGo's)"

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(values={keys.FEDFA_ACCURACY: (0.0, 1.0, "an accuracy")})

    def init(self) -> State:
        return State()

    def request(self, server_round, state, current):
        return Request(self.params.to_run_config())  # γ for the clients' momentum

    def aggregate(self, round_: Round, state: State) -> Step:
        counts = dict(state.counts)
        for client in round_.clients:
            counts[client] = counts.get(client, 0) + 1
        freq = torch.tensor([counts[c] for c in round_.clients], dtype=torch.float64)
        p = information_weights(round_.value(keys.FEDFA_ACCURACY), freq, self.params.beta)
        theta = round_.theta
        mean_model = round_.weighted_models(p)  # Σ p_i θ_i from the reply bytes
        new, momentum = fedfa_step(theta, mean_model, state.momentum, self.params.gamma, round_.lr)
        metrics = {"fedfa-weights": [float(x) for x in p], "fedfa-counts": [int(x) for x in freq],
                   "momentum-norm": float(momentum.norm()), "update-norm": float((theta - new).norm())}
        return Step(new, State(counts, momentum), metrics)


@register("fedfa")
class FedFa(FairStrategy):
    """FedFa (see the module docstring): ``FedFa(beta=0.5, gamma=0.9, fraction_train=0.1, lr=0.1, seed=0)``."""

    method_class = FedFaMethod
    Params = Params

    def __init__(self, *, beta: float = Params.beta, gamma: float = Params.gamma, params: Params | None = None,
                 **common: Any) -> None:
        super().__init__(method_params(Params, params, "FedFa", beta=beta, gamma=gamma), **common)
