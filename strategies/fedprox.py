"""FedProx (Li et al., MLSys 2020): FedAvg's server with a proximal client.

Clients minimise f_i(w) + (μ/2)‖w − θ_t‖² (``client_app.methods.fedprox``); the server
takes FedAvg's data-size-weighted mean. Stateless across rounds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.base import Request
from strategies.fedavg import FedAvgMethod, MetricsFn, WeightedStrategy, check_weighting
from strategies.flower import flower_arguments, given_once, method_params, params_property
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedprox"
    mu: float = hyper(0.01, low=0.0, key=keys.FEDPROX_MU, grid=Grid((0.001, 0.01, 0.1, 1.0), 1e-5, 100.0),
                      reduces_to={"fedavg": 0.0},
                      doc="μ, the proximal term's weight (0 is FedAvg); sent to the clients "
                          "(client_app.methods.fedprox)")


class FedProxMethod(FedAvgMethod):
    """FedAvg on the server; the clients run ``client_app.methods.fedprox`` with the sent μ."""

    Params = Params
    client_method = keys.FEDPROX

    def request(self, server_round, state, current):
        # μ under Flower's name too: a ClientApp written for Flower's FedProx reads "proximal-mu"
        return Request({**self.params.to_run_config(), keys.PROXIMAL_MU: self.params.mu})


@register("fedprox")
class FedProx(WeightedStrategy):
    """FedProx (see the module docstring), and a drop-in for Flower's ``FedProx``: Flower's
    arguments in Flower's order (``proximal_mu`` is μ, also given as ``mu``; default 0.01)."""

    method_class = FedProxMethod
    Params = Params
    mu = proximal_mu = params_property("mu", "μ, the proximal term's weight (Flower's proximal_mu)")

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, weighted_by_key: str = keys.NUM_EXAMPLES,
                 arrayrecord_key: str = keys.ARRAYS, configrecord_key: str = keys.CONFIG,
                 train_metrics_aggr_fn: MetricsFn | None = None, evaluate_metrics_aggr_fn: MetricsFn | None = None,
                 proximal_mu: float | None = None, *, mu: float | None = None, fedavg_weighting: str = "data-size",
                 params: Params | None = None, **common: Any) -> None:
        self.fedavg_weighting = check_weighting(fedavg_weighting)
        mu = given_once("FedProx", "proximal_mu", proximal_mu, "mu", mu, Params.mu)
        super().__init__(method_params(Params, params, "FedProx", mu=mu), **flower_arguments(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn),
            **common)
