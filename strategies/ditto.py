"""Ditto (Li et al., 2021) with a pluggable aggregator for the shared model.

Each client k keeps a personal model v_k next to the shared model θ. In round t a sampled
client trains θ with plain local SGD (its reply, as FedAvg's) and, on the same mini-batches,
its personal model with the proximal pull towards the round's global model:

    v_k ← v_k − η (∇f_k(v_k) + λ (v_k − θ_t)).

Clients are scored with their personal models (``personalized = True``: the server uses
federated evaluation; a client never sampled yet is scored with the global model, which
is where its personal model starts). The shared model is aggregated by FedAvg or by CRAFT
(``ditto-aggregator``), the CRAFT paper's "CRAFT inside Ditto" experiment; the aggregator is
the registered strategy itself (:mod:`strategies.fedavg`, :mod:`strategies.craft`), so its
keys (``server-lr``, ``craft-*``) apply unchanged.

Hyperparameters:

* ``ditto-lambda`` λ ≥ 0, default 0.1 (Ditto's grid {0.1, 1, 2}). λ = 0: personal models
  are purely local (trained from their own past state, never pulled); large λ: they track
  the global model.
* ``ditto-aggregator`` — ``fedavg`` (default, Ditto as published) or ``craft``.

Checkpoints: the aggregator's state is saved, but the personal models live on the nodes
(Flower's per-node ``context.state``), not on the server: a run resumed from a checkpoint
in a new process starts every personal model again from the global model.
"""

from __future__ import annotations

from typing import Any

from strategies import craft, fedavg
from strategies.base import FairStrategy
from strategies.registry import register

AGGREGATORS = {"fedavg": fedavg.build, "craft": craft.build}
LAMBDA = "ditto-lambda"
AGGREGATOR = "ditto-aggregator"


class DittoStrategy(FairStrategy):
    client_method = "ditto"
    personalized = True

    def __init__(self, cfg, shared: FairStrategy) -> None:
        super().__init__(cfg)
        self.shared = shared  # the shared model's aggregator
        self.needs_individual_updates = shared.needs_individual_updates

    def begin_round(self, server_round, arrays):
        super().begin_round(server_round, arrays)
        return self.shared.begin_round(server_round, arrays)

    def aggregate_train(self, server_round, replies):
        return self.shared.aggregate_train(server_round, replies)

    def state_dict(self) -> dict[str, Any]:
        return {"shared": self.shared.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shared.load_state_dict(state["shared"])


@register("ditto")
def build(cfg):
    cfg.get_float(LAMBDA, low=0.0)  # read by the clients; fail here, before the run starts
    aggregator = cfg.get_choice(AGGREGATOR, tuple(AGGREGATORS))
    return DittoStrategy(cfg, AGGREGATORS[aggregator](cfg))
