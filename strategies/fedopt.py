"""Server optimisers on the FedAvg pseudo-gradient: FedAvgM (Hsu, Qi, Brown, 2019,
arXiv:1909.06335) and FedAdam / FedYogi / FedAdagrad (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021).

Flower ships all four in ``flwr.serverapp.strategy``; this module wraps them instead of
rewriting them. The wrapped strategy aggregates the validated replies exactly as Flower
does; before each aggregation the wrapper hands it θ_t and its moments, which live in the
wrapper's :class:`State` (so they are checkpointed generically), and takes the updated
moments back after. With Δ = avg θ_i − θ_t (Flower's sign) and p_i = n_i / Σ n_j:

* FedAvgM: v ← β v + (θ_t − avg θ_i) (v = the first pseudo-gradient in round 1),
  θ ← θ − η_s v.
* FedAdam: m ← β₁m + (1−β₁)Δ, v ← β₂v + (1−β₂)Δ², θ ← θ + η̂ m / (√v + τ) with Flower's
  bias-corrected η̂ = η √(1−β₂^(t+1)) / (1−β₁^(t+1)).
* FedYogi: as FedAdam with v ← v − (1−β₂) Δ² sign(v − Δ²) and no bias correction.
* FedAdagrad: m = Δ, v ← v + Δ², θ ← θ + η m / (√v + τ).

With ``fedavg-weighting = "uniform"`` (or ``participation = "size-proportional"``) the mean
of the local models that the optimisers step on is the uniform one (``strategies.fedavg``).

Flower's ``eta_l`` is the run's ``lr`` (it enters no arithmetic, only Flower's summary). The
run-wide ``server-lr`` does not apply: each optimiser has its own server step size.

Flower's keywords and attributes (``server_momentum``, ``eta_l``, ``beta_1``, ``beta_2``,
``m_t``, ``v_t``, ``momentum_vector``, ...) are the classes' too (:mod:`strategies.flower_compat`);
setting a hyperparameter after construction rebuilds the wrapped strategy (its moments stay in
the State). A float64 model is stepped in float64 (Flower's numpy arithmetic), returned in its
own dtypes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
from flwr.app import MetricRecord
from flwr.serverapp import strategy as flower

from fedcore import flat, keys
from fedcore.config import APP
from fedcore.params import MethodParams, hyper
from strategies.base import FairStrategy
from strategies.fedavg import check_weighting
from strategies.registry import register
from strategies.robust import flower_copies
from strategies.rounds import Aggregated

UNIFORM_KEY = "fedavg-uniform-weight"  # fedavg-weighting = uniform: Flower's weighted_by_key


def state_attribute(name: str) -> property:
    """Flower's attribute ``name`` (a moment), kept in the strategy's State (checkpointed)."""
    return property(lambda self: getattr(self.state, name), lambda self, value: setattr(self.state, name, value),
                    doc=f"Flower's ``{name}``: the State's (checkpointed)")


def no_metrics(contents, weighted_by_key):
    """Flower would average every reply metric (partition ids included): report none."""
    del contents, weighted_by_key
    return MetricRecord()


@dataclasses.dataclass(frozen=True)
class FedAvgMParams(MethodParams):
    prefix = "fedavgm"
    # Flower's name: ``server_lr`` is the base's η_g, which FedAvgM does not use.
    server_learning_rate: float = hyper(1.0, key="fedavgm-server-lr", low=0.0, low_open=True,
                                        doc="η_s, the server step on the momentum")
    momentum: float = hyper(0.9, low=0.0, high=1.0, high_open=True,
                            reduces_to={"fedavg": 0.0}, reduces_with={"fedavgm-server-lr": 1.0},
                            doc="β (Hsu et al.); 0 with fedavgm-server-lr = 1 is FedAvg")


@dataclasses.dataclass(frozen=True)
class FedAdamParams(MethodParams):
    prefix = "fedadam"
    eta: float = hyper(0.1, low=0.0, low_open=True, doc="η, the server step (Flower's default)")
    beta1: float = hyper(0.9, low=0.0, high=1.0, high_open=True, doc="β₁, the first moment's decay")
    beta2: float = hyper(0.99, low=0.0, high=1.0, high_open=True, doc="β₂, the second moment's decay")
    tau: float = hyper(0.001, low=0.0, low_open=True, doc="τ, the adaptivity floor")


@dataclasses.dataclass(frozen=True)
class FedYogiParams(FedAdamParams):
    prefix = "fedyogi"
    eta: float = hyper(0.01, low=0.0, low_open=True, doc="η, the server step (Flower's default)")


@dataclasses.dataclass(frozen=True)
class FedAdagradParams(MethodParams):
    prefix = "fedadagrad"
    eta: float = hyper(0.1, low=0.0, low_open=True, doc="η, the server step (Flower's default)")
    tau: float = hyper(0.001, low=0.0, low_open=True, doc="τ, the adaptivity floor (large τ makes FedAdagrad plain SGD "
                                                          "on Δ)")


@dataclasses.dataclass
class MomentumState:
    momentum_vector: list[np.ndarray] | None = None  # FedAvgM's v, one array per model array


@dataclasses.dataclass
class MomentsState:
    m_t: dict[str, np.ndarray] | None = None  # FedAdam / FedYogi / FedAdagrad's moments
    v_t: dict[str, np.ndarray] | None = None


class FlowerServerOpt(FairStrategy):
    """A Flower server-optimiser strategy behind the FairStrategy contract.

    Subclasses build the wrapped strategy (:meth:`make_inner`) and say which of its
    attributes are the moments (the fields of their ``State``) and in what form it keeps θ_t
    (:meth:`inner_view`).
    """

    weighting = "data-size"  # or uniform: fedavg-weighting (resolve_weighting)

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return str(APP["fedavg-weighting"].read(config))

    # Only the weighted mean of the local models enters: works under secure aggregation.
    needs_individual_updates = False
    weights_replies = True

    def __init__(self, *, fedavg_weighting: str = "data-size", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        self.inner = self.make_inner()
        if fedavg_weighting == "uniform":  # Flower weights by a reply metric: one that is 1 for all
            self.secagg_weighting = "uniform"

    def params_changed(self) -> None:
        self.inner = self.make_inner()

    def make_inner(self):
        raise NotImplementedError

    def inner_view(self, arrays):
        """θ_t in the form the wrapped strategy keeps it."""
        raise NotImplementedError

    def aggregate_valid(self, server_round, replies):
        moments = [f.name for f in dataclasses.fields(self.state)]
        self.inner.current_arrays = self.inner_view(self.current_arrays)
        for name in moments:  # the state's moments into the wrapped strategy ...
            setattr(self.inner, name, getattr(self.state, name))
        replies = flower_copies(replies)  # the metric keys all replies share (Flower's requirement)
        self.inner.weighted_by_key = self.weighted_by_key
        if self.fedavg_weighting == "uniform":  # Flower weights by a reply metric: one that is 1 for all
            self.inner.weighted_by_key = UNIFORM_KEY
            for msg in replies:
                msg.content[keys.METRICS][UNIFORM_KEY] = 1
        new_arrays, _ = self.inner.aggregate_train(server_round, replies)
        for name in moments:  # ... and its updated moments back
            setattr(self.state, name, getattr(self.inner, name))
        if new_arrays is None:
            return Aggregated(None)
        theta = self.current_flat()
        # Flower's arithmetic can promote to float64: back to the model's own dtypes.
        new = flat.record_to_flat(new_arrays, dtype=theta.dtype)
        return Aggregated(self.to_record(new), MetricRecord({"update-norm": float((theta - new).norm())}))


@register("fedavgm")
class FedAvgM(FlowerServerOpt):
    """Flower's FedAvgM (state: its momentum vector)."""

    Params = FedAvgMParams

    State = MomentumState
    flower_counterpart = flower.FedAvgM
    flower_names = {"server_momentum": "momentum"}
    momentum_vector = state_attribute("momentum_vector")

    def make_inner(self):
        p = self.params
        return flower.FedAvgM(server_learning_rate=p.server_learning_rate, server_momentum=p.momentum,
                              train_metrics_aggr_fn=no_metrics)

    def inner_view(self, arrays):
        return arrays


class FedOpt(FlowerServerOpt):
    """Flower's FedAdam / FedYogi / FedAdagrad (state: the moments m_t, v_t)."""

    flower_class: ClassVar[type]

    State = MomentsState
    m_t = state_attribute("m_t")
    v_t = state_attribute("v_t")

    def make_inner(self):
        p = self.params
        betas = {"beta_1": p.beta1, "beta_2": p.beta2} if hasattr(p, "beta1") else {}  # not FedAdagrad's
        return self.flower_class(eta=p.eta, eta_l=self.lr, tau=p.tau, train_metrics_aggr_fn=no_metrics, **betas)

    def inner_view(self, arrays):
        return {k: a.numpy() for k, a in arrays.items()}


@register("fedadam")
class FedAdam(FedOpt):
    Params = FedAdamParams
    flower_class = flower_counterpart = flower.FedAdam
    flower_names = {"eta_l": "lr", "beta_1": "beta1", "beta_2": "beta2"}


@register("fedyogi")
class FedYogi(FedOpt):
    Params = FedYogiParams
    flower_class = flower_counterpart = flower.FedYogi
    flower_names = {"eta_l": "lr", "beta_1": "beta1", "beta_2": "beta2"}


@register("fedadagrad")
class FedAdagrad(FedOpt):
    Params = FedAdagradParams
    flower_class = flower_counterpart = flower.FedAdagrad
    flower_names = {"eta_l": "lr"}
