"""FedAvg (McMahan et al., 2017): the data-size-weighted mean of the local models.

θ_{t+1} = Σ_i p_i θ_i with p_i = n_i / Σ_j n_j. With ``server-lr`` η_g set (> 0) the step
is θ_t − η_g/η_l · Σ p_i Δ_i, i.e. η_g = η_l (the default) is plain FedAvg. No
hyperparameters of its own.

Weighting of the FedAvg family (FedAvg, FedProx, and the server optimisers of
``strategies.fedopt``): ``fedavg_weighting`` (the app's run-config key ``fedavg-weighting``)
``"data-size"`` (default, p_i = n_i / Σ n_j, or Flower's ``weighted_by_key`` metric) or
``"uniform"`` (p_i = 1/m over the m replies: FedeRage's Algorithm 1 FedAvg, and the
q-FFL/FedProx authors' FedAvg, whose clients are drawn with probability ∝ n_k, so that the
uniform mean stays unbiased for Σ_k p_k F_k; the app uses it whenever ``participation =
"size-proportional"``). Under secure aggregation the secure sum is then uniform too.

The mean is taken straight from the replies' bytes, one column block at a time
(:meth:`strategies.base.Round.weighted_models`): no (m, d) matrix is built, so a round reads each
reply once and touches no fresh memory beyond the d-vectors (the matrix's first-touch allocation
was a large part of the round: docs/performance.md, rule 5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from flwr.app import MetricRecord, RecordDict

from fedcore import keys
from fedcore.config import APP
from fedcore.params import NoParams
from strategies.base import Method, Round, Step
from strategies.flower import FairStrategy, flower_arguments
from strategies.registry import register

MetricsFn = Callable[[list[RecordDict], str], MetricRecord]


def check_weighting(value: str) -> str:
    """The keyword ``fedavg_weighting``, checked against the app key it mirrors."""
    return str(APP["fedavg-weighting"].check(value))


def fedavg_weights(num_examples: torch.Tensor, weighting: str) -> torch.Tensor:
    """p_i: n_i / Σ n_j (``data-size``) or 1/m (``uniform``), float64."""
    n = num_examples.to(torch.float64)
    return n / n.sum() if weighting == "data-size" else torch.full_like(n, 1.0 / n.numel())


def fedavg_direction(pseudo_gradients: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """ḡ = Σ_i p_i g_i for (m, d) rows and (m,) weights summing to 1."""
    return weights.to(pseudo_gradients.dtype) @ pseudo_gradients


class WeightedMethod(Method):
    """A method of the FedAvg family: it weights its clients by ``fedavg_weighting``."""

    weighting = "data-size"  # or uniform: fedavg-weighting (resolve_weighting)
    needs_individual_updates = False  # a weighted mean: runs under secure aggregation and central DP

    def __init__(self, params=None, setting=None, fedavg_weighting: str = "data-size") -> None:
        super().__init__(params, setting)
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        if self.fedavg_weighting == "uniform":
            self.secagg_weighting = "uniform"  # the secure sum is the uniform mean too

    @classmethod
    def resolve_weighting(cls, config) -> str:
        return str(APP["fedavg-weighting"].read(config))

    def weights(self, round_: Round) -> torch.Tensor:
        """p_i (float64): the replies' weights (num-examples, or Flower's ``weighted_by_key``) normalised, or 1/m."""
        return fedavg_weights(round_.weights, self.fedavg_weighting)


class FedAvgMethod(WeightedMethod):
    """FedAvg (see the module docstring)."""

    Params = NoParams

    def aggregate(self, round_: Round, state: Any) -> Step:
        theta = round_.theta
        g_bar = round_.weighted_models(self.weights(round_))  # Σ p_i θ_i
        g_bar = torch.sub(theta, g_bar, out=g_bar)  # Σ p_i Δ_i
        new = theta - round_.step_scale * g_bar
        return Step(new, state, {"update-norm": float(g_bar.norm())})


class WeightedStrategy(FairStrategy):
    """A strategy of the FedAvg family, named like one of Flower's: its method is built with the
    ``fedavg_weighting`` keyword, and a model holding a float64 array is aggregated in float64."""

    float64_models = True
    app_keywords = ("fedavg_weighting",)
    fedavg_weighting: str = "data-size"

    def build(self, params, setting):
        return self.method_class(params, setting, self.fedavg_weighting)


@register("fedavg")
class FedAvg(WeightedStrategy):
    """FedAvg (see the module docstring), and a drop-in for Flower's ``FedAvg``: Flower's arguments
    in Flower's order, the same model::

        FedAvg(fraction_train=0.25, lr=0.1, seed=0)

    ``fedavg_weighting``: ``"data-size"`` (Flower's ``weighted_by_key``, ``num-examples`` by
    default) or ``"uniform"`` (1/m); ``**common``: :class:`strategies.flower.FairStrategy`'s."""

    method_class = FedAvgMethod
    Params = NoParams

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None, *,
                 fedavg_weighting: str = "data-size", params: NoParams | None = None, **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        super().__init__(params, **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)
