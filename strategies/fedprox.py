"""FedProx (Li et al., MLSys 2020): FedAvg's server with a proximal client.

Clients minimise f_i(w) + (μ/2)‖w − θ_t‖² (``client_app.methods.fedprox``); the server
takes FedAvg's data-size-weighted mean. Stateless across rounds.

Hyperparameters (declared here once; sent to the clients with every request)
---------------
fedprox-mu : float, default 0.01 — μ ≥ 0 (the paper sweeps {0.001, 0.01, 0.1, 1});
    μ = 0 is FedAvg.
"""

from __future__ import annotations

import dataclasses

from fedcore.params import MethodParams, hyper
from strategies.fedavg import FedAvg
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "fedprox"
    mu: float = hyper(0.01, low=0.0)


@register("fedprox")
class FedProx(FedAvg):
    """FedAvg on the server; the clients run ``client_app.methods.fedprox`` with the sent μ."""

    Params = Params
    client_method = "fedprox"

    def client_config(self):
        return self.params.to_run_config()
