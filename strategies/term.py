"""TERM (Li, Beirami, Sanjabi, Smith, "Tilted Empirical Risk Minimization", ICLR 2021; "On Tilted
Losses in Machine Learning", JMLR 2023): the server weights each client by e^(t·F_i(θ_t)) over a
running estimate of the tilted normaliser, so that a tilt t > 0 moves from the mean towards the
largest of the clients' losses.

Which TERM. The papers' federated experiment ("fair federated learning", ``litian96/TERM``,
``fair_flearn/flearn/trainers/tilting.py``, commit c4941bd of 2020-07-02, read 2026) tilts at the
*client* level and on the server only: the clients run plain local SGD and send the loss of the
received model on their training data (``loss-before``, the code's ``c.get_loss()`` before
``solve_inner``); the server reweights their updates. Nothing changes on the clients, so TERM has
no client routine. (The JMLR paper's hierarchical TERM, with a second tilt over each client's
samples, is not what its federated code runs.) huawei-noah's ``Federated-Learning/FairFL``
(``algs/algorithms.py``, class ``TERM``, commit 8d111ed of 2023-04-22) runs the same client-level
tilt with the normaliser of the round alone.

With F_i = ``loss-before`` of the m replying clients, p_i = n_i/Σn_j (Flower's ``weighted_by_key``),
tilt t and rate λ:

    R̃_k = (1 − λ) R̃_{k−1} + λ Σ_i p_i e^(t F_i),    R̃_0 = 0   (k: the rounds aggregated so far)
    R̂_k = R̃_k / (1 − (1 − λ)^k)                              (the running mean, bias-corrected)
    w_i = p_i e^(t F_i) / R̂_k,    θ_{t+1} = θ_t − s Σ_i w_i Δ_i     (Δ_i = θ_t − θ_i)

with s = ``server-lr``/``lr`` (1 by default). R̃ is the JMLR paper's stochastic estimate of the
normaliser (the code's ``estimates``, λ = 0.5); kept in log space, e^(tF) never overflows. λ = 1
normalises every round (Σ w_i = 1: FairFL's TERM, ``weights_term``).

Deviations from ``tilting.py``, each a correction of the code's arithmetic (the test ports the
code and checks each against it):

* the code divides by m twice (``weights`` over ``estimates·clients_per_round``, then the mean of
  the m models): its step is 1/m of Σ w_i Δ_i — here s = 1, as FedAvg's; the code's step is this
  method with ``server-lr`` = ``lr``/m;
* the code starts ``estimates`` at 0, so that its first rounds' weights sum to 1/(1 − (1 − λ)^k)
  (2 in round 1): here the running mean is bias-corrected (as Adam's moments are);
* the code shifts each round's losses by their maximum before the exponential (its numerical
  guard) but keeps the shifted values in the running mean, whose rounds then mix different
  shifts; here the mean is of e^(tF) itself (log space), exactly the paper's R̃;
* the code's clients are drawn ∝ n_i and averaged uniformly; here the draw is the app's and the
  weights carry p_i, so that t = 0 is FedAvg's data-size mean exactly.

Limiting cases: t = 0 gives w_i = p_i for any λ: FedAvg (its data-size mean; ``reduces_to``). As
t → ∞ (λ = 1) the weight goes to the clients of the largest loss (the max-loss objective), t < 0
tilts towards the smallest losses (TERM's robust side). The method is ``term``; the strategy is
:class:`TERM`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "term"
    tilt: float = hyper(0.1, grid=Grid((0.1, 0.5, 1.0, 2.0, 5.0), 0.0, 50.0), reduces_to={"fedavg": 0.0},
                        doc="t, the tilt of the clients' losses (the authors' federated run: 0.1); 0 is FedAvg "
                            "(data-size weights), > 0 weights the larger losses more (max-loss as t grows), < 0 "
                            "the smaller (TERM's robust side)")
    rate: float = hyper(0.5, low=0.0, high=1.0, low_open=True,
                        doc="λ, the rate of the running estimate of the tilted normaliser Σ p_i e^(tF_i) (the "
                            "authors' 0.5); 1 normalises every round's weights to sum 1 (FairFL's TERM)")


def log_tilted_mass(losses: torch.Tensor, p: torch.Tensor, tilt: float) -> float:
    """log Σ_i p_i e^(t F_i), in float64 and without overflow (log-sum-exp)."""
    return float(torch.logsumexp(torch.log(p.to(torch.float64)) + tilt * losses.to(torch.float64), dim=0))


def running_log_normaliser(log_prev: float, rounds_prev: int, log_mass: float, rate: float) -> float:
    """log R̃_k = log((1 − λ) R̃_{k−1} + λ x_k) with R̃_0 = 0 (``rounds_prev`` = k − 1)."""
    fresh = math.log(rate) + log_mass
    if rounds_prev == 0 or rate == 1.0:
        return fresh
    return float(torch.logaddexp(torch.tensor(math.log1p(-rate) + log_prev, dtype=torch.float64),
                                 torch.tensor(fresh, dtype=torch.float64)))


def term_weights(losses: torch.Tensor, p: torch.Tensor, tilt: float, rate: float, log_prev: float = 0.0,
                 rounds_prev: int = 0) -> tuple[torch.Tensor, float]:
    """(w_i = p_i e^(tF_i)/R̂_k, log R̃_k): the round's weights (float64) and the running
    normaliser to keep (uncorrected; R̂_k = R̃_k/(1 − (1 − λ)^k))."""
    log_r = running_log_normaliser(log_prev, rounds_prev, log_tilted_mass(losses, p, tilt), rate)
    correction = math.log1p(-((1.0 - rate) ** (rounds_prev + 1)))  # log(1 − (1 − λ)^k); 0 at λ = 1
    log_w = torch.log(p.to(torch.float64)) + tilt * losses.to(torch.float64) - (log_r - correction)
    return torch.exp(log_w), log_r


@dataclasses.dataclass
class State:
    """The running tilted normaliser: log R̃_k (uncorrected) and k, the rounds aggregated."""

    log_normaliser: float = 0.0
    rounds: int = 0


class TERMMethod(Method):
    """TERM's server step (client: plain local SGD, reporting ``loss-before``)."""

    Params = Params
    weighting = "loss"  # p_i e^(tF_i); t = 0 is the data-size mean

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(keys.LOSS_BEFORE,))  # F_i(θ_t), the tilted losses

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return "data-size" if cls.Params.from_run_config(config).tilt == 0.0 else "loss"

    def init(self) -> State:
        return State()

    def aggregate(self, round_: Round, state: State) -> Step:
        theta = round_.theta
        p = round_.weights / round_.weights.sum()
        w, log_r = term_weights(round_.value(keys.LOSS_BEFORE), p, self.params.tilt, self.params.rate,
                                state.log_normaliser, state.rounds)
        total = float(w.sum())
        g = round_.weighted_models(w)  # Σ w_i θ_i from the reply bytes, no (m, d) matrix
        g = torch.sub(theta * total, g, out=g)  # Σ w_i Δ_i = (Σ w_i) θ_t − Σ w_i θ_i
        metrics = {"term-weights": [float(x) for x in w], "term-weight-sum": total,
                   "update-norm": float(round_.step_scale * g.norm())}
        return Step(theta - round_.step_scale * g, State(log_r, state.rounds + 1), metrics)


@register("term")
class TERM(FairStrategy):
    """TERM (see the module docstring): ``TERM(tilt=1.0, rate=0.5, fraction_train=0.1, lr=0.1, seed=0)``."""

    method_class = TERMMethod
    Params = Params

    def __init__(self, *, tilt: float = Params.tilt, rate: float = Params.rate, params: Params | None = None,
                 **common: Any) -> None:
        super().__init__(method_params(Params, params, "TERM", tilt=tilt, rate=rate), **common)
