"""Ditto (Li et al., 2021) with a pluggable aggregator for the shared model.

Each client k keeps a personal model v_k next to the shared model θ. In round t a sampled
client trains θ with plain local SGD (its reply, as FedAvg's) and, on the same mini-batches,
its personal model with the proximal pull towards the round's global model:

    v_k ← v_k − η (∇f_k(v_k) + λ (v_k − θ_t)).

Clients are scored with their personal models (``personalized = True``: the server uses
federated evaluation; a client never sampled yet is scored with the global model, which
is where its personal model starts). The shared model is aggregated by FedAvg or by CRAFT
(``ditto-aggregator``), the CRAFT paper's "CRAFT inside Ditto" experiment; the aggregator is
the registered strategy itself (:class:`strategies.fedavg.FedAvg`, :class:`strategies.craft.Craft`),
built with Ditto's own common arguments, so its keys (``server-lr`` for FedAvg, ``craft-*``
for CRAFT, which refuses a non-zero ``server-lr`` as it does alone) apply unchanged.

State (:class:`State`): the aggregator's own State (CRAFT's reference; FedAvg keeps none).
Checkpoints: that state is saved, but the personal models live on the nodes
(Flower's per-node ``context.state``), not on the server: a run resumed from a checkpoint
in a new process starts every personal model again from the global model.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from fedcore import keys
from fedcore.config import Grid
from fedcore.params import MethodParams, hyper, nested
from strategies import craft, fedavg
from strategies.base import FairStrategy
from strategies.registry import register

AGGREGATORS: dict[str, type[FairStrategy]] = {"fedavg": fedavg.FedAvg, "craft": craft.Craft}
AGGREGATOR = "ditto-aggregator"
# The arguments every FairStrategy takes besides its Params (each kept as the attribute of
# that name): the aggregator gets Ditto's.
_COMMON = tuple(p.name for p in inspect.signature(FairStrategy.__init__).parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.name != "params")


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """Ditto's hyperparameters; ``craft`` are the CRAFT aggregator's (its own keys)."""

    prefix = "ditto"
    lam: float = hyper(0.1, low=0.0, key=keys.DITTO_LAMBDA, grid=Grid((0.1, 1.0, 2.0), 1e-3, 100.0),
                       doc="λ, the personal models' proximal pull towards the global model: 0 = purely local "
                           "personal models, large = they track it; sent to the clients (client_app.methods.ditto)")
    aggregator: str = hyper("fedavg", choices=tuple(AGGREGATORS),
                            doc="the shared model's aggregator: fedavg (Ditto as published) or craft (with the "
                                "craft-* keys, the CRAFT paper's \"CRAFT inside Ditto\")")
    craft: craft.Params = nested(craft.Params)


@dataclasses.dataclass
class State:
    shared: Any = None  # the aggregator's State (None for FedAvg)


@register("ditto")
class Ditto(FairStrategy):
    """Ditto (see the module docstring): ``Ditto(fraction_train=0.1, lam=0.1, aggregator="craft",
    model=net)``. The shared model's step is the aggregator's (:attr:`shared`)."""

    weighting = "personal"  # scored on the personal models

    Params = Params
    client_method = keys.DITTO
    personalized = True

    def __init__(self, *, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        cls = AGGREGATORS[self.params.aggregator]
        extra = {"model": model} if "model" in cls.app_arguments else {}
        params = self.params.craft if cls is craft.Craft else cls.Params()
        self.shared = cls(params=params, **{k: getattr(self, k) for k in _COMMON}, **extra)
        self.needs_individual_updates = self.shared.needs_individual_updates
        self.state = self.init_state()

    def init_state(self) -> State:
        shared = getattr(self, "shared", None)  # None while FairStrategy.__init__ runs
        return State(None if shared is None else shared.init_state())

    def restore_state(self, fields) -> State:
        """The aggregator rebuilds its own State (Ditto's one field is typed ``Any``)."""
        self.shared.state = fields.get("shared")
        return State(self.shared.state)

    def client_config(self) -> dict[str, Any]:
        return {keys.DITTO_LAMBDA: self.params.lam}

    def set_model(self, arrays) -> None:
        super().set_model(arrays)
        self.shared.set_model(arrays)

    def aggregate_valid(self, server_round, replies):
        self.shared.state = self.state.shared  # a restored checkpoint replaces self.state
        out = self.shared.aggregate_valid(server_round, replies)
        self.state.shared = self.shared.state
        return out
