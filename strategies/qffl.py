"""q-FedAvg / q-FFL (Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated
Learning", ICLR 2020; reference code ``litian96/fair_flearn``, Flower's
``serverapp/strategy/qfedavg.py``).

With L = 1/η_l (η_l = this round's client learning rate) and F_k the loss of θ_t on
client k's training data *before* local training (the ``loss-before`` metric):

    Δw_k = L (θ_t − θ_k),   Δ_k = F_k^q Δw_k,
    h_k  = q F_k^(q−1) ‖Δw_k‖² + L F_k^q,
    θ_{t+1} = θ_t − Σ_k Δ_k / Σ_k h_k.

``server-lr`` is not used (a non-zero value is refused): the step Σ Δ_k / Σ h_k is q-FFL's own
(its size comes from L and h_k).
The method is ``qffl``; the strategy is :class:`QFFL`, a drop-in for Flower's ``QFedAvg`` (also
exported under that name: ``client_learning_rate`` is ``lr``; a reply without ``loss-before`` is
read with Flower's ``train_loss_key`` metric instead, the loss after local training that Flower's
QFedAvg uses), returning Flower's float64 arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedcore import keys
from fedcore.config import Grid, check_value
from fedcore.params import MethodParams, hyper
from strategies.base import Method, Reads, Round, Step
from strategies.fedavg import MetricsFn
from strategies.flower import (
    FairStrategy,
    flower_arguments,
    flower_dtypes,
    given_lr,
    given_once,
    method_params,
    params_property,
)
from strategies.registry import register

LOSS_EPS = 1e-10  # as fair_flearn and Flower: keeps F^(q−1) finite when a loss is 0


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "qffl"
    q: float = hyper(1.0, low=0.0, grid=Grid((0.1, 0.2, 1.0, 2.0, 5.0), 0.0, 50.0),
                     reduces_to={"fedavg": 0.0},
                     doc="the fairness exponent q; 0 is FedAvg with equal client weights (θ_t − Σ Δw_k/(m L) = "
                         "the uniform mean of the local models)")


def qffl_step(deltas: torch.Tensor, losses: torch.Tensor, q: float, lipschitz: float) -> tuple[torch.Tensor, float]:
    """The q-FFL displacement Σ Δ_k / Σ h_k and Σ h_k.

    ``deltas``: (m, d) rows θ_t − θ_k; ``losses``: (m,) F_k ≥ 0; ``lipschitz``: L = 1/η_l.
    """
    f = losses.to(torch.float64) + LOSS_EPS
    sq_norms = torch.linalg.vector_norm(deltas.to(torch.float64), dim=1) ** 2 * lipschitz**2  # ‖Δw_k‖²
    f_q = f.pow(q)
    h = q * f.pow(q - 1.0) * sq_norms + lipschitz * f_q
    coef = (lipschitz * f_q).to(deltas.dtype)  # Δ_k = F_k^q · L (θ_t − θ_k)
    sum_h = float(h.sum())
    return (coef @ deltas) / sum_h, sum_h


class QFFLMethod(Method):
    """q-FFL's server step (client: plain local SGD, reporting ``loss-before``)."""

    Params = Params
    weighting = "loss"  # F_k^q; q = 0 is the uniform mean
    own_step = "its step is Σ Δ_k / Σ h_k (its size comes from L = 1/lr and h_k)"
    # h_k needs each client's ‖Δw_k‖²: the server must see every update.
    needs_individual_updates = True

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        self.reads = Reads(losses=(keys.LOSS_BEFORE,))  # F_i(θ_t): the clients compute it for this method

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return "uniform" if cls.Params.from_run_config(config).q == 0.0 else "loss"

    def aggregate(self, round_: Round, state: Any) -> Step:
        theta, deltas = round_.theta, round_.deltas
        step, sum_h = qffl_step(deltas, round_.value(keys.LOSS_BEFORE), self.params.q, 1.0 / round_.lr)
        return Step(theta - step, state, {"qffl-sum-h": sum_h, "update-norm": float(step.norm())})


@register("qffl")
class QFFL(FairStrategy):
    """q-FFL (see the module docstring), and a drop-in for Flower's ``QFedAvg``: Flower's
    arguments in Flower's order (``client_learning_rate`` is the clients' ``lr``; default 0.1)::

        QFFL(q=1.0, fraction_train=0.25, lr=0.1, seed=0)      # or QFedAvg(0.1, 1.0)
    """

    method_class = QFFLMethod
    Params = Params
    float64_models = True
    q = params_property("q", "q, the fairness exponent")

    def __init__(self, client_learning_rate: float | None = None, q: float = Params.q,
                 train_loss_key: str = "train_loss", fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2, min_available_nodes: int = 2,
                 weighted_by_key: str = keys.NUM_EXAMPLES, arrayrecord_key: str = keys.ARRAYS,
                 configrecord_key: str = keys.CONFIG, train_metrics_aggr_fn: MetricsFn | None = None,
                 evaluate_metrics_aggr_fn: MetricsFn | None = None, *, lr: float | None = None,
                 params: Params | None = None, **common: Any) -> None:
        self.train_loss_key = train_loss_key  # Flower's QFedAvg's: read when a reply has no loss-before
        given_lr(common, given_once("QFFL", "client_learning_rate", client_learning_rate, "lr", lr, None))
        super().__init__(method_params(Params, params, "QFFL", q=q), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)

    @property
    def client_learning_rate(self) -> float:
        """Flower's name of the clients' learning rate ``lr``."""
        return self.lr

    @client_learning_rate.setter
    def client_learning_rate(self, value: float) -> None:
        self.lr = check_value("lr", value, float, low=0.0, low_open=True,
                              subject="QFFL attribute 'client_learning_rate'")

    def metric_fallbacks(self) -> dict[str, tuple[str, str]]:
        """loss-before, read from Flower's ``train_loss_key`` when a reply lacks it (strategies.gate)."""
        return {keys.LOSS_BEFORE: (self.train_loss_key, "Flower's QFedAvg train_loss_key (the loss after local "
                                   "training, as Flower's QFedAvg weights); send 'loss-before' for q-FFL's F_k(θ_t)")}

    def flower_arrays(self, arrays):
        """Flower's QFedAvg returns float64 arrays (its numpy arithmetic promotes float32)."""
        return flower_dtypes(arrays, {k: "float64" for k in (arrays or {}).keys()})


QFedAvg = QFFL  # Flower's name
