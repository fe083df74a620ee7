"""Server optimisers on the FedAvg pseudo-gradient: FedAvgM (Hsu, Qi, Brown, 2019,
arXiv:1909.06335) and FedAdam / FedYogi / FedAdagrad (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021).

Flower ships all four in ``flwr.serverapp.strategy``; their maths is written here as pure
functions on the gate's checked round, array by array, in Flower's own numpy arithmetic (the same
operations in the same order: the same bits as Flower's strategies on the same replies), with the
moments in the method's :class:`State` (returned by every round, checkpointed generically). With
the FedAvg aggregate avg θ_i = Σ p_i θ_i (:func:`flower_mean`: Flower's ``aggregate_arrayrecords``),
Δ = avg θ_i − θ_t (Flower's sign) and p_i = n_i / Σ n_j:

* FedAvgM: v ← β v + (θ_t − avg θ_i) (v = the first pseudo-gradient in round 1),
  θ ← θ − η_s v (β = 0 and η_s = 1: the FedAvg aggregate itself, as Flower).
* FedAdam: m ← β₁m + (1−β₁)Δ, v ← β₂v + (1−β₂)Δ², θ ← θ + η̂ m / (√v + τ) with Flower's
  bias-corrected η̂ = η √(1−β₂^(t+1)) / (1−β₁^(t+1)).
* FedYogi: as FedAdam with v ← v − (1−β₂) Δ² sign(v − Δ²) and no bias correction.
* FedAdagrad: m = Δ, v ← v + Δ², θ ← θ + η m / (√v + τ).

With ``fedavg-weighting = "uniform"`` (or ``participation = "size-proportional"``) the mean
of the local models that the optimisers step on is the uniform one (``strategies.fedavg``).

Flower's ``eta_l`` is the run's ``lr`` (it enters no arithmetic, only Flower's summary). The
run-wide ``server-lr`` does not apply: each optimiser has its own server step size.

The classes are drop-ins for Flower's: Flower's arguments in Flower's order, each of Flower's
attributes (``server_momentum``, ``eta_l``, ``beta_1``, ``m_t``, ``v_t``, ``momentum_vector``, ...)
readable, and the hyperparameters settable after construction (checked then). A float64 model is
stepped in float64; FedAdam returns Flower's dtypes to Flower's loop (its bias correction promotes
float32 arrays to float64).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedcore import flat, keys
from fedcore.config import check_value
from fedcore.params import MethodParams, hyper
from strategies.base import Round, Step
from strategies.fedavg import MetricsFn, WeightedMethod, WeightedStrategy, check_weighting
from strategies.flower import flower_arguments, flower_dtypes, given_lr, given_once, method_params, params_property
from strategies.registry import register

Arrays = dict[str, np.ndarray]


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


# -- the maths, as Flower's numpy computes it ----------------------------------------------------------
def flower_mean(models: list[Arrays], weights: list[float]) -> Arrays:
    """Σ_i (w_i / Σ_j w_j) θ_i array by array, accumulated in reply order as Flower's
    ``aggregate_arrayrecords`` does (``value * factor``, then ``+=``): the same bits."""
    total = sum(weights)
    factors = [w / total for w in weights]
    out: Arrays = {}
    for model, factor in zip(models, factors):
        for key, value in model.items():
            if key not in out:
                out[key] = value * factor
            else:
                out[key] += value * factor
    return out


def fedavgm_step(current: Arrays, mean: Arrays, momentum_vector: list[np.ndarray] | None, server_lr: float,
                 momentum: float) -> tuple[Arrays, list[np.ndarray] | None]:
    """(θ_{t+1}, v) of Flower's FedAvgM from θ_t and the FedAvg aggregate."""
    if momentum == 0.0 and server_lr == 1.0:  # Flower's server_opt off: the aggregate itself
        return mean, momentum_vector
    old, new = list(current.values()), list(mean.values())
    pseudo_gradient = [o - n for n, o in zip(new, old)]
    if momentum > 0.0:
        momentum_vector = pseudo_gradient if momentum_vector is None else [
            momentum * mv + pg for mv, pg in zip(momentum_vector, pseudo_gradient)]
        pseudo_gradient = momentum_vector
    return {k: np.asarray(o - server_lr * pg) for k, o, pg in zip(mean, old, pseudo_gradient)}, momentum_vector


def first_moment(current: Arrays, mean: Arrays, m_t: Arrays | None, beta1: float) -> tuple[Arrays, Arrays]:
    """(Δ = aggregate − θ_t, m ← β₁m + (1−β₁)Δ): Flower's shared stage of FedAdam/FedYogi/FedAdagrad."""
    delta = {k: x - current[k] for k, x in mean.items()}
    if not m_t:
        m_t = {k: np.zeros_like(v) for k, v in mean.items()}
    return delta, {k: beta1 * v + (1 - beta1) * delta[k] for k, v in m_t.items()}


def fedadam_step(current: Arrays, mean: Arrays, state: MomentsState, p: FedAdamParams,
                 server_round: int) -> tuple[Arrays, MomentsState]:
    delta, m_t = first_moment(current, mean, state.m_t, p.beta1)
    v_t = state.v_t if state.v_t else {k: np.zeros_like(v) for k, v in mean.items()}
    v_t = {k: p.beta2 * v + (1 - p.beta2) * (delta[k] ** 2) for k, v in v_t.items()}
    eta_norm = p.eta * np.sqrt(1 - np.power(p.beta2, server_round + 1.0)) / (1 - np.power(p.beta1, server_round + 1.0))
    new = {k: x + eta_norm * m_t[k] / (np.sqrt(v_t[k]) + p.tau) for k, x in current.items()}
    return new, MomentsState(m_t, v_t)


def fedyogi_step(current: Arrays, mean: Arrays, state: MomentsState, p: FedYogiParams,
                 server_round: int) -> tuple[Arrays, MomentsState]:
    delta, m_t = first_moment(current, mean, state.m_t, p.beta1)
    v_t = state.v_t if state.v_t else {k: np.zeros_like(v) for k, v in mean.items()}
    v_t = {k: v - (1.0 - p.beta2) * (delta[k] ** 2) * np.sign(v - delta[k] ** 2) for k, v in v_t.items()}
    new = {k: x + p.eta * m_t[k] / (np.sqrt(v_t[k]) + p.tau) for k, x in current.items()}
    return new, MomentsState(m_t, v_t)


def fedadagrad_step(current: Arrays, mean: Arrays, state: MomentsState, p: FedAdagradParams,
                    server_round: int) -> tuple[Arrays, MomentsState]:
    delta, m_t = first_moment(current, mean, state.m_t, 0.0)  # Flower's FedAdagrad: β₁ = 0, so m = Δ
    v_t = state.v_t if state.v_t else {k: np.zeros_like(v) for k, v in mean.items()}
    v_t = {k: v + (delta[k] ** 2) for k, v in v_t.items()}
    new = {k: x + p.eta * m_t[k] / (np.sqrt(v_t[k]) + p.tau) for k, x in current.items()}
    return new, MomentsState(m_t, v_t)


# -- the methods --------------------------------------------------------------------------------------
def numpy_models(round_: Round) -> tuple[Arrays, list[Arrays], list[float]]:
    """(θ_t, the local models, their weights) as Flower's numpy sees them."""
    current = {k: a.numpy() for k, a in round_.current.items()}
    models = [{k: a.numpy() for k, a in rec.items()} for rec in round_.models]
    return current, models, round_.weights.tolist()


class ServerOptMethod(WeightedMethod):
    """A server optimiser on the FedAvg aggregate (see the module docstring)."""

    def flower_weights(self, round_: Round) -> list[float]:
        """The weights of Flower's mean: the replies' (num-examples, or ``weighted_by_key``), or 1 each (uniform)."""
        return [1.0] * len(round_) if self.fedavg_weighting == "uniform" else round_.weights.tolist()

    def optimise(self, current: Arrays, mean: Arrays, state: Any, server_round: int) -> tuple[Arrays, Any]:
        raise NotImplementedError

    def aggregate(self, round_: Round, state: Any) -> Step:
        current, models, _ = numpy_models(round_)
        new, state = self.optimise(current, flower_mean(models, self.flower_weights(round_)), state, round_.number)
        theta = round_.theta
        stepped = flat.record_to_flat_views([np.asarray(v).reshape(-1) for v in new.values()], dtype=theta.dtype)
        return Step(new, state, {"update-norm": float((theta - stepped).norm())})


class FedAvgMMethod(ServerOptMethod):
    Params = FedAvgMParams

    def init(self) -> MomentumState:
        return MomentumState()

    def optimise(self, current, mean, state, server_round):
        p = self.params
        new, v = fedavgm_step(current, mean, state.momentum_vector, p.server_learning_rate, p.momentum)
        return new, MomentumState(v)


class FedOptMethod(ServerOptMethod):
    """FedAdam / FedYogi / FedAdagrad: one of the ``*_step`` functions on the moments."""

    def init(self) -> MomentsState:
        return MomentsState()


class FedAdamMethod(FedOptMethod):
    Params = FedAdamParams

    def optimise(self, current, mean, state, server_round):
        return fedadam_step(current, mean, state, self.params, server_round)


class FedYogiMethod(FedOptMethod):
    Params = FedYogiParams

    def optimise(self, current, mean, state, server_round):
        return fedyogi_step(current, mean, state, self.params, server_round)


class FedAdagradMethod(FedOptMethod):
    Params = FedAdagradParams

    def optimise(self, current, mean, state, server_round):
        return fedadagrad_step(current, mean, state, self.params, server_round)


# -- the strategies (Flower's names) -----------------------------------------------------------------
class ServerOptStrategy(WeightedStrategy):
    """A server optimiser named like Flower's: Flower's ``eta_l`` is the clients' ``lr``."""

    @property
    def eta_l(self) -> float:
        return self.lr

    @eta_l.setter
    def eta_l(self, value: float) -> None:
        self.lr = check_value("lr", value, float, low=0.0, low_open=True,
                              subject=f"{type(self).__name__} attribute 'eta_l' (the clients' lr)")

    @property
    def m_t(self) -> Arrays | None:
        """Flower's first moment: the State's (checkpointed)."""
        return self.state.m_t

    @property
    def v_t(self) -> Arrays | None:
        """Flower's second moment: the State's (checkpointed)."""
        return self.state.v_t


@register("fedavgm")
class FedAvgM(WeightedStrategy):
    """Flower's FedAvgM (see the module docstring): Flower's arguments in Flower's order
    (``server_momentum`` is β, also given as ``momentum``; default 0.9)."""

    method_class = FedAvgMMethod
    Params = FedAvgMParams
    server_learning_rate = params_property("server_learning_rate", "η_s, the server step on the momentum")
    server_momentum = momentum = params_property("momentum", "β, the server momentum (Flower's server_momentum)")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 server_learning_rate: float = FedAvgMParams.server_learning_rate,
                 server_momentum: float | None = None, *, momentum: float | None = None,
                 fedavg_weighting: str = "data-size", params: FedAvgMParams | None = None, **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        momentum = given_once("FedAvgM", "server_momentum", server_momentum, "momentum", momentum,
                              FedAvgMParams.momentum)
        super().__init__(method_params(FedAvgMParams, params, "FedAvgM", server_learning_rate=server_learning_rate,
                                       momentum=momentum), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)

    @property
    def momentum_vector(self) -> list[np.ndarray] | None:
        """Flower's momentum vector: the State's (checkpointed)."""
        return self.state.momentum_vector


def _adam_like(owner: str, params_cls, params, eta, eta_l, lr, beta_1, beta1, beta_2, beta2, tau, common):
    """FedAdam's and FedYogi's hyperparameters from Flower's names and their own (one of each pair)."""
    given_lr(common, given_once(owner, "eta_l", eta_l, "lr", lr, None))
    beta1 = given_once(owner, "beta_1", beta_1, "beta1", beta1, params_cls.beta1)
    beta2 = given_once(owner, "beta_2", beta_2, "beta2", beta2, params_cls.beta2)
    return method_params(params_cls, params, owner, eta=eta, beta1=beta1, beta2=beta2, tau=tau)


@register("fedadam")
class FedAdam(ServerOptStrategy):
    """Flower's FedAdam (see the module docstring): Flower's arguments in Flower's order (``eta_l`` is
    the clients' ``lr``, ``beta_1``/``beta_2`` also given as ``beta1``/``beta2``)."""

    method_class = FedAdamMethod
    Params = FedAdamParams
    eta = params_property("eta", "η, the server step")
    beta_1 = beta1 = params_property("beta1", "β₁, the first moment's decay")
    beta_2 = beta2 = params_property("beta2", "β₂, the second moment's decay")
    tau = params_property("tau", "τ, the adaptivity floor")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 eta: float = FedAdamParams.eta, eta_l: float | None = None, beta_1: float | None = None,
                 beta_2: float | None = None, tau: float = FedAdamParams.tau, *, lr: float | None = None,
                 beta1: float | None = None, beta2: float | None = None, fedavg_weighting: str = "data-size",
                 params: FedAdamParams | None = None, **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        built = _adam_like("FedAdam", FedAdamParams, params, eta, eta_l, lr, beta_1, beta1, beta_2, beta2, tau, common)
        super().__init__(built, **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)

    def flower_arrays(self, arrays):
        """Flower's FedAdam returns float64 arrays (its bias-corrected η̂ is a numpy float64)."""
        return flower_dtypes(arrays, {k: "float64" for k in (arrays or {}).keys()})


@register("fedyogi")
class FedYogi(ServerOptStrategy):
    """Flower's FedYogi (see the module docstring): Flower's arguments in Flower's order."""

    method_class = FedYogiMethod
    Params = FedYogiParams
    eta = params_property("eta", "η, the server step")
    beta_1 = beta1 = params_property("beta1", "β₁, the first moment's decay")
    beta_2 = beta2 = params_property("beta2", "β₂, the second moment's decay")
    tau = params_property("tau", "τ, the adaptivity floor")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 eta: float = FedYogiParams.eta, eta_l: float | None = None, beta_1: float | None = None,
                 beta_2: float | None = None, tau: float = FedYogiParams.tau, *, lr: float | None = None,
                 beta1: float | None = None, beta2: float | None = None, fedavg_weighting: str = "data-size",
                 params: FedYogiParams | None = None, **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        built = _adam_like("FedYogi", FedYogiParams, params, eta, eta_l, lr, beta_1, beta1, beta_2, beta2, tau, common)
        super().__init__(built, **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)


@register("fedadagrad")
class FedAdagrad(ServerOptStrategy):
    """Flower's FedAdagrad (see the module docstring): Flower's arguments in Flower's order."""

    method_class = FedAdagradMethod
    Params = FedAdagradParams
    eta = params_property("eta", "η, the server step")
    tau = params_property("tau", "τ, the adaptivity floor")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 eta: float = FedAdagradParams.eta, eta_l: float | None = None, tau: float = FedAdagradParams.tau, *,
                 lr: float | None = None, fedavg_weighting: str = "data-size", params: FedAdagradParams | None = None,
                 **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        given_lr(common, given_once("FedAdagrad", "eta_l", eta_l, "lr", lr, None))
        super().__init__(method_params(FedAdagradParams, params, "FedAdagrad", eta=eta, tau=tau), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)

