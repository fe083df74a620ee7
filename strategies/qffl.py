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
The method is ``qffl``; the strategy is :class:`QFFL`, a drop-in for Flower's ``QFedAvg``
(``client_learning_rate`` is ``lr``; a reply without ``loss-before`` is read with Flower's
``train_loss_key`` metric instead, the loss after local training that Flower's QFedAvg uses).
"""

from __future__ import annotations

import dataclasses

import torch
from flwr.app import MetricRecord
from flwr.serverapp import strategy as flower

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import FairStrategy
from strategies.registry import register
from strategies.rounds import Aggregated

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


@register("qffl")
class QFFL(FairStrategy):
    """q-FFL server step (client: plain local SGD, reporting ``loss-before``)::

        QFFL(q=1.0, fraction_train=0.25, lr=0.1, seed=0)
    """

    weighting = "loss"  # F_k^q; q = 0 is the uniform mean

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return "uniform" if cls.Params.from_run_config(config).q == 0.0 else "loss"

    Params = Params
    own_step = "its step is Σ Δ_k / Σ h_k (its size comes from L = 1/lr and h_k)"
    # h_k needs each client's ‖Δw_k‖²: the server must see every update.
    needs_individual_updates = True
    required_metrics = (keys.LOSS_BEFORE,)  # F_i(θ_t): the clients compute it for this method
    loss_metrics = (keys.LOSS_BEFORE,)  # weighted by: finite, >= 0, bounded (FairStrategy.check_numbers)
    flower_counterpart = flower.QFedAvg
    flower_names = {"client_learning_rate": "lr"}

    def __init__(self, *, train_loss_key: str = "train_loss", **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_loss_key = train_loss_key  # Flower's QFedAvg's: read when a reply has no loss-before

    @property
    def metric_fallbacks(self) -> dict[str, tuple[str, str]]:
        """loss-before, read from Flower's ``train_loss_key`` when a reply lacks it (strategies.rounds)."""
        return {keys.LOSS_BEFORE: (self.train_loss_key, "Flower's QFedAvg train_loss_key (the loss after local "
                                   "training, as Flower's QFedAvg weights); send 'loss-before' for q-FFL's F_k(θ_t)")}

    def aggregate_valid(self, server_round, replies):
        batch = self.read_updates(replies)
        theta, deltas = batch.theta, batch.deltas
        step, sum_h = qffl_step(deltas, batch.loss_before, self.params.q, 1.0 / self.round_lr(server_round))
        metrics = {"qffl-sum-h": sum_h, "update-norm": float(step.norm())}
        return Aggregated(self.to_record(theta - step), MetricRecord(metrics))
