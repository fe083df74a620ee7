"""PropFair (Zhang, Malekmohammadi, Chen, Yu, "Proportional Fairness in Federated Learning", TMLR
2023, arXiv:2202.01666): each client maximises the log utility log(M − f) of its batch loss f
against a baseline M (the Nash bargaining solution's objective); the server takes FedAvg's mean.

Reference: the authors' code, huawei-noah ``Federated-Learning/FairFL`` (``algs/algorithms.py``,
class ``PropFair``, and ``algs/run.py``; commit 8d111ed of 2023-04-22, read 2026). Each local step
on a batch of mean cross-entropy f minimises

    φ(f) = −log(1 − f/M)                      if M − f ≥ ε,
    φ(f) = f/M   (``propfair-huber`` false)   or   f/ε   (true)   otherwise,

(−log(1 − f/M) = −log(M − f) + log M: the paper's −log(M − f) up to a constant; the linear branch
keeps a batch whose loss nears M from diverging: its gradient is ∇f/M, or with the Huber variant
∇f/ε, the log branch's slope at f = M − ε). The client routine is ``client_app.methods.propfair``
(on the loop, as rows, and in ``client_app.foreign.ClientSide``); the strategy sends M, ε and the
variant in every request. The server is FedAvg's (data-size weights n_i/Σn_j, the code's
``weights``; ``fedavg-weighting`` as FedAvg's), so PropFair's aggregate runs under secure
aggregation and central DP as FedAvg's does.

Defaults are the code's: M = 2 (``--base``), ε = 0.2 (``run.py`` passes 0.2 to PropFair), the
linear branch f/M (``--huber`` false).

Special cases: with ε ≥ M every batch takes the linear branch (f ≥ 0 > M − ε, and at f = 0 the log
branch has the same slope 1/M): local SGD on f/M, i.e. FedAvg's local SGD at the learning rate
η_l/M (with the Huber variant, η_l/ε); FedAvg is also the limit M → ∞ at η_l·M fixed, where
∇φ = ∇f/(M − f) → ∇f/M. Neither is a reduction at a finite value of one key at the same learning
rate, so none is declared (``reduces_to``). The method is ``propfair``; the strategy is
:class:`PropFair`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Request
from strategies.fedavg import FedAvgMethod, WeightedStrategy, check_weighting
from strategies.flower import method_params
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "propfair"
    base: float = hyper(2.0, low=0.0, low_open=True, grid=Grid((2.0, 3.0, 5.0, 10.0), 1.0, 100.0),
                        doc="M, the baseline of the clients' log utility log(M − f) (the code's default 2); the "
                            "larger, the closer to FedAvg at the learning rate lr/M; below the clients' losses "
                            "every batch takes the linear branch (SGD at lr/M)")
    epsilon: float = hyper(0.2, low=0.0, low_open=True,
                           doc="ε: a batch whose loss f exceeds M − ε takes the linear branch (the code's 0.2); "
                               "ε >= M: every batch, local SGD on f/M")
    huber: bool = hyper(False, doc="the linear branch's slope: false 1/M (the code's default), true 1/ε (the "
                                   "log branch's slope at f = M − ε)")


class PropFairMethod(FedAvgMethod):
    """FedAvg on the server; the clients run ``client_app.methods.propfair`` with the sent M, ε."""

    Params = Params
    client_method = keys.PROPFAIR

    def request(self, server_round, state, current):
        return Request(self.params.to_run_config())


@register("propfair")
class PropFair(WeightedStrategy):
    """PropFair (see the module docstring): ``PropFair(base=2.0, epsilon=0.2, fraction_train=0.1, lr=0.1)``;
    ``fedavg_weighting`` as FedAvg's (``"data-size"`` or ``"uniform"``)."""

    method_class = PropFairMethod
    Params = Params

    def __init__(self, *, base: float = Params.base, epsilon: float = Params.epsilon, huber: bool = Params.huber,
                 fedavg_weighting: str = "data-size", params: Params | None = None, **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        super().__init__(method_params(Params, params, "PropFair", base=base, epsilon=epsilon, huber=huber),
                         **common)
