"""FedProx (Li et al., MLSys 2020): FedAvg's server with a proximal client.

Clients minimise f_i(w) + (μ/2)‖w − θ_t‖² (``client_app.methods.fedprox``); the server
takes FedAvg's data-size-weighted mean. ``fedprox-mu`` μ ≥ 0 (default 0.01; the paper
sweeps {0.001, 0.01, 0.1, 1}); μ = 0 is FedAvg. Stateless across rounds.
"""

from __future__ import annotations

from strategies.fedavg import FedAvgStrategy
from strategies.registry import register


class FedProxStrategy(FedAvgStrategy):
    client_method = "fedprox"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.mu = cfg.get_float("fedprox-mu", 0.01, low=0.0)  # read here: a bad value fails at start


@register("fedprox")
def build(cfg):
    return FedProxStrategy(cfg)
