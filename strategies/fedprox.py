"""FedProx (Li et al., MLSys 2020): FedAvg's server with a proximal client.

Clients minimise f_i(w) + (μ/2)‖w − θ_t‖² (``client_app.methods.fedprox``); the server
takes FedAvg's data-size-weighted mean. Stateless across rounds.
"""

from __future__ import annotations

import dataclasses

from flwr.serverapp import strategy as flower

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.fedavg import FedAvg
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedprox"
    mu: float = hyper(0.01, low=0.0, key=keys.FEDPROX_MU, grid=Grid((0.001, 0.01, 0.1, 1.0), 1e-5, 100.0),
                      reduces_to={"fedavg": 0.0},
                      doc="μ, the proximal term's weight (0 is FedAvg); sent to the clients "
                          "(client_app.methods.fedprox)")


@register("fedprox")
class FedProx(FedAvg):
    """FedAvg on the server; the clients run ``client_app.methods.fedprox`` with the sent μ."""

    Params = Params
    client_method = keys.FEDPROX
    flower_counterpart = flower.FedProx
    flower_names = {"proximal_mu": "mu"}

    def client_config(self):
        # μ under Flower's name too: a ClientApp written for Flower's FedProx reads "proximal-mu"
        return {**self.params.to_run_config(), keys.PROXIMAL_MU: self.params.mu}
