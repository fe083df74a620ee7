"""Byzantine-robust aggregation: Flower's FedMedian, FedTrimmedAvg, Krum, MultiKrum and Bulyan.

Flower 1.42 ships all five in ``flwr.serverapp.strategy``; their maths is written here as pure
functions on the gate's checked round, in Flower's own numpy arithmetic (the same operations in
the same order: the same bits as Flower's strategies on the same replies). With θ_i the m local
models of a round and n_i their example counts:

* FedMedian (Yin et al., ICML 2018, arXiv:1803.01498): the coordinate-wise median of θ_i.
* FedTrimmedAvg (same paper): per coordinate, the mean after dropping the ⌊β·m⌋ lowest and
  ⌊β·m⌋ highest values.
* Krum (Blanchard et al., NeurIPS 2017, arXiv:1703.02757): the θ_i whose summed squared
  distance to its m − f − 2 nearest other models is smallest (f: assumed attackers).
* MultiKrum (same paper): the n_i-weighted mean of the k models with the lowest such scores.
* Bulyan (El Mhamdi et al., ICML 2018, arXiv:1802.07927): MultiKrum selects m − 2f models;
  per coordinate, the mean of the m − 4f of them closest to their median.

**f against the clients a round brings.** Krum and MultiKrum need m > 2f + 2 replies when
f > 0 (each score sums the m − f − 2 nearest neighbours of a model), Bulyan m ≥ 4f + 3; MultiKrum's k at
most the clients a round asks. A run whose rounds ask fewer clients (``fraction-train`` ×
``num-clients``, known when ``num_clients`` is given) is refused before it starts, in one line
(:meth:`FlowerRobust.check_clients`); a round left with fewer valid replies (drops) keeps the
model, reports ``<method>-skipped`` = 1 and logs a warning (:meth:`FlowerRobust.aggregate_valid`).

None of them weights by data size except MultiKrum's final mean. With ``server-lr`` η_g set
the step is θ_t − (η_g/η_l)·(θ_t − aggregate), as for FedAvg; 0 (the default) takes the
aggregate as it is. Krum, MultiKrum and Bulyan report the partitions they selected
(``<method>-selected``); every method reports ``update-norm`` = ‖θ_t − aggregate‖.

"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from flwr.app import MetricRecord, RecordDict

from fedcore import flat, keys
from fedcore.config import ConfigError
from fedcore.params import MethodParams, NoParams, hyper
from strategies.base import Method, Round, Step
from strategies.fedavg import MetricsFn
from strategies.fedopt import flower_mean
from strategies.flower import FairStrategy, flower_arguments, given_once, method_params, params_property
from strategies.registry import register

log = logging.getLogger("fedpcd")
Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class FedTrimmedAvgParams(MethodParams):
    prefix = "fedtrimmedavg"
    beta: float = hyper(0.2, low=0.0, high=0.5, high_open=True, doc="β, the fraction cut at each end (Flower's "
                                                                     "default)")


@dataclasses.dataclass(frozen=True)
class KrumParams(MethodParams):
    prefix = "krum"
    num_malicious: int = hyper(0, low=0, doc="f, the attackers assumed")


@dataclasses.dataclass(frozen=True)
class MultiKrumParams(KrumParams):
    prefix = "multikrum"
    num_select: int = hyper(0, low=0, doc="k, the models averaged; 0 = m − f (all but the assumed "
                                                  "attackers, El Mhamdi et al.'s choice); 1 is Krum")


@dataclasses.dataclass(frozen=True)
class BulyanParams(KrumParams):
    prefix = "bulyan"


# -- the maths, as Flower's numpy computes it ----------------------------------------------------------
def coordinate_median(models: list[Arrays]) -> Arrays:
    """The coordinate-wise median of the models, array by array (Flower's FedMedian)."""
    return {k: np.asarray(np.median(np.stack([m[k] for m in models]), axis=0)) for k in models[0]}


def trim_mean(array: np.ndarray, cut_fraction: float) -> np.ndarray:
    """The mean along axis 0 after cutting ⌊β·n⌋ values at each end (Flower's ``trim_mean``, after scipy's)."""
    nobs = array.shape[0]
    lowercut = int(cut_fraction * nobs)
    uppercut = nobs - lowercut
    atmp = np.partition(array, (lowercut, uppercut - 1), 0)
    return np.mean(atmp[lowercut:uppercut], axis=0)


def trimmed_mean(models: list[Arrays], beta: float) -> Arrays:
    """The coordinate-wise trimmed mean, array by array (Flower's FedTrimmedAvg)."""
    return {k: np.asarray(trim_mean(np.stack([m[k] for m in models]), beta)) for k in models[0]}


def squared_distances(models: list[Arrays]) -> np.ndarray:
    """‖θ_i − θ_j‖² = ‖θ_i‖² + ‖θ_j‖² − 2 θ_i·θ_j for all pairs (Flower's ``compute_distances``)."""
    flat_w = np.stack([np.concatenate(list(m.values()), axis=None).ravel() for m in models], axis=0)
    norms = np.square(flat_w).sum(axis=1)
    return norms[:, None] + norms[None, :] - 2 * flat_w @ flat_w.T


def multikrum_selection(models: list[Arrays], num_malicious: int, num_select: int) -> list[int]:
    """The indices of the ``num_select`` models whose summed squared distance to their
    max(1, m − f − 2) nearest others is smallest, best first (Flower's ``select_multikrum``)."""
    distances = squared_distances(models)
    num_closest = max(1, len(models) - num_malicious - 2)
    closest = [np.argsort(d)[1 : num_closest + 1].tolist() for d in distances]
    scores = [np.sum(distances[i, closest[i]]) for i in range(len(distances))]
    return [int(i) for i in np.argsort(scores)[:num_select]]


def n_closest_mean(reference: list[np.ndarray], models: list[list[np.ndarray]], beta: int) -> list[np.ndarray]:
    """Per coordinate, the mean of the ``beta`` values closest to the reference (Flower's
    ``aggregate_n_closest_weights``)."""
    out = []
    for layer, ref in enumerate(reference):
        stack = np.stack([m[layer] for m in models])
        idx = np.argpartition(np.abs(stack - ref), beta - 1, axis=0)[:beta]
        out.append(np.mean(np.take_along_axis(stack, idx, axis=0), axis=0))
    return out


def bulyan(models: list[list[np.ndarray]], beta: int) -> list[np.ndarray]:
    """Bulyan's step on the selected models: their coordinate-wise median, then the mean of the
    ``beta`` values closest to it (Flower's Bulyan after its selection)."""
    median = [np.median(arr, axis=0) for arr in zip(*models)]
    return n_closest_mean(median, models, beta)


def select_multikrum(contents: list[RecordDict], num_malicious_nodes: int, num_nodes_to_select: int
                     ) -> list[RecordDict]:
    """MultiKrum's selection with Flower's signature (``Bulyan(selection_rule=...)``'s default): the
    ``num_nodes_to_select`` contents whose model (their one ArrayRecord) scores best."""
    models = [{k: a.numpy() for k, a in next(iter(c.array_records.values())).items()} for c in contents]
    return [contents[i] for i in multikrum_selection(models, num_malicious_nodes, num_nodes_to_select)]


def krum_min_replies(f: int) -> tuple[int, str]:
    """Krum's and MultiKrum's m > 2f + 2 (f = 0 assumes no attacker: any round, as Flower's Krum
    scores a model by its max(1, m − 2) nearest neighbours)."""
    return (2 * f + 3, "2f + 3") if f > 0 else (1, "1")


# -- the methods --------------------------------------------------------------------------------------
class RobustMethod(Method):
    """A robust rule on the round's local models (see the module docstring): the rule in
    :meth:`rule` ((the aggregate, the selected indices or None)), the step θ_t − (η_g/η_l)(θ_t − aggregate)."""

    weighting = "robust"  # a robust statistic picks what counts
    reports_selection: ClassVar[bool] = False

    def min_replies(self) -> tuple[int, str]:
        """(the fewest replies a round needs, the rule as a formula): 1 unless f says more."""
        return 1, "1"

    def rule(self, round_: Round, models: list[Arrays]) -> tuple[Arrays, list[int] | None]:
        raise NotImplementedError

    def aggregate(self, round_: Round, state: Any) -> Step:
        need, formula = self.min_replies()
        if len(round_) < need:  # drops left too few: the model stays, said in the round and the log
            log.warning("round %d: %s needs %s = %d valid replies, the round has %d: the model stays",
                        round_.number, self.name, formula, need, len(round_))
            return Step(None, state, {f"{self.name}-skipped": 1})
        models = [{k: a.numpy() for k, a in rec.items()} for rec in round_.models]
        aggregate, chosen = self.rule(round_, models)
        theta = round_.theta
        direction = theta - flat.record_to_flat_views([np.asarray(v).reshape(-1) for v in aggregate.values()],
                                                      dtype=theta.dtype)
        metrics: dict[str, Any] = {"update-norm": float(direction.norm())}
        if self.reports_selection and chosen is not None:
            metrics[f"{self.name}-selected"] = sorted(round_.clients[i] for i in chosen)
        return Step(theta - round_.step_scale * direction, state, metrics,
                    selected=chosen if self.reports_selection else None)


class FedMedianMethod(RobustMethod):
    Params = NoParams

    def rule(self, round_, models):
        return coordinate_median(models), None


class FedTrimmedAvgMethod(RobustMethod):
    Params = FedTrimmedAvgParams

    def rule(self, round_, models):
        return trimmed_mean(models, self.params.beta), None


class MultiKrumMethod(RobustMethod):
    """MultiKrum: the weighted mean (Flower's ``weighted_by_key``) of the k best-scored models."""

    Params = MultiKrumParams
    reports_selection = True

    def min_replies(self):
        return krum_min_replies(self.params.num_malicious)

    def num_select(self, m: int) -> int:
        p = self.params
        return p.num_select or max(1, m - p.num_malicious)

    def rule(self, round_, models):
        chosen = multikrum_selection(models, self.params.num_malicious, self.num_select(len(models)))
        weights = round_.weights.tolist()
        return flower_mean([models[i] for i in chosen], [weights[i] for i in chosen]), chosen


class KrumMethod(MultiKrumMethod):
    """Krum: the one best-scored model."""

    Params = KrumParams

    def num_select(self, m: int) -> int:
        return 1


class BulyanMethod(RobustMethod):
    """Bulyan: ``selection_rule`` (MultiKrum's by default) picks m − 2f models, then per coordinate
    the mean of the m − 4f closest to their median."""

    Params = BulyanParams
    reports_selection = True

    def __init__(self, params=None, setting=None, selection_rule: Callable | None = None,
                 weight_key: str = keys.NUM_EXAMPLES) -> None:
        super().__init__(params, setting)
        self.selection_rule, self.weight_key = selection_rule, weight_key

    def min_replies(self):
        return 4 * self.params.num_malicious + 3, "4f + 3"

    def rule(self, round_, models):
        f = self.params.num_malicious
        keep = len(models) - 2 * f
        if self.selection_rule is None:
            chosen = multikrum_selection(models, f, keep)
        else:  # Flower's signature: the replies' contents (as RecordDicts built from the checked round)
            contents = [RecordDict({keys.ARRAYS: rec, keys.METRICS: MetricRecord({self.weight_key: float(w)})})
                        for rec, w in zip(round_.models, round_.weights.tolist())]
            picked = self.selection_rule(contents, f, keep)
            position = {id(c): i for i, c in enumerate(contents)}
            chosen = [position[id(c)] for c in picked]
        names = list(models[0])
        out = bulyan([[models[i][k] for k in names] for i in chosen], keep - 2 * f)
        return dict(zip(names, (np.asarray(a) for a in out))), chosen


# -- the strategies (Flower's names) -----------------------------------------------------------------
class RobustStrategy(FairStrategy):
    """A robust rule named like Flower's: a run whose rounds can never bring the replies its f
    needs is refused in one line (:meth:`check_clients`)."""

    float64_models = True

    def __init__(self, params=None, **common: Any) -> None:
        super().__init__(params, **common)
        self.check_clients()

    def set_params(self, **changes: Any) -> None:
        super().set_params(**changes)
        self.check_clients()

    def clients_per_round(self) -> int | None:
        return self.setting().clients_per_round

    def check_clients(self) -> None:
        """A one-line ConfigError when no round can ever bring :meth:`min_replies` replies."""
        need, rule = self.method.min_replies()
        per_round = self.clients_per_round()
        if per_round is None or per_round >= need:
            return
        key = f"{self.Params.prefix}-num-malicious"
        f = self.params.num_malicious
        raise ConfigError(
            f"run-config key '{key}' = {f} needs at least {rule} = {need} replies per round, but fraction-train "
            f"x num-clients gives {per_round}: "
            + ("lower it or raise fraction-train" if self.num_clients >= need else
               f"a federation of {self.num_clients} clients is too small for {self.name}; "
               f"use num-clients >= {need} or another robust method (e.g. method='fedmedian')"))


@register("fedmedian")
class FedMedian(RobustStrategy):
    """Coordinate-wise median of the local models (Yin et al., 2018); Flower's arguments in Flower's order."""

    method_class = FedMedianMethod
    Params = NoParams

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None, *,
                 params: NoParams | None = None, **common: Any) -> None:
        super().__init__(method_params(NoParams, params, "FedMedian"), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)


@register("fedtrimmedavg")
class FedTrimmedAvg(RobustStrategy):
    """Coordinate-wise mean after cutting the ``beta`` fraction of largest and smallest values;
    Flower's arguments in Flower's order."""

    method_class = FedTrimmedAvgMethod
    Params = FedTrimmedAvgParams
    beta = params_property("beta", "β, the fraction cut at each end")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 beta: float = FedTrimmedAvgParams.beta, *, params: FedTrimmedAvgParams | None = None,
                 **common: Any) -> None:
        super().__init__(method_params(FedTrimmedAvgParams, params, "FedTrimmedAvg", beta=beta), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)


@register("krum")
class Krum(RobustStrategy):
    """The one local model closest to its m − f − 2 nearest neighbours (Blanchard et al., 2017);
    Flower's arguments in Flower's order (``num_malicious_nodes`` is f, also given as ``num_malicious``)."""

    method_class = KrumMethod
    Params = KrumParams
    num_malicious_nodes = num_malicious = params_property("num_malicious", "f, the attackers assumed")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, num_malicious_nodes: int | None = None,
                 weighted_by_key: str = keys.NUM_EXAMPLES, arrayrecord_key: str = keys.ARRAYS,
                 configrecord_key: str = keys.CONFIG, train_metrics_aggr_fn: MetricsFn | None = None,
                 evaluate_metrics_aggr_fn: MetricsFn | None = None, *, num_malicious: int | None = None,
                 params: KrumParams | None = None, **common: Any) -> None:
        f = given_once("Krum", "num_malicious_nodes", num_malicious_nodes, "num_malicious", num_malicious, 0)
        super().__init__(method_params(KrumParams, params, "Krum", num_malicious=f), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)


@register("multikrum")
class MultiKrum(RobustStrategy):
    """The weighted mean of the k models with the best Krum scores; Flower's arguments in Flower's
    order (``num_nodes_to_select`` is k, also given as ``num_select``; 0 = m − f)."""

    method_class = MultiKrumMethod
    Params = MultiKrumParams
    num_malicious_nodes = num_malicious = params_property("num_malicious", "f, the attackers assumed")
    num_nodes_to_select = num_select = params_property("num_select", "k, the models averaged (0: m − f)")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, num_malicious_nodes: int | None = None,
                 num_nodes_to_select: int | None = None, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None, *,
                 num_malicious: int | None = None, num_select: int | None = None,
                 params: MultiKrumParams | None = None, **common: Any) -> None:
        f = given_once("MultiKrum", "num_malicious_nodes", num_malicious_nodes, "num_malicious", num_malicious, 0)
        k = given_once("MultiKrum", "num_nodes_to_select", num_nodes_to_select, "num_select", num_select, 0)
        super().__init__(method_params(MultiKrumParams, params, "MultiKrum", num_malicious=f, num_select=k),
                         **flower_arguments(fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
                                            min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
                                            train_metrics_aggr_fn, evaluate_metrics_aggr_fn), **common)

    def check_clients(self) -> None:
        super().check_clients()
        k, per_round = self.params.num_select, self.clients_per_round()
        if per_round is not None and k > per_round:
            raise ConfigError(f"run-config key 'multikrum-num-select' = {k} exceeds the {per_round} clients a round "
                              "asks (fraction-train x num-clients): use at most that, or 0 (m - f)")


@register("bulyan")
class Bulyan(RobustStrategy):
    """Multi-Krum selection, then a coordinate-wise trimmed mean (El Mhamdi et al., 2018); Flower's
    arguments in Flower's order (``num_malicious_nodes`` is f; ``selection_rule`` Flower's:
    ``(contents, num_malicious_nodes, num_to_select) -> contents``, MultiKrum's by default)."""

    method_class = BulyanMethod
    Params = BulyanParams
    num_malicious_nodes = num_malicious = params_property("num_malicious", "f, the attackers assumed")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, num_malicious_nodes: int | None = None,
                 weighted_by_key: str = keys.NUM_EXAMPLES, arrayrecord_key: str = keys.ARRAYS,
                 configrecord_key: str = keys.CONFIG, train_metrics_aggr_fn: MetricsFn | None = None,
                 evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 selection_rule: Callable[[list[RecordDict], int, int], list[RecordDict]] | None = None, *,
                 num_malicious: int | None = None, params: BulyanParams | None = None, **common: Any) -> None:
        self._selection_rule = selection_rule
        f = given_once("Bulyan", "num_malicious_nodes", num_malicious_nodes, "num_malicious", num_malicious, 0)
        super().__init__(method_params(BulyanParams, params, "Bulyan", num_malicious=f), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)

    def build(self, params, setting):
        weight_key = getattr(self, "weighted_by_key", keys.NUM_EXAMPLES)  # not set yet while __init__ builds it
        return self.method_class(params, setting, self._selection_rule, weight_key)

    @property
    def selection_rule(self) -> Callable:
        """Flower's attribute: the rule that selects the m − 2f models (MultiKrum's when none was given)."""
        return self._selection_rule or select_multikrum

    @selection_rule.setter
    def selection_rule(self, rule: Callable | None) -> None:
        self._selection_rule = rule
        self.method = self.build(self.params, self.setting())

